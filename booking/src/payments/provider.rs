//! The payment provider as booking sees it. Everything provider-specific (HTTP, JSON shapes,
//! error codes) stays behind [`PaymentProvider`]; the pay flow, webhooks and reconciliation
//! only see these types.

use async_trait::async_trait;
use std::collections::BTreeMap;

/// A charge request. `idempotency_key` identifies one payment attempt: the provider charges
/// at most once per key, and replays the first answer to every repeat.
#[derive(Debug, Clone)]
pub struct CreatePayment {
    pub idempotency_key: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217, lower case on the wire.
    pub currency: String,
    pub payment_method: String,
    /// Echoed back on the payment and in webhooks (`order_id`, `attempt`, `payment_id`).
    pub metadata: BTreeMap<String, String>,
}

/// What the provider knows about a payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentStatus {
    /// Money taken.
    Succeeded,
    /// Refused by the card issuer; nothing taken.
    Declined { decline_code: String },
    /// Anything else (processing, requires action...): not final.
    Other(String),
}

#[derive(Debug, Clone)]
pub struct ProviderPayment {
    /// The provider's id (`pi_...`).
    pub id: String,
    pub status: PaymentStatus,
    pub amount: i64,
    /// ISO 4217 as the provider spells it (lower case).
    pub currency: String,
    pub amount_refunded: i64,
    pub metadata: BTreeMap<String, String>,
}

impl ProviderPayment {
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
}

#[derive(Debug, Clone)]
pub struct ProviderRefund {
    pub id: String,
    pub payment_id: String,
    pub amount: i64,
}

/// Why a provider call did not give an answer. The distinction matters for money:
/// only [`ProviderError::NotSent`] proves the provider never saw the request.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The connection could not be made: the request never reached the provider.
    #[error("payment provider unreachable")]
    NotSent(#[source] anyhow::Error),
    /// Sent, but no answer in time: the provider may or may not have acted on it.
    #[error("payment provider timed out")]
    Timeout,
    /// The provider answered 5xx or the connection broke mid-request: outcome unknown.
    #[error("payment provider failed (status {status:?})")]
    Unavailable { status: Option<u16> },
    /// Another request with the same idempotency key is still running at the provider.
    #[error("a request with this idempotency key is still in progress at the provider")]
    InProgress,
    /// The provider refused the request itself (bad key, bad parameters, already refunded):
    /// a bug or a state mismatch, never a card decline.
    #[error("payment provider refused the request: {status} {code}")]
    Rejected { status: u16, code: String },
    /// The answer could not be understood.
    #[error("unexpected answer from the payment provider")]
    Protocol(#[source] anyhow::Error),
}

impl ProviderError {
    /// True when a retry with the same idempotency key is the right thing to do.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            ProviderError::Timeout | ProviderError::Unavailable { .. } | ProviderError::InProgress
        )
    }

    /// True when the failure proves no money was taken: the request never reached the
    /// provider, or the provider refused the request itself. Only then may an attempt be
    /// closed as `failed` (its next pay is a fresh attempt with a new key).
    pub fn proves_not_charged(&self) -> bool {
        matches!(
            self,
            ProviderError::NotSent(_) | ProviderError::Rejected { .. }
        )
    }
}

#[async_trait]
pub trait PaymentProvider: Send + Sync + 'static {
    /// Creates and confirms a payment. A decline is `Ok` with [`PaymentStatus::Declined`].
    async fn create_payment(&self, req: &CreatePayment) -> Result<ProviderPayment, ProviderError>;

    async fn retrieve(&self, payment_id: &str) -> Result<ProviderPayment, ProviderError>;

    /// Cancels a payment that has not taken money (`requires_action`, `processing`, ...), so
    /// it can never be completed; the answer is the payment as it is now. One that already
    /// succeeded is refused ([`ProviderError::Rejected`], `payment_intent_unexpected_state`).
    async fn cancel(&self, payment_id: &str) -> Result<ProviderPayment, ProviderError>;

    /// Every payment the provider holds for a merchant order id (metadata `order_id`).
    async fn find_by_order(&self, order_id: &str) -> Result<Vec<ProviderPayment>, ProviderError>;

    /// Refunds `amount` minor units of the payment (`None`: all that is left), at most once
    /// per `idempotency_key`. More than is left is refused ([`ProviderError::Rejected`]:
    /// `charge_already_refunded` when nothing is left, otherwise a refusal of `amount`).
    async fn refund(
        &self,
        idempotency_key: &str,
        payment_id: &str,
        amount: Option<i64>,
    ) -> Result<ProviderRefund, ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<ProviderError> {
        vec![
            ProviderError::NotSent(anyhow::anyhow!("connection refused")),
            ProviderError::Timeout,
            ProviderError::Unavailable { status: Some(503) },
            ProviderError::InProgress,
            ProviderError::Rejected {
                status: 400,
                code: "parameter_invalid".into(),
            },
            ProviderError::Protocol(anyhow::anyhow!("not json")),
        ]
    }

    #[test]
    fn only_unsent_or_refused_requests_prove_nothing_was_charged() {
        let proven: Vec<bool> = all()
            .iter()
            .map(ProviderError::proves_not_charged)
            .collect();
        assert_eq!(proven, [true, false, false, false, true, false]);
    }

    #[test]
    fn unknown_outcomes_are_retried_with_the_same_key() {
        let unknown: Vec<bool> = all().iter().map(ProviderError::outcome_unknown).collect();
        assert_eq!(unknown, [false, true, true, true, false, false]);
        // Nothing is both proven uncharged and unknown.
        assert!(
            all()
                .iter()
                .all(|e| !(e.proves_not_charged() && e.outcome_unknown()))
        );
    }

    #[test]
    fn metadata_is_read_by_key() {
        let p = ProviderPayment {
            id: "pi_1".into(),
            status: PaymentStatus::Succeeded,
            amount: 1,
            currency: "jpy".into(),
            amount_refunded: 0,
            metadata: BTreeMap::from([("order_id".to_owned(), "ord_1".to_owned())]),
        };
        assert_eq!(p.meta("order_id"), Some("ord_1"));
        assert_eq!(p.meta("payment_id"), None);
    }
}
