//! Booking's integration tests: the real service on a free port, a fresh Postgres database
//! per test, a unique Redis key prefix per test, real HTTP.
//!
//! Needs Postgres and Redis: `deploy/stack test` starts private ones and points the tests at
//! them (`FLOODGATE_TEST_DATABASE_URL`, `FLOODGATE_TEST_REDIS_URL`).

mod health;
mod helpers;
mod idempotency;
mod auctions;
mod storefront;
mod events;
mod holds;
mod ga;
mod sweeper;
mod bad_input;
mod hot_auctions;
mod cart;
mod flash;
mod orders;
mod products;
mod auction_ws;
mod payments;
mod webhooks;
mod outbox;
