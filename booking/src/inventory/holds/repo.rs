//! The hold helpers other flows build on (orders pin and release holds, payments sell them),
//! and the release of whatever ended holds still hold. The guarantees and the exact contract
//! of each helper are in the `holds` module docs; the signatures are stable.
//!
//! They return `sqlx::Result` because their callers run them inside their own transactions
//! and retry those whole.

use crate::inventory::model::{HoldKind, HoldStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
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

/// One seat of a pinned hold with its tier price (minor units).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct PinnedSeat {
    pub seat_id: String,
    pub tier: String,
    pub price: i64,
}

/// What an order needs to know about the hold it now owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedHold {
    pub hold_id: String,
    pub event_id: String,
    pub kind: HoldKind,
    pub quantity: i32,
    /// The new `expires_at` (and seats' `held_until`).
    pub expires_at: DateTime<Utc>,
    /// Seats in `seat_id` order (empty for GA).
    pub seats: Vec<PinnedSeat>,
    pub ga_tier: Option<String>,
    /// Unit price of the GA tier (None for seats).
    pub ga_price: Option<i64>,
    /// Sum of seat prices, or `quantity * ga_price`.
    pub total: i64,
}

/// A ticket issued by [`sell_hold_tx`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IssuedTicket {
    pub id: String,
    pub seat_id: Option<String>,
    pub ga_tier: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SellOutcome {
    Sold {
        event_id: String,
        tickets: Vec<IssuedTicket>,
    },
    /// Some seat no longer belongs to the hold; nothing was changed. Roll back and refund.
    Lost { expected: i32, still_held: u64 },
    /// The hold is not `ordered` for this account (already sold, expired, unknown...).
    NotOrdered,
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
pub(crate) async fn release_hold_inner(
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
        seats_released = sqlx::query(concat!(
            "WITH doomed AS (
                 SELECT s.event_id, s.seat_id FROM holds h
                 JOIN seats s ON s.event_id = h.event_id AND s.seat_id = ANY(",
            crate::hold_seat_ids_sql!("h"),
            ")
                 WHERE h.id = ANY($1) AND s.hold_id = h.id AND s.status = 'held'
                 ORDER BY s.event_id, s.seat_id
                 FOR UPDATE OF s)
             UPDATE seats s SET status = 'available', hold_id = NULL, held_until = NULL
             FROM doomed d
             WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id",
        ))
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

/// One row per seat the pin (or sale) statement moved, the hold's columns repeated; one row
/// with no seat for a GA hold or when no seat moved.
#[derive(sqlx::FromRow)]
struct HoldSeatRow {
    event_id: String,
    kind: HoldKind,
    ga_tier: Option<String>,
    quantity: i32,
    expires_at: DateTime<Utc>,
    ga_price: Option<i64>,
    seat_id: Option<String>,
    tier: Option<String>,
    price: Option<i64>,
}

/// The seats of seat hold `$h` (an alias with `id`, `event_id`, `seat_ids`): its list, or for a
/// hold written by a process from before migration 0014 (a rolling upgrade runs old and new
/// processes on the new schema, and the old ones write no list) the event's seats carrying its
/// id, found by scanning the event's seats. `COALESCE` evaluates the scan only for such a hold.
#[macro_export]
macro_rules! hold_seat_ids_sql {
    ($h:literal) => {
        concat!(
            "COALESCE(",
            $h,
            ".seat_ids, ARRAY(SELECT x.seat_id FROM seats x WHERE x.event_id = ",
            $h,
            ".event_id AND x.hold_id = ",
            $h,
            ".id))"
        )
    };
}

/// `mine`: the seats hold `h` (a `WITH` part of the caller's returning `id`, `event_id`,
/// `kind`, `seat_ids`) still holds, locked in `seat_id` order like every seat path. Found by
/// primary key from the hold's `seat_ids`; `s.hold_id = h.id` drops a seat a later hold
/// reclaimed (migration 0014: no index on `seats.hold_id`, so seat updates are HOT). Shared by the order's
/// pin of its hold ([`pin_hold_tx`]), the pay request's start and the sale (payments'
/// `START_ATTEMPT`, `SETTLE_HOLD_ORDER`).
#[macro_export]
macro_rules! hold_seats_locked_sql {
    () => {
        concat!(
            "
         mine AS (
             SELECT s.event_id, s.seat_id FROM seats s JOIN h ON s.event_id = h.event_id
             WHERE h.kind = 'seats' AND s.seat_id = ANY(",
            $crate::hold_seat_ids_sql!("h"),
            ") AND s.hold_id = h.id
               AND s.status = 'held'
             ORDER BY s.seat_id
             FOR UPDATE OF s)"
        )
    };
}

/// Pins an active hold for an order. See the module docs. ONE statement: the hold row, then
/// its seats locked in `seat_id` order with their tier prices (or the GA tier's price).
/// `None` when the hold is not pinnable or lost a seat; the statement may have changed rows
/// then, so the caller must roll back (every caller does: no hold, no order).
pub async fn pin_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    account: &str,
    until_interval_s: i64,
) -> sqlx::Result<Option<PinnedHold>> {
    let rows: Vec<HoldSeatRow> = sqlx::query_as(concat!(
        "WITH h AS (
             UPDATE holds
             SET status = 'ordered',
                 expires_at = clock_timestamp() + make_interval(secs => $3::double precision)
             WHERE id = $1 AND account_id = $2 AND status = 'active'
               AND expires_at > clock_timestamp()
             RETURNING id, event_id, kind, ga_tier, quantity, expires_at, seat_ids),",
        crate::hold_seats_locked_sql!(),
        ",
         upd AS (
             UPDATE seats s SET held_until = h.expires_at
             FROM mine m, h, price_tiers p
             WHERE s.event_id = m.event_id AND s.seat_id = m.seat_id
               AND p.event_id = s.event_id AND p.tier = s.tier
             RETURNING s.seat_id, s.tier, p.price)
         SELECT h.event_id, h.kind, h.ga_tier, h.quantity, h.expires_at,
                (SELECT g.price FROM ga_tiers g
                  WHERE g.event_id = h.event_id AND g.tier = h.ga_tier) AS ga_price,
                u.seat_id, u.tier, u.price
         FROM h LEFT JOIN upd u ON true"
    ))
    .bind(hold_id)
    .bind(account)
    .bind(until_interval_s as f64)
    .fetch_all(&mut *conn)
    .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let mut pinned = PinnedHold {
        hold_id: hold_id.to_owned(),
        event_id: row.event_id.clone(),
        kind: row.kind,
        quantity: row.quantity,
        expires_at: row.expires_at,
        seats: Vec::new(),
        ga_tier: row.ga_tier.clone(),
        ga_price: None,
        total: 0,
    };
    if row.kind == HoldKind::Seats {
        let mut seats: Vec<PinnedSeat> = rows
            .iter()
            .filter_map(|r| {
                Some(PinnedSeat {
                    seat_id: r.seat_id.clone()?,
                    tier: r.tier.clone()?,
                    price: r.price?,
                })
            })
            .collect();
        if i32::try_from(seats.len()).ok() != Some(row.quantity) {
            // A seat was reclaimed between the hold's expiry check and the lock.
            return Ok(None);
        }
        seats.sort_by(|a, b| a.seat_id.cmp(&b.seat_id));
        pinned.total = seats.iter().map(|s| s.price).sum();
        pinned.seats = seats;
    } else {
        let price = row.ga_price.ok_or(sqlx::Error::RowNotFound)?;
        pinned.ga_price = Some(price);
        pinned.total = price * i64::from(row.quantity);
    }
    Ok(Some(pinned))
}

/// One statement over a GA hold's units (`$1` the hold, `$2` the event, `$3` the tier): locks
/// the shards it took units from (its `hold_ga_items`) in shard order, like every GA path,
/// then applies `$set` to each with `l.quantity`, that shard's units of the hold.
macro_rules! ga_hold_units_sql {
    ($set:literal) => {
        concat!(
            "WITH items AS (SELECT shard, quantity FROM hold_ga_items WHERE hold_id = $1),
             locked AS (
                 SELECT c.shard, items.quantity
                 FROM ga_counters c JOIN items USING (shard)
                 WHERE c.event_id = $2 AND c.tier = $3
                 ORDER BY c.shard
                 FOR UPDATE OF c)
             UPDATE ga_counters c SET ",
            $set,
            "
             FROM locked l
             WHERE c.event_id = $2 AND c.tier = $3 AND c.shard = l.shard"
        )
    };
}

/// Gives a sold GA hold's units back to the shards it took them from: on sale when
/// `release`, else held back. Used by a whole-order reversal and by the refund of an order's
/// GA line (payments).
pub async fn return_ga_units_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: Option<&str>,
    release: bool,
) -> sqlx::Result<()> {
    sqlx::query(ga_hold_units_sql!(
        "sold = c.sold - l.quantity,
             available = c.available + CASE WHEN $4 THEN l.quantity ELSE 0 END,
             held_back = c.held_back + CASE WHEN $4 THEN 0 ELSE l.quantity END"
    ))
    .bind(hold_id)
    .bind(event)
    .bind(tier)
    .bind(release)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sells an ordered hold. See the module docs. The hold row and its seats are ONE statement,
/// which changes nothing unless every seat is still the hold's: `NotOrdered` and `Lost` leave
/// the hold and its seats as they were (a lost seat's rows are listed, not sold).
pub async fn sell_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    order_id: &str,
    account: &str,
) -> sqlx::Result<SellOutcome> {
    let rows: Vec<HoldSeatRow> = sqlx::query_as(concat!(
        "WITH hold AS (
             SELECT id, event_id, kind, ga_tier, quantity, expires_at, seat_ids FROM holds
             WHERE id = $1 AND account_id = $2 AND status = 'ordered'
             FOR UPDATE),
         mine AS (
             SELECT s.event_id, s.seat_id, s.tier FROM seats s JOIN hold h ON s.event_id = h.event_id
             WHERE h.kind = 'seats' AND s.seat_id = ANY(",
        crate::hold_seat_ids_sql!("h"),
        ") AND s.hold_id = h.id
               AND s.status = 'held'
             ORDER BY s.seat_id
             FOR UPDATE OF s),
         ok AS (
             SELECT id FROM hold
             WHERE kind <> 'seats' OR (SELECT count(*) FROM mine) = quantity),
         sold AS (
             UPDATE holds SET status = 'sold' FROM ok WHERE holds.id = ok.id),
         upd AS (
             UPDATE seats s SET status = 'sold', order_id = $3, held_until = NULL
             FROM mine m, ok
             WHERE s.event_id = m.event_id AND s.seat_id = m.seat_id
             RETURNING s.seat_id, s.tier)
         SELECT h.event_id, h.kind, h.ga_tier, h.quantity, h.expires_at,
                NULL::bigint AS ga_price, u.seat_id, u.tier, NULL::bigint AS price
         FROM hold h LEFT JOIN (
             SELECT seat_id, tier FROM upd
             UNION ALL
             SELECT seat_id, tier FROM mine WHERE NOT EXISTS (SELECT 1 FROM ok)) u ON true",
    ))
    .bind(hold_id)
    .bind(account)
    .bind(order_id)
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(SellOutcome::NotOrdered);
    };
    let (event_id, kind, ga_tier, quantity) = (
        first.event_id.clone(),
        first.kind,
        first.ga_tier.clone(),
        first.quantity,
    );
    let tickets = if kind == HoldKind::Seats {
        let mut sold: Vec<String> = rows.iter().filter_map(|r| r.seat_id.clone()).collect();
        if i32::try_from(sold.len()).ok() != Some(quantity) {
            return Ok(SellOutcome::Lost {
                expected: quantity,
                still_held: sold.len() as u64,
            });
        }
        sold.sort();
        sold.into_iter()
            .map(|seat| IssuedTicket {
                id: shared::ids::new_id(),
                seat_id: Some(seat),
                ga_tier: None,
            })
            .collect::<Vec<_>>()
    } else {
        sqlx::query(ga_hold_units_sql!("sold = c.sold + l.quantity"))
            .bind(hold_id)
            .bind(&event_id)
            .bind(&ga_tier)
            .execute(&mut *conn)
            .await?;
        (0..quantity)
            .map(|_| IssuedTicket {
                id: shared::ids::new_id(),
                seat_id: None,
                ga_tier: ga_tier.clone(),
            })
            .collect()
    };
    let ids: Vec<&str> = tickets.iter().map(|t| t.id.as_str()).collect();
    let seat_ids: Vec<Option<&str>> = tickets.iter().map(|t| t.seat_id.as_deref()).collect();
    let tiers: Vec<Option<&str>> = tickets.iter().map(|t| t.ga_tier.as_deref()).collect();
    sqlx::query(
        "INSERT INTO tickets (id, event_id, seat_id, ga_tier, order_id, account_id)
         SELECT t.id, $4, t.seat_id, t.ga_tier, $5, $6
         FROM unnest($1::text[], $2::text[], $3::text[]) AS t(id, seat_id, ga_tier)",
    )
    .bind(&ids)
    .bind(&seat_ids)
    .bind(&tiers)
    .bind(&event_id)
    .bind(order_id)
    .bind(account)
    .execute(&mut *conn)
    .await?;
    Ok(SellOutcome::Sold { event_id, tickets })
}
