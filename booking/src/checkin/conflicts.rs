//! `GET /admin/events/{event}/checkin/conflicts` (viewer role): the offline admissions the
//! server would not have made, newest first, paged by id. Each says what the device decided,
//! what the server decided, at which gate and when (device and server time), and the entry
//! in force (the other gate) — what ops need to find a double entry or a void ticket let in.

use crate::checkin::CheckinState;
use crate::platform::audit::Viewer;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 200;

pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new().routes(routes!(list))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ConflictQuery {
    /// 1 to 200 (default 50)
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// The `next_before` of the previous page
    before: Option<i64>,
}

/// One conflict.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct Conflict {
    id: i64,
    ticket: Option<String>,
    scan_id: Option<String>,
    scanner: String,
    /// The gate of the offline scan
    gate: String,
    direction: String,
    /// What the device decided (`ENTRY` or `EXIT`)
    device_decided: String,
    /// What the server decided (`ALREADY_INSIDE`, `VOIDED`, `INVALID_CODE`, ...)
    server_result: String,
    reason: Option<String>,
    /// The device's clock at the scan (information only)
    scanned_at: Option<DateTime<Utc>>,
    /// When the server received it (the order that decides)
    received_at: DateTime<Utc>,
    /// The entry in force at the server's decision: the other gate and when
    entry_gate: Option<String>,
    entry_at: Option<DateTime<Utc>>,
    /// Uploaded by a scanner revoked since
    from_revoked_scanner: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ConflictPage {
    conflicts: Vec<Conflict>,
    /// Pass as `before` for the next (older) page; absent on the last page
    #[serde(skip_serializing_if = "Option::is_none")]
    next_before: Option<i64>,
}

/// An event's offline check-in conflicts, newest first
#[utoipa::path(get, path = "/admin/events/{event}/checkin/conflicts", tag = tags::CHECKIN,
    security(("admin" = ["viewer"])),
    params(doc::EventPath, ConflictQuery),
    responses(
        (status = 200, description = "OK", body = ConflictPage),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn list(
    State(state): State<CheckinState>,
    _caller: Viewer,
    Path(event): Path<String>,
    q: Result<Query<ConflictQuery>, QueryRejection>,
) -> ApiResult<ApiJson<ConflictPage>> {
    let q = q
        .map(|Query(v)| v)
        .map_err(|e| ApiError::validation(format!("invalid query: {}", e.body_text())))?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(
            ApiError::validation(format!("limit must be 1 to {MAX_LIMIT}")).with("field", "limit"),
        );
    }
    let exists: bool = shared::ids::is_valid_slug(&event)
        && sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)")
            .bind(&event)
            .fetch_one(&state.pool)
            .await
            .context("failed to find the event")?;
    if !exists {
        return Err(ApiError::not_found(codes::UNKNOWN_EVENT, "no such event"));
    }
    // One more than the page, to know whether there is a next one.
    let mut conflicts: Vec<Conflict> = sqlx::query_as(
        "SELECT id, ticket_id AS ticket, scan_id, scanner_id AS scanner, gate, direction,
                offline_decided AS device_decided, result AS server_result, reason,
                device_time AS scanned_at, received_at, entry_gate, entry_at,
                from_revoked_scanner
           FROM checkins
          WHERE event_id = $1 AND conflict AND ($2::int8 IS NULL OR id < $2)
          ORDER BY id DESC LIMIT $3",
    )
    .bind(&event)
    .bind(q.before)
    .bind(limit + 1)
    .fetch_all(&state.pool)
    .await
    .context("failed to list the conflicts")?;
    let more = conflicts.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    conflicts.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_before = more.then(|| conflicts.last().map(|c| c.id)).flatten();
    Ok(ApiJson(ConflictPage {
        conflicts,
        next_before,
    }))
}
