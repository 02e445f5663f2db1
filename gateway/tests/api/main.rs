//! Gateway integration tests: real pingora listeners, real Redis (unique key prefix per
//! test), real HTTP, real concurrency.
//!
//! Needs `redis-server` on the path (one test starts a private one) and the shared test
//! Redis (`FLOODGATE_TEST_REDIS_URL`, default 127.0.0.1:56379); `deploy/stack test` provides
//! both. The browser test needs Debian's `chromium` (skipped only when it is absent and
//! `CI` is unset).

// Test helpers are test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod admin;
mod admission;
mod browser;
mod browser_registered;
mod browser_states;
mod cluster_failover;
mod edge;
mod faults;
mod helpers;
mod limits_shared;
mod operators;
mod pages;
mod proxy;
mod queue;
mod redis_outage;
mod registered;
mod registered_draw;
mod safety_net;
mod schedule;
mod slots;
mod slots_retake;
mod split_queue;
mod split_registered;
mod split_safety_net;
mod startup_config;
mod status_memory;
mod stepper;
mod ticker;
mod upstream_leg;
mod webhooks;
