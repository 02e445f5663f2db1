//! `PATCH /admin/events/{event}` (operator): name, sale start and limits of an event,
//! validated as on creation, unknown fields refused, with a before/after audit entry written
//! in the same transaction as the change (the event row is locked while it is read).

use crate::inventory::InventoryState;
use crate::inventory::model::Invalid;
use crate::platform::audit::{self, AdminOp};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared::error::codes;
use utoipa::ToSchema;

/// At least one field to change.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(min_properties = 1)]
pub struct UpdateEvent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sale_start: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 10, maximum = 86400)]
    pub hold_ttl_s: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub max_tickets_per_account: Option<i32>,
}

/// The same bounds as `model::validate` applies on creation.
pub fn validate(req: &UpdateEvent) -> Result<(), Invalid> {
    if req.name.is_none()
        && req.sale_start.is_none()
        && req.hold_ttl_s.is_none()
        && req.max_tickets_per_account.is_none()
    {
        return Err(Invalid::field("body", "name at least one field to change"));
    }
    if let Some(name) = &req.name
        && (name.trim().is_empty() || name.chars().count() > 200)
    {
        return Err(Invalid::field("name", "name must be 1-200 characters"));
    }
    if let Some(ttl) = req.hold_ttl_s
        && !(10..=86_400).contains(&ttl)
    {
        return Err(Invalid::field(
            "hold_ttl_s",
            "hold_ttl_s must be 10..=86400",
        ));
    }
    if let Some(limit) = req.max_tickets_per_account
        && !(1..=100).contains(&limit)
    {
        return Err(Invalid::field(
            "max_tickets_per_account",
            "max_tickets_per_account must be 1..=100",
        ));
    }
    Ok(())
}

#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct EventSettings {
    pub id: String,
    pub name: String,
    pub sale_start: DateTime<Utc>,
    pub hold_ttl_s: i32,
    pub max_tickets_per_account: i32,
}

/// Change an event's name, sale start or limits (audited with before/after)
#[utoipa::path(patch, path = "/admin/events/{event}", tag = tags::OPS, security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader),
    request_body = UpdateEvent,
    responses(
        (status = 200, description = "OK", body = EventSettings),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn update_event(
    State(state): State<InventoryState>,
    op: AdminOp,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<UpdateEvent>,
) -> ApiResult<ApiJson<EventSettings>> {
    validate(&req).map_err(|e| ApiError::from(crate::inventory::InventoryError::from(e)))?;
    let mut tx = state.pool.begin().await?;
    let before: Option<(EventSettings, bool)> =
        sqlx::query_as::<_, (String, String, DateTime<Utc>, i32, i32, bool)>(
            "SELECT id, name, sale_start, hold_ttl_s, max_tickets_per_account,
                cancelled_at IS NOT NULL
           FROM events WHERE id = $1 FOR UPDATE",
        )
        .bind(&event)
        .fetch_optional(&mut *tx)
        .await?
        .map(
            |(id, name, sale_start, hold_ttl_s, max_tickets_per_account, cancelled)| {
                (
                    EventSettings {
                        id,
                        name,
                        sale_start,
                        hold_ttl_s,
                        max_tickets_per_account,
                    },
                    cancelled,
                )
            },
        );
    let Some((before, cancelled)) = before else {
        return Err(ApiError::not_found(codes::NOT_FOUND, "no such event"));
    };
    if cancelled {
        return Err(ApiError::conflict(
            codes::EVENT_CANCELLED,
            "this event is cancelled and can no longer be changed",
        ));
    }
    let after: EventSettings = sqlx::query_as(
        "UPDATE events SET name = COALESCE($2, name), sale_start = COALESCE($3, sale_start),
                hold_ttl_s = COALESCE($4, hold_ttl_s),
                max_tickets_per_account = COALESCE($5, max_tickets_per_account)
          WHERE id = $1
         RETURNING id, name, sale_start, hold_ttl_s, max_tickets_per_account",
    )
    .bind(&event)
    .bind(req.name.as_deref().map(str::trim))
    .bind(req.sale_start)
    .bind(req.hold_ttl_s)
    .bind(req.max_tickets_per_account)
    .fetch_one(&mut *tx)
    .await?;
    audit::record_tx(
        &mut tx,
        &op,
        "event.update",
        &format!("event:{event}"),
        Some(&event),
        &json!({"request": req, "before": before, "after": after}),
    )
    .await
    .map_err(ApiError::Unexpected)?;
    tx.commit().await?;
    Ok(ApiJson(after))
}
