//! Gateway configuration: the shared TOML file plus `FLOODGATE_*` overrides (see
//! `shared::config`). The gateway reads `[tokens]`, `[identity]`, `[redis]`, `[log]`,
//! `[dev]`, `admin_token`, its own `[gateway]` section and `[booking] body_limit_bytes` (the
//! body limit it enforces for booking, see `size.rs`); other sections are left to the
//! processes that read them (a key inside any section it reads that it does not know, or an
//! unknown section, is an error: `shared::config`; `[booking]` is read only in part, so its
//! other keys are booking's to check).
//!
//! Every value has a default so `deploy/local.toml` only lists what differs, and tests build
//! [`GatewayConfig`] directly (no environment variables). Outside dev mode the signing keys,
//! the identity key and the admin secret must be set, and not to built-in values
//! ([`shared::config::ProcessConfig`]).

use secrecy::SecretString;
use serde::Deserialize;
use shared::config::{
    DevSettings, IdentitySettings, LogSettings, ProcessConfig, RedisSettings, Secret, TokenSettings,
};

/// Everything the gateway process needs.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct GatewayConfig {
    pub gateway: GatewaySettings,
    pub tokens: TokenSettings,
    pub identity: IdentitySettings,
    pub redis: RedisSettings,
    pub log: LogSettings,
    /// The one booking setting the gateway must agree with.
    pub booking: BookingView,
    /// The bootstrap admin secret (`FLOODGATE_ADMIN_TOKEN`; role admin, actor `bootstrap`).
    /// Unset (dev mode only): it matches nothing, and only operator credentials are accepted.
    pub admin_token: Option<SecretString>,
    /// `[dev]`: built-in secrets and dev login allowed (local stack, tests).
    pub dev: DevSettings,
}

/// The `[gateway]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySettings {
    /// Public listener: waiting room, static pages, proxied API.
    pub listen: String,
    /// Admin listener (ops config, revocation). Kept off the public port on purpose.
    pub admin_listen: String,
    /// Booking upstreams (`host:port`), health-checked, round-robin.
    pub upstreams: Vec<String>,
    /// Directory with the waiting page and storefront files.
    pub static_dir: String,
    /// Base URL the fan's ticket page (and the shop's ticket step) reads tickets from
    /// (`https://booking.example`), put into the pages at start-up. Empty: the page's own
    /// origin, for when the gateway's route table or a proxy in front routes `/api/tickets`
    /// to booking. Until then it is booking's listener, which answers these reads
    /// cross-origin (docs/operations.md, "The ticket page").
    pub tickets_api_url: String,
    /// Local development: serves `POST /dev/login` (as does `identity.dev_login`).
    pub dev_mode: bool,
    /// Worker threads of the public listener.
    pub threads: usize,
    /// Tokio work stealing. On by default: with several single-thread runtimes in one process
    /// pingora hands pooled upstream connections between threads, which measured slower and
    /// reopened connections ("failed to acquire reusable stream"). For peak proxying run N
    /// processes × `threads = 1` with `reuse_port` instead (docs/gateway.md).
    pub work_stealing: bool,
    /// Bind the public listener with `SO_REUSEPORT`, so several gateway processes (each with
    /// `threads = 1`, like nginx workers) can share the port; each needs its own admin port.
    pub reuse_port: bool,
    /// Seconds a graceful shutdown (SIGTERM) keeps serving in-flight requests.
    pub grace_period_s: u64,
    /// Admission tick interval. Each tick admits at most one batch.
    pub tick_ms: u64,
    /// Admission lease TTL: how fast another instance takes over when the holder dies.
    pub lease_ttl_ms: u64,
    /// How often live config, sold-out flags and revocations are re-read from Redis.
    pub refresh_ms: u64,
    /// Upstream health-check interval.
    pub health_check_ms: u64,
    /// Timeout for connecting to an upstream.
    pub upstream_connect_timeout_ms: u64,
    /// Timeout for reading an upstream response.
    pub upstream_read_timeout_ms: u64,
    /// Admitted API calls reach booking through the gateway's own HTTP/1.1 upstream leg
    /// (`forward.rs`) instead of pingora-proxy's loop (docs/decisions.md). `false` sends
    /// everything through pingora-proxy.
    pub fast_forward: bool,
    /// Defaults applied to fields an event config PUT leaves out.
    pub default_claim_deadline_s: u64,
    pub limits: RateLimits,
    /// Largest request body the gateway itself accepts (join, admin PUT); 413 above.
    pub max_body_bytes: usize,
    /// Largest account list one `PUT /admin/events/{event}/registrations` accepts (the admin
    /// listener's only large body; 64 MiB holds a million ids of up to 60 characters).
    pub registrations_max_body_bytes: usize,
    /// Largest request line plus header block accepted on the public listener; `431` above.
    pub max_header_bytes: usize,
    /// Largest body `POST /webhooks/payments` accepts; `413` above, booking not contacted. A
    /// provider's event is a few KiB; the gateway never lets through more than booking's own
    /// limit (`[booking] body_limit_bytes`), whichever is smaller.
    pub webhook_max_body_bytes: usize,
    /// Sliding window (seconds) over which upstream latency and errors are measured for
    /// auto mode.
    pub auto_window_s: u64,
    /// Largest number of fans one tick may admit in passthrough mode (drains the queue).
    pub passthrough_batch: u64,
    /// Load balancers / CDNs in front of the gateway (CIDRs or addresses): only from these is
    /// `X-Forwarded-For` believed for per-IP limits. Empty: the connecting address counts.
    pub trusted_proxies: Vec<String>,
    /// Verified login tokens remembered per instance (a waiting fan's repeat polls then skip
    /// the RS256/EdDSA signature check); about 100 bytes each; 0 disables.
    pub identity_cache_entries: usize,
    /// Also serve `GET /metrics` on the public listener (it is always on the admin one).
    pub public_metrics: bool,
    /// Seconds a checkout refresh keeps the admission past the end of the fan's last hold or
    /// pending order (covers a fan paying in its last moments and clock skew); a token is
    /// re-minted only when this moves its expiry by more than half of it.
    pub session_slack_s: u64,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_listen: "127.0.0.1:8081".into(),
            upstreams: vec!["127.0.0.1:8090".into()],
            static_dir: "static".into(),
            tickets_api_url: String::new(),
            dev_mode: false,
            threads: 2,
            work_stealing: true,
            reuse_port: false,
            grace_period_s: 5,
            tick_ms: 250,
            lease_ttl_ms: 3000,
            refresh_ms: 250,
            health_check_ms: 1000,
            upstream_connect_timeout_ms: 1000,
            upstream_read_timeout_ms: 30_000,
            fast_forward: true,
            default_claim_deadline_s: 120,
            limits: RateLimits::default(),
            max_body_bytes: 16 * 1024,
            registrations_max_body_bytes: 64 * 1024 * 1024,
            max_header_bytes: 16 * 1024,
            webhook_max_body_bytes: 64 * 1024,
            auto_window_s: 10,
            passthrough_batch: 5000,
            trusted_proxies: Vec::new(),
            identity_cache_entries: 262_144,
            public_metrics: false,
            session_slack_s: 30,
        }
    }
}

/// What the gateway reads of booking's `[booking]` section (the other keys are booking's and
/// are checked there).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct BookingView {
    /// Booking's request body limit. The gateway refuses larger bodies itself (`413
    /// BODY_TOO_LARGE`) so booking never has to cut a body off mid-upload.
    pub body_limit_bytes: usize,
}

impl Default for BookingView {
    fn default() -> Self {
        // Booking's own default (`booking/src/config.rs`).
        Self {
            body_limit_bytes: 64 * 1024,
        }
    }
}

/// Per-key request limits (governor GCRA). `0` disables a limit.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// Joins per account per minute (repeat joins are cheap but still limited).
    pub join_per_account_per_min: u32,
    /// Joins per client IP per minute (many fans can share a NAT: keep it generous).
    pub join_per_ip_per_min: u32,
    /// Status polls per account per minute (the page polls every 1–30 s).
    pub status_per_account_per_min: u32,
    pub status_per_ip_per_min: u32,
    /// Admitted API calls per account per second.
    pub api_per_account_per_s: u32,
    pub api_per_ip_per_s: u32,
    /// Payment webhooks (`POST /webhooks/payments`) per client IP per minute, all of which
    /// may come at once: the provider's own budget, never spent by fans' requests nor
    /// spending theirs. An event cancellation makes the provider send tens of thousands of
    /// events in a burst, and it retries whatever is refused (`429` with `Retry-After`).
    pub webhooks_per_ip_per_min: u32,
    /// Failed credential checks (a wrong, malformed, expired or scanner credential) one
    /// address may make on the admin listener per minute; past that, every call from it that
    /// presents a credential is refused `429 TOO_MANY_FAILED_LOGINS` until the minute ends,
    /// a valid credential included. The listener's peer address counts, never
    /// `X-Forwarded-For`.
    pub admin_auth_failures_per_ip_per_min: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            join_per_account_per_min: 30,
            join_per_ip_per_min: 600,
            status_per_account_per_min: 120,
            status_per_ip_per_min: 6000,
            api_per_account_per_s: 20,
            api_per_ip_per_s: 500,
            webhooks_per_ip_per_min: 60_000,
            admin_auth_failures_per_ip_per_min: 20,
        }
    }
}

impl ProcessConfig for GatewayConfig {
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
                key: "identity.key",
                values: vec![&self.identity.key],
            },
            Secret {
                key: "admin_token",
                values: self.admin_token.iter().collect(),
            },
        ]
    }

    fn dev_only(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("identity.dev_login", self.identity.dev_login),
            ("gateway.dev_mode", self.gateway.dev_mode),
        ]
    }
}

impl GatewayConfig {
    /// Dev login is served when either switch is on (the local stack sets both).
    pub fn dev_login_enabled(&self) -> bool {
        self.identity.dev_login || self.gateway.dev_mode
    }
}
