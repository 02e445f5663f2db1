//! The statements of the hold paths (seats here, GA units in `ga/repo.rs`): the hold
//! transaction and its settings, THE seat hold statement (usage, hold row and seats in one)
//! and the reading of its answer, and the reclaim of expired holds (the reads that explain a
//! refusal are in `refusal.rs`). Each returns [`InventoryError`] naming the statement that
//! failed.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::repo::{EndedHold, release_resources};
use crate::inventory::model::HoldKind;
use crate::platform::kept::KeptPool;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeSet;

type Result<T> = std::result::Result<T, InventoryError>;

/// What a hold statement did: a hold, or why nothing was written.
pub(crate) enum Attempt<T, S> {
    Done(T),
    /// Over the limit, or no such event.
    Limit,
    NotOnSale,
    /// Not enough to take. Seats: the requested seats that were free (fewer than requested).
    Short(S),
}

/// The connections of the hold statements: the main pool's settings and size, plus what every
/// hold statement wants, set once per connection (startup options) instead of by a statement
/// per hold, so a seat hold and a release are ONE autocommit statement each:
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
/// - `client_connection_check_interval = 200ms`: with no transaction around it, a statement
///   whose client has gone (booking killed, its connection cut) would still commit once the
///   lock it waits for is free. Postgres checks the socket while the statement runs and
///   aborts it instead, so a vanished request leaves nothing behind unless it had already
///   finished (the same window as a lost `COMMIT` answer in a transaction).
///
/// Nothing else runs on these connections: the settings would be wrong for money.
pub fn hold_pool(pool: &PgPool, async_commit: bool) -> KeptPool {
    let mut settings = vec![
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_seqscan", "off"),
        ("client_connection_check_interval", "200ms"),
    ];
    if async_commit {
        settings.push(("synchronous_commit", "off"));
    }
    // Transactions are rare here (see `KeptPool`): a quarter of the size, at least 2.
    let tx_size = (pool.options().get_max_connections() / 4).max(2);
    KeptPool::new(
        crate::platform::db::derived_pool(pool, &settings),
        crate::platform::db::derived_pool_of(pool, &settings, tx_size),
    )
}

/// A transaction on the hold connections (GA holds, whose ways may be rolled back).
pub(crate) async fn begin_hold_tx(
    hold_pool: &KeptPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    hold_pool.begin().await.during("begin the hold transaction")
}

/// Why a seat hold statement took nothing although the sale is on and the limit allows it.
pub(crate) enum SeatShort {
    /// The requested seats that were free (fewer than requested).
    Free(Vec<String>),
    /// The guarded statement ([`super::guard`]): the hold would strand these seats.
    Stranded(Vec<String>),
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

/// THE seat hold statement, all or nothing, so it needs no transaction around it:
/// - `wanted` locks the requested seats in `seat_id` order (a fixed order, so two overlapping
///   requests cannot deadlock) and keeps those available or whose hold has expired by the
///   database clock; under READ COMMITTED a row another transaction took while we waited is
///   re-checked after the lock and drops out, so the rows are exactly the seats we can take;
/// - `usage` adds `n` tickets to the account's usage only if EVERY requested seat is in
///   `wanted`, the sale has started and the event's limit allows it (concurrent requests of
///   one account cannot both pass: the row's lock re-checks the sum);
/// - `hold` is inserted only with the usage, with its seats (`seat_ids`: every later path
///   finds them by primary key), and `took` marks the wanted seats held only with the hold
///   (`expires_at` from the database clock).
///
/// So either all of it is written or nothing is. Locks are taken seats → usage, the order of
/// every release and expiry (hold → seats → shards → usage). One row per wanted seat (taken
/// when the hold column is set) or one row of NULLs; the last columns explain a refusal from
/// the statement's snapshot: whether the sale has started (NULL: no such event) and whether
/// the limit would allow `n` more. `bench/sql/hold_seats.sql` runs this text.
pub const HOLD_SEATS: &str = concat!(
    "
WITH wanted AS (
    SELECT s.seat_id, s.hold_id AS prev_hold, p.price
    FROM seats s JOIN price_tiers p ON p.event_id = s.event_id AND p.tier = s.tier
    WHERE s.event_id = $1 AND s.seat_id = ANY($4)
      AND (s.status = 'available' OR (s.status = 'held' AND s.held_until <= clock_timestamp()))
    ORDER BY s.seat_id
    FOR UPDATE OF s),",
    crate::seat_hold_writes_sql!("", "NULL::text[]")
);

/// The writing half of the seat hold statements ([`HOLD_SEATS`] and the guarded one in
/// `holds/guard.rs`), after the caller's `WITH` parts that end in `wanted` (the requested
/// seats it could lock and take, with `prev_hold` and `price`): `usage`, `hold` and `took`,
/// all or nothing, then the answer's columns. `$guard`: one more condition on the usage (so
/// on everything), e.g. `AND NOT EXISTS (...)`; `$last`: the last column (`text[]`).
#[macro_export]
macro_rules! seat_hold_writes_sql {
    ($guard:literal, $last:literal) => {
        concat!(
            "
usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, $2, $5 FROM events e
    WHERE e.id = $1 AND $5 <= e.max_tickets_per_account
      AND e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
      AND (SELECT count(*) FROM wanted) = cardinality($4::text[])
      ",
            $guard,
            "
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at, seat_ids)
    SELECT $3, e.id, $2, 'seats', NULL, $5,
           clock_timestamp() + make_interval(secs => e.hold_ttl_s),
           (SELECT array_agg(seat_id ORDER BY seat_id) FROM wanted)
    FROM events e, usage
    WHERE e.id = $1
    RETURNING expires_at),
took AS (
    UPDATE seats s SET status = 'held', hold_id = $3, held_until = h.expires_at
    FROM hold h, wanted w
    WHERE s.event_id = $1 AND s.seat_id = w.seat_id
    RETURNING s.seat_id)
SELECT (SELECT expires_at FROM hold), (SELECT count(*) FROM took),
       w.seat_id, w.prev_hold, w.price,
       (SELECT e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
          FROM events e WHERE e.id = $1),
       (SELECT COALESCE(a.tickets, 0) + $5 <= e.max_tickets_per_account
          FROM events e LEFT JOIN account_event_usage a
            ON a.event_id = e.id AND a.account_id = $2
         WHERE e.id = $1),
       ",
            $crate::live_until_ms_sql!("$2", "$1", "(SELECT expires_at FROM hold)", "NULL"),
            ",
       ",
            $last,
            "
FROM (VALUES (1)) AS one (x) LEFT JOIN wanted w ON true"
        )
    };
}

/// One row of a seat hold statement's answer (see [`HOLD_SEATS`]): the hold's expiry (NULL:
/// nothing written), seats taken, one wanted seat (`seat_id`, its previous hold, its price),
/// whether the sale is on, whether the limit allows the request, the checkout end, and the
/// seats the guard found stranded.
pub type SeatRow = (
    Option<DateTime<Utc>>,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<bool>,
    Option<bool>,
    i64,
    Option<Vec<String>>,
);

/// What a seat hold statement took for one request, before the holds whose expired seats it
/// reclaimed are tidied ([`finish_seats`]).
pub(crate) struct SeatsTook {
    pub hold_id: String,
    pub expires_at: DateTime<Utc>,
    /// (seat_id, previous hold, price) for the seats the statement took.
    seats: Vec<(String, Option<String>, i64)>,
    live_until_ms: i64,
}

/// One seat hold: THE seat hold statement (one round trip, its own transaction), then
/// (rarely) the tidying of holds whose expired seats it reclaimed, in a transaction of its own:
/// until then such a hold is an expired hold like any other, which the sweeper would end the
/// same way (its other seats and usage back; the reclaimed seat is no longer its own).
///
/// `guard`: run the guarded statement instead ([`super::guard`]: same steps, and nothing is
/// written when the hold would strand a seat).
pub(crate) async fn take_seats_tx(
    hold_pool: &KeptPool,
    event: &str,
    account: &str,
    seats: &[String],
    n: i32,
    guard: bool,
) -> Result<Attempt<SeatsTaken, SeatShort>> {
    let hold_id = shared::ids::new_id();
    let rows = hold_seats_rows(hold_pool, event, account, &hold_id, seats, n, guard).await?;
    Ok(finish_attempt(hold_pool, seats_outcome(hold_id, seats.len(), rows)?).await)
}

/// [`finish_seats`] for a hold the statement took; a refusal as it is.
pub(crate) async fn finish_attempt(
    hold_pool: &KeptPool,
    attempt: Attempt<SeatsTook, SeatShort>,
) -> Attempt<SeatsTaken, SeatShort> {
    match attempt {
        Attempt::Done(took) => Attempt::Done(finish_seats(hold_pool, took).await),
        Attempt::Limit => Attempt::Limit,
        Attempt::NotOnSale => Attempt::NotOnSale,
        Attempt::Short(s) => Attempt::Short(s),
    }
}

/// Runs the seat hold statement (or the guarded one) for one request; its answer's rows.
pub(crate) async fn hold_seats_rows(
    hold_pool: &KeptPool,
    event: &str,
    account: &str,
    hold_id: &str,
    seats: &[String],
    n: i32,
    guard: bool,
) -> Result<Vec<SeatRow>> {
    let (statement, what) = if guard {
        (
            super::guard::HOLD_SEATS_GUARDED,
            "take the requested seats (orphan guard)",
        )
    } else {
        (HOLD_SEATS, "take the requested seats")
    };
    sqlx::query_as(statement)
        .bind(event)
        .bind(account)
        .bind(hold_id)
        .bind(seats)
        .bind(n)
        .fetch_all(hold_pool)
        .await
        .during(what)
}

/// What one request's rows of a seat hold statement say: the seats it took, or why nothing
/// was written. `requested`: how many seats the request named.
pub(crate) fn seats_outcome(
    hold_id: String,
    requested: usize,
    rows: Vec<SeatRow>,
) -> Result<Attempt<SeatsTook, SeatShort>> {
    let stranded = rows.first().and_then(|r| r.8.clone()).unwrap_or_default();
    let Some(first) = rows.first() else {
        return Err(InventoryError::Db {
            statement: "take the requested seats",
            source: sqlx::Error::RowNotFound,
        });
    };
    let (expires_at, took, on_sale, limit_ok, live_until_ms) =
        (first.0, first.1, first.5, first.6, first.7);
    let wanted: Vec<(String, Option<String>, i64)> = rows
        .into_iter()
        .filter_map(|r| Some((r.2?, r.3, r.4?)))
        .collect();
    let Some(expires_at) = expires_at else {
        // Nothing was written. Why, in the order the checks mean to the fan.
        return Ok(match (on_sale, limit_ok) {
            // No such event: the limit read says so (`limit_refusal`).
            (None, _) | (_, Some(false) | None) => Attempt::Limit,
            (Some(false), _) => Attempt::NotOnSale,
            _ if wanted.len() < requested => Attempt::Short(SeatShort::Free(
                wanted.into_iter().map(|(s, _, _)| s).collect(),
            )),
            _ if !stranded.is_empty() => Attempt::Short(SeatShort::Stranded(stranded)),
            // Every check passed in the snapshot, but the usage row (locked after it) had
            // moved on: a concurrent hold of the same account took the room.
            _ => Attempt::Limit,
        });
    };
    if took != wanted.len() as i64 || wanted.len() != requested {
        // Cannot happen: the hold is only written with every wanted seat, locked by us.
        tracing::error!(
            hold_id,
            took,
            wanted = wanted.len(),
            requested,
            "a seat hold took a different number of seats than it locked"
        );
    }
    Ok(Attempt::Done(SeatsTook {
        hold_id,
        expires_at,
        seats: wanted,
        live_until_ms,
    }))
}

/// Ends the holds whose expired seats `took` reclaimed (rarely any), and the answer.
pub(crate) async fn finish_seats(hold_pool: &KeptPool, took: SeatsTook) -> SeatsTaken {
    let reclaimed: BTreeSet<&str> = took
        .seats
        .iter()
        .filter_map(|(_, h, _)| h.as_deref())
        .collect();
    let mut ended = Vec::new();
    if !reclaimed.is_empty() {
        let reclaimed: Vec<&str> = reclaimed.into_iter().collect();
        ended = crate::platform::db::retry(2, || async {
            let mut tx = begin_hold_tx(hold_pool).await?;
            let ended = expire_reclaimed(&mut tx, &reclaimed).await?;
            tx.commit()
                .await
                .during("commit the expiry of reclaimed holds")?;
            Ok::<_, InventoryError>(ended)
        })
        .await
        .unwrap_or_else(|e| {
            // The sweeper ends them later, exactly the same way.
            tracing::warn!(error = ?e, "could not end the holds of reclaimed seats now");
            Vec::new()
        });
    }
    SeatsTaken {
        hold_id: took.hold_id,
        expires_at: took.expires_at,
        seats: took.seats.into_iter().map(|(s, _, p)| (s, p)).collect(),
        reclaimed: ended.into_iter().map(|h| h.kind).collect(),
        live_until_ms: took.live_until_ms,
    }
}

/// Expires the holds of `$1` that are still active and due, skipping those another
/// transaction has locked ([`expire_reclaimed`]). The locking sub-select is an `ARRAY(...)`
/// InitPlan, run once whatever the plan (docs/decisions.md, "Claims lock their batch once").
pub const EXPIRE_RECLAIMED: &str = "UPDATE holds h SET status = 'expired'
         WHERE h.id = ANY (ARRAY(
             SELECT id FROM holds
             WHERE id = ANY($1) AND status = 'active' AND expires_at <= clock_timestamp()
             ORDER BY id
             FOR UPDATE SKIP LOCKED))
         RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity";

/// The previous holds of seats we just reclaimed: those still `active` become `expired`
/// (conditional on the status, so exactly once) and give back their other seats and their
/// usage. A hold another transaction has locked is skipped: whoever holds it (the sweeper,
/// a release, another reclaimer) ends it, or the sweeper does later. Skipping also means we
/// never wait on a hold row while holding seat locks the sweeper may be waiting for.
async fn expire_reclaimed(conn: &mut PgConnection, hold_ids: &[&str]) -> Result<Vec<EndedHold>> {
    let ended: Vec<EndedHold> = sqlx::query_as(EXPIRE_RECLAIMED)
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

/// Expires account `$2`'s due holds in event `$1` ([`expire_account_holds`]). The locking
/// sub-select is an `ARRAY(...)` InitPlan, run once whatever the plan (docs/decisions.md,
/// "Claims lock their batch once").
pub const EXPIRE_OWN: &str = "UPDATE holds h SET status = 'expired'
         WHERE h.id = ANY (ARRAY(
             SELECT id FROM holds
             WHERE event_id = $1 AND account_id = $2 AND status = 'active'
               AND expires_at <= clock_timestamp()
             ORDER BY expires_at, id
             FOR UPDATE))
         RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity";

/// Expires one account's own expired active holds for an event (what the sweeper would do),
/// so a fan whose earlier hold ran out is not refused by the ticket limit until the next
/// sweep. Returns how many holds it ended.
///
/// Waits (plain `FOR UPDATE`, not `SKIP LOCKED`) when a sweeper is expiring the same hold at
/// that moment: skipping it would return before the sweeper's commit gave the usage back, and
/// the fan's retry would be refused `LIMIT_EXCEEDED` for nothing. Locks in the sweeper's order
/// (`expires_at, id`), so the two never deadlock; the set is one account's few holds.
pub(crate) async fn expire_account_holds(
    pool: &KeptPool,
    event: &str,
    account: &str,
) -> Result<u64> {
    crate::platform::db::retry(1, || async {
        let mut tx = pool.begin().await.during("begin expiring own holds")?;
        let ended: Vec<EndedHold> = sqlx::query_as(EXPIRE_OWN)
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
