//! Seat holds: take seats for a while, release them, and the transaction helpers the order
//! and payment flows build on.
//!
//! Files: `repo.rs` (the helpers below and the release of ended holds), `take.rs` (the
//! statements of the seat and GA hold paths), `guard.rs` (the seat hold statement with the
//! orphan guard), `best.rs` (the pure best-available pick), `pick.rs` (best available: the
//! request, the candidate read and the picks on it), `batch.rs` (best available: one
//! event's queued requests picked on one read, held concurrently, losers retried),
//! `grouped.rs` (explicit seat holds of one event that arrive together, in one statement),
//! `refusal.rs` (the reads that explain a refusal), `release.rs` (a fan's release in one
//! statement), `http.rs` (`POST /api/events/{event}/holds`, `DELETE /api/holds/{hold}`).
//!
//! Guarantees:
//! - A seat is taken by ONE conditional statement that locks the requested seats in `seat_id`
//!   order and takes only those that are `available` or `held` past `held_until`
//!   (`clock_timestamp()`); fewer rows than requested rolls the whole transaction back. Expired
//!   holds are reclaimed by the hold statement itself; the sweeper only tidies.
//! - Best available and the explicit holds of `no_orphans` events run the same statement with
//!   the orphan guard (`guard.rs`): it also locks the seats' row neighbours and writes nothing
//!   when the hold would leave a free seat with no free neighbour, judged on the locked rows.
//! - The per-account ticket limit is one conditional upsert on `account_event_usage`; every
//!   path that ends a hold (release, expiry, reclaim) gives the tickets back exactly once,
//!   because it is guarded by a conditional status change of the hold row.
//!
//! # Helpers for other flows (stable signatures)
//!
//! All take a connection that is already inside the caller's transaction; none of them
//! commits. Rows are locked in a fixed order (holds → seats by `seat_id` → GA shards by shard
//! → usage by account), like the hold path, so deadlocks stay rare and are retryable.
//!
//! - [`release_hold_tx`]`(conn, hold_id, from_statuses, to_status)`: moves the hold from one of
//!   `from_statuses` to `to_status` (one conditional `UPDATE`), returns its seats to
//!   `available` (only seats still carrying this `hold_id` in status `held`), its GA units to
//!   the shards recorded in `hold_ga_items`, and decrements the account's usage. `None` when
//!   the hold was not in one of `from_statuses` (nothing changed). Statuses are
//!   [`HoldStatus`]es and only lifecycle moves are made ([`HoldStatus::can_become`]). Example:
//!   order expiry uses `release_hold_tx(conn, id, &[HoldStatus::Ordered], HoldStatus::Expired)`.
//! - [`pin_hold_tx`]`(conn, hold_id, account, until_interval_s)`: an `active`, unexpired hold
//!   of `account` becomes `ordered`; its `expires_at` and its seats' `held_until` move to
//!   `clock_timestamp() + until_interval_s`. Returns what the order needs (kind, event,
//!   quantity, seats with tier prices, GA tier and price), in one statement. `None` when the
//!   hold is not active, not the account's, expired, or lost a seat meanwhile; the caller then
//!   rolls its transaction back (no savepoint: nothing else would roll back to one).
//! - [`sell_hold_tx`]`(conn, hold_id, order_id, account)`: an `ordered` hold of `account`
//!   becomes `sold`: its seats `sold` (one conditional `UPDATE`), GA units counted as sold on
//!   their shards, one ticket per seat/unit inserted (`UNIQUE (event_id, seat_id)` is the
//!   backstop). [`SellOutcome::Lost`] when a seat no longer belongs to the hold (its pin ran
//!   out and someone reclaimed it): nothing changed; the caller undoes its own earlier steps and
//!   refunds.
//!   [`SellOutcome::NotOrdered`] (nothing changed) when the hold is not `ordered` for that
//!   account.

mod batch;
pub mod best;
pub mod grouped;
mod guard;
pub(crate) mod http;
pub mod pick;
pub(crate) mod refusal;
mod release;
pub mod repo;
pub(crate) mod take;

pub use crate::inventory::model::{HoldKind, HoldStatus};
pub use http::{HoldRequest, HoldResponse, router};
pub use repo::{
    IssuedTicket, PinnedHold, PinnedSeat, ReleasedHold, SellOutcome, pin_hold_tx, release_hold_tx,
    return_ga_units_tx, sell_hold_tx,
};
pub use take::{EXPIRE_OWN, EXPIRE_RECLAIMED, HOLD_SEATS, SeatRow};
