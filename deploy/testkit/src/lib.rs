//! Test tools shared by Floodgate's integration tests. Not shipped.
//!
//! - [`ChaosProxy`]: a TCP proxy between a service and Postgres or Redis that a test can cut,
//!   reset or slow down, to check that the service answers a clean `503` (never a `500`, never
//!   a hang), leaves nothing half-done, and recovers by itself once the network is back.
//! - [`promtext`]: single values out of a Prometheus `/metrics` text (the gateway tests and
//!   loadgen's surge timeline).

mod chaos;
pub mod promtext;

pub use chaos::ChaosProxy;
