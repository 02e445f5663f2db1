//! `PATCH /admin/events/{event}` (operator): name, sale start, limits, date, place, zone,
//! ticket-code kind and door rules (`reentry`, `transfers`) of an event (a field left out is unchanged),
//! validated as on creation, unknown fields refused, with a before/after audit entry written
//! in the same transaction as the change (the event row is locked while it is read).

use crate::inventory::InventoryState;
use crate::inventory::events::model::{TicketCode, validate_date};
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
    /// Not after `starts_at` (the new one, or the stored one when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doors_at: Option<DateTime<Utc>>,
    /// An IANA time zone name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 64)]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    pub venue_address: Option<String>,
    /// Switching an event to `rotating` changes how codes are shown from the next fetch on;
    /// codes already handed out for it stay valid until their ticket's version changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket_code: Option<TicketCode>,
    /// Whether a ticket that went out at the door may come back in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reentry: Option<bool>,
    /// Whether tickets may be transferred to another fan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfers: Option<bool>,
}

/// The same bounds as `model::validate` applies on creation.
pub fn validate(req: &UpdateEvent) -> Result<(), Invalid> {
    if req.name.is_none()
        && req.sale_start.is_none()
        && req.hold_ttl_s.is_none()
        && req.max_tickets_per_account.is_none()
        && req.starts_at.is_none()
        && req.doors_at.is_none()
        && req.timezone.is_none()
        && req.venue_address.is_none()
        && req.ticket_code.is_none()
        && req.reentry.is_none()
        && req.transfers.is_none()
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
    validate_date(
        req.starts_at,
        req.doors_at,
        req.timezone.as_deref(),
        req.venue_address.as_deref(),
    )
}

#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct EventSettings {
    pub id: String,
    pub name: String,
    pub sale_start: DateTime<Utc>,
    pub hold_ttl_s: i32,
    pub max_tickets_per_account: i32,
    pub starts_at: Option<DateTime<Utc>>,
    pub doors_at: Option<DateTime<Utc>>,
    pub timezone: Option<String>,
    pub venue_address: Option<String>,
    pub ticket_code: TicketCode,
    pub reentry: bool,
    pub transfers: bool,
}

#[derive(sqlx::FromRow)]
struct EventSettingsRow {
    #[sqlx(flatten)]
    settings: EventSettings,
    cancelled: bool,
}

/// Change an event's name, sale start, limits, date, place or ticket codes (audited with before/after)
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
    let before: Option<(EventSettings, bool)> = sqlx::query_as::<_, EventSettingsRow>(
        "SELECT id, name, sale_start, hold_ttl_s, max_tickets_per_account, starts_at, doors_at,
                timezone, venue_address, ticket_code, reentry, transfers,
                cancelled_at IS NOT NULL AS cancelled
           FROM events WHERE id = $1 FOR UPDATE",
    )
    .bind(&event)
    .fetch_optional(&mut *tx)
    .await?
    .map(|row| (row.settings, row.cancelled));
    let Some((before, cancelled)) = before else {
        return Err(ApiError::not_found(codes::NOT_FOUND, "no such event"));
    };
    if cancelled {
        return Err(ApiError::conflict(
            codes::EVENT_CANCELLED,
            "this event is cancelled and can no longer be changed",
        ));
    }
    // Doors against the start as they will be: one of them may be the stored value.
    validate_date(
        req.starts_at.or(before.starts_at),
        req.doors_at.or(before.doors_at),
        None,
        None,
    )
    .map_err(|e| ApiError::from(crate::inventory::InventoryError::from(e)))?;
    let after: EventSettings = sqlx::query_as(
        "UPDATE events SET name = COALESCE($2, name), sale_start = COALESCE($3, sale_start),
                hold_ttl_s = COALESCE($4, hold_ttl_s),
                max_tickets_per_account = COALESCE($5, max_tickets_per_account),
                starts_at = COALESCE($6, starts_at), doors_at = COALESCE($7, doors_at),
                timezone = COALESCE($8, timezone),
                venue_address = COALESCE($9, venue_address),
                ticket_code = COALESCE($10, ticket_code),
                reentry = COALESCE($11, reentry), transfers = COALESCE($12, transfers)
          WHERE id = $1
         RETURNING id, name, sale_start, hold_ttl_s, max_tickets_per_account, starts_at,
                   doors_at, timezone, venue_address, ticket_code, reentry, transfers",
    )
    .bind(&event)
    .bind(req.name.as_deref().map(str::trim))
    .bind(req.sale_start)
    .bind(req.hold_ttl_s)
    .bind(req.max_tickets_per_account)
    .bind(req.starts_at)
    .bind(req.doors_at)
    .bind(req.timezone.as_deref())
    .bind(req.venue_address.as_deref())
    .bind(req.ticket_code)
    .bind(req.reentry)
    .bind(req.transfers)
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
