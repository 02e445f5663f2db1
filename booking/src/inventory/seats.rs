//! The seat map: `GET /api/events/{event}/seats`.
//!
//! The map of a 60,000-seat event is a few megabytes and every admitted fan asks for it, so
//! the rendered body is cached per event for `seat_map_cache_s` (one second by default) and
//! rendered by ONE request at a time per event (the others wait for it instead of stampeding
//! Postgres). Availability is a hint here: the hold statement decides. A seat whose hold has
//! expired (by the database clock) is shown as available, as the next hold would take it.

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::http::{admitted_for, counted};
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn router() -> Router<InventoryState> {
    Router::new().route("/api/events/{event}/seats", get(seat_map))
}

type Slot = Arc<tokio::sync::Mutex<Option<(Instant, Bytes)>>>;

/// In-memory cache of rendered seat maps, one slot per event. The outer lock is held only
/// to find the slot; the slot's async lock serialises rendering for that event.
#[derive(Default)]
pub struct SeatMapCache {
    slots: Mutex<HashMap<String, Slot>>,
}

impl SeatMapCache {
    fn slot(&self, event: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(event.to_owned()).or_default().clone()
    }

    fn forget(&self, event: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.remove(event);
    }
}

#[derive(Serialize, sqlx::FromRow)]
struct SeatView {
    seat_id: String,
    section: String,
    #[sqlx(rename = "row_no")]
    row: i32,
    number: i32,
    tier: String,
    status: String,
}

#[derive(Serialize)]
struct SeatMapView<'a> {
    event: &'a str,
    seats: Vec<SeatView>,
}

async fn seat_map(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<Response> {
    let r = async {
        admitted_for(admitted, &event)?;
        Ok(cached_body(&state, &event).await?)
    }
    .await;
    let body = counted(&state, r)?;
    let max_age = state.settings.seat_map_cache_s;
    let cache_control = HeaderValue::from_str(&format!("private, max-age={max_age}"))
        .unwrap_or(HeaderValue::from_static("private, max-age=1"));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, cache_control),
        ],
        body,
    )
        .into_response())
}

async fn cached_body(state: &InventoryState, event: &str) -> Result<Bytes, InventoryError> {
    let ttl = Duration::from_secs(state.settings.seat_map_cache_s);
    if ttl.is_zero() {
        return render(&state.pool, event).await;
    }
    let slot = state.seat_maps.slot(event);
    let mut cached = slot.lock().await;
    if let Some((at, body)) = cached.as_ref()
        && at.elapsed() < ttl
    {
        return Ok(body.clone());
    }
    match render(&state.pool, event).await {
        Ok(body) => {
            *cached = Some((Instant::now(), body.clone()));
            Ok(body)
        }
        Err(e) => {
            drop(cached);
            // Do not keep slots for events that do not exist.
            state.seat_maps.forget(event);
            Err(e)
        }
    }
}

/// The seat map's body, read from Postgres.
async fn render(pool: &PgPool, event: &str) -> Result<Bytes, InventoryError> {
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM events WHERE id = $1")
        .bind(event)
        .fetch_optional(pool)
        .await
        .during("check that the event exists")?;
    if exists.is_none() {
        return Err(InventoryError::UnknownEvent);
    }
    let seats: Vec<SeatView> = sqlx::query_as(
        "SELECT seat_id, section, row_no, number, tier,
                CASE WHEN status = 'held' AND held_until <= clock_timestamp() THEN 'available'
                     -- Held back after a refund: to a fan it is simply not for sale.
                     WHEN status = 'held_back' THEN 'sold'
                     ELSE status END AS status
         FROM seats WHERE event_id = $1
         ORDER BY section, row_no, number, seat_id",
    )
    .bind(event)
    .fetch_all(pool)
    .await
    .during("read the seat map")?;
    let body = serde_json::to_vec(&SeatMapView { event, seats }).map_err(InventoryError::Render)?;
    Ok(Bytes::from(body))
}
