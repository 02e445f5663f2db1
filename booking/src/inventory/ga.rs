//! General-admission holds: `POST /api/events/{event}/ga-holds {"tier", "quantity"}`.
//!
//! A tier's capacity lives in `shards` counter rows (`ga_counters`). Guarantees: units are
//! taken only by conditional decrements of those rows, so a tier never sells more than its
//! capacity (`CHECK (available >= 0)` is the last line of defence); the units a hold took are
//! recorded per shard in `hold_ga_items`, so releasing it returns them exactly.
//!
//! Taking units: ONE statement reserves the account's usage, inserts the hold row, picks a
//! shard with enough units (starting at a random shard, skipping shards another transaction
//! has locked: `FOR UPDATE SKIP LOCKED`), decrements it, records the allocation and reads the
//! tier's price; then the commit. Concurrent buyers spread over the shards instead of queueing
//! on one row lock, and this statement never waits for a shard (except the only shard of a
//! one-shard tier). Only when it finds none do further transactions run: one that waits for ONE
//! shard with enough (every such shard was busy), and as a last resort one that locks the
//! shards with units in shard order and splits the quantity across them (the stock is spread
//! thinner than the quantity). A transaction never waits for a shard while holding a shard
//! lock out of shard order, so holds, releases, expiries and sales cannot deadlock.
//!
//! Files: this one (the handler), `ga/repo.rs` (the statements).

mod repo;

use crate::inventory::InventoryState;
use crate::inventory::error::InventoryError;
use crate::inventory::holds::refusal::{limit_refusal, sale_not_started};
use crate::inventory::holds::take::{Attempt, expire_account_holds};
use crate::inventory::http::{admitted_for, counted};
use crate::inventory::model::{HoldKind, check_ga_request};
use crate::platform::auth::Admitted;
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::platform::session_until::SessionUntil;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<InventoryState> {
    OpenApiRouter::new().routes(routes!(create_ga_hold))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GaHoldRequest {
    #[schema(min_length = 1, max_length = 32)]
    pub tier: String,
    /// Signed so that `-1` is a clear validation error rather than a type error.
    #[schema(minimum = 1, maximum = 100)]
    pub quantity: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GaHoldResponse {
    pub hold_id: String,
    pub event: String,
    pub kind: HoldKind,
    pub tier: String,
    pub quantity: i32,
    pub held_until: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub total: i64,
}

/// Hold general-admission units of a tier
#[utoipa::path(post, path = "/api/events/{event}/ga-holds", tag = tags::INVENTORY,
    params(doc::EventPath),
    request_body = GaHoldRequest,
    responses(
        (status = 201, description = "Held", body = GaHoldResponse),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
    ))]
async fn create_ga_hold(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
    body: Result<ApiJson<GaHoldRequest>, ApiError>,
) -> ApiResult<(StatusCode, SessionUntil, ApiJson<GaHoldResponse>)> {
    let r = async {
        let account = admitted_for(admitted, &event)?;
        let ApiJson(req) = body?;
        Ok(hold_ga(&state, &event, &account, req).await?)
    }
    .await;
    let (resp, until) = counted(&state, r)?;
    state.metrics.holds.with_label_values(&["ga"]).inc();
    Ok((
        StatusCode::CREATED,
        SessionUntil(Some(until)),
        ApiJson(resp),
    ))
}

async fn hold_ga(
    state: &InventoryState,
    event: &str,
    account: &str,
    req: GaHoldRequest,
) -> Result<(GaHoldResponse, i64), InventoryError> {
    let qty = check_ga_request(&req.tier, req.quantity)?;
    let pool = &state.hold_pool;
    let mut healed = false;
    loop {
        let attempt = db::retry(4, || {
            repo::take_units_tx(pool, event, account, &req.tier, qty)
        })
        .await?;
        match attempt {
            Attempt::Done(t) => {
                // Units were taken, so the tier exists and the statement read its price.
                let price = t.price.unwrap_or_default();
                let resp = GaHoldResponse {
                    hold_id: t.hold_id,
                    event: event.to_owned(),
                    kind: HoldKind::Ga,
                    tier: req.tier,
                    quantity: qty,
                    held_until: t.expires_at,
                    expires_at: t.expires_at,
                    total: price * i64::from(qty),
                };
                return Ok((resp, t.live_until_ms));
            }
            Attempt::Limit if !healed => {
                healed = true;
                // Try again even when it ended nothing itself: it may have waited for a
                // sweeper that was expiring the same hold and has now given the usage back.
                expire_account_holds(pool, event, account).await?;
            }
            Attempt::Limit => return Err(limit_refusal(pool, event, account, qty).await),
            Attempt::NotOnSale => return Err(sale_not_started(pool, event).await),
            Attempt::Short(_) => return Err(repo::sold_out(pool, event, &req.tier, qty).await),
        }
    }
}
