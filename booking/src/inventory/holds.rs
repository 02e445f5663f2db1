//! Seat holds: take seats for a while, release them, and the transaction helpers the order
//! and payment flows build on.
//!
//! Guarantees:
//! - A seat is taken by ONE conditional statement that locks the requested seats in `seat_id`
//!   order and takes only those that are `available` or `held` past `held_until`
//!   (`clock_timestamp()`); fewer rows than requested rolls the whole transaction back. Expired
//!   holds are reclaimed by the hold statement itself; the sweeper only tidies.
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
//!   the hold was not in one of `from_statuses` (nothing changed). Example: order expiry uses
//!   `release_hold_tx(conn, id, &["ordered"], "expired")`.
//! - [`pin_hold_tx`]`(conn, hold_id, account, until_interval_s)`: an `active`, unexpired hold
//!   of `account` becomes `ordered`; its `expires_at` and its seats' `held_until` move to
//!   `clock_timestamp() + until_interval_s`. Returns what the order needs (kind, event,
//!   quantity, seats with tier prices, GA tier and price). `None` (and nothing changed) when
//!   the hold is not active, not the account's, expired, or lost a seat meanwhile.
//! - [`sell_hold_tx`]`(conn, hold_id, order_id, account)`: an `ordered` hold of `account`
//!   becomes `sold`: its seats `sold` (one conditional `UPDATE`), GA units counted as sold on
//!   their shards, one ticket per seat/unit inserted (`UNIQUE (event_id, seat_id)` is the
//!   backstop). [`SellOutcome::Lost`] when a seat no longer belongs to the hold (its pin ran
//!   out and someone reclaimed it): nothing was changed, roll back and refund.
//!   [`SellOutcome::NotOrdered`] when the hold is not `ordered` for that account.

use crate::app::state::AppState;
use crate::platform::auth::Admitted;
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use sqlx::{Acquire, PgConnection};
use std::collections::{BTreeSet, HashSet};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/events/{event}/holds", post(create_hold))
        .route("/api/holds/{hold}", delete(delete_hold))
}

// ---------------------------------------------------------------------------------------------
// Public transaction helpers
// ---------------------------------------------------------------------------------------------

/// A hold that [`release_hold_tx`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedHold {
    pub hold_id: String,
    pub event_id: String,
    pub account_id: String,
    /// `seats` or `ga`.
    pub kind: String,
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
    /// `seats` or `ga`.
    pub kind: String,
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
    pub kind: String,
    pub quantity: i32,
}

/// Ends a hold (conditional status change) and releases what it held. See the module docs.
pub async fn release_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    from_statuses: &[&str],
    to_status: &str,
) -> sqlx::Result<Option<ReleasedHold>> {
    release_hold_inner(conn, hold_id, None, from_statuses, to_status).await
}

async fn release_hold_inner(
    conn: &mut PgConnection,
    hold_id: &str,
    account: Option<&str>,
    from_statuses: &[&str],
    to_status: &str,
) -> sqlx::Result<Option<ReleasedHold>> {
    let ended: Option<EndedHold> = sqlx::query_as(
        "UPDATE holds SET status = $2
         WHERE id = $1 AND status = ANY($3) AND ($4::text IS NULL OR account_id = $4)
         RETURNING id, event_id, account_id, kind, quantity",
    )
    .bind(hold_id)
    .bind(to_status)
    .bind(from_statuses)
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
        .filter(|h| h.kind == "seats")
        .map(|h| h.id.as_str())
        .collect();
    let ga_holds: Vec<&str> = holds
        .iter()
        .filter(|h| h.kind == "ga")
        .map(|h| h.id.as_str())
        .collect();
    let mut seats_released = 0;
    if !seat_holds.is_empty() {
        // Only seats that still belong to these holds: a reclaimed seat carries another
        // hold_id by now and must not be touched. Locked in seat order like the hold path.
        seats_released = sqlx::query(
            "WITH doomed AS (
                 SELECT event_id, seat_id FROM seats
                 WHERE hold_id = ANY($1) AND status = 'held'
                 ORDER BY event_id, seat_id
                 FOR UPDATE)
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

#[derive(sqlx::FromRow)]
struct PinRow {
    event_id: String,
    kind: String,
    ga_tier: Option<String>,
    quantity: i32,
    expires_at: DateTime<Utc>,
}

/// Pins an active hold for an order. See the module docs. Runs inside a savepoint so that
/// `None` always means "nothing changed".
pub async fn pin_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    account: &str,
    until_interval_s: i64,
) -> sqlx::Result<Option<PinnedHold>> {
    let mut sp = conn.begin().await?;
    let row: Option<PinRow> = sqlx::query_as(
        "UPDATE holds
         SET status = 'ordered',
             expires_at = clock_timestamp() + make_interval(secs => $3::double precision)
         WHERE id = $1 AND account_id = $2 AND status = 'active'
           AND expires_at > clock_timestamp()
         RETURNING event_id, kind, ga_tier, quantity, expires_at",
    )
    .bind(hold_id)
    .bind(account)
    .bind(until_interval_s as f64)
    .fetch_optional(&mut *sp)
    .await?;
    let Some(row) = row else {
        sp.rollback().await?;
        return Ok(None);
    };
    let mut pinned = PinnedHold {
        hold_id: hold_id.to_owned(),
        event_id: row.event_id.clone(),
        kind: row.kind.clone(),
        quantity: row.quantity,
        expires_at: row.expires_at,
        seats: Vec::new(),
        ga_tier: row.ga_tier.clone(),
        ga_price: None,
        total: 0,
    };
    if row.kind == "seats" {
        let mut seats: Vec<PinnedSeat> = sqlx::query_as(
            "WITH mine AS (
                 SELECT seat_id FROM seats
                 WHERE event_id = $1 AND hold_id = $2 AND status = 'held'
                 ORDER BY seat_id
                 FOR UPDATE)
             UPDATE seats s SET held_until = $3
             FROM mine m, price_tiers p
             WHERE s.event_id = $1 AND s.seat_id = m.seat_id
               AND p.event_id = $1 AND p.tier = s.tier
             RETURNING s.seat_id, s.tier, p.price",
        )
        .bind(&row.event_id)
        .bind(hold_id)
        .bind(row.expires_at)
        .fetch_all(&mut *sp)
        .await?;
        if i32::try_from(seats.len()).ok() != Some(row.quantity) {
            // A seat was reclaimed between the hold's expiry check and the lock.
            sp.rollback().await?;
            return Ok(None);
        }
        seats.sort_by(|a, b| a.seat_id.cmp(&b.seat_id));
        pinned.total = seats.iter().map(|s| s.price).sum();
        pinned.seats = seats;
    } else {
        let price: i64 =
            sqlx::query_scalar("SELECT price FROM ga_tiers WHERE event_id = $1 AND tier = $2")
                .bind(&row.event_id)
                .bind(&row.ga_tier)
                .fetch_one(&mut *sp)
                .await?;
        pinned.ga_price = Some(price);
        pinned.total = price * i64::from(row.quantity);
    }
    sp.commit().await?;
    Ok(Some(pinned))
}

/// Sells an ordered hold. See the module docs. Runs inside a savepoint so that `Lost` and
/// `NotOrdered` always mean "nothing changed".
pub async fn sell_hold_tx(
    conn: &mut PgConnection,
    hold_id: &str,
    order_id: &str,
    account: &str,
) -> sqlx::Result<SellOutcome> {
    let mut sp = conn.begin().await?;
    let row: Option<(String, String, Option<String>, i32)> = sqlx::query_as(
        "UPDATE holds SET status = 'sold'
         WHERE id = $1 AND account_id = $2 AND status = 'ordered'
         RETURNING event_id, kind, ga_tier, quantity",
    )
    .bind(hold_id)
    .bind(account)
    .fetch_optional(&mut *sp)
    .await?;
    let Some((event_id, kind, ga_tier, quantity)) = row else {
        sp.rollback().await?;
        return Ok(SellOutcome::NotOrdered);
    };
    let tickets = if kind == "seats" {
        let mut sold: Vec<String> = sqlx::query_scalar(
            "WITH mine AS (
                 SELECT seat_id FROM seats
                 WHERE event_id = $1 AND hold_id = $2 AND status = 'held'
                 ORDER BY seat_id
                 FOR UPDATE)
             UPDATE seats s SET status = 'sold', order_id = $3, held_until = NULL
             FROM mine m
             WHERE s.event_id = $1 AND s.seat_id = m.seat_id
             RETURNING s.seat_id",
        )
        .bind(&event_id)
        .bind(hold_id)
        .bind(order_id)
        .fetch_all(&mut *sp)
        .await?;
        if i32::try_from(sold.len()).ok() != Some(quantity) {
            sp.rollback().await?;
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
        sqlx::query(
            "WITH items AS (SELECT shard, quantity FROM hold_ga_items WHERE hold_id = $1),
             locked AS (
                 SELECT c.shard, items.quantity
                 FROM ga_counters c JOIN items USING (shard)
                 WHERE c.event_id = $2 AND c.tier = $3
                 ORDER BY c.shard
                 FOR UPDATE OF c)
             UPDATE ga_counters c SET sold = c.sold + l.quantity
             FROM locked l
             WHERE c.event_id = $2 AND c.tier = $3 AND c.shard = l.shard",
        )
        .bind(hold_id)
        .bind(&event_id)
        .bind(&ga_tier)
        .execute(&mut *sp)
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
    .execute(&mut *sp)
    .await?;
    sp.commit().await?;
    Ok(SellOutcome::Sold { event_id, tickets })
}

// ---------------------------------------------------------------------------------------------
// Pieces shared by the seat and GA hold paths
// ---------------------------------------------------------------------------------------------

/// Starts a hold transaction, in ONE round trip with its settings:
/// - holds move no money, so with `async_commit_holds` the commit does not wait for the WAL
///   flush (a crash can lose the last few milliseconds of holds, never a sale; see
///   docs/decisions.md);
/// - `plan_cache_mode = force_generic_plan`: every hold statement is a primary-key or hold-id
///   lookup whose best plan never depends on the values, but with array parameters Postgres
///   would re-plan them on every execution (custom plans cost ~0.2 ms each, measured: about a
///   third of Postgres' work per hold).
pub(crate) async fn begin_hold_tx(
    state: &AppState,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    if state.config.booking.async_commit_holds {
        state
            .pool
            .begin_with(
                "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
                 SET LOCAL synchronous_commit = off",
            )
            .await
    } else {
        state
            .pool
            .begin_with("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
            .await
    }
}

/// Adds `n` tickets to the account's usage for the event if that stays within the event's
/// limit: ONE conditional upsert, so concurrent requests of one account cannot both pass.
/// `false` when over the limit or the event does not exist (the caller tells them apart
/// after rolling back).
pub(crate) async fn reserve_usage(
    conn: &mut PgConnection,
    event: &str,
    account: &str,
    n: i32,
) -> sqlx::Result<bool> {
    let row: Option<i32> = sqlx::query_scalar(
        "INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
         SELECT e.id, $2, $3 FROM events e
         WHERE e.id = $1 AND $3 <= e.max_tickets_per_account
         ON CONFLICT (event_id, account_id) DO UPDATE
             SET tickets = u.tickets + EXCLUDED.tickets
             WHERE u.tickets + EXCLUDED.tickets
                   <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
         RETURNING u.tickets",
    )
    .bind(event)
    .bind(account)
    .bind(n)
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// Inserts the hold row with `expires_at = clock_timestamp() + hold_ttl_s`, only if the
/// event's sale has started. Returns `expires_at`, or `None` before the sale start.
pub(crate) async fn insert_hold(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    account: &str,
    ga_tier: Option<&str>,
    quantity: i32,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar(
        "INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
         SELECT $1, e.id, $3, CASE WHEN $4::text IS NULL THEN 'seats' ELSE 'ga' END, $4, $5,
                clock_timestamp() + make_interval(secs => e.hold_ttl_s)
         FROM events e
         WHERE e.id = $2 AND e.sale_start <= clock_timestamp()
         RETURNING expires_at",
    )
    .bind(hold_id)
    .bind(event)
    .bind(account)
    .bind(ga_tier)
    .bind(quantity)
    .fetch_optional(conn)
    .await
}

/// Why a hold transaction did not produce a hold (it was rolled back).
pub(crate) enum Attempt<T> {
    Done(T),
    /// The usage upsert refused: over the limit, or no such event.
    Limit,
    NotOnSale,
    /// Seats: the ones the statement could take (fewer than requested). GA: units left.
    Short(T),
}

/// The 4xx for a refused usage upsert: 404 when the event does not exist, else 409
/// LIMIT_EXCEEDED with the numbers (read after the rollback, for the message only).
pub(crate) async fn limit_refusal(
    state: &AppState,
    event: &str,
    account: &str,
    requested: i32,
) -> ApiError {
    let row: Result<Option<(i32, i32)>, _> = sqlx::query_as(
        "SELECT e.max_tickets_per_account, COALESCE(u.tickets, 0)
         FROM events e
         LEFT JOIN account_event_usage u ON u.event_id = e.id AND u.account_id = $2
         WHERE e.id = $1",
    )
    .bind(event)
    .bind(account)
    .fetch_optional(&state.pool)
    .await;
    match row {
        Err(e) => e.into(),
        Ok(None) => unknown_event(),
        Ok(Some((limit, held))) => ApiError::conflict(
            codes::LIMIT_EXCEEDED,
            format!("at most {limit} tickets per account for this event"),
        )
        .with("limit", limit)
        .with("held", held)
        .with("requested", requested),
    }
}

pub(crate) async fn sale_not_started(state: &AppState, event: &str) -> ApiError {
    let start: Result<Option<DateTime<Utc>>, _> =
        sqlx::query_scalar("SELECT sale_start FROM events WHERE id = $1")
            .bind(event)
            .fetch_optional(&state.pool)
            .await;
    match start {
        Err(e) => e.into(),
        Ok(None) => unknown_event(),
        Ok(Some(start)) => ApiError::conflict(codes::SALE_NOT_STARTED, "the sale has not started")
            .with("sale_start", start.to_rfc3339()),
    }
}

/// A transaction error after [`db::retry`] gave up: a deadlock that keeps recurring is load,
/// not a bug, so the client gets a `503` with `Retry-After` rather than a `500`.
pub(crate) fn tx_failed(e: sqlx::Error) -> ApiError {
    if db::is_retryable(&e) {
        ApiError::Unavailable(anyhow::Error::new(e).context("transaction kept deadlocking"))
    } else {
        e.into()
    }
}

pub(crate) fn unknown_event() -> ApiError {
    ApiError::not_found(codes::UNKNOWN_EVENT, "no such event")
}

/// Counts a client-facing refusal by code (metrics), passing the result through.
pub(crate) fn counted<T>(state: &AppState, r: ApiResult<T>) -> ApiResult<T> {
    if let Err(e) = &r
        && e.status().is_client_error()
    {
        state.metrics.refusals.with_label_values(&[e.code()]).inc();
    }
    r
}

/// Resolves the event-scoped caller: a valid token for exactly this event, and an event id
/// that can exist at all.
pub(crate) fn admitted_for(admitted: Result<Admitted, ApiError>, event: &str) -> ApiResult<String> {
    let admitted = admitted?;
    admitted.for_event(event)?;
    if !shared::ids::is_valid_slug(event) {
        return Err(unknown_event());
    }
    Ok(admitted.account().to_owned())
}

// ---------------------------------------------------------------------------------------------
// POST /api/events/{event}/holds
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub seats: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct HoldResponse {
    pub hold_id: String,
    pub event: String,
    pub kind: &'static str,
    pub seats: Vec<String>,
    pub held_until: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub total: i64,
}

async fn create_hold(
    State(state): State<AppState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
    body: Result<ApiJson<HoldRequest>, ApiError>,
) -> ApiResult<(StatusCode, ApiJson<HoldResponse>)> {
    let r = async {
        let account = admitted_for(admitted, &event)?;
        let ApiJson(req) = body?;
        hold_seats(&state, &event, &account, req.seats).await
    }
    .await;
    let resp = counted(&state, r)?;
    state.metrics.holds.with_label_values(&["seats"]).inc();
    Ok((StatusCode::CREATED, ApiJson(resp)))
}

fn validate_seat_list(state: &AppState, seats: &[String]) -> ApiResult<()> {
    let max = state.config.booking.max_seats_per_hold;
    if seats.is_empty() {
        return Err(ApiError::validation("seats must not be empty").with("field", "seats"));
    }
    if seats.len() > max {
        return Err(
            ApiError::validation(format!("at most {max} seats per hold"))
                .with("field", "seats")
                .with("max", max),
        );
    }
    if let Some(bad) = seats
        .iter()
        .find(|s| !crate::inventory::seats::is_valid_seat_id(s))
    {
        return Err(ApiError::validation("malformed seat id")
            .with("field", "seats")
            .with("seat", bad.chars().take(80).collect::<String>()));
    }
    let mut seen = HashSet::with_capacity(seats.len());
    let dups: BTreeSet<&str> = seats
        .iter()
        .filter(|s| !seen.insert(s.as_str()))
        .map(String::as_str)
        .collect();
    if !dups.is_empty() {
        return Err(ApiError::validation("duplicate seat ids in one request")
            .with("field", "seats")
            .with("seats", dups.into_iter().collect::<Vec<_>>()));
    }
    Ok(())
}

struct SeatsTaken {
    hold_id: String,
    expires_at: DateTime<Utc>,
    /// (seat_id, price) for the seats the statement took.
    seats: Vec<(String, i64)>,
}

async fn hold_seats(
    state: &AppState,
    event: &str,
    account: &str,
    seats: Vec<String>,
) -> ApiResult<HoldResponse> {
    validate_seat_list(state, &seats)?;
    let n = i32::try_from(seats.len()).map_err(|_| ApiError::validation("too many seats"))?;
    let mut healed = false;
    loop {
        let attempt = db::retry(1, || take_seats_tx(state, event, account, &seats))
            .await
            .map_err(tx_failed)?;
        match attempt {
            Attempt::Done(taken) => {
                let total = taken.seats.iter().map(|(_, p)| p).sum();
                return Ok(HoldResponse {
                    hold_id: taken.hold_id,
                    event: event.to_owned(),
                    kind: "seats",
                    seats,
                    held_until: taken.expires_at,
                    expires_at: taken.expires_at,
                    total,
                });
            }
            Attempt::Limit if !healed => {
                // The account's own expired holds still count until swept; expire them now
                // (exactly like the sweeper would) and try once more.
                healed = true;
                // Try again even when it ended nothing itself: it may have waited for a
                // sweeper that was expiring the same hold and has now given the usage back.
                crate::inventory::sweeper::expire_account_holds(&state.pool, event, account)
                    .await?;
            }
            Attempt::Limit => return Err(limit_refusal(state, event, account, n).await),
            Attempt::NotOnSale => return Err(sale_not_started(state, event).await),
            Attempt::Short(taken) => return Err(seat_refusal(state, event, &seats, taken).await),
        }
    }
}

/// One hold transaction: usage, hold row, the seat statement, tidying of reclaimed holds.
async fn take_seats_tx(
    state: &AppState,
    event: &str,
    account: &str,
    seats: &[String],
) -> sqlx::Result<Attempt<SeatsTaken>> {
    let n = seats.len() as i32;
    let hold_id = shared::ids::new_id();
    let mut tx = begin_hold_tx(state).await?;
    if !reserve_usage(&mut tx, event, account, n).await? {
        tx.rollback().await?;
        return Ok(Attempt::Limit);
    }
    let Some(expires_at) = insert_hold(&mut tx, &hold_id, event, account, None, n).await? else {
        tx.rollback().await?;
        return Ok(Attempt::NotOnSale);
    };
    // THE hold statement. The CTE locks the requested seats in seat_id order (a fixed order,
    // so two overlapping requests cannot deadlock on each other) and keeps only those that
    // are available or whose hold has expired by the database clock. Under READ COMMITTED a
    // row another transaction took while we waited is re-checked after the lock and drops
    // out, so the count of returned rows is exactly what we got.
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "WITH wanted AS (
             SELECT seat_id, hold_id AS prev_hold FROM seats
             WHERE event_id = $1 AND seat_id = ANY($2)
               AND (status = 'available'
                    OR (status = 'held' AND held_until <= clock_timestamp()))
             ORDER BY seat_id
             FOR UPDATE)
         UPDATE seats s SET status = 'held', hold_id = $3, held_until = $4
         FROM wanted w, price_tiers p
         WHERE s.event_id = $1 AND s.seat_id = w.seat_id
           AND p.event_id = $1 AND p.tier = s.tier
         RETURNING s.seat_id, w.prev_hold, p.price",
    )
    .bind(event)
    .bind(seats)
    .bind(&hold_id)
    .bind(expires_at)
    .fetch_all(&mut *tx)
    .await?;
    if rows.len() < seats.len() {
        tx.rollback().await?;
        return Ok(Attempt::Short(SeatsTaken {
            hold_id,
            expires_at,
            seats: rows.into_iter().map(|(s, _, p)| (s, p)).collect(),
        }));
    }
    let reclaimed: BTreeSet<&str> = rows.iter().filter_map(|(_, h, _)| h.as_deref()).collect();
    if !reclaimed.is_empty() {
        let reclaimed: Vec<&str> = reclaimed.into_iter().collect();
        let ended = expire_reclaimed(&mut tx, &reclaimed).await?;
        for h in &ended {
            state
                .metrics
                .holds_expired
                .with_label_values(&[h.kind.as_str()])
                .inc();
        }
    }
    tx.commit().await?;
    Ok(Attempt::Done(SeatsTaken {
        hold_id,
        expires_at,
        seats: rows.into_iter().map(|(s, _, p)| (s, p)).collect(),
    }))
}

/// The previous holds of seats we just reclaimed: those still `active` become `expired`
/// (conditional on the status, so exactly once) and give back their other seats and their
/// usage. A hold another transaction has locked is skipped: whoever holds it (the sweeper,
/// a release, another reclaimer) ends it, or the sweeper does later. Skipping also means we
/// never wait on a hold row while holding seat locks the sweeper may be waiting for.
async fn expire_reclaimed(
    conn: &mut PgConnection,
    hold_ids: &[&str],
) -> sqlx::Result<Vec<EndedHold>> {
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
    .await?;
    if !ended.is_empty() {
        release_resources(conn, &ended).await?;
    }
    Ok(ended)
}

/// The 4xx for a seat statement that came up short: unknown seat ids are a 422 listing them;
/// otherwise the seats we could not take are a 409 SEAT_TAKEN listing them.
async fn seat_refusal(
    state: &AppState,
    event: &str,
    requested: &[String],
    taken: SeatsTaken,
) -> ApiError {
    let existing: Result<Vec<String>, _> =
        sqlx::query_scalar("SELECT seat_id FROM seats WHERE event_id = $1 AND seat_id = ANY($2)")
            .bind(event)
            .bind(requested)
            .fetch_all(&state.pool)
            .await;
    let existing: HashSet<String> = match existing {
        Ok(v) => v.into_iter().collect(),
        Err(e) => return e.into(),
    };
    let unknown: Vec<&str> = requested
        .iter()
        .filter(|s| !existing.contains(*s))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::UNKNOWN_SEATS,
            "some seats do not exist in this event",
        )
        .with("seats", unknown);
    }
    let got: HashSet<&str> = taken.seats.iter().map(|(s, _)| s.as_str()).collect();
    let lost: Vec<&str> = requested
        .iter()
        .map(String::as_str)
        .filter(|s| !got.contains(s))
        .collect();
    ApiError::conflict(codes::SEAT_TAKEN, "some seats are no longer available").with("seats", lost)
}

// ---------------------------------------------------------------------------------------------
// DELETE /api/holds/{hold}
// ---------------------------------------------------------------------------------------------

async fn delete_hold(
    State(state): State<AppState>,
    Path(hold): Path<String>,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<StatusCode> {
    let r = async {
        let admitted = admitted?;
        release_own_hold(&state, &hold, admitted.account()).await
    }
    .await;
    counted(&state, r)
}

async fn release_own_hold(state: &AppState, hold: &str, account: &str) -> ApiResult<StatusCode> {
    let not_found = || ApiError::not_found(codes::NOT_FOUND, "no such hold");
    if hold.is_empty() || hold.len() > 64 {
        return Err(not_found());
    }
    let released = db::retry(1, || async {
        let mut tx = begin_hold_tx(state).await?;
        let r = release_hold_inner(&mut tx, hold, Some(account), &["active"], "released").await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(r)
    })
    .await
    .map_err(tx_failed)?;
    if released.is_some() {
        return Ok(StatusCode::NO_CONTENT);
    }
    // Nothing changed; say why (a read for the answer only).
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT status, account_id FROM holds WHERE id = $1")
            .bind(hold)
            .fetch_optional(&state.pool)
            .await?;
    match row {
        Some((_, owner)) if owner != account => Err(not_found()),
        None => Err(not_found()),
        Some((status, _)) if status == "ordered" || status == "sold" => Err(ApiError::conflict(
            codes::HOLD_ORDERED,
            "an order owns this hold; cancel the order instead",
        )
        .with("status", status)),
        // Already released or expired: the release is idempotent.
        Some(_) => Ok(StatusCode::NO_CONTENT),
    }
}
