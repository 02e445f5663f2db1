//! GA hold-backs by ops (issue 18): `POST /admin/events/{event}/ga-holdbacks` takes N units
//! of a GA tier out of sale, `POST .../ga-holdbacks/{id}/release` puts all of them back,
//! `GET .../ga-holdbacks` lists them.
//!
//! Guarantees:
//! - A hold-back is all or nothing, ONE statement over the tier's shard counters: the shards
//!   with units are locked in shard order (waiting, the order every multi-shard GA path uses,
//!   so it cannot deadlock with a hold; see `ga/repo.rs`), the quantity is split greedily over
//!   them, and only if they have it all are the units moved `available → held_back` and the
//!   hold-back row and its per-shard items written. The `CHECK (available >= 0)` of every
//!   shard is the backstop: a hold-back never oversells, whatever holds race it.
//! - A release gives back exactly the units of the hold-back, to the shards they came from,
//!   once: the conditional `UPDATE ... WHERE status = 'active'` and the counter moves are one
//!   statement; a second release finds it released (`409 HOLDBACK_RELEASED`).
//! - The units show as `held_back` in the event's counts (with those a refund held back).
//! - Audit entry in the change's transaction; optional `Idempotency-Key` as for seat kills.

use crate::inventory::InventoryState;
use crate::inventory::kills::{KillReason, claim_key, complete_key, keyed};
use crate::platform::audit::Viewer;
use crate::platform::audit::{self, AdminOp};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::IdempotencyKey;
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// `409`: the hold-back was released already.
pub const HOLDBACK_RELEASED: &str = "HOLDBACK_RELEASED";
/// Most units in one hold-back.
pub const MAX_HOLDBACK_UNITS: i32 = 1_000_000;

pub fn router() -> OpenApiRouter<InventoryState> {
    OpenApiRouter::new()
        .routes(routes!(hold_back, list))
        .routes(routes!(release))
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldbackRequest {
    #[schema(min_length = 1, max_length = 64)]
    tier: String,
    #[schema(minimum = 1, maximum = 1_000_000)]
    quantity: i32,
    reason: KillReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    note: Option<String>,
}

#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct Holdback {
    id: String,
    event_id: String,
    tier: String,
    quantity: i32,
    reason: String,
    note: Option<String>,
    actor: String,
    #[schema(value_type = HoldbackStatus)]
    status: String,
    created_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    released_by: Option<String>,
}

const COLUMNS: &str = "id, event_id, tier, quantity, reason, note, actor, status, created_at, \
                       released_at, released_by";

/// The hold-back statement (module docs). `$1` event, `$2` tier, `$3` quantity, `$4` id,
/// `$5` reason, `$6` note, `$7` actor. Answers the units taken (`None`: nothing written),
/// whether the tier exists, and the tier's units as the snapshot saw them (for a refusal).
const HOLD_BACK: &str = "
WITH locked AS (
    SELECT shard, available FROM ga_counters
     WHERE event_id = $1 AND tier = $2 AND available > 0
     ORDER BY shard
     FOR UPDATE),
got AS (
    SELECT shard, available,
           LEAST(available::bigint,
                 GREATEST(0, $3 - (sum(available) OVER (ORDER BY shard) - available)))::int
               AS take
      FROM locked
     WHERE (SELECT sum(available) FROM locked) >= $3),
hb AS (
    INSERT INTO ga_holdbacks (id, event_id, tier, quantity, reason, note, actor)
    SELECT $4, $1, $2, $3, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM got WHERE take > 0)
    RETURNING id),
took AS (
    -- From the locked count, not the snapshot's (see the GA hold's `took`).
    UPDATE ga_counters c SET available = g.available - g.take, held_back = c.held_back + g.take
      FROM got g, hb
     WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = g.shard AND g.take > 0
    RETURNING c.shard, g.take),
item AS (
    INSERT INTO ga_holdback_items (holdback_id, shard, quantity)
    SELECT $4, shard, take FROM took
    RETURNING quantity)
SELECT (SELECT sum(quantity)::int FROM item),
       EXISTS (SELECT 1 FROM ga_tiers WHERE event_id = $1 AND tier = $2),
       (SELECT COALESCE(sum(available), 0)::bigint FROM ga_counters
         WHERE event_id = $1 AND tier = $2)";

/// The release statement (module docs). `$1` event, `$2` id, `$3` actor. Answers whether this
/// statement released it, and the hold-back's status before (`None`: no such hold-back).
const RELEASE: &str = "
WITH hb AS (
    UPDATE ga_holdbacks SET status = 'released', released_at = clock_timestamp(),
                            released_by = $3
     WHERE id = $2 AND event_id = $1 AND status = 'active'
    RETURNING id, tier),
locked AS (
    SELECT c.shard, i.quantity
      FROM hb
      JOIN ga_holdback_items i ON i.holdback_id = hb.id
      JOIN ga_counters c ON c.event_id = $1 AND c.tier = hb.tier AND c.shard = i.shard
     ORDER BY c.shard
     FOR UPDATE OF c),
back AS (
    UPDATE ga_counters c SET held_back = c.held_back - l.quantity,
                             available = c.available + l.quantity
      FROM locked l, hb
     WHERE c.event_id = $1 AND c.tier = hb.tier AND c.shard = l.shard
    RETURNING l.quantity)
SELECT EXISTS (SELECT 1 FROM hb),
       (SELECT status FROM ga_holdbacks WHERE id = $2 AND event_id = $1)";

async fn event_exists(conn: &mut sqlx::PgConnection, event: &str) -> ApiResult<()> {
    let known: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)")
        .bind(event)
        .fetch_one(&mut *conn)
        .await
        .context("failed to read the event")?;
    if known {
        Ok(())
    } else {
        Err(ApiError::not_found(codes::UNKNOWN_EVENT, "no such event"))
    }
}

async fn read(conn: &mut sqlx::PgConnection, event: &str, id: &str) -> ApiResult<Holdback> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM ga_holdbacks WHERE id = $1 AND event_id = $2"
    )))
    .bind(id)
    .bind(event)
    .fetch_one(&mut *conn)
    .await
    .context("failed to read the hold-back")?)
}

fn validate(req: &HoldbackRequest) -> ApiResult<()> {
    if req.tier.is_empty() || req.tier.chars().count() > 64 {
        return Err(ApiError::validation("tier is 1 to 64 characters").with("field", "tier"));
    }
    if !(1..=MAX_HOLDBACK_UNITS).contains(&req.quantity) {
        return Err(
            ApiError::validation(format!("quantity must be 1 to {MAX_HOLDBACK_UNITS}"))
                .with("field", "quantity"),
        );
    }
    if let Some(note) = &req.note
        && note.chars().count() > 500
    {
        return Err(ApiError::validation("note is at most 500 characters").with("field", "note"));
    }
    Ok(())
}

/// `active` until released (`released`).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[expect(
    dead_code,
    reason = "a schema only: the values of `ga_holdbacks.status`"
)]
enum HoldbackStatus {
    Active,
    Released,
}

/// Take units of a GA tier out of sale (all or nothing; `409 SOLD_OUT` when not enough are on sale)
#[utoipa::path(post, path = "/admin/events/{event}/ga-holdbacks", tag = tags::OPS,
    security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader, doc::OptionalIdempotencyKey),
    request_body = HoldbackRequest,
    responses(
        (status = 201, description = "Held back", body = Holdback),
        (status = 200, description = "The first answer replayed", body = Holdback),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
async fn hold_back(
    State(state): State<InventoryState>,
    op: AdminOp,
    key: Option<IdempotencyKey>,
    method: Method,
    uri: OriginalUri,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<HoldbackRequest>,
) -> ApiResult<Response> {
    validate(&req)?;
    let keyed = keyed(key, &method, &uri, &req)?;
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the hold-back")?;
    let claim = match claim_key(&state, &mut tx, &keyed).await? {
        Ok(claim) => claim,
        Err(replay) => return Ok(replay),
    };
    event_exists(&mut tx, &event).await?;
    let id = format!("hb_{}", shared::ids::new_id());
    let (taken, tier_known, left): (Option<i32>, bool, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(HOLD_BACK))
            .bind(&event)
            .bind(&req.tier)
            .bind(req.quantity)
            .bind(&id)
            .bind(req.reason.as_str())
            .bind(req.note.as_deref())
            .bind(op.name())
            .fetch_one(&mut *tx)
            .await
            .context("failed to hold the units back")?;
    if !tier_known {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::UNKNOWN_TIER,
            "the event has no such GA tier",
        )
        .with("field", "tier"));
    }
    if taken != Some(req.quantity) {
        // Nothing was written (the statement is all or nothing).
        return Err(ApiError::conflict(
            codes::SOLD_OUT,
            "not enough units on sale in this tier; nothing was held back",
        )
        .with("tier", req.tier.as_str())
        .with("requested", req.quantity)
        .with("available", left));
    }
    let created = read(&mut tx, &event, &id).await?;
    audit::record_tx(
        &mut tx,
        &op,
        "ga.holdback",
        &format!("event:{event}"),
        Some(&event),
        &serde_json::json!({"holdback_id": id, "tier": req.tier, "quantity": req.quantity,
                            "reason": req.reason, "note": req.note}),
    )
    .await?;
    let resp = complete_key(&mut tx, claim.as_ref(), StatusCode::CREATED, &created).await?;
    tx.commit()
        .await
        .context("failed to commit the hold-back")?;
    Ok(resp)
}

/// Put all units of a hold-back back on sale, once (`409 HOLDBACK_RELEASED` after)
#[utoipa::path(post, path = "/admin/events/{event}/ga-holdbacks/{id}/release", tag = tags::OPS,
    security(("admin" = ["admin"])),
    params(doc::EventPath, ("id" = String, Path), doc::ActorHeader, doc::OptionalIdempotencyKey),
    responses(
        (status = 200, description = "OK", body = Holdback),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 422, response = doc::Invalid),
    ))]
async fn release(
    State(state): State<InventoryState>,
    op: AdminOp,
    key: Option<IdempotencyKey>,
    method: Method,
    uri: OriginalUri,
    Path((event, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    // No body: the path says it all (a body, if sent, is ignored).
    let keyed = keyed(key, &method, &uri, &serde_json::json!({}))?;
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the hold-back release")?;
    let claim = match claim_key(&state, &mut tx, &keyed).await? {
        Ok(claim) => claim,
        Err(replay) => return Ok(replay),
    };
    event_exists(&mut tx, &event).await?;
    let (released, status): (bool, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(RELEASE))
        .bind(&event)
        .bind(&id)
        .bind(op.name())
        .fetch_one(&mut *tx)
        .await
        .context("failed to release the hold-back")?;
    match (released, status) {
        (true, _) => {}
        (false, None) => {
            return Err(ApiError::not_found(codes::NOT_FOUND, "no such hold-back"));
        }
        (false, Some(_)) => {
            return Err(ApiError::conflict(
                HOLDBACK_RELEASED,
                "this hold-back was released already; nothing changed",
            ));
        }
    }
    let done = read(&mut tx, &event, &id).await?;
    audit::record_tx(
        &mut tx,
        &op,
        "ga.holdback.release",
        &format!("event:{event}"),
        Some(&event),
        &serde_json::json!({"holdback_id": id, "tier": done.tier, "quantity": done.quantity}),
    )
    .await?;
    let resp = complete_key(&mut tx, claim.as_ref(), StatusCode::OK, &done).await?;
    tx.commit()
        .await
        .context("failed to commit the hold-back release")?;
    Ok(resp)
}

#[derive(Serialize, ToSchema)]
struct Listed {
    holdbacks: Vec<Holdback>,
}

/// An event's GA hold-backs, newest first
#[utoipa::path(get, path = "/admin/events/{event}/ga-holdbacks", tag = tags::OPS,
    security(("admin" = ["viewer"])),
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = Listed),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
async fn list(
    State(state): State<InventoryState>,
    _caller: Viewer,
    Path(event): Path<String>,
) -> ApiResult<ApiJson<Listed>> {
    let mut conn = state
        .pool
        .acquire()
        .await
        .context("failed to get a connection")?;
    event_exists(&mut conn, &event).await?;
    let holdbacks = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM ga_holdbacks WHERE event_id = $1
          ORDER BY created_at DESC, id DESC LIMIT 1000"
    )))
    .bind(&event)
    .fetch_all(&mut *conn)
    .await
    .context("failed to list the hold-backs")?;
    Ok(ApiJson(Listed { holdbacks }))
}
