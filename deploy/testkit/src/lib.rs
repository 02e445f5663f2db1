//! Test tools shared by Floodgate's integration tests. Not shipped.
//!
//! - [`child`]: a workspace binary run as its own process (stderr echoed into the test's
//!   output with its tail kept for the panic message, readiness awaited, stopped), and a
//!   binary run to its exit (the startup tests).
//! - [`wait`]: polling for something another task, process or service does, failing with what
//!   was awaited ([`wait::eventually`], [`wait::until`]).
//! - `browser` (feature `browser`): a Chrome DevTools Protocol driver for Debian's headless
//!   Chromium (the gateway's waiting-page tests and the e2e journeys).
//! - [`ChaosProxy`]: a TCP proxy between a service and Postgres or Redis that a test can cut,
//!   reset or slow down, to check that the service answers a clean `503` (never a `500`, never
//!   a hang), leaves nothing half-done, and recovers by itself once the network is back.
//! - [`promtext`]: single values out of a Prometheus `/metrics` text (the gateway tests and
//!   loadgen's surge timeline).
//! - [`free_port`]: a port for a listener configured before it binds.
//! - `mail` (feature `mail`): what the local SMTP server received, taken apart, and QR codes
//!   read by Debian's `zbarimg`.

#[cfg(feature = "browser")]
pub mod browser;
mod chaos;
pub mod child;
#[cfg(feature = "mail")]
pub mod mail;
pub mod promtext;
pub mod wait;

pub use chaos::ChaosProxy;

/// A port for a listener configured before it binds (pingora and the child processes take an
/// address, not a socket): drawn below the ephemeral range, so no outgoing connection or
/// `bind(:0)` can be sitting on it between this pick and the listener's bind, and never the
/// same one twice in a process (see [`shared::net::free_port_outside_ephemeral_range`]).
pub fn free_port() -> u16 {
    shared::net::free_port_outside_ephemeral_range().expect("a free test port")
}
