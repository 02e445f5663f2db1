//! Floodgate booking core: the source of truth behind the gateway.
//!
//! Postgres decides every sale with one conditional statement per check-and-write; Redis is a
//! filter or a fast path. Start it with [`app::startup::Application`].
//!
//! Dependencies point one way (see `docs/code-map.md`):
//!
//! ```text
//! app  ──►  auctions ─┐
//!      ──►  payments ─┼─►  orders  ──►  inventory ──►  platform
//!      ──►  outbox  ◄─┘                                  ▲
//!                                   (every domain) ───────┘
//! ```
//!
//! `platform` (database, Redis, errors, JSON, auth, idempotency, the job runner) imports no
//! domain; a domain imports the platform and the small public functions of the domains below
//! it; `app` alone assembles state, routes, config, metrics and jobs.

pub mod platform;

// Seat booking: events, seat map, holds, general admission, sweeper, storefront.
pub mod inventory;

// Carts, products, the flash-sale gate and orders.
pub mod orders;

// Outbox relay and ticket delivery.
pub mod outbox;

// Payments, the provider adapter, reconciliation, reversals and provider webhooks.
pub mod payments;

// Auctions: cold (Postgres) and hot (Redis Lua) bids, closer, live prices.
pub mod auctions;

// The ops API's read side: order search and detail, the audit log reader.
pub mod ops;

// Ticket codes, their keys and the fan's ticket list.
pub mod tickets;

// The door: scanners and check-in.
pub mod checkin;

// Assembles state, routes, config, metrics and jobs; starts the service.
pub mod app;
