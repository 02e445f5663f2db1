//! The payments model: attempt statuses exactly as `payments.status` stores them
//! (`migrations/0003_payments.sql`), the outcomes of the shared transitions, and the pure rules
//! every payment path applies. No I/O here; the database still does the deciding (each
//! transition is one conditional `UPDATE`), these functions say what the code does with what it
//! read.

use crate::payments::provider::{CreatePayment, ProviderPayment};
use std::collections::BTreeMap;
use std::time::Duration;

mod charge;
mod reversal;

pub use charge::*;
pub use reversal::{Reversal, ReversalStep, is_full_refund, reversal_step};

/// A payment attempt's status. The life of an attempt:
///
/// ```text
/// pending ──► succeeded (the order is PAID by this attempt) ──► refunded (provider-side refund)
///    │    ──► declined  (card refused; the next attempt gets a new key)
///    │    ──► failed    (the provider provably never charged it)
///    └──────► refund_pending (money taken for an order that cannot take it) ──► refunded
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    Pending,
    Succeeded,
    Declined,
    Failed,
    RefundPending,
    Refunded,
}

impl AttemptStatus {
    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Pending => "pending",
            AttemptStatus::Succeeded => "succeeded",
            AttemptStatus::Declined => "declined",
            AttemptStatus::Failed => "failed",
            AttemptStatus::RefundPending => "refund_pending",
            AttemptStatus::Refunded => "refunded",
        }
    }

    /// The provider took money for this attempt but nothing here recorded it yet: a refund or
    /// dispute that arrives now overtook the success, which must be applied first.
    pub fn success_unapplied(self) -> bool {
        matches!(
            self,
            AttemptStatus::Pending | AttemptStatus::Failed | AttemptStatus::Declined
        )
    }
}

/// A recorded payment attempt (a row, or its `row_to_json` where a statement returns it
/// beside other columns).
#[derive(Debug, Clone, sqlx::FromRow, serde::Deserialize)]
pub struct Attempt {
    pub id: String,
    pub order_id: String,
    pub account_id: String,
    pub attempt: i32,
    /// The provider idempotency key, `<order id>-<attempt>`, committed before the first call.
    pub provider_key: String,
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    pub status: AttemptStatus,
}

impl Attempt {
    /// The provider request for this attempt. Every call for one attempt sends the same key
    /// and parameters, so a repeat replays the provider's first outcome and never charges
    /// again.
    pub fn create_request(&self) -> CreatePayment {
        CreatePayment {
            idempotency_key: self.provider_key.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
            metadata: BTreeMap::from([
                ("order_id".to_owned(), self.order_id.clone()),
                ("attempt".to_owned(), self.attempt.to_string()),
                ("payment_id".to_owned(), self.id.clone()),
            ]),
        }
    }

    /// True when the provider payment `p` was made for this attempt (by its metadata).
    pub fn is_paid_by(&self, p: &ProviderPayment) -> bool {
        is_attempt_of(p, &self.id, self.attempt)
    }
}

/// Why an order cannot be paid now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpayable {
    /// The order's status as the fan sees it (`EXPIRED`, `CANCELLED`, `REFUNDED`, ...).
    Status(String),
    /// The order's hold no longer holds all its seats.
    HoldLost,
}

/// What became of an attempt that was still open when its order turned out unpayable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAttempt {
    /// None, or nothing proven about it yet (reconciliation will settle it).
    Untouched,
    /// It had been charged; the money is back.
    Refunded,
    /// It had been charged; the refund is under way.
    RefundPending,
}

/// What an order's status says about paying it, once the conditional pin changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payability {
    AlreadyPaid,
    Unpayable(Unpayable),
}

/// Reads an order's stored status (and whether its deadline passed) as the pay request
/// answers it: a pending order past its deadline is `EXPIRED` to the fan even before the
/// expiry job got to it.
pub fn payability(order_status: &str, expired: bool) -> Payability {
    match order_status {
        "PAID" => Payability::AlreadyPaid,
        "PENDING_PAYMENT" if expired => Payability::Unpayable(Unpayable::Status("EXPIRED".into())),
        other => Payability::Unpayable(Unpayable::Status(other.to_owned())),
    }
}

/// A provider payment method id as the pay request accepts it (`pm_` and up to 100
/// alphanumerics or underscores).
pub fn valid_payment_method(pm: &str) -> bool {
    pm.len() <= 100
        && pm.starts_with("pm_")
        && pm.len() > 3
        && pm.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An order id worth looking up (anything else is answered like a missing order).
pub fn plausible_order_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64
}

/// The provider idempotency key of the refund of attempt `payment_id`: every retry of that
/// refund (the pay request, a webhook, reconciliation) is the same refund.
pub fn refund_key(payment_id: &str) -> String {
    format!("refund-{payment_id}")
}

/// The refund id recorded when the provider says the charge was refunded already (by an
/// operator, say): nothing is left to give back.
pub fn already_refunded_id(provider_payment_id: &str) -> String {
    format!("already-refunded:{provider_payment_id}")
}

/// The next wait while the provider reports a concurrent request with the same key:
/// doubling from 20 ms, at most 250 ms.
pub fn next_in_progress_pause(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(250))
}

/// The first wait of [`next_in_progress_pause`].
pub const FIRST_IN_PROGRESS_PAUSE: Duration = Duration::from_millis(20);

/// The metrics label of a pay request that ended with the error `code`.
pub fn outcome_label(code: &str) -> &'static str {
    use shared::error::codes;
    match code {
        c if c == codes::PAYMENT_PROVIDER_TIMEOUT => "timeout",
        c if c == codes::PAYMENT_PROVIDER_ERROR => "provider_error",
        c if c == codes::PAYMENT_IN_PROGRESS => "in_progress",
        c if c == codes::ORDER_NOT_PAYABLE => "not_payable",
        c if c == codes::PAYMENT_ATTEMPTS_EXHAUSTED => "attempts_exhausted",
        _ => "refused",
    }
}

/// How reconciliation (or the pay request settling an open attempt) left an attempt; the
/// label is the `outcome` of `payment_reconciled_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The provider had charged it: the order is paid now.
    Completed,
    /// Settled meanwhile by another path, or nothing to apply.
    Unchanged,
    /// Charged for an order that could not take it: the money is back.
    Refunded,
    /// Charged for an order that could not take it: the refund failed, retried later.
    RefundPending,
    Declined,
    /// The provider has not finished with it.
    StillProcessing,
    /// Search does not show it and it may not be replayed now (the pay request's check).
    UnknownToProvider,
    /// The provider could not be reached to ask by its key.
    ProviderUnreachable,
    /// Provably never charged: closed as `failed`.
    Abandoned,
    /// Still unknown after asking; asked again later.
    Unknown,
    /// Still open at the provider when its order could no longer be paid: canceled there
    /// (it can no longer be completed) and closed as `failed`.
    Canceled,
}

impl Reconciled {
    pub fn label(self) -> &'static str {
        match self {
            Reconciled::Completed => "completed",
            Reconciled::Unchanged => "unchanged",
            Reconciled::Refunded => "refunded",
            Reconciled::RefundPending => "refund_pending",
            Reconciled::Declined => "declined",
            Reconciled::StillProcessing => "still_processing",
            Reconciled::UnknownToProvider => "unknown_to_provider",
            Reconciled::ProviderUnreachable => "provider_unreachable",
            Reconciled::Abandoned => "abandoned",
            Reconciled::Unknown => "unknown",
            Reconciled::Canceled => "canceled",
        }
    }

    /// A refund's outcome: true when the money is back.
    pub fn of_refund(refunded: bool) -> Self {
        if refunded {
            Reconciled::Refunded
        } else {
            Reconciled::RefundPending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payments::provider::PaymentStatus;

    const ALL: [AttemptStatus; 6] = [
        AttemptStatus::Pending,
        AttemptStatus::Succeeded,
        AttemptStatus::Declined,
        AttemptStatus::Failed,
        AttemptStatus::RefundPending,
        AttemptStatus::Refunded,
    ];

    #[test]
    fn attempt_statuses_are_the_stored_strings() {
        let stored: Vec<&str> = ALL.iter().map(|s| s.as_str()).collect();
        // The CHECK constraint of payments.status, in its order.
        assert_eq!(
            stored,
            [
                "pending",
                "succeeded",
                "declined",
                "failed",
                "refund_pending",
                "refunded"
            ]
        );
    }

    #[test]
    fn a_reversal_applies_an_overtaken_success_only_to_unsettled_attempts() {
        let unsettled: Vec<&str> = ALL
            .iter()
            .filter(|s| s.success_unapplied())
            .map(|s| s.as_str())
            .collect();
        // Money kept, owed back or given back was recorded with its provider payment.
        assert_eq!(unsettled, ["pending", "declined", "failed"]);
    }

    #[test]
    fn payment_methods_are_provider_ids() {
        assert!(valid_payment_method("pm_card_visa"));
        assert!(valid_payment_method("pm_X9"));
        for bad in [
            "",
            "pm_",
            "card_visa",
            "pm_card visa",
            "pm_card-visa",
            "pm_é",
        ] {
            assert!(!valid_payment_method(bad), "{bad:?}");
        }
        assert!(valid_payment_method(&format!("pm_{}", "a".repeat(97))));
        assert!(!valid_payment_method(&format!("pm_{}", "a".repeat(98))));
    }

    #[test]
    fn order_ids_out_of_range_are_not_looked_up() {
        assert!(plausible_order_id("ord_1"));
        assert!(plausible_order_id(&"o".repeat(64)));
        assert!(!plausible_order_id(""));
        assert!(!plausible_order_id(&"o".repeat(65)));
    }

    #[test]
    fn payability_follows_the_order_status() {
        assert_eq!(payability("PAID", false), Payability::AlreadyPaid);
        assert_eq!(payability("PAID", true), Payability::AlreadyPaid);
        let status = |s: &str| Payability::Unpayable(Unpayable::Status(s.into()));
        assert_eq!(payability("PENDING_PAYMENT", true), status("EXPIRED"));
        // Lost a race with its own deadline: still reported as it is stored.
        assert_eq!(
            payability("PENDING_PAYMENT", false),
            status("PENDING_PAYMENT")
        );
        assert_eq!(payability("CANCELLED", false), status("CANCELLED"));
        assert_eq!(payability("REFUNDED", true), status("REFUNDED"));
    }

    fn attempt() -> Attempt {
        Attempt {
            id: "pay_1".into(),
            order_id: "ord_1".into(),
            account_id: "alice".into(),
            attempt: 2,
            provider_key: "ord_1-2".into(),
            amount: 9000,
            currency: "JPY".into(),
            payment_method: "pm_card_visa".into(),
            status: AttemptStatus::Pending,
        }
    }

    fn provider_payment(meta: &[(&str, &str)]) -> ProviderPayment {
        ProviderPayment {
            id: "pi_1".into(),
            status: PaymentStatus::Succeeded,
            amount: 9000,
            currency: "jpy".into(),
            amount_refunded: 0,
            metadata: meta
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_success_pays_only_its_own_intent_amount_and_currency() {
        let c = Charge::of(&provider_payment(&[("payment_id", "pay_1")]));
        assert!(charge_matches(9000, "JPY", None, &c));
        assert!(charge_matches(9000, "JPY", Some("pi_1"), &c));
        assert!(!charge_matches(9000, "JPY", Some("pi_other"), &c));
        assert!(!charge_matches(100, "JPY", None, &c));
        assert!(!charge_matches(9000, "USD", None, &c));
        assert_eq!(mismatch_refund_key("pi_1"), "refund-mismatch-pi_1");
    }

    #[test]
    fn every_call_for_an_attempt_is_the_same_request() {
        let a = attempt();
        let req = a.create_request();
        assert_eq!(req.idempotency_key, "ord_1-2");
        assert_eq!((req.amount, req.currency.as_str()), (9000, "JPY"));
        assert_eq!(req.payment_method, "pm_card_visa");
        let meta: Vec<(&str, &str)> = req
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            meta,
            [
                ("attempt", "2"),
                ("order_id", "ord_1"),
                ("payment_id", "pay_1")
            ]
        );
        assert_eq!(a.create_request().metadata, req.metadata);
    }

    #[test]
    fn provider_payments_are_matched_by_their_metadata() {
        let a = attempt();
        assert!(a.is_paid_by(&provider_payment(&[("payment_id", "pay_1")])));
        assert!(a.is_paid_by(&provider_payment(&[("attempt", "2")])));
        assert!(!a.is_paid_by(&provider_payment(&[
            ("payment_id", "pay_9"),
            ("attempt", "1")
        ])));
        assert!(!a.is_paid_by(&provider_payment(&[])));
    }

    #[test]
    fn refund_keys_are_one_per_attempt() {
        assert_eq!(refund_key("pay_1"), "refund-pay_1");
        assert_eq!(refund_key("pay_1"), refund_key("pay_1"));
        assert_ne!(refund_key("pay_1"), refund_key("pay_2"));
        assert_eq!(already_refunded_id("pi_7"), "already-refunded:pi_7");
    }

    #[test]
    fn in_progress_pauses_double_up_to_a_cap() {
        let mut pause = FIRST_IN_PROGRESS_PAUSE;
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(pause.as_millis());
            pause = next_in_progress_pause(pause);
        }
        assert_eq!(seen, [20, 40, 80, 160, 250, 250]);
    }

    #[test]
    fn pay_outcome_labels_by_error_code() {
        use shared::error::codes;
        assert_eq!(outcome_label(codes::PAYMENT_PROVIDER_TIMEOUT), "timeout");
        assert_eq!(
            outcome_label(codes::PAYMENT_PROVIDER_ERROR),
            "provider_error"
        );
        assert_eq!(outcome_label(codes::PAYMENT_IN_PROGRESS), "in_progress");
        assert_eq!(outcome_label(codes::ORDER_NOT_PAYABLE), "not_payable");
        assert_eq!(outcome_label(codes::HOLD_EXPIRED), "refused");
        assert_eq!(outcome_label(codes::NOT_FOUND), "refused");
    }

    #[test]
    fn reconciliation_outcomes_keep_their_metric_labels() {
        use Reconciled as R;
        let labels: Vec<&str> = [
            R::Completed,
            R::Unchanged,
            R::Refunded,
            R::RefundPending,
            R::Declined,
            R::StillProcessing,
            R::UnknownToProvider,
            R::ProviderUnreachable,
            R::Abandoned,
            R::Unknown,
        ]
        .iter()
        .map(|r| r.label())
        .collect();
        assert_eq!(
            labels,
            [
                "completed",
                "unchanged",
                "refunded",
                "refund_pending",
                "declined",
                "still_processing",
                "unknown_to_provider",
                "provider_unreachable",
                "abandoned",
                "unknown"
            ]
        );
        assert_eq!(R::of_refund(true), R::Refunded);
        assert_eq!(R::of_refund(false), R::RefundPending);
    }
}
