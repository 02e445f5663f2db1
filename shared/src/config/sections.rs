//! The settings sections more than one process reads: Postgres, Redis, admission-token keys,
//! login-token verification and logging.

use super::{DEV_IDENTITY_KEY, DEV_TOKEN_KEY};
use secrecy::SecretString;
use serde::Deserialize;

/// Postgres connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before answering `503`.
    pub acquire_timeout_ms: u64,
    /// Postgres cancels any of booking's statements that runs (or waits for a lock) longer
    /// than this (`statement_timeout`; 0: no limit). A runaway statement would otherwise hold
    /// its row locks and a connection until it ends, stalling every order of a hot row behind
    /// it; cancelled, its transaction rolls back and the request gets `503` (retry shortly).
    /// Migrations run without it.
    pub statement_timeout_ms: u64,
    /// Postgres ends a session whose transaction stays open and idle longer than this
    /// (`idle_in_transaction_session_timeout`; 0: no limit): a transaction left open (a
    /// stuck task, a bug) would keep its locks, and every hold or order on those rows would
    /// wait for it. Ended, the transaction rolls back.
    pub idle_in_transaction_timeout_ms: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: SecretString::from("postgres://postgres@127.0.0.1:55432/floodgate"),
            max_connections: 32,
            acquire_timeout_ms: 3000,
            statement_timeout_ms: 30_000,
            idle_in_transaction_timeout_ms: 60_000,
        }
    }
}

/// Whether the waiting room's Redis is one server or a Redis Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    #[default]
    Standalone,
    Cluster,
}

/// Redis connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSettings {
    /// One server (`redis://` or `rediss://`); in cluster mode the waiting room's seed nodes,
    /// comma-separated, unless `queue_url` names them.
    pub url: SecretString,
    /// The waiting room's server kind: `standalone` or `cluster` (Redis Cluster; applies to
    /// `queue_url`, or to `url` when that is unset). Booking's own Redis (bids, carts, outbox)
    /// is always a single server.
    pub mode: RedisMode,
    /// The waiting room's Redis (queue, places, admissions, revocations) when it is a server
    /// of its own: it can run `appendfsync everysec` (joins at the arrival peak must not wait
    /// for a disk flush each; a crash is made whole from the fans' place receipts), while
    /// `url` (bids, carts, outbox) keeps `always`. Unset: the same server as `url`.
    pub queue_url: Option<SecretString>,
    /// Prepended to every key this deployment writes; lets tests share one Redis.
    pub key_prefix: String,
    /// Per-command timeout: a stalled Redis must fail fast, not hang requests.
    pub response_timeout_ms: u64,
}

impl RedisSettings {
    /// The settings for the waiting room's keys: `queue_url` when set, else `url`.
    pub fn queue(&self) -> RedisSettings {
        RedisSettings {
            url: self.queue_url.clone().unwrap_or_else(|| self.url.clone()),
            queue_url: None,
            ..self.clone()
        }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: SecretString::from("redis://127.0.0.1:56379"),
            queue_url: None,
            mode: RedisMode::Standalone,
            key_prefix: String::new(),
            response_timeout_ms: 1000,
        }
    }
}

/// One admission-token signing key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySettings {
    pub kid: String,
    /// HS256 secret; at least 32 bytes.
    pub secret: SecretString,
}

/// Admission-token settings, shared by the gateway (mints and verifies) and booking (verifies).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenSettings {
    /// The `kid` new tokens are signed with. Every other key listed still verifies, so a key
    /// is rotated by adding the new one, switching `current_kid`, and removing the old one
    /// after the longest TTL has passed.
    pub current_kid: String,
    pub keys: Vec<KeySettings>,
    pub issuer: String,
    pub audience: String,
    pub default_ttl_s: u64,
    /// Clock skew tolerated when checking `exp`/`iat`, in seconds.
    pub leeway_s: u64,
}

impl Default for TokenSettings {
    fn default() -> Self {
        Self {
            current_kid: "dev-1".into(),
            keys: vec![KeySettings {
                kid: "dev-1".into(),
                secret: SecretString::from(DEV_TOKEN_KEY),
            }],
            issuer: "floodgate-gateway".into(),
            audience: "floodgate".into(),
            default_ttl_s: 600,
            leeway_s: 5,
        }
    }
}

/// How fans' login (identity) tokens are verified.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentitySettings {
    /// `HS256`, `RS256` or `EdDSA`.
    pub algorithm: String,
    /// HS256: the shared secret. RS256/EdDSA: the PEM public key.
    pub key: SecretString,
    pub issuer: String,
    /// The `aud` login tokens must carry (default `floodgate`). A token without it, or for
    /// another audience, is refused unless `verify_audience = false`.
    pub audience: Option<String>,
    /// Set to `false` only for a login service that cannot put an `aud` in its tokens: then
    /// any token of the issuer is accepted, whatever it was meant for.
    pub verify_audience: bool,
    /// Serve `POST /dev/login` (local stack only). Never enable in production.
    pub dev_login: bool,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            algorithm: "HS256".into(),
            key: SecretString::from(DEV_IDENTITY_KEY),
            issuer: "floodgate-dev-login".into(),
            audience: Some("floodgate".into()),
            verify_audience: true,
            dev_login: false,
        }
    }
}

/// Log output settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `json` (production) or `pretty` (local).
    pub format: String,
    /// An `EnvFilter` directive, e.g. `info,booking=debug`.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: "pretty".into(),
            level: "info".into(),
        }
    }
}
