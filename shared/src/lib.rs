//! Floodgate's common crate: configuration loading, telemetry, the admission-token format,
//! the login (identity) token check, the JSON error shape and id generation.
//!
//! Both services depend on it so that the gateway and booking can never disagree on what a
//! valid admission token is or how an error looks on the wire.

pub mod config;
pub mod error;
pub mod identity;
pub mod ids;
pub mod net;
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
}
