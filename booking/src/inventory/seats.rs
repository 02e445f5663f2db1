//! The seat map, in two forms (docs/api.md, "Seat map" and "Compact seat map"):
//! - `GET /api/events/{event}/seats`: the JSON map, one object per seat (about 5 MB for
//!   60,000 seats), kept for existing clients;
//! - `GET /api/events/{event}/seats/layout` (what exists: sections, rows, seat ids, tiers and
//!   prices; written once per event, cacheable for long) and
//!   `GET /api/events/{event}/seats/availability` (2 bits per seat in the layout's order,
//!   base64: 20 KB for 60,000 seats), each with its own `ETag`; `If-None-Match` → `304`.
//!
//! All three are rendered from one cached snapshot per event and process, built once per
//! change by one request (single flight) and gzipped once when the client accepts gzip
//! ([`cache`] says when a snapshot is stale). Availability is a hint: the hold statement
//! decides. A seat whose hold has expired (by the database clock) is shown as available, as
//! the next hold would take it.

mod cache;
pub(crate) mod encode;
mod layout;

pub use cache::SeatMapCache;

use crate::inventory::InventoryState;
use crate::inventory::http::{admitted_for, counted};
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use encode::{Encoded, accepts_gzip, not_modified};
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<InventoryState> {
    OpenApiRouter::new()
        .routes(routes!(seat_map))
        .routes(routes!(seat_layout))
        .routes(routes!(seat_availability))
}

/// The bodies as the document describes them (the handlers serve pre-encoded bytes).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "schemas only: the shape of the pre-encoded answers"
)]
struct SeatMapBody {
    event: String,
    seats: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "schemas only: the shape of the pre-encoded answers"
)]
struct SeatLayoutBody {
    event: String,
    id: String,
    format: i64,
    seats: i64,
    #[schema(required = false)]
    tiers: Vec<serde_json::Map<String, serde_json::Value>>,
    sections: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "schemas only: the shape of the pre-encoded answers"
)]
struct SeatAvailabilityBody {
    event: String,
    layout: String,
    seats: i64,
    encoding: AvailabilityEncoding,
    data: String,
}

#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "schemas only: the shape of the pre-encoded answers"
)]
enum AvailabilityEncoding {
    #[schema(rename = "2bit-base64")]
    TwoBitBase64,
}

/// How long a client may keep the layout without asking (it never changes for an event).
const LAYOUT_MAX_AGE: &str = "private, max-age=86400";

#[derive(Clone, Copy)]
enum Form {
    Json,
    Layout,
    Availability,
}

/// The full seat map (large: prefer layout + availability)
#[utoipa::path(get, path = "/api/events/{event}/seats", tag = tags::INVENTORY, params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = inline(SeatMapBody)),
        (status = 304, description = "Not modified (If-None-Match)"),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
    ))]
async fn seat_map(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    headers: HeaderMap,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<Response> {
    serve(&state, &event, &headers, admitted, Form::Json).await
}

/// The compact layout (never changes for an event)
#[utoipa::path(get, path = "/api/events/{event}/seats/layout", tag = tags::INVENTORY,
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = inline(SeatLayoutBody)),
        (status = 304, description = "Not modified"),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
    ))]
async fn seat_layout(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    headers: HeaderMap,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<Response> {
    serve(&state, &event, &headers, admitted, Form::Layout).await
}

/// The compact availability (2 bits per seat, base64)
#[utoipa::path(get, path = "/api/events/{event}/seats/availability", tag = tags::INVENTORY,
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = inline(SeatAvailabilityBody)),
        (status = 304, description = "Not modified"),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
    ))]
async fn seat_availability(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    headers: HeaderMap,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<Response> {
    serve(&state, &event, &headers, admitted, Form::Availability).await
}

async fn serve(
    state: &InventoryState,
    event: &str,
    headers: &HeaderMap,
    admitted: Result<Admitted, ApiError>,
    form: Form,
) -> ApiResult<Response> {
    let arrived = Instant::now();
    let r = async {
        admitted_for(admitted, event)?;
        let ttl = Duration::from_secs(state.settings.seat_map_cache_s);
        let builds = &state.metrics.seat_map_builds;
        let snap = state
            .seat_maps
            .snapshot(&state.pool, event, ttl, arrived, builds)
            .await?;
        let encoded: Arc<Encoded> = match form {
            Form::Json => snap.json(event, builds).await?,
            Form::Layout => return Ok(respond(&snap.layout.compact, headers, form, state)),
            Form::Availability => return Ok(respond(&snap.availability, headers, form, state)),
        };
        Ok(respond(&encoded, headers, form, state))
    }
    .await;
    counted(state, r)
}

/// The body (gzipped if accepted) with its `ETag`, or `304` when the client has it.
fn respond(enc: &Encoded, req: &HeaderMap, form: Form, state: &InventoryState) -> Response {
    let cache_control = match form {
        // The JSON map keeps the header it always had.
        Form::Json => HeaderValue::from_str(&format!(
            "private, max-age={}",
            state.settings.seat_map_cache_s
        ))
        .unwrap_or(HeaderValue::from_static("private, max-age=1")),
        Form::Layout => HeaderValue::from_static(LAYOUT_MAX_AGE),
        // Always revalidate: a 304 costs a few bytes, a stale map costs a lost pick.
        Form::Availability => HeaderValue::from_static("private, no-cache"),
    };
    let modified = !not_modified(req, &enc.etag);
    let mut resp = if !modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        match (&enc.gzip, accepts_gzip(req)) {
            (Some(gz), true) => {
                let mut r = gz.clone().into_response();
                r.headers_mut()
                    .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                r
            }
            _ => enc.body.clone().into_response(),
        }
    };
    let h = resp.headers_mut();
    if modified {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    h.insert(header::CACHE_CONTROL, cache_control);
    h.insert(header::ETAG, enc.etag.clone());
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    resp
}
