//! The statements of the hold paths (seats here, GA units in `ga/repo.rs`): the hold
//! transaction and its settings, THE seat hold statement (usage, hold row and seats in one),
//! the reclaim of expired holds, and the reads that explain a refusal. Each returns [`InventoryError`] naming
//! the statement that failed.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::repo::{EndedHold, release_resources};
use crate::inventory::model::{HoldKind, HoldStatus, missing_from};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeSet, HashSet};

type Result<T> = std::result::Result<T, InventoryError>;

/// Why a hold transaction did not produce a hold (it was rolled back).
pub(crate) enum Attempt<T> {
    Done(T),
    /// The usage upsert refused: over the limit, or no such event.
    Limit,
    NotOnSale,
    /// Seats: the ones the statement could take (fewer than requested). GA: units left.
    Short(T),
}

/// Starts a hold transaction, in ONE round trip with its settings:
/// - holds move no money, so with `async_commit_holds` the commit does not wait for the WAL
///   flush (a crash can lose the last few milliseconds of holds, never a sale; see
///   docs/decisions.md);
/// - `plan_cache_mode = force_generic_plan`: every hold statement is a primary-key or hold-id
///   lookup whose best plan never depends on the values, but with array parameters Postgres
///   would re-plan them on every execution (custom plans cost ~0.2 ms each, measured: about a
///   third of Postgres' work per hold);
/// - `enable_seqscan = off`: a generic plan is made ONCE per connection, from the statistics
///   of that moment, and kept for the connection's life. Right after a fresh start (empty
///   `holds` and `account_event_usage`, analysed) a sequential scan looks free, so the release
///   statements were planned as scans of those tables and stayed scans while they grew: that
///   is why the first benchmark run, async commits, cost twice the Postgres CPU of the durable
///   run after it (issue 16). Every statement here is an index lookup; this keeps it one.
pub(crate) async fn begin_hold_tx(
    pool: &PgPool,
    async_commit: bool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    // One `set_config(…, true)` statement (= `SET LOCAL`) for all settings: one statement for
    // Postgres to run instead of three.
    let begin = if async_commit {
        "BEGIN; SELECT set_config('plan_cache_mode', 'force_generic_plan', true), \
         set_config('enable_seqscan', 'off', true), set_config('synchronous_commit', 'off', true)"
    } else {
        "BEGIN; SELECT set_config('plan_cache_mode', 'force_generic_plan', true), \
         set_config('enable_seqscan', 'off', true)"
    };
    pool.begin_with(begin)
        .await
        .during("begin the hold transaction")
}

/// The refusal for a refused usage upsert: no such event, or LIMIT_EXCEEDED with the numbers
/// (read after the rollback, for the message only).
pub(crate) async fn limit_refusal(
    pool: &PgPool,
    event: &str,
    account: &str,
    requested: i32,
) -> InventoryError {
    let row: Result<Option<(i32, i32)>> = sqlx::query_as(
        "SELECT e.max_tickets_per_account, COALESCE(u.tickets, 0)
         FROM events e
         LEFT JOIN account_event_usage u ON u.event_id = e.id AND u.account_id = $2
         WHERE e.id = $1",
    )
    .bind(event)
    .bind(account)
    .fetch_optional(pool)
    .await
    .during("read the ticket limit and usage");
    match row {
        Err(e) => e,
        Ok(None) => InventoryError::UnknownEvent,
        Ok(Some((limit, held))) => InventoryError::LimitExceeded {
            limit,
            held,
            requested,
        },
    }
}

/// The refusal for a hold before the sale start: no such event, or SALE_NOT_STARTED.
pub(crate) async fn sale_not_started(pool: &PgPool, event: &str) -> InventoryError {
    let start: Result<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT sale_start FROM events WHERE id = $1")
            .bind(event)
            .fetch_optional(pool)
            .await
            .during("read the sale start");
    match start {
        Err(e) => e,
        Ok(None) => InventoryError::UnknownEvent,
        Ok(Some(sale_start)) => InventoryError::SaleNotStarted { sale_start },
    }
}

pub(crate) struct SeatsTaken {
    pub hold_id: String,
    pub expires_at: DateTime<Utc>,
    /// (seat_id, price) for the seats the statement took.
    pub seats: Vec<(String, i64)>,
    /// Kinds of the expired holds this transaction ended because it reclaimed their seats.
    pub reclaimed: Vec<HoldKind>,
    /// The account's checkout end with this hold (`platform::session_until`).
    pub live_until_ms: i64,
}

/// THE seat hold statement: the usage upsert (`n` more tickets for the account, only within
/// the event's limit: concurrent requests of one account cannot both pass), the hold row (only
/// if the usage passed and the sale has started, `expires_at` from the database clock), and
/// the seats. The seat part locks the requested seats in `seat_id` order (a fixed order, so
/// two overlapping requests cannot deadlock on each other) and keeps only those that are
/// available or whose hold has expired by the database clock; under READ COMMITTED a row
/// another transaction took while we waited is re-checked after the lock and drops out, so the
/// rows returned are exactly what we got. One row per seat taken, or one row with NULL seat
/// when none was: the first two columns say whether the usage passed and when the hold
/// expires (NULL: not on sale). `bench/sql/hold_seats.sql` runs this text.
const HOLD_SEATS: &str = concat!(
    "
WITH usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, $2, $5 FROM events e
    WHERE e.id = $1 AND $5 <= e.max_tickets_per_account
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
    SELECT $3, e.id, $2, 'seats', NULL, $5,
           clock_timestamp() + make_interval(secs => e.hold_ttl_s)
    FROM events e, usage
    WHERE e.id = $1 AND e.sale_start <= clock_timestamp()
    RETURNING expires_at),
wanted AS (
    SELECT seat_id, hold_id AS prev_hold FROM seats
    WHERE event_id = $1 AND seat_id = ANY($4)
      AND (status = 'available' OR (status = 'held' AND held_until <= clock_timestamp()))
    ORDER BY seat_id
    FOR UPDATE),
took AS (
    UPDATE seats s SET status = 'held', hold_id = $3, held_until = h.expires_at
    FROM hold h, wanted w, price_tiers p
    WHERE s.event_id = $1 AND s.seat_id = w.seat_id
      AND p.event_id = $1 AND p.tier = s.tier
    RETURNING s.seat_id, w.prev_hold, p.price)
SELECT EXISTS (SELECT 1 FROM usage), (SELECT expires_at FROM hold),
       t.seat_id, t.prev_hold, t.price, ",
    crate::live_until_ms_sql!("$2", "$1", "(SELECT expires_at FROM hold)", "NULL"),
    "
FROM (VALUES (1)) AS one (x) LEFT JOIN took t ON true"
);

/// One hold transaction: THE seat hold statement, then (rarely) tidying of reclaimed holds.
/// Three round trips in the common case: begin, the statement, commit.
pub(crate) async fn take_seats_tx(
    pool: &PgPool,
    async_commit: bool,
    event: &str,
    account: &str,
    seats: &[String],
    n: i32,
) -> Result<Attempt<SeatsTaken>> {
    type Row = (
        bool,
        Option<DateTime<Utc>>,
        Option<String>,
        Option<String>,
        Option<i64>,
        i64,
    );
    let hold_id = shared::ids::new_id();
    let mut tx = begin_hold_tx(pool, async_commit).await?;
    let rows: Vec<Row> = sqlx::query_as(HOLD_SEATS)
        .bind(event)
        .bind(account)
        .bind(&hold_id)
        .bind(seats)
        .bind(n)
        .fetch_all(&mut *tx)
        .await
        .during("take the requested seats")?;
    let (usage_ok, expires_at, live_until_ms) =
        rows.first().map_or((false, None, 0), |r| (r.0, r.1, r.5));
    if !usage_ok {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Limit);
    }
    let Some(expires_at) = expires_at else {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::NotOnSale);
    };
    let rows: Vec<(String, Option<String>, i64)> = rows
        .into_iter()
        .filter_map(|(_, _, seat, prev, price, _)| Some((seat?, prev, price?)))
        .collect();
    if rows.len() < seats.len() {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Short(SeatsTaken {
            hold_id,
            expires_at,
            seats: rows.into_iter().map(|(s, _, p)| (s, p)).collect(),
            reclaimed: Vec::new(),
            live_until_ms,
        }));
    }
    let reclaimed: BTreeSet<&str> = rows.iter().filter_map(|(_, h, _)| h.as_deref()).collect();
    let mut ended = Vec::new();
    if !reclaimed.is_empty() {
        let reclaimed: Vec<&str> = reclaimed.into_iter().collect();
        ended = expire_reclaimed(&mut tx, &reclaimed).await?;
    }
    tx.commit().await.during("commit the hold")?;
    Ok(Attempt::Done(SeatsTaken {
        hold_id,
        expires_at,
        seats: rows.into_iter().map(|(s, _, p)| (s, p)).collect(),
        reclaimed: ended.into_iter().map(|h| h.kind).collect(),
        live_until_ms,
    }))
}

/// The previous holds of seats we just reclaimed: those still `active` become `expired`
/// (conditional on the status, so exactly once) and give back their other seats and their
/// usage. A hold another transaction has locked is skipped: whoever holds it (the sweeper,
/// a release, another reclaimer) ends it, or the sweeper does later. Skipping also means we
/// never wait on a hold row while holding seat locks the sweeper may be waiting for.
async fn expire_reclaimed(conn: &mut PgConnection, hold_ids: &[&str]) -> Result<Vec<EndedHold>> {
    let ended: Vec<EndedHold> = sqlx::query_as(
        "UPDATE holds h SET status = 'expired'
         WHERE h.id IN (
             SELECT id FROM holds
             WHERE id = ANY($1) AND status = 'active' AND expires_at <= clock_timestamp()
             ORDER BY id
             FOR UPDATE SKIP LOCKED)
         RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity",
    )
    .bind(hold_ids)
    .fetch_all(&mut *conn)
    .await
    .during("expire the holds of reclaimed seats")?;
    if !ended.is_empty() {
        release_resources(conn, &ended)
            .await
            .during("release what reclaimed holds still held")?;
    }
    Ok(ended)
}

/// The refusal for a seat statement that came up short: unknown seat ids (listed), or the
/// seats we could not take (SEAT_TAKEN, listed).
pub(crate) async fn seat_refusal(
    pool: &PgPool,
    event: &str,
    requested: &[String],
    taken: SeatsTaken,
) -> InventoryError {
    let existing: Result<Vec<String>> =
        sqlx::query_scalar("SELECT seat_id FROM seats WHERE event_id = $1 AND seat_id = ANY($2)")
            .bind(event)
            .bind(requested)
            .fetch_all(pool)
            .await
            .during("read which requested seats exist");
    let existing = match existing {
        Ok(v) => v,
        Err(e) => return e,
    };
    let existing: HashSet<&str> = existing.iter().map(String::as_str).collect();
    let unknown = missing_from(requested, &existing);
    if !unknown.is_empty() {
        return InventoryError::UnknownSeats {
            seats: unknown.into_iter().map(str::to_owned).collect(),
        };
    }
    let got: HashSet<&str> = taken.seats.iter().map(|(s, _)| s.as_str()).collect();
    InventoryError::SeatTaken {
        seats: missing_from(requested, &got)
            .into_iter()
            .map(str::to_owned)
            .collect(),
    }
}

/// Expires one account's own expired active holds for an event (what the sweeper would do),
/// so a fan whose earlier hold ran out is not refused by the ticket limit until the next
/// sweep. Returns how many holds it ended.
///
/// Waits (plain `FOR UPDATE`, not `SKIP LOCKED`) when a sweeper is expiring the same hold at
/// that moment: skipping it would return before the sweeper's commit gave the usage back, and
/// the fan's retry would be refused `LIMIT_EXCEEDED` for nothing. Locks in the sweeper's order
/// (`expires_at, id`), so the two never deadlock; the set is one account's few holds.
pub(crate) async fn expire_account_holds(pool: &PgPool, event: &str, account: &str) -> Result<u64> {
    crate::platform::db::retry(1, || async {
        let mut tx = pool.begin().await.during("begin expiring own holds")?;
        let ended: Vec<EndedHold> = sqlx::query_as(
            "UPDATE holds h SET status = 'expired'
             WHERE h.id IN (
                 SELECT id FROM holds
                 WHERE event_id = $1 AND account_id = $2 AND status = 'active'
                   AND expires_at <= clock_timestamp()
                 ORDER BY expires_at, id
                 FOR UPDATE)
             RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity",
        )
        .bind(event)
        .bind(account)
        .fetch_all(&mut *tx)
        .await
        .during("expire the account's own expired holds")?;
        if !ended.is_empty() {
            release_resources(&mut tx, &ended)
                .await
                .during("release what the account's expired holds held")?;
        }
        tx.commit().await.during("commit expiring own holds")?;
        Ok(ended.len() as u64)
    })
    .await
}

/// A hold's status and owner (to explain why a release changed nothing).
pub(crate) async fn hold_status(pool: &PgPool, hold: &str) -> Result<Option<(HoldStatus, String)>> {
    sqlx::query_as("SELECT status, account_id FROM holds WHERE id = $1")
        .bind(hold)
        .fetch_optional(pool)
        .await
        .during("read the hold's status")
}
