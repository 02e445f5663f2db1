//! The event statements: create an event whole (one transaction; seats inserted in bulk by
//! Postgres itself) and read its counts from one snapshot.

use super::model::{CreateEvent, EventCreated, RefundStock};
use crate::inventory::error::{During, InventoryError};
use crate::inventory::model::Invalid;
use crate::platform::audit::{self, Operator};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

type Result<T> = std::result::Result<T, InventoryError>;

/// The constraint a unique violation came from, if any.
fn unique_violation(e: &sqlx::Error) -> Option<String> {
    let db = e.as_database_error()?;
    if db.code().as_deref() == Some("23505") {
        Some(db.constraint().unwrap_or_default().to_owned())
    } else {
        None
    }
}

/// Creates the event with its tiers, seats and GA counters in one transaction; `seats` is
/// the count [`validate`](super::model::validate) returned.
pub(super) async fn insert_event(
    pool: &PgPool,
    req: CreateEvent,
    seats: u64,
    actor: &Operator,
) -> Result<EventCreated> {
    let id = req.id.clone().unwrap_or_else(shared::ids::new_id);
    let started = std::time::Instant::now();
    match insert_tx(pool, &id, &req, seats, actor).await {
        Ok(true) => {}
        Ok(false) => return Err(InventoryError::EventExists { id }),
        Err(e) => {
            return Err(match e.db_source().and_then(unique_violation).as_deref() {
                Some("events_pkey") => InventoryError::EventExists { id },
                // An explicit seat id equal to a generated one.
                Some("seats_pkey") => Invalid::field("seat_map", "duplicate seat id").into(),
                _ => e,
            });
        }
    }
    analyze_new_seats(pool, &id, seats).await;
    tracing::info!(
        event = %id,
        seats,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "event created"
    );
    Ok(EventCreated {
        id,
        name: req.name,
        venue: req.venue,
        sale_start: req.sale_start,
        hold_ttl_s: req.hold_ttl_s,
        max_tickets_per_account: req.max_tickets_per_account,
        seats,
        price_tiers: req.price_tiers,
        ga_tiers: req.ga_tiers,
        refund_stock: req.refund_stock,
        no_orphans: req.no_orphans,
        starts_at: req.starts_at,
        doors_at: req.doors_at,
        timezone: req.timezone,
        venue_address: req.venue_address,
        ticket_code: req.ticket_code,
        reentry: req.reentry,
        transfers: req.transfers,
    })
}

/// Refreshes the planner's statistics of `seats` when this event's seats are a large share of
/// the table (it was never analyzed, or they are at least a tenth of its rows, autovacuum's own
/// threshold). Booking's connections keep generic plans; made from statistics that predate
/// the seats (a young table: say the first event of a deployment), the hold, order and pay
/// statements look a seat up by `event_id` alone and read every seat of the event, several
/// thousand buffers a statement, until autovacuum gets round to it (measured: a purchase cost
/// Postgres twice the CPU). ANALYZE invalidates those plans. Best effort, after the commit:
/// the event exists either way; a failure is logged and left to autovacuum.
async fn analyze_new_seats(pool: &PgPool, event: &str, seats: u64) {
    if seats == 0 {
        return;
    }
    let run = async {
        let mut tx = pool.begin().await?;
        let rows: f32 =
            sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'seats'::regclass")
                .fetch_one(&mut *tx)
                .await?;
        // -1: never analyzed or vacuumed.
        if rows >= 0.0 && (seats as f32) * 10.0 < rows {
            return Ok::<_, sqlx::Error>(false);
        }
        // ANALYZE waits for a running autovacuum of the table: not for long.
        sqlx::raw_sql("SET LOCAL lock_timeout = '5s'; ANALYZE seats")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    };
    match run.await {
        Ok(true) => tracing::debug!(event, seats, "analyzed seats"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(event, error = ?e, "could not analyze seats after creating an event; autovacuum will")
        }
    }
}

/// The insert transaction; `false` when an event with this id exists (nothing written).
async fn insert_tx(
    pool: &PgPool,
    id: &str,
    req: &CreateEvent,
    seats: u64,
    actor: &Operator,
) -> Result<bool> {
    let mut tx = pool.begin().await.during("begin creating the event")?;
    let inserted: Option<String> = sqlx::query_scalar(
        "INSERT INTO events (id, name, venue, sale_start, hold_ttl_s, max_tickets_per_account,
                                 refund_stock, no_orphans, starts_at, doors_at, timezone,
                                 venue_address, ticket_code, reentry, transfers)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             ON CONFLICT (id) DO NOTHING
             RETURNING id",
    )
    .bind(id)
    .bind(&req.name)
    .bind(&req.venue)
    .bind(req.sale_start)
    .bind(req.hold_ttl_s)
    .bind(req.max_tickets_per_account)
    .bind(req.refund_stock)
    .bind(req.no_orphans)
    .bind(req.starts_at)
    .bind(req.doors_at)
    .bind(req.timezone.as_deref())
    .bind(req.venue_address.as_deref())
    .bind(req.ticket_code)
    .bind(req.reentry)
    .bind(req.transfers)
    .fetch_optional(&mut *tx)
    .await
    .during("insert the event row")?;
    if inserted.is_none() {
        return Ok(false);
    }
    let tier_names: Vec<&str> = req.price_tiers.iter().map(|t| t.tier.as_str()).collect();
    let tier_prices: Vec<i64> = req.price_tiers.iter().map(|t| t.price).collect();
    sqlx::query(
        "INSERT INTO price_tiers (event_id, tier, price)
             SELECT $1, t, p FROM unnest($2::text[], $3::bigint[]) AS x(t, p)",
    )
    .bind(id)
    .bind(&tier_names)
    .bind(&tier_prices)
    .execute(&mut *tx)
    .await
    .during("insert the price tiers")?;
    let sections = &req.seat_map.sections;
    if !sections.is_empty() {
        let names: Vec<&str> = sections.iter().map(|s| s.name.as_str()).collect();
        let rows: Vec<i32> = sections.iter().map(|s| s.rows).collect();
        let per_row: Vec<i32> = sections.iter().map(|s| s.seats_per_row).collect();
        let tiers: Vec<&str> = sections.iter().map(|s| s.price_tier.as_str()).collect();
        sqlx::query(
            // The default rank: front rows first, then the centre of the row (see
            // migrations/0010_best_available.sql, which gives older seats the same).
            "INSERT INTO seats (event_id, seat_id, section, row_no, number, tier, rank)
                 SELECT $1, s.name || '-R' || r || '-' || n, s.name, r, n, s.tier,
                        (r - 1) * 20001 + abs(2 * n - (1 + s.per_row))
                 FROM unnest($2::text[], $3::int[], $4::int[], $5::text[])
                          AS s(name, nrows, per_row, tier),
                      generate_series(1, s.nrows) AS r,
                      generate_series(1, s.per_row) AS n",
        )
        .bind(id)
        .bind(&names)
        .bind(&rows)
        .bind(&per_row)
        .bind(&tiers)
        .execute(&mut *tx)
        .await
        .during("insert the seats of the sections")?;
    }
    let explicit = &req.seat_map.seats;
    if !explicit.is_empty() {
        let ids: Vec<&str> = explicit.iter().map(|s| s.seat_id.as_str()).collect();
        let secs: Vec<&str> = explicit.iter().map(|s| s.section.as_str()).collect();
        let rows: Vec<i32> = explicit.iter().map(|s| s.row).collect();
        let nums: Vec<i32> = explicit.iter().map(|s| s.number).collect();
        let tiers: Vec<&str> = explicit.iter().map(|s| s.price_tier.as_str()).collect();
        let ranks: Vec<Option<i32>> = explicit.iter().map(|s| s.rank).collect();
        // Without a rank of its own, a seat is ranked like a generated one, its row's centre
        // taken from the explicit seats of that row.
        sqlx::query(
            "INSERT INTO seats (event_id, seat_id, section, row_no, number, tier, rank)
                 SELECT $1, x.seat_id, x.section, x.row_no, x.number, x.tier,
                        COALESCE(x.rank, (x.row_no - 1) * 20001
                            + abs(2 * x.number - (min(x.number) OVER w + max(x.number) OVER w)))
                 FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::text[], $7::int[])
                          AS x(seat_id, section, row_no, number, tier, rank)
                 WINDOW w AS (PARTITION BY x.section, x.row_no)",
        )
        .bind(id)
        .bind(&ids)
        .bind(&secs)
        .bind(&rows)
        .bind(&nums)
        .bind(&tiers)
        .bind(&ranks)
        .execute(&mut *tx)
        .await
        .during("insert the explicit seats")?;
    }
    let ranked = &req.seat_map.ranks;
    if !ranked.is_empty() {
        let ids: Vec<&str> = ranked.keys().map(String::as_str).collect();
        let ranks: Vec<i32> = ranked.values().copied().collect();
        let set = sqlx::query(
            "UPDATE seats s SET rank = x.rank
             FROM unnest($2::text[], $3::int[]) AS x(seat_id, rank)
             WHERE s.event_id = $1 AND s.seat_id = x.seat_id",
        )
        .bind(id)
        .bind(&ids)
        .bind(&ranks)
        .execute(&mut *tx)
        .await
        .during("set the seat map's ranks")?
        .rows_affected();
        if set != ids.len() as u64 {
            // Rolled back with the transaction: nothing of the event is written.
            return Err(Invalid::field("seat_map.ranks", "ranks name seats not in the map").into());
        }
    }
    if !req.ga_tiers.is_empty() {
        let names: Vec<&str> = req.ga_tiers.iter().map(|t| t.tier.as_str()).collect();
        let prices: Vec<i64> = req.ga_tiers.iter().map(|t| t.price).collect();
        let caps: Vec<i32> = req.ga_tiers.iter().map(|t| t.capacity).collect();
        let shards: Vec<i32> = req.ga_tiers.iter().map(|t| t.shards).collect();
        sqlx::query(
            "INSERT INTO ga_tiers (event_id, tier, price, capacity, shards)
                 SELECT $1, t, p, c, s FROM unnest($2::text[], $3::bigint[], $4::int[], $5::int[])
                     AS x(t, p, c, s)",
        )
        .bind(id)
        .bind(&names)
        .bind(&prices)
        .bind(&caps)
        .bind(&shards)
        .execute(&mut *tx)
        .await
        .during("insert the GA tiers")?;
        // The capacity is spread evenly: shard i gets capacity / shards, plus one for the
        // first capacity % shards shards, so the shards add up to exactly the capacity.
        sqlx::query(
                "INSERT INTO ga_counters (event_id, tier, shard, available)
                 SELECT $1, t.tier, g.i,
                        t.capacity / t.shards + CASE WHEN g.i < t.capacity % t.shards THEN 1 ELSE 0 END
                 FROM ga_tiers t, generate_series(0, t.shards - 1) AS g(i)
                 WHERE t.event_id = $1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await
            .during("insert the GA counters")?;
    }
    // The audit entry (issue 18) commits with the event; the seat map is summarised.
    let detail = serde_json::json!({
        "name": req.name, "sale_start": req.sale_start, "hold_ttl_s": req.hold_ttl_s,
        "max_tickets_per_account": req.max_tickets_per_account, "seats": seats,
        "price_tiers": req.price_tiers.len(), "ga_tiers": req.ga_tiers.len(),
    });
    audit::insert_tx(
        &mut tx,
        actor,
        "event.create",
        &format!("event:{id}"),
        Some(id),
        &detail,
    )
    .await
    .during("record the audit entry")?;
    tx.commit().await.during("commit the new event")?;
    Ok(true)
}

#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct GaCounts {
    pub tier: String,
    /// integer minor units
    pub price: i64,
    pub capacity: i32,
    pub shards: i32,
    pub available: i64,
    pub held: i64,
    pub sold: i64,
    /// Units of refunded/disputed orders held back (`refund_stock = "hold_back"`).
    pub held_back: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventCounts {
    pub id: String,
    pub name: String,
    pub venue: String,
    pub sale_start: DateTime<Utc>,
    pub hold_ttl_s: i32,
    pub max_tickets_per_account: i32,
    pub seats: i64,
    pub available: i64,
    pub held: i64,
    pub sold: i64,
    /// Seats of refunded/disputed orders held back (`refund_stock = "hold_back"`).
    pub held_back: i64,
    pub refund_stock: RefundStock,
    pub no_orphans: bool,
    /// Whether a ticket that went out may come back in.
    pub reentry: bool,
    /// Whether tickets may be transferred.
    pub transfers: bool,
    pub ga_tiers: Vec<GaCounts>,
}

type EventRow = (
    String,
    String,
    String,
    DateTime<Utc>,
    i32,
    i32,
    RefundStock,
    bool,
    bool,
    bool,
);

/// Counts from one snapshot (REPEATABLE READ), so seats and GA add up to the same moment.
/// A seat held past `held_until` counts as available: the next hold takes it. GA `held`
/// is what the counters hold (expired GA holds count until the sweeper returns them).
pub(super) async fn event_counts(pool: &PgPool, event: &str) -> Result<EventCounts> {
    if !shared::ids::is_valid_slug(event) {
        return Err(InventoryError::UnknownEvent);
    }
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .during("begin reading the event's counts")?;
    let row: Option<EventRow> = sqlx::query_as(
        "SELECT id, name, venue, sale_start, hold_ttl_s, max_tickets_per_account, refund_stock,
                no_orphans, reentry, transfers
         FROM events WHERE id = $1",
    )
    .bind(event)
    .fetch_optional(&mut *tx)
    .await
    .during("read the event")?;
    let Some((
        id,
        name,
        venue,
        sale_start,
        hold_ttl_s,
        max_tickets_per_account,
        refund_stock,
        no_orphans,
        reentry,
        transfers,
    )) = row
    else {
        return Err(InventoryError::UnknownEvent);
    };
    let (seats, available, held, sold, held_back): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE status = 'available'
                                 OR (status = 'held' AND held_until <= clock_timestamp())),
                count(*) FILTER (WHERE status = 'held' AND held_until > clock_timestamp()),
                count(*) FILTER (WHERE status = 'sold'),
                count(*) FILTER (WHERE status = 'held_back')
         FROM seats WHERE event_id = $1",
    )
    .bind(event)
    .fetch_one(&mut *tx)
    .await
    .during("count the seats")?;
    let ga_tiers: Vec<GaCounts> = sqlx::query_as(
        "SELECT t.tier, t.price, t.capacity, t.shards,
                COALESCE(sum(c.available), 0)::bigint AS available,
                (t.capacity - COALESCE(sum(c.available), 0) - COALESCE(sum(c.sold), 0)
                    - COALESCE(sum(c.held_back), 0))::bigint AS held,
                COALESCE(sum(c.sold), 0)::bigint AS sold,
                COALESCE(sum(c.held_back), 0)::bigint AS held_back
         FROM ga_tiers t LEFT JOIN ga_counters c USING (event_id, tier)
         WHERE t.event_id = $1
         GROUP BY t.tier, t.price, t.capacity, t.shards
         ORDER BY t.tier",
    )
    .bind(event)
    .fetch_all(&mut *tx)
    .await
    .during("count the GA units")?;
    tx.commit().await.during("finish reading the counts")?;
    Ok(EventCounts {
        id,
        name,
        venue,
        sale_start,
        hold_ttl_s,
        max_tickets_per_account,
        seats,
        available,
        held,
        sold,
        held_back,
        refund_stock,
        no_orphans,
        reentry,
        transfers,
        ga_tiers,
    })
}
