//! `[sandbox]` settings. Everything that shapes the sandbox's behaviour (latency, fault and
//! decline rates, webhook delivery) can also be changed at run time through
//! [`crate::Sandbox::update`], so one in-process sandbox serves many test scenarios.

use secrecy::SecretString;
use serde::Deserialize;
use shared::config::{DevSettings, LogSettings, ProcessConfig, Secret};

/// The whole file as the sandbox reads it (other sections are left to their processes).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    pub sandbox: SandboxSettings,
    pub log: LogSettings,
    /// `[dev]`: the built-in API key and webhook secret allowed (local stack, tests).
    pub dev: DevSettings,
}

/// Outside dev mode the sandbox, too, refuses the keys that are public in this repository:
/// whoever knows the webhook secret can forge payments to the booking it signs for.
impl ProcessConfig for SandboxConfig {
    fn dev(&self) -> &DevSettings {
        &self.dev
    }

    fn secrets(&self) -> Vec<Secret<'_>> {
        vec![
            Secret {
                key: "sandbox.api_key",
                values: vec![&self.sandbox.api_key],
            },
            Secret {
                key: "sandbox.webhook_secret",
                values: vec![&self.sandbox.webhook_secret],
            },
        ]
    }
}

/// How webhooks leave the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookMode {
    /// After the API response, in the background, retried with backoff (what real providers do).
    Async,
    /// One delivery attempt is made (and awaited) *before* the API response is sent, so the
    /// merchant sees the webhook first; failed attempts are then retried in the background.
    BeforeResponse,
    /// Queued until `POST /_sandbox/webhooks/flush` (tests control order and duplication).
    Manual,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// Listen address; port 0 picks a free port (tests).
    pub listen: String,
    /// The secret API key merchants send as `Authorization: Bearer`.
    pub api_key: SecretString,
    /// Where signed webhooks are POSTed (booking's `/webhooks/payments`).
    pub webhook_url: String,
    /// Signing secret for the `Stripe-Signature` header.
    pub webhook_secret: SecretString,
    /// Added to every API call (before it acts), plus up to `latency_jitter_ms` at random.
    /// Charges and refunds run to completion even when the client gives up meanwhile, as at
    /// a real provider: a latency above the merchant's timeout is a charge it never hears of.
    pub latency_ms: u64,
    pub latency_jitter_ms: u64,
    /// Share of create/refund calls answered `500` *before* anything happens (nothing is
    /// stored, so a retry with the same idempotency key runs afresh).
    pub failure_rate: f64,
    /// Share of payments with an otherwise good card that are declined anyway.
    pub decline_rate: f64,
    /// Share of payments that succeed but whose response is held back `timeout_delay_ms`
    /// (the merchant's client times out although the customer was charged). The test card
    /// `pm_card_sandbox_timeout` always behaves this way.
    pub timeout_rate: f64,
    pub timeout_delay_ms: u64,
    /// Search lag: `GET /v1/payment_intents/search` leaves out intents younger than this.
    /// Stripe's search index trails writes (under a minute normally, up to an hour during
    /// incidents), so a merchant must never read "not found by search" as "never charged".
    pub search_lag_s: u64,
    pub webhooks_enabled: bool,
    pub webhook_mode: WebhookMode,
    /// Delay before the first delivery attempt in `async` mode.
    pub webhook_delay_ms: u64,
    /// Extra random delay (0..=this) per delivery, so events can arrive out of order.
    pub webhook_reorder_ms: u64,
    /// Share of events delivered twice.
    pub webhook_duplicate_rate: f64,
    /// Attempts per event before giving up, and the backoff between them (doubling, capped).
    pub webhook_max_attempts: u32,
    pub webhook_backoff_ms: u64,
    pub webhook_backoff_max_ms: u64,
    /// Timeout of one delivery attempt.
    pub webhook_timeout_ms: u64,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8099".into(),
            api_key: SecretString::from(shared::config::DEV_PROVIDER_KEY),
            webhook_url: "http://127.0.0.1:8090/webhooks/payments".into(),
            webhook_secret: SecretString::from(shared::config::DEV_WEBHOOK_SECRET),
            latency_ms: 0,
            latency_jitter_ms: 0,
            failure_rate: 0.0,
            decline_rate: 0.0,
            timeout_rate: 0.0,
            timeout_delay_ms: 30_000,
            search_lag_s: 0,
            webhooks_enabled: true,
            webhook_mode: WebhookMode::Async,
            webhook_delay_ms: 0,
            webhook_reorder_ms: 0,
            webhook_duplicate_rate: 0.0,
            webhook_max_attempts: 8,
            webhook_backoff_ms: 500,
            webhook_backoff_max_ms: 60_000,
            webhook_timeout_ms: 5_000,
        }
    }
}

impl SandboxSettings {
    /// Refuses rates outside `0..=1` and other nonsense at start-up rather than misbehaving.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, rate) in [
            ("failure_rate", self.failure_rate),
            ("decline_rate", self.decline_rate),
            ("timeout_rate", self.timeout_rate),
            ("webhook_duplicate_rate", self.webhook_duplicate_rate),
        ] {
            anyhow::ensure!(
                (0.0..=1.0).contains(&rate),
                "[sandbox] {name} must be between 0 and 1, got {rate}"
            );
        }
        anyhow::ensure!(
            self.webhook_max_attempts >= 1,
            "[sandbox] webhook_max_attempts must be at least 1"
        );
        Ok(())
    }
}
