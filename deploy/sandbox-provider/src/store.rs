//! The sandbox's memory: payment intents, refunds and idempotency records.
//!
//! Idempotency follows Stripe: the first request with a key runs and its response is stored;
//! a repeat with the same parameters replays that response; the same key with different
//! parameters is `400 idempotency_error`; a repeat while the first is still running is
//! `409 idempotency_key_in_use`. A `5xx` that happened before anything was done is not stored,
//! so the retry runs afresh. All of this sits behind one mutex that is never held across an
//! `await`, so a check and its write are always one step.

use crate::list::{self, ListQuery, Listed, NoSuchCursor, Page};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

#[derive(Debug, Clone, Serialize)]
pub struct Intent {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub amount_refunded: i64,
    pub amount_received: i64,
    pub currency: String,
    /// Stripe's statuses: `requires_payment_method` (new, or declined: then
    /// `last_payment_error` is set), `requires_confirmation`, `requires_action`,
    /// `processing`, `succeeded`, `canceled`.
    pub status: String,
    pub payment_method: Option<String>,
    pub payment_method_types: Vec<String>,
    pub capture_method: &'static str,
    pub confirmation_method: &'static str,
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    /// Free text and the receipt address the merchant set (create or update); the sandbox
    /// sends no receipts.
    pub description: Option<String>,
    pub receipt_email: Option<String>,
    pub created: i64,
    pub latest_charge: Option<String>,
    pub last_payment_error: Option<Value>,
    pub next_action: Option<Value>,
    /// Set by a cancel (unix seconds), as Stripe's `canceled_at`.
    pub canceled_at: Option<i64>,
    /// `duplicate`, `fraudulent`, `requested_by_customer` or `abandoned`.
    pub cancellation_reason: Option<String>,
}

impl Intent {
    /// Declined: back to `requires_payment_method` with the card error kept.
    pub fn declined(&self) -> bool {
        self.last_payment_error.is_some() && self.status == "requires_payment_method"
    }
}

impl Listed for Intent {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}

/// A dispute (chargeback) opened by the card holder's bank, Stripe-shaped.
#[derive(Debug, Clone, Serialize)]
pub struct Dispute {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: String,
    pub charge: Option<String>,
    pub payment_intent: String,
    pub reason: String,
    pub status: &'static str,
    pub created: i64,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: String,
    pub payment_intent: String,
    pub charge: Option<String>,
    pub reason: Option<String>,
    pub status: &'static str,
    pub created: i64,
    pub metadata: BTreeMap<String, String>,
}

impl Listed for Refund {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}

/// What the merchant asked for under one idempotency key.
#[derive(Debug, Clone)]
enum IdemState {
    InFlight,
    Done { status: u16, body: Value },
}

#[derive(Debug, Clone)]
struct IdemEntry {
    endpoint: &'static str,
    fingerprint: String,
    state: IdemState,
}

/// The outcome of presenting an idempotency key.
#[derive(Debug)]
pub enum IdemBegin {
    /// Run the request; finish with [`Store::idem_finish`] or [`Store::idem_forget`].
    Run,
    /// Same key, same parameters, finished before: send this again.
    Replay { status: u16, body: Value },
    /// Same key, different parameters (or endpoint).
    Mismatch,
    /// Same key, still running.
    InFlight,
}

#[derive(Default)]
struct Inner {
    intents: HashMap<String, Intent>,
    /// Creation order, for listing and search.
    intent_ids: Vec<String>,
    refunds: HashMap<String, Refund>,
    /// Creation order, for listing.
    refund_ids: Vec<String>,
    /// Disputes by payment intent id (at most one per charge, as with card networks).
    disputes: HashMap<String, Dispute>,
    idem: HashMap<String, IdemEntry>,
}

#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

/// Per-order counts for tests and operators ("was the customer charged once?").
#[derive(Debug, Clone, Serialize)]
pub struct OrderSummary {
    pub order_id: String,
    /// Payment intents that succeeded (money taken).
    pub charges: usize,
    pub declines: usize,
    pub refunds: usize,
    pub disputes: usize,
    pub amount_charged: i64,
    pub amount_refunded: i64,
    pub intents: Vec<Intent>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind, still consistent for a
        // sandbox; keep serving rather than poisoning every later request.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `key` for a request, or says why not.
    pub fn idem_begin(&self, key: &str, endpoint: &'static str, fingerprint: &str) -> IdemBegin {
        let mut inner = self.lock();
        match inner.idem.get(key) {
            Some(e) if e.endpoint != endpoint || e.fingerprint != fingerprint => {
                IdemBegin::Mismatch
            }
            Some(IdemEntry {
                state: IdemState::InFlight,
                ..
            }) => IdemBegin::InFlight,
            Some(IdemEntry {
                state: IdemState::Done { status, body },
                ..
            }) => IdemBegin::Replay {
                status: *status,
                body: body.clone(),
            },
            None => {
                inner.idem.insert(
                    key.to_owned(),
                    IdemEntry {
                        endpoint,
                        fingerprint: fingerprint.to_owned(),
                        state: IdemState::InFlight,
                    },
                );
                IdemBegin::Run
            }
        }
    }

    /// Stores the response of a request that ran.
    pub fn idem_finish(&self, key: &str, status: u16, body: &Value) {
        if let Some(e) = self.lock().idem.get_mut(key) {
            e.state = IdemState::Done {
                status,
                body: body.clone(),
            };
        }
    }

    /// Drops the claim of a request that did nothing (so a retry runs afresh).
    pub fn idem_forget(&self, key: &str) {
        self.lock().idem.remove(key);
    }

    pub fn insert_intent(&self, intent: Intent) {
        let mut inner = self.lock();
        inner.intent_ids.push(intent.id.clone());
        inner.intents.insert(intent.id.clone(), intent);
    }

    pub fn intent(&self, id: &str) -> Option<Intent> {
        self.lock().intents.get(id).cloned()
    }

    /// Runs `f` on one intent under the store's lock: a check of its status and the change
    /// that follows are one step, so two confirms of one intent cannot both charge.
    pub fn update_intent<T, E>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Intent) -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        self.lock().intents.get_mut(id).map(f)
    }

    /// The intent whose charge is `charge_id`.
    pub fn intent_by_charge(&self, charge_id: &str) -> Option<Intent> {
        self.lock()
            .intents
            .values()
            .find(|i| i.latest_charge.as_deref() == Some(charge_id))
            .cloned()
    }

    /// The refunds of one intent, oldest first.
    pub fn refunds_of(&self, intent_id: &str) -> Vec<Refund> {
        let mut out: Vec<Refund> = self
            .lock()
            .refunds
            .values()
            .filter(|r| r.payment_intent == intent_id)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        out
    }

    /// One page of every intent, newest first (`GET /v1/payment_intents`).
    pub fn list_intents(&self, q: &ListQuery) -> Result<Page<Intent>, NoSuchCursor> {
        let inner = self.lock();
        list::page(
            inner
                .intent_ids
                .iter()
                .filter_map(|id| inner.intents.get(id)),
            q,
        )
    }

    pub fn refund_by_id(&self, id: &str) -> Option<Refund> {
        self.lock().refunds.get(id).cloned()
    }

    /// One page of the refunds, newest first, of one intent (or charge) when given
    /// (`GET /v1/refunds`); a cursor must name a refund of that intent.
    pub fn list_refunds(
        &self,
        payment_intent: Option<&str>,
        charge: Option<&str>,
        q: &ListQuery,
    ) -> Result<Page<Refund>, NoSuchCursor> {
        let inner = self.lock();
        let refunds = inner
            .refund_ids
            .iter()
            .filter_map(|id| inner.refunds.get(id))
            .filter(|r| payment_intent.is_none_or(|pi| r.payment_intent == pi))
            .filter(|r| charge.is_none_or(|ch| r.charge.as_deref() == Some(ch)));
        list::page(refunds, q)
    }

    /// Intents whose `metadata[key] == value`, oldest first.
    pub fn search_metadata(&self, key: &str, value: &str) -> Vec<Intent> {
        let inner = self.lock();
        inner
            .intent_ids
            .iter()
            .filter_map(|id| inner.intents.get(id))
            .filter(|i| i.metadata.get(key).map(String::as_str) == Some(value))
            .cloned()
            .collect()
    }

    /// Refunds the rest of a succeeded intent, or says why not. One locked step, so two
    /// refund requests with different keys cannot both refund.
    pub fn refund(&self, intent_id: &str, refund: Refund) -> Result<(Refund, Intent), RefundError> {
        let mut inner = self.lock();
        let intent = inner
            .intents
            .get_mut(intent_id)
            .ok_or(RefundError::NoSuchIntent)?;
        if intent.status != "succeeded" {
            return Err(RefundError::NotCharged);
        }
        let remaining = intent.amount - intent.amount_refunded;
        if remaining <= 0 {
            return Err(RefundError::AlreadyRefunded);
        }
        let amount = if refund.amount > 0 {
            refund.amount
        } else {
            remaining
        };
        if amount > remaining {
            return Err(RefundError::TooMuch);
        }
        intent.amount_refunded += amount;
        let intent = intent.clone();
        let refund = Refund {
            amount,
            currency: intent.currency.clone(),
            charge: intent.latest_charge.clone(),
            ..refund
        };
        inner.refund_ids.push(refund.id.clone());
        inner.refunds.insert(refund.id.clone(), refund.clone());
        Ok((refund, intent))
    }

    /// Opens a dispute on a succeeded intent (at most one per intent).
    pub fn dispute(&self, intent_id: &str, dispute: Dispute) -> Result<Dispute, DisputeError> {
        let mut inner = self.lock();
        let intent = inner
            .intents
            .get(intent_id)
            .ok_or(DisputeError::NoSuchIntent)?;
        if intent.status != "succeeded" {
            return Err(DisputeError::NotCharged);
        }
        let dispute = Dispute {
            amount: intent.amount,
            currency: intent.currency.clone(),
            charge: intent.latest_charge.clone(),
            payment_intent: intent.id.clone(),
            ..dispute
        };
        if inner.disputes.contains_key(intent_id) {
            return Err(DisputeError::AlreadyDisputed);
        }
        inner.disputes.insert(intent_id.to_owned(), dispute.clone());
        Ok(dispute)
    }

    pub fn order_summary(&self, order_id: &str) -> OrderSummary {
        let intents = self.search_metadata("order_id", order_id);
        let inner = self.lock();
        let ids: Vec<&str> = intents.iter().map(|i| i.id.as_str()).collect();
        let refunds = inner
            .refunds
            .values()
            .filter(|r| ids.contains(&r.payment_intent.as_str()))
            .count();
        let disputes = ids
            .iter()
            .filter(|id| inner.disputes.contains_key(**id))
            .count();
        OrderSummary {
            order_id: order_id.to_owned(),
            disputes,
            charges: intents.iter().filter(|i| i.status == "succeeded").count(),
            declines: intents.iter().filter(|i| i.declined()).count(),
            refunds,
            amount_charged: intents
                .iter()
                .filter(|i| i.status == "succeeded")
                .map(|i| i.amount)
                .sum(),
            amount_refunded: intents.iter().map(|i| i.amount_refunded).sum(),
            intents,
        }
    }

    /// Totals over everything (for `GET /_sandbox/stats`).
    pub fn stats(&self) -> Value {
        let inner = self.lock();
        let charges = inner
            .intents
            .values()
            .filter(|i| i.status == "succeeded")
            .count();
        let declines = inner.intents.values().filter(|i| i.declined()).count();
        serde_json::json!({
            "intents": inner.intents.len(),
            "charges": charges,
            "declines": declines,
            "refunds": inner.refunds.len(),
            "disputes": inner.disputes.len(),
            "idempotency_keys": inner.idem.len(),
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RefundError {
    #[error("no such payment intent")]
    NoSuchIntent,
    #[error("the payment intent has not been charged")]
    NotCharged,
    #[error("the charge has already been refunded")]
    AlreadyRefunded,
    #[error("refund amount exceeds the charge")]
    TooMuch,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DisputeError {
    #[error("no such payment intent")]
    NoSuchIntent,
    #[error("the payment intent has not been charged")]
    NotCharged,
    #[error("the charge is already disputed")]
    AlreadyDisputed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_states() {
        let s = Store::default();
        assert!(matches!(s.idem_begin("k", "create", "a"), IdemBegin::Run));
        assert!(matches!(
            s.idem_begin("k", "create", "a"),
            IdemBegin::InFlight
        ));
        assert!(matches!(
            s.idem_begin("k", "create", "b"),
            IdemBegin::Mismatch
        ));
        s.idem_finish("k", 200, &serde_json::json!({"id": "pi_1"}));
        assert!(matches!(
            s.idem_begin("k", "create", "a"),
            IdemBegin::Replay { status: 200, .. }
        ));
        assert!(matches!(
            s.idem_begin("k", "refund", "a"),
            IdemBegin::Mismatch
        ));
        s.idem_forget("k");
        assert!(matches!(s.idem_begin("k", "create", "b"), IdemBegin::Run));
    }
}
