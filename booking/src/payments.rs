//! Payments: taking an order from `PENDING_PAYMENT` to `PAID` without ever charging twice,
//! selling a seat twice or resurrecting an expired order (DESIGN.md section 6).
//!
//! - [`provider`]: the [`provider::PaymentProvider`] trait the rest of booking talks to;
//!   [`stripe`] is the shipped adapter (a Stripe-style HTTP API with `Idempotency-Key`).
//! - [`flow`]: `POST /api/orders/{id}/pay` (handler in [`http`]). Each attempt is recorded
//!   (with its provider idempotency key `<order>-<attempt>`) *before* the provider is called,
//!   the call happens outside any transaction, and the outcome is applied by
//!   [`transitions::apply_success_tx`] — the one conditional transition
//!   (`WHERE status = 'PENDING_PAYMENT'`) that the webhook and the reconciliation job use
//!   too, so whichever arrives first wins and the others are no-ops.
//! - [`reconcile`]: asks the provider about attempts nobody heard back about — by the
//!   attempt's own idempotency key, never trusting a search that may lag — and retries
//!   pending refunds. An attempt whose outcome is unknown stays `pending`, and while it does
//!   no other attempt of its order can start (one pending attempt per order).
//! - [`reversal`]: refunds and disputes made on the provider's side (`charge.refunded`,
//!   `charge.dispute.created`) reverse a paid order once: `REFUNDED`/`DISPUTED`, tickets
//!   voided, stock back on sale or held back per the event's `refund_stock`.
//! - [`webhooks`]: the provider's signed events, applied once each.
//! - Layers: [`model`] (attempt statuses, pure rules), [`repo`] and [`transitions`] (SQL,
//!   returning [`PaymentError`]), [`http`] (handlers; the only place a [`PaymentError`]
//!   becomes an `ApiError`).
//!
//! Money that arrives for an order that can no longer be fulfilled (expired, cancelled, hold
//! lost, already paid by another attempt) is refunded with an idempotency key derived from the
//! payment id, exactly once, and announced as `order.refunded`.

pub mod error;
pub mod flow;
pub mod http;
pub mod model;
pub mod ops;
pub mod provider;
pub mod reconcile;
pub mod repo;
pub mod reversal;
pub mod stripe;
pub mod transitions;
pub mod webhooks;

use crate::platform::auth::Auth;
use crate::platform::idempotency::Idempotency;
use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use axum::extract::FromRef;
use provider::PaymentProvider;
use secrecy::SecretString;
use serde::Deserialize;
use sqlx::PgPool;
use std::sync::Arc;

pub use error::PaymentError;
pub use http::router;

/// Everything the payments domain's handlers and jobs use; the app layer builds it and
/// handlers take it with `State<PaymentsState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct PaymentsState {
    pub pool: PgPool,
    /// The flash gates a provider-side refund gives stock back to.
    pub redis: Redis,
    pub auth: Auth,
    /// `Idempotency-Key`s of pay requests.
    pub idempotency: Idempotency,
    /// The payment provider (the Stripe-style HTTP adapter).
    pub provider: Arc<dyn PaymentProvider>,
    pub settings: Arc<PaymentSettings>,
    pub metrics: PaymentMetrics,
    /// `[orders] ttl_s`: with `pay_grace_s`, how long after its creation an order's
    /// inventory may stay reserved by pay calls.
    pub order_ttl_s: u64,
}

impl FromRef<PaymentsState> for Auth {
    fn from_ref(state: &PaymentsState) -> Self {
        state.auth.clone()
    }
}

impl PaymentsState {
    /// What the money-moving paths use (the pay flow, refunds, reconciliation).
    pub fn clients(&self) -> PaymentClients {
        PaymentClients {
            pool: self.pool.clone(),
            provider: self.provider.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            order_ttl_s: self.order_ttl_s,
        }
    }
}

/// The clients every path that moves money uses: the database, the provider, the
/// `[payments]` settings and the counters. Cheap to clone.
#[derive(Clone)]
pub struct PaymentClients {
    pub pool: PgPool,
    pub provider: Arc<dyn PaymentProvider>,
    pub settings: Arc<PaymentSettings>,
    pub metrics: PaymentMetrics,
    /// `[orders] ttl_s` (see [`PaymentClients::reserve_bound_s`]).
    pub order_ttl_s: u64,
}

impl PaymentClients {
    /// Seconds after an order's `created_at` past which no pay call reserves its inventory:
    /// `[orders] ttl_s + [payments] pay_grace_s`.
    pub fn reserve_bound_s(&self) -> f64 {
        (self.order_ttl_s + self.settings.pay_grace_s) as f64
    }
}

/// The background jobs of payments: reconciliation and the ops refunds (event cancellation),
/// both safe on any number of instances.
pub fn jobs(state: &PaymentsState) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(reconcile::Reconcile(state.clients())),
        Arc::new(ops::event_cancel::RefundJob::new(state)),
    ]
}

/// `[payments]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaymentSettings {
    /// Base URL of the Stripe-style provider (the sandbox locally).
    pub provider_url: String,
    /// Secret API key sent as `Authorization: Bearer`.
    pub api_key: SecretString,
    /// Secrets that verify `Stripe-Signature` on webhooks. Several during rotation: add the
    /// new one, switch the provider, remove the old one once its retries are over.
    pub webhook_secrets: Vec<SecretString>,
    /// Webhook timestamps further than this from our clock are refused (replay protection).
    pub webhook_tolerance_s: u64,
    pub connect_timeout_ms: u64,
    /// Whole-request timeout of a provider call. A timeout leaves the attempt pending; the
    /// retry (or reconciliation) reuses its key.
    pub request_timeout_ms: u64,
    /// How long the provider's `409 idempotency_key_in_use` (a concurrent request with the
    /// same key) is waited out before answering the client `409 PAYMENT_IN_PROGRESS`.
    pub in_progress_wait_ms: u64,
    /// `pay` pins the hold and the order this far into the future (never shortens them), so
    /// neither can expire under a running payment. Must exceed `request_timeout_ms`.
    pub pay_pin_s: u64,
    /// ...but never past the order's `created_at + [orders] ttl_s + pay_grace_s`, however
    /// many pay calls: a fan looping pay (an unauthenticated 3-D Secure card) cannot keep
    /// inventory off sale.
    pub pay_grace_s: u64,
    /// Payment attempts one order may have; then `409 PAYMENT_ATTEMPTS_EXHAUSTED`.
    pub max_attempts: u32,
    /// An attempt nobody heard back about is reconciled this long after it started.
    pub reconcile_after_s: u64,
    /// How long after an attempt started the provider's search is trusted to list it
    /// (Stripe's search trails writes: under a minute normally, up to an hour during
    /// incidents). Only then may an attempt that neither search, a webhook nor its own
    /// idempotency key has shown be closed as never charged.
    pub search_horizon_s: u64,
    pub reconcile_interval_ms: u64,
    pub reconcile_batch: i64,
}

impl Default for PaymentSettings {
    fn default() -> Self {
        Self {
            provider_url: "http://127.0.0.1:8099".into(),
            api_key: SecretString::from(shared::config::DEV_PROVIDER_KEY),
            webhook_secrets: vec![SecretString::from(shared::config::DEV_WEBHOOK_SECRET)],
            webhook_tolerance_s: 300,
            connect_timeout_ms: 1_000,
            request_timeout_ms: 10_000,
            in_progress_wait_ms: 5_000,
            pay_pin_s: 120,
            pay_grace_s: 120,
            max_attempts: 5,
            reconcile_after_s: 60,
            search_horizon_s: 3_600,
            reconcile_interval_ms: 15_000,
            reconcile_batch: 100,
        }
    }
}

/// Payment and webhook metrics, registered on the app's registry.
#[derive(Clone)]
pub struct PaymentMetrics {
    /// Pay attempts by outcome (`paid`, `declined`, `timeout`, `provider_error`, ...).
    pub attempts: prometheus::IntCounterVec,
    /// Provider webhooks by result (`applied`, `duplicate`, `bad_signature`, `ignored`).
    pub webhooks: prometheus::IntCounterVec,
    /// Refunds issued for payments that could not be honoured.
    pub refunds: prometheus::IntCounter,
    /// Paid orders reversed by a provider-side refund or dispute, by resulting status.
    pub reversals: prometheus::IntCounterVec,
    /// Attempts the reconciliation job resolved, by outcome.
    pub reconciled: prometheus::IntCounterVec,
    /// Successes that named an attempt of ours but were not its own intent, amount or
    /// currency, by the path that saw them (`pay`, `webhook`, `reversal`) and what became
    /// of their money (`refunded`, `refund_failed`).
    pub mismatches: prometheus::IntCounterVec,
}

impl PaymentMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        use prometheus::{IntCounter, IntCounterVec, Opts};
        let m = Self {
            attempts: IntCounterVec::new(
                Opts::new("payment_attempts_total", "Pay requests by outcome"),
                &["outcome"],
            )?,
            webhooks: IntCounterVec::new(
                Opts::new("payment_webhooks_total", "Provider webhooks by result"),
                &["result"],
            )?,
            refunds: IntCounter::new("payment_refunds_total", "Refunds issued")?,
            reversals: IntCounterVec::new(
                Opts::new(
                    "payment_reversals_total",
                    "Paid orders reversed by a provider-side refund or dispute",
                ),
                &["status"],
            )?,
            reconciled: IntCounterVec::new(
                Opts::new(
                    "payment_reconciled_total",
                    "Attempts resolved by reconciliation",
                ),
                &["outcome"],
            )?,
            mismatches: IntCounterVec::new(
                Opts::new(
                    "payment_mismatches_total",
                    "Successes refused because they were not their attempt's own intent, amount or currency",
                ),
                &["path", "result"],
            )?,
        };
        registry.register(Box::new(m.mismatches.clone()))?;
        registry.register(Box::new(m.attempts.clone()))?;
        registry.register(Box::new(m.webhooks.clone()))?;
        registry.register(Box::new(m.refunds.clone()))?;
        registry.register(Box::new(m.reversals.clone()))?;
        registry.register(Box::new(m.reconciled.clone()))?;
        // Exported at 0 from startup (the dashboard's paid/min reads `paid`).
        for outcome in ["paid", "already_paid", "refunded", "declined"] {
            m.attempts.with_label_values(&[outcome]);
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::PaymentSettings;
    use secrecy::ExposeSecret;

    /// The `[payments]` section as booking's config holds it.
    #[derive(serde::Deserialize)]
    struct Root {
        #[serde(default)]
        payments: PaymentSettings,
    }

    /// The local stack passes the webhook secrets as a TOML array in one variable.
    #[test]
    fn stack_environment_configures_payments() {
        let env = vec![
            (
                "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS".to_owned(),
                r#"["whsec_new","whsec_old"]"#.to_owned(),
            ),
            (
                "FLOODGATE_PAYMENTS__PROVIDER_URL".to_owned(),
                "http://127.0.0.1:18099".to_owned(),
            ),
            ("FLOODGATE_PAYMENTS__PAY_PIN_S".to_owned(), "90".to_owned()),
        ];
        let c: Root = shared::config::load(None, env).unwrap();
        let secrets: Vec<&str> = c
            .payments
            .webhook_secrets
            .iter()
            .map(|s| s.expose_secret())
            .collect();
        assert_eq!(secrets, ["whsec_new", "whsec_old"]);
        assert_eq!(c.payments.provider_url, "http://127.0.0.1:18099");
        assert_eq!(c.payments.pay_pin_s, 90);
        assert_eq!(c.payments.webhook_tolerance_s, 300);
    }

    #[test]
    fn unknown_payment_keys_are_refused() {
        let env = vec![("FLOODGATE_PAYMENTS__PAY_PIN".to_owned(), "90".to_owned())];
        assert!(shared::config::load::<Root>(None, env).is_err());
    }
}
