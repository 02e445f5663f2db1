//! End-to-end tests of the whole stack (gateway, booking, sandbox payment provider, the
//! static pages in headless Chromium), started in-process on free ports against the test
//! Postgres and Redis. One test binary: `cargo test -p e2e`.
//!
//! Needs Postgres and Redis (`deploy/stack deps`, or `FLOODGATE_TEST_DATABASE_URL` /
//! `FLOODGATE_TEST_REDIS_URL`) and, for the browser journey, Chromium (`CHROMIUM` or
//! `chromium` on the PATH; without it the browser test is skipped unless `CI` is set).

mod i18n;
mod journey_api;
mod journey_browser;
mod operators;
mod ops_page;
mod session;
mod stack;
mod tickets_page;
