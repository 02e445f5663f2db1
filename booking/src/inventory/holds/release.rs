//! A fan's release of their own active hold (`DELETE /api/holds/{hold}`) as ONE statement:
//! the same moves as [`release_hold_tx`](super::repo::release_hold_tx) followed by
//! `release_resources` (status change, seats, GA units to the shards they came from, the
//! account's usage), in the same lock order (hold → seats by `seat_id` → shards by shard →
//! usage), without a round trip per step. Everything hangs on the conditional status change:
//! a hold that is not this account's active hold changes nothing.

use crate::inventory::error::{During, InventoryError};
use sqlx::PgConnection;

/// `bench/sql/hold_seats.sql` runs this text. (`usage`, like every data-modifying `WITH`, runs
/// whether or not the final `SELECT` reads it.)
///
/// The seats are found by primary key from the hold's `seat_ids` (required since migration 0015),
/// and are the hold's only while they still carry its id (a later hold may have reclaimed one).
const RELEASE_OWN: &str = concat!(
    "
WITH h AS (
    UPDATE holds SET status = 'released'
    WHERE id = $1 AND account_id = $2 AND status = 'active'
    RETURNING id, event_id, account_id, kind, ga_tier, quantity, seat_ids),
doomed AS (
    SELECT s.event_id, s.seat_id FROM seats s, h
    WHERE h.kind = 'seats' AND s.event_id = h.event_id AND s.seat_id = ANY(h.seat_ids)
      AND s.hold_id = $1
    ORDER BY s.event_id, s.seat_id
    FOR UPDATE OF s),
seats_back AS (
    UPDATE seats s SET status = 'available', hold_id = NULL, held_until = NULL
    FROM doomed d
    WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id
      AND s.status = 'held' AND s.hold_id = $1
    RETURNING 1),
units AS (
    SELECT c.shard, i.quantity FROM h, hold_ga_items i, ga_counters c
    WHERE h.kind = 'ga' AND i.hold_id = $1
      AND c.event_id = h.event_id AND c.tier = h.ga_tier AND c.shard = i.shard
    ORDER BY c.shard
    FOR UPDATE OF c),
units_back AS (
    UPDATE ga_counters c SET available = c.available + u.quantity
    FROM h, units u
    WHERE c.event_id = h.event_id AND c.tier = h.ga_tier AND c.shard = u.shard
    RETURNING u.quantity),
usage AS (
    UPDATE account_event_usage u SET tickets = u.tickets - h.quantity
    FROM h
    WHERE u.event_id = h.event_id AND u.account_id = h.account_id
    RETURNING 1)
SELECT h.event_id, h.kind = 'seats',
       (SELECT count(*) FROM seats_back) + (SELECT COALESCE(sum(quantity), 0) FROM units_back),
       ",
    crate::live_until_ms_sql!("$2", "$3", "NULL::timestamptz", "$1"),
    "
FROM h"
);

/// What a release changed: the hold's event, and whether it held seats (the seat map's cache
/// then has to be rebuilt); the account's checkout end in the admission's event without it.
pub(crate) struct Released {
    pub event_id: String,
    pub seats: bool,
    pub live_until_ms: i64,
}

/// Releases the account's active hold (`admission_event`: the event of the caller's admission,
/// for the checkout end); `None` when nothing changed (not active, not theirs,
/// unknown). A negative usage (a double release) violates `CHECK (tickets >= 0)` and fails.
pub(crate) async fn release_own_tx(
    conn: &mut PgConnection,
    hold: &str,
    account: &str,
    admission_event: &str,
) -> Result<Option<Released>, InventoryError> {
    let released: Option<(String, bool, i64, i64)> = sqlx::query_as(RELEASE_OWN)
        .bind(hold)
        .bind(account)
        .bind(admission_event)
        .fetch_optional(conn)
        .await
        .during("release the hold")?;
    Ok(
        released.map(|(event_id, seats, _, live_until_ms)| Released {
            event_id,
            seats,
            live_until_ms,
        }),
    )
}
