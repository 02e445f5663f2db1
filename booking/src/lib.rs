//! Floodgate booking core: the source of truth behind the gateway.
//!
//! Postgres decides every sale with one conditional statement per check-and-write; Redis is a
//! filter or a fast path. Start it with [`startup::Application`].

pub mod auth;
pub mod config;
pub mod db;
pub mod error;
pub mod health;
pub mod jobs;
pub mod json;
pub mod metrics;
pub mod revocation;
pub mod routes;
pub mod session;
pub mod startup;
pub mod state;

// Seat booking (events, seat map, holds, general admission, sweeper).
pub mod events;
pub mod ga;
pub mod holds;
pub mod seats;
pub mod sweeper;

// Carts, orders, inventory, idempotency keys, flash-sale gate.
pub mod cart;
pub mod flash;
pub mod idempotency;
pub mod orders;
pub mod products;

// Auctions: cold (Postgres) and hot (Redis Lua) bids, closer, live prices.
pub mod auctions;

// Storefront: event details for the shop page.
pub mod storefront;

// Payments, provider webhooks, outbox relay and ticket delivery.
pub mod delivery;
pub mod outbox;
pub mod payments;
pub mod webhooks;
