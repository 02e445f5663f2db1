//! Booking's integration tests: the real service on a free port, a fresh Postgres database
//! per test, a unique Redis key prefix per test, real HTTP.
//!
//! Needs Postgres and Redis: `deploy/stack test` starts private ones and points the tests at
//! them (`FLOODGATE_TEST_DATABASE_URL`, `FLOODGATE_TEST_REDIS_URL`).

mod auction_ws;
mod auctions;
mod bad_input;
mod best;
mod best_race;
mod cancelled_orders;
mod cart;
mod checkin;
mod deadlines;
mod event_cancel;
mod event_cancel_kill;
mod event_scope;
mod events;
mod fan_orders;
mod faults;
mod flash;
mod ga;
mod ga_holdbacks;
mod ga_shards;
mod health;
mod helpers;
mod hold_batches;
mod holds;
mod hot_auctions;
mod idempotency;
mod idempotency_tx;
mod jobs;
mod kept_pool;
mod line_refunds;
mod mail;
mod one_statement;
mod openapi;
mod operators;
mod ops;
mod ops_refunds;
mod order_batches;
mod orders;
mod outbox;
mod pay_bounds;
mod payments;
mod plans;
mod products;
mod seat_kills;
mod seat_map;
mod seat_plans;
mod session;
mod split_stock;
mod startup_config;
mod storefront;
mod stripe_fake;
mod sweeper;
mod tickets;
mod transfers;
mod webhooks;
