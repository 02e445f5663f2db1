//! Booking's configuration: the common sections from `shared::config` plus `[booking]` and
//! the domains' sections. Unknown keys in any of them are errors, and outside dev mode the
//! signing keys, the admin secret, the provider key, the webhook secrets, the identity key and
//! the `[tickets]` keys and secrets must be set, and
//! not to built-in values ([`shared::config::ProcessConfig`]).

use secrecy::SecretString;
use serde::Deserialize;
use shared::config::{
    DatabaseSettings, DevSettings, IdentitySettings, LogSettings, ProcessConfig, RedisSettings,
    Secret, TokenSettings,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct BookingConfig {
    /// Admin bearer secret for `/admin/*`. Empty (dev mode only) disables the admin API.
    pub admin_token: SecretString,
    /// `[dev]`: built-in secrets allowed (local stack, tests).
    pub dev: DevSettings,
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub tokens: TokenSettings,
    pub identity: IdentitySettings,
    pub log: LogSettings,
    pub booking: BookingSettings,
    /// `[auctions]`: bid rate limit, closer, hot-bid consumer, live prices.
    pub auctions: crate::auctions::AuctionSettings,
    /// `[idempotency]`: Idempotency-Key retention and stale-claim takeover.
    pub idempotency: crate::platform::idempotency::IdempotencySettings,
    /// `[orders]`: carts, orders, expiry, flash-sale gate.
    pub orders: crate::orders::OrderSettings,
    /// `[payments]`: provider URL and key, webhook secrets, timeouts, reconciliation.
    pub payments: crate::payments::PaymentSettings,
    /// `[outbox]`: relay batches and leases, stream trimming, the ticket-delivery consumer.
    pub outbox: crate::outbox::OutboxSettings,
    /// `[tickets]`: ticket-code signing keys, the holder-handle and door secrets.
    pub tickets: crate::tickets::TicketSettings,
    /// `[mail]`: SMTP for ticket e-mail (off without `smtp_url`).
    pub mail: crate::tickets::mail::MailSettings,
}

impl Default for BookingConfig {
    fn default() -> Self {
        Self {
            admin_token: SecretString::from(""),
            dev: DevSettings::default(),
            database: DatabaseSettings::default(),
            redis: RedisSettings::default(),
            tokens: TokenSettings::default(),
            identity: IdentitySettings::default(),
            log: LogSettings::default(),
            booking: BookingSettings::default(),
            auctions: Default::default(),
            idempotency: Default::default(),
            orders: Default::default(),
            payments: Default::default(),
            outbox: Default::default(),
            tickets: Default::default(),
            mail: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BookingSettings {
    /// Listen address; port 0 picks a free port (tests).
    pub listen: String,
    /// Largest accepted request body.
    pub body_limit_bytes: usize,
    /// Run background jobs (sweeper, expiry, relays) in this process. Tests turn it off and
    /// call the jobs directly.
    pub jobs_enabled: bool,
    /// How often the hold sweeper runs.
    pub sweeper_interval_ms: u64,
    /// Rows per sweeper batch.
    pub sweeper_batch: i64,
    /// Largest number of seats one hold request may name.
    pub max_seats_per_hold: usize,
    /// Use `synchronous_commit = off` for hold transactions (holds move no money; a crash can
    /// lose the last few milliseconds of holds, never a sale). See docs/decisions.md.
    pub async_commit_holds: bool,
    /// Most explicit seat holds of one event that go in one statement when they arrive while
    /// earlier ones are in Postgres (group commit, `holds/grouped.rs`); below 2, every hold
    /// runs on its own.
    pub hold_batch_max: u32,
    /// Statements of batched seat holds one event may have running at once.
    pub hold_batch_concurrency: u32,
    /// Longest a cached seat map is served without re-reading it (seconds; also the JSON
    /// map's `Cache-Control: max-age`). Bounds how late changes made elsewhere show; this
    /// process's holds and releases show at once. 0 re-reads for every request.
    pub seat_map_cache_s: u64,
    /// How long a stop waits for the background jobs' running work after in-flight requests
    /// are done; a job still running then is cut off (its work is leased in Postgres and
    /// redone, as after a crash).
    pub jobs_stop_grace_ms: u64,
    /// Longest time a request may take before booking answers `503` (a stuck dependency
    /// must not hold a fan's phone on a spinner). Dependency timeouts are shorter.
    pub request_timeout_ms: u64,
    /// Failed admin credential checks one client address may make per minute; past it, every
    /// admin call from that address is refused (`429`) until the minute is over. 0: no limit.
    pub admin_auth_failures_per_ip_per_min: u32,
}

impl Default for BookingSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8090".into(),
            body_limit_bytes: 64 * 1024,
            jobs_enabled: true,
            sweeper_interval_ms: 2000,
            sweeper_batch: 500,
            max_seats_per_hold: 10,
            async_commit_holds: true,
            hold_batch_max: 32,
            hold_batch_concurrency: 2,
            seat_map_cache_s: 1,
            request_timeout_ms: 30_000,
            jobs_stop_grace_ms: 10_000,
            admin_auth_failures_per_ip_per_min: 20,
        }
    }
}

impl ProcessConfig for BookingConfig {
    fn dev(&self) -> &DevSettings {
        &self.dev
    }

    fn secrets(&self) -> Vec<Secret<'_>> {
        vec![
            Secret {
                key: "tokens.keys",
                values: self.tokens.keys.iter().map(|k| &k.secret).collect(),
            },
            Secret {
                key: "admin_token",
                values: vec![&self.admin_token],
            },
            Secret {
                key: "payments.api_key",
                values: vec![&self.payments.api_key],
            },
            Secret {
                key: "payments.webhook_secrets",
                values: self.payments.webhook_secrets.iter().collect(),
            },
            // Booking verifies login tokens for a fan's own tickets (class `identity`).
            Secret {
                key: "identity.key",
                values: vec![&self.identity.key],
            },
            Secret {
                key: "tickets.signing_keys",
                values: self
                    .tickets
                    .signing_keys
                    .iter()
                    .map(|k| &k.secret)
                    .collect(),
            },
            Secret {
                key: "tickets.handle_secret",
                values: vec![&self.tickets.handle_secret],
            },
            Secret {
                key: "tickets.door_secret",
                values: vec![&self.tickets.door_secret],
            },
        ]
    }
}
