//! What the storefront needs to know about an event besides its seat map:
//! `GET /api/events/{event}` → name, venue, sale start, hold TTL, the per-account ticket
//! limit, price tiers and GA tiers with their remaining units.
//!
//! Read-only and admitted-only (the token's `evt` must match, like every event-scoped path).
//! The numbers are a hint for display: the hold statements decide. One query, one round trip:
//! the tiers are aggregated to JSON by Postgres.

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::http::{admitted_for, counted};
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::types::Json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<InventoryState> {
    OpenApiRouter::new().routes(routes!(event_info))
}

#[derive(sqlx::FromRow)]
struct InfoRow {
    id: String,
    name: String,
    venue: String,
    sale_start: DateTime<Utc>,
    hold_ttl_s: i32,
    max_tickets_per_account: i32,
    price_tiers: Json<Value>,
    ga_tiers: Json<Value>,
}

#[derive(Serialize, ToSchema)]
struct EventInfo {
    id: String,
    name: String,
    venue: String,
    sale_start: DateTime<Utc>,
    hold_ttl_s: i32,
    max_tickets_per_account: i32,
    /// The store currency (`[orders] currency`); prices are in its minor units.
    currency: String,
    /// `[{"tier", "price"}]`, prices in minor units.
    #[schema(value_type = Vec<Object>)]
    price_tiers: Value,
    /// `[{"tier", "price", "capacity", "available"}]`; `available` sums the tier's shards.
    #[schema(value_type = Vec<Object>)]
    ga_tiers: Value,
}

/// The event as the shop shows it
#[utoipa::path(get, path = "/api/events/{event}", tag = tags::INVENTORY, params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = EventInfo),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
    ))]
async fn event_info(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<Response> {
    let r = async {
        admitted_for(admitted, &event)?;
        Ok(load(&state.pool, &event, &state.settings.currency).await?)
    }
    .await;
    let info = counted(&state, r)?;
    Ok((
        [(
            header::CACHE_CONTROL,
            // GA counts move; a fan's browser may reuse the answer for a second.
            HeaderValue::from_static("private, max-age=1"),
        )],
        axum::Json(info),
    )
        .into_response())
}

async fn load(pool: &PgPool, event: &str, currency: &str) -> Result<EventInfo, InventoryError> {
    let row: Option<InfoRow> = sqlx::query_as(
        "SELECT e.id, e.name, e.venue, e.sale_start, e.hold_ttl_s, e.max_tickets_per_account,
                COALESCE((SELECT json_agg(json_build_object('tier', p.tier, 'price', p.price)
                                          ORDER BY p.tier)
                          FROM price_tiers p WHERE p.event_id = e.id), '[]'::json)
                    AS price_tiers,
                COALESCE((SELECT json_agg(json_build_object(
                                     'tier', g.tier, 'price', g.price, 'capacity', g.capacity,
                                     'available', COALESCE(c.available, 0))
                                  ORDER BY g.tier)
                          FROM ga_tiers g
                          LEFT JOIN (SELECT tier, sum(available)::bigint AS available
                                     FROM ga_counters WHERE event_id = $1 GROUP BY tier) c
                                 ON c.tier = g.tier
                          WHERE g.event_id = e.id), '[]'::json)
                    AS ga_tiers
         FROM events e WHERE e.id = $1",
    )
    .bind(event)
    .fetch_optional(pool)
    .await
    .during("read the event with its tiers")?;
    let row = row.ok_or(InventoryError::UnknownEvent)?;
    Ok(EventInfo {
        id: row.id,
        name: row.name,
        venue: row.venue,
        sale_start: row.sale_start,
        hold_ttl_s: row.hold_ttl_s,
        max_tickets_per_account: row.max_tickets_per_account,
        currency: currency.to_owned(),
        price_tiers: row.price_tiers.0,
        ga_tiers: row.ga_tiers.0,
    })
}
