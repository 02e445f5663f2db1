//! Ending a hold and giving back what it held: the status change ([`release_hold_tx`]) and
//! the release of the seats, GA units and usage of holds a transaction just ended
//! ([`release_resources`], shared with the sweeper and the reclaim of expired seats).

use crate::inventory::model::{HoldKind, HoldStatus};
use sqlx::PgConnection;

/// A hold that [`release_hold_tx`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedHold {
    pub hold_id: String,
    pub event_id: String,
    pub account_id: String,
    pub kind: HoldKind,
    pub quantity: i32,
    /// Seats that went back to `available` (fewer than `quantity` if some were reclaimed).
    pub seats_released: u64,
    /// GA units returned to their shards.
    pub ga_units_returned: i64,
}

/// The identity of a hold whose status this transaction just changed; its resources are
/// released by [`release_resources`].
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct EndedHold {
    pub id: String,
    pub event_id: String,
    pub account_id: String,
    pub kind: HoldKind,
    pub quantity: i32,
}

/// Ends a hold (conditional status change) and releases what it held. See the module docs.
/// Only the moves the hold lifecycle allows are made ([`HoldStatus::can_become`]): a
/// status in `from_statuses` that cannot become `to_status` matches nothing.
pub async fn release_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    from_statuses: &[HoldStatus],
    to_status: HoldStatus,
) -> sqlx::Result<Option<ReleasedHold>> {
    release_hold_inner(conn, hold_id, None, from_statuses, to_status).await
}

/// [`release_hold_tx`], optionally only for the hold's own account.
async fn release_hold_inner(
    conn: &mut PgConnection,
    hold_id: &str,
    account: Option<&str>,
    from_statuses: &[HoldStatus],
    to_status: HoldStatus,
) -> sqlx::Result<Option<ReleasedHold>> {
    let from: Vec<HoldStatus> = from_statuses
        .iter()
        .copied()
        .filter(|s| s.can_become(to_status))
        .collect();
    if from.is_empty() {
        return Ok(None);
    }
    let ended: Option<EndedHold> = sqlx::query_as(
        "UPDATE holds SET status = $2
         WHERE id = $1 AND status = ANY($3) AND ($4::text IS NULL OR account_id = $4)
         RETURNING id, event_id, account_id, kind, quantity",
    )
    .bind(hold_id)
    .bind(to_status)
    .bind(&from)
    .bind(account)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(hold) = ended else {
        return Ok(None);
    };
    let (seats_released, ga_units_returned) =
        release_resources(conn, std::slice::from_ref(&hold)).await?;
    Ok(Some(ReleasedHold {
        hold_id: hold.id,
        event_id: hold.event_id,
        account_id: hold.account_id,
        kind: hold.kind,
        quantity: hold.quantity,
        seats_released,
        ga_units_returned,
    }))
}

/// Gives back everything the given holds (whose status this transaction has just moved away
/// from `active`/`ordered`) still hold: seats still carrying their `hold_id` in status `held`,
/// GA units to the shards they came from, and the tickets counted in the accounts' usage.
/// Returns (seats released, GA units returned).
pub(crate) async fn release_resources(
    conn: &mut PgConnection,
    holds: &[EndedHold],
) -> sqlx::Result<(u64, i64)> {
    let seat_holds: Vec<&str> = holds
        .iter()
        .filter(|h| h.kind == HoldKind::Seats)
        .map(|h| h.id.as_str())
        .collect();
    let ga_holds: Vec<&str> = holds
        .iter()
        .filter(|h| h.kind == HoldKind::Ga)
        .map(|h| h.id.as_str())
        .collect();
    let mut seats_released = 0;
    if !seat_holds.is_empty() {
        // Only seats that still belong to these holds: a reclaimed seat carries another
        // hold_id by now and must not be touched. Locked in seat order like the hold path.
        seats_released = sqlx::query(
            "WITH doomed AS (
                 SELECT s.event_id, s.seat_id FROM holds h
                 JOIN seats s ON s.event_id = h.event_id AND s.seat_id = ANY(h.seat_ids)
                 WHERE h.id = ANY($1) AND s.hold_id = h.id AND s.status = 'held'
                 ORDER BY s.event_id, s.seat_id
                 FOR UPDATE OF s)
             UPDATE seats s SET status = 'available', hold_id = NULL, held_until = NULL
             FROM doomed d
             WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id",
        )
        .bind(&seat_holds)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    }
    let mut ga_units = 0;
    if !ga_holds.is_empty() {
        ga_units = sqlx::query_scalar(
            "WITH items AS (
                 SELECT h.event_id, h.ga_tier AS tier, i.shard, sum(i.quantity)::int AS qty
                 FROM hold_ga_items i JOIN holds h ON h.id = i.hold_id
                 WHERE i.hold_id = ANY($1)
                 GROUP BY 1, 2, 3),
             locked AS (
                 SELECT c.event_id, c.tier, c.shard, items.qty
                 FROM ga_counters c JOIN items USING (event_id, tier, shard)
                 ORDER BY c.event_id, c.tier, c.shard
                 FOR UPDATE OF c),
             upd AS (
                 UPDATE ga_counters c SET available = c.available + l.qty
                 FROM locked l
                 WHERE c.event_id = l.event_id AND c.tier = l.tier AND c.shard = l.shard
                 RETURNING l.qty)
             SELECT COALESCE(sum(qty), 0)::bigint FROM upd",
        )
        .bind(&ga_holds)
        .fetch_one(&mut *conn)
        .await?;
    }
    if !holds.is_empty() {
        let events: Vec<&str> = holds.iter().map(|h| h.event_id.as_str()).collect();
        let accounts: Vec<&str> = holds.iter().map(|h| h.account_id.as_str()).collect();
        let qty: Vec<i32> = holds.iter().map(|h| h.quantity).collect();
        // Aggregated per account and locked in account order. A negative result violates
        // CHECK (tickets >= 0): that would be a double release, so it must fail loudly.
        sqlx::query(
            "WITH d AS (
                 SELECT e AS event_id, a AS account_id, sum(q)::int AS q
                 FROM unnest($1::text[], $2::text[], $3::int[]) AS t(e, a, q)
                 GROUP BY 1, 2),
             locked AS (
                 SELECT u.event_id, u.account_id, d.q
                 FROM account_event_usage u JOIN d USING (event_id, account_id)
                 ORDER BY u.event_id, u.account_id
                 FOR UPDATE OF u)
             UPDATE account_event_usage u SET tickets = u.tickets - l.q
             FROM locked l
             WHERE u.event_id = l.event_id AND u.account_id = l.account_id",
        )
        .bind(&events)
        .bind(&accounts)
        .bind(&qty)
        .execute(&mut *conn)
        .await?;
    }
    Ok((seats_released, ga_units))
}
