//! Whether a provider success belongs to its attempt (issue 41): metadata names the attempt,
//! but only the attempt's own intent, amount and currency pay it.

use crate::payments::provider::ProviderPayment;

/// True when the provider payment `p` carries attempt `payment_id` (or attempt number
/// `attempt` of the same order) in its metadata.
pub fn is_attempt_of(p: &ProviderPayment, payment_id: &str, attempt: i32) -> bool {
    let attempt = attempt.to_string();
    p.meta("payment_id") == Some(payment_id) || p.meta("attempt") == Some(attempt.as_str())
}

/// A provider success as every success path compares it with its attempt: the intent that
/// took the money, how much and in which currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub intent_id: String,
    pub amount: i64,
    pub currency: String,
}

impl Charge {
    pub fn of(p: &ProviderPayment) -> Self {
        Self {
            intent_id: p.id.clone(),
            amount: p.amount,
            currency: p.currency.clone(),
        }
    }
}

/// A success pays attempt (`amount`, `currency`, `recorded` intent id) only if it is the
/// attempt's own intent (or none is recorded yet) for exactly its amount and currency;
/// metadata alone proves nothing (anyone holding the API key can write any metadata).
pub fn charge_matches(amount: i64, currency: &str, recorded: Option<&str>, c: &Charge) -> bool {
    amount == c.amount
        && currency.eq_ignore_ascii_case(&c.currency)
        && recorded.is_none_or(|r| r == c.intent_id)
}

/// What applying a provider success did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Success {
    /// This transaction moved the order to `PAID` (tickets issued, `order.paid` written).
    Paid { order_id: String, tickets: usize },
    /// The order was already paid by this very payment (the other path won): nothing to do.
    AlreadyPaid,
    /// Money was taken for an order that cannot take it: refund it after the commit.
    RefundNeeded {
        payment_id: String,
        provider_payment_id: String,
    },
    /// Not one of our payments.
    Unknown,
    /// Names an attempt of ours but is not its own intent, amount or currency: it pays
    /// nothing, and its money is refunded (refund key [`mismatch_refund_key`]).
    Mismatch { intent_id: String },
}

/// The provider idempotency key of the refund of a success that did not match its attempt.
pub fn mismatch_refund_key(intent_id: &str) -> String {
    format!("refund-mismatch-{intent_id}")
}
