//! The hold helpers other flows build on (orders pin and release holds, payments sell them),
//! and the release of whatever ended holds still hold. The guarantees and the exact contract
//! of each helper are in the `holds` module docs; the signatures are stable.
//!
//! They return `sqlx::Result` because their callers run them inside their own transactions
//! and retry those whole.

use crate::inventory::model::HoldKind;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

mod ended;
pub(crate) use ended::{EndedHold, release_resources};
pub use ended::{ReleasedHold, release_hold_tx};

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

/// `mine`: the seats hold `h` (a `WITH` part of the caller's returning `id`, `event_id`,
/// `kind`, `seat_ids`) still holds, locked in `seat_id` order like every seat path. Found by
/// primary key from the hold's `seat_ids`; `s.hold_id = h.id` drops a seat a later hold
/// reclaimed (migration 0014: no index on `seats.hold_id`, so seat updates are HOT). Shared by the order's
/// pin of its hold ([`pin_hold_tx`]), the pay request's start and the sale (payments'
/// `START_ATTEMPT`, `SETTLE_HOLD_ORDER`).
#[macro_export]
macro_rules! hold_seats_locked_sql {
    () => {
        "
         mine AS (
             SELECT s.event_id, s.seat_id FROM seats s JOIN h ON s.event_id = h.event_id
             WHERE h.kind = 'seats' AND s.seat_id = ANY(h.seat_ids) AND s.hold_id = h.id
               AND s.status = 'held'
             ORDER BY s.seat_id
             FOR UPDATE OF s)"
    };
}

/// [`pin_hold_tx`]'s statement: `$1` the hold, `$2` its account, `$3` seconds until the
/// order expires.
pub const PIN_HOLD: &str = concat!(
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
);

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
    let rows: Vec<HoldSeatRow> = sqlx::query_as(PIN_HOLD)
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
    let rows: Vec<HoldSeatRow> = sqlx::query_as(
        "WITH hold AS (
             SELECT id, event_id, kind, ga_tier, quantity, expires_at, seat_ids FROM holds
             WHERE id = $1 AND account_id = $2 AND status = 'ordered'
             FOR UPDATE),
         mine AS (
             SELECT s.event_id, s.seat_id, s.tier FROM seats s JOIN hold h ON s.event_id = h.event_id
             WHERE h.kind = 'seats' AND s.seat_id = ANY(h.seat_ids) AND s.hold_id = h.id
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
    )
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
        "INSERT INTO tickets (id, event_id, seat_id, ga_tier, order_id, account_id, holder_account)
         SELECT t.id, $4, t.seat_id, t.ga_tier, $5, $6, $6
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
