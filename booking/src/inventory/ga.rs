//! General-admission holds: `POST /api/events/{event}/ga-holds {"tier", "quantity"}`.
//!
//! A tier's capacity lives in `shards` counter rows (`ga_counters`). Guarantees: units are
//! taken only by conditional decrements of those rows, so a tier never sells more than its
//! capacity (`CHECK (available >= 0)` is the last line of defence); the units a hold took are
//! recorded per shard in `hold_ga_items`, so releasing it returns them exactly.
//!
//! Taking units, fast path first: ONE statement picks a shard with enough units, starting at a
//! random shard, skipping shards another transaction has locked (`FOR UPDATE SKIP LOCKED`),
//! decrements it and records the allocation. Concurrent buyers therefore spread over the
//! shards instead of queueing on one row lock. Only when that finds nothing (every shard busy,
//! or the remaining units are spread thinner than the quantity) does the slow path lock all of
//! the tier's shards in shard order and split the quantity across them.

use crate::app::state::AppState;
use crate::inventory::holds::{
    Attempt, admitted_for, begin_hold_tx, counted, insert_hold, limit_refusal, reserve_usage,
    sale_not_started, tx_failed,
};
use crate::platform::auth::Admitted;
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use sqlx::PgConnection;

/// No event allows more tickets per account than this (see the `events` CHECK).
const MAX_QUANTITY: i64 = 100;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/events/{event}/ga-holds", post(create_ga_hold))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GaHoldRequest {
    pub tier: String,
    /// Signed so that `-1` is a clear validation error rather than a type error.
    pub quantity: i64,
}

#[derive(Debug, Serialize)]
pub struct GaHoldResponse {
    pub hold_id: String,
    pub event: String,
    pub kind: &'static str,
    pub tier: String,
    pub quantity: i32,
    pub held_until: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub total: i64,
}

async fn create_ga_hold(
    State(state): State<AppState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
    body: Result<ApiJson<GaHoldRequest>, ApiError>,
) -> ApiResult<(StatusCode, ApiJson<GaHoldResponse>)> {
    let r = async {
        let account = admitted_for(admitted, &event)?;
        let ApiJson(req) = body?;
        hold_ga(&state, &event, &account, req).await
    }
    .await;
    let resp = counted(&state, r)?;
    state.metrics.holds.with_label_values(&["ga"]).inc();
    Ok((StatusCode::CREATED, ApiJson(resp)))
}

struct GaTaken {
    hold_id: String,
    expires_at: DateTime<Utc>,
}

async fn hold_ga(
    state: &AppState,
    event: &str,
    account: &str,
    req: GaHoldRequest,
) -> ApiResult<GaHoldResponse> {
    if req.tier.is_empty() || req.tier.len() > 32 {
        return Err(ApiError::validation("tier must be 1-32 characters").with("field", "tier"));
    }
    if !(1..=MAX_QUANTITY).contains(&req.quantity) {
        return Err(
            ApiError::validation(format!("quantity must be 1..={MAX_QUANTITY}"))
                .with("field", "quantity"),
        );
    }
    let qty = req.quantity as i32;
    let mut healed = false;
    loop {
        let attempt = db::retry(1, || take_units_tx(state, event, account, &req.tier, qty))
            .await
            .map_err(tx_failed)?;
        match attempt {
            Attempt::Done(t) => {
                let price: i64 = sqlx::query_scalar(
                    "SELECT price FROM ga_tiers WHERE event_id = $1 AND tier = $2",
                )
                .bind(event)
                .bind(&req.tier)
                .fetch_one(&state.pool)
                .await?;
                return Ok(GaHoldResponse {
                    hold_id: t.hold_id,
                    event: event.to_owned(),
                    kind: "ga",
                    tier: req.tier,
                    quantity: qty,
                    held_until: t.expires_at,
                    expires_at: t.expires_at,
                    total: price * i64::from(qty),
                });
            }
            Attempt::Limit if !healed => {
                healed = true;
                // Try again even when it ended nothing itself: it may have waited for a
                // sweeper that was expiring the same hold and has now given the usage back.
                crate::inventory::sweeper::expire_account_holds(&state.pool, event, account)
                    .await?;
            }
            Attempt::Limit => return Err(limit_refusal(state, event, account, qty).await),
            Attempt::NotOnSale => return Err(sale_not_started(state, event).await),
            Attempt::Short(_) => return Err(sold_out(state, event, &req.tier, qty).await),
        }
    }
}

async fn take_units_tx(
    state: &AppState,
    event: &str,
    account: &str,
    tier: &str,
    qty: i32,
) -> sqlx::Result<Attempt<GaTaken>> {
    let hold_id = shared::ids::new_id();
    let mut tx = begin_hold_tx(state).await?;
    if !reserve_usage(&mut tx, event, account, qty).await? {
        tx.rollback().await?;
        return Ok(Attempt::Limit);
    }
    let Some(expires_at) = insert_hold(&mut tx, &hold_id, event, account, Some(tier), qty).await?
    else {
        tx.rollback().await?;
        return Ok(Attempt::NotOnSale);
    };
    let taken = if take_from_one_shard(&mut tx, &hold_id, event, tier, qty).await? {
        true
    } else {
        take_across_shards(&mut tx, &hold_id, event, tier, qty).await?
    };
    let t = GaTaken {
        hold_id,
        expires_at,
    };
    if !taken {
        tx.rollback().await?;
        return Ok(Attempt::Short(t));
    }
    tx.commit().await?;
    Ok(Attempt::Done(t))
}

/// Fast path: one free shard with enough units, starting from a random shard.
async fn take_from_one_shard(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
) -> sqlx::Result<bool> {
    let start = rand::random_range(0..64i32);
    let shard: Option<i32> = sqlx::query_scalar(
        "WITH pick AS (
             SELECT shard FROM ga_counters
             WHERE event_id = $1 AND tier = $2 AND available >= $3
             ORDER BY (shard + 64 - $4) % 64
             LIMIT 1
             FOR UPDATE SKIP LOCKED),
         took AS (
             UPDATE ga_counters c SET available = c.available - $3
             FROM pick
             WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = pick.shard
             RETURNING c.shard)
         INSERT INTO hold_ga_items (hold_id, shard, quantity)
         SELECT $5, shard, $3 FROM took
         RETURNING shard",
    )
    .bind(event)
    .bind(tier)
    .bind(qty)
    .bind(start)
    .bind(hold_id)
    .fetch_optional(conn)
    .await?;
    Ok(shard.is_some())
}

/// Slow path: lock every shard of the tier in shard order and take `qty` across them
/// (greedily, lowest shard first), all or nothing.
async fn take_across_shards(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
) -> sqlx::Result<bool> {
    let parts: Vec<i32> = sqlx::query_scalar(
        "WITH locked AS (
             SELECT shard, available FROM ga_counters
             WHERE event_id = $1 AND tier = $2
             ORDER BY shard
             FOR UPDATE),
         plan AS (
             SELECT shard,
                    LEAST(available::bigint,
                          GREATEST(0, $3 - (sum(available) OVER (ORDER BY shard) - available)))::int
                        AS take
             FROM locked
             WHERE (SELECT sum(available) FROM locked) >= $3),
         took AS (
             UPDATE ga_counters c SET available = c.available - p.take
             FROM plan p
             WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = p.shard AND p.take > 0
             RETURNING c.shard, p.take)
         INSERT INTO hold_ga_items (hold_id, shard, quantity)
         SELECT $4, shard, take FROM took
         RETURNING quantity",
    )
    .bind(event)
    .bind(tier)
    .bind(qty)
    .bind(hold_id)
    .fetch_all(conn)
    .await?;
    Ok(parts.iter().map(|&q| i64::from(q)).sum::<i64>() == i64::from(qty))
}

/// The 4xx when no units could be taken: unknown tier (422), or SOLD_OUT with what is left
/// when some but not enough units remain (read after the rollback, informational).
async fn sold_out(state: &AppState, event: &str, tier: &str, qty: i32) -> ApiError {
    let left: Result<Option<i64>, _> = sqlx::query_scalar(
        "SELECT sum(available)::bigint FROM ga_counters WHERE event_id = $1 AND tier = $2",
    )
    .bind(event)
    .bind(tier)
    .fetch_one(&state.pool)
    .await;
    match left {
        Err(e) => e.into(),
        Ok(None) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::UNKNOWN_TIER,
            "no such GA tier for this event",
        )
        .with("tier", tier.to_owned()),
        Ok(Some(n)) if n > 0 && n < i64::from(qty) => {
            ApiError::conflict(codes::SOLD_OUT, "not enough units left in this tier")
                .with("available", n)
        }
        Ok(Some(_)) => ApiError::conflict(codes::SOLD_OUT, "this tier is sold out"),
    }
}
