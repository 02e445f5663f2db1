//! Floodgate's common crate: configuration loading, telemetry, the admission-token format,
//! the login (identity) token check, the JSON error shape and id generation.
//!
//! Both services depend on it so that the gateway and booking can never disagree on what a
//! valid admission token is or how an error looks on the wire.

pub mod config;
pub mod credentials;
pub mod error;
pub mod identity;
pub mod ids;
pub mod net;
pub mod redis_conn;
pub mod revocation;
pub mod telemetry;
pub mod token;

/// Header names the gateway sets on forwarded requests (and strips from inbound ones).
pub mod headers {
    pub const ACCOUNT: &str = "x-floodgate-account";
    pub const EVENT: &str = "x-floodgate-event";
    pub const REQUEST_ID: &str = "x-request-id";
    /// Every inbound header with this prefix is removed by the gateway before forwarding.
    pub const INTERNAL_PREFIX: &str = "x-floodgate-";
    /// Cookie carrying the admission token for browsers.
    pub const ADMISSION_COOKIE: &str = "fg_admission";
    /// Booking → gateway, on answers to checkout writes (holds, orders, payment): when the
    /// caller's last live hold or `PENDING_PAYMENT` order in the token's event ends (unix ms),
    /// `0` when none is left. The gateway removes it from the answer (docs/decisions.md,
    /// "Admission lasts through checkout").
    pub const SESSION_UNTIL: &str = "x-floodgate-session-until";
    /// Gateway → fan: a refreshed admission token (same admission, later `exp`) for clients
    /// that send it as `Authorization: Bearer`; browsers get the cookie as well.
    pub const ADMISSION_TOKEN: &str = "x-floodgate-admission-token";
}
