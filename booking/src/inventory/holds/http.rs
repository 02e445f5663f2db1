//! `POST /api/events/{event}/holds` (take seats) and `DELETE /api/holds/{hold}` (let them go).

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::pick::{BestAvailable, hold_best};
use crate::inventory::holds::refusal::{
    hold_status, limit_refusal, sale_not_started, seat_refusal,
};
use crate::inventory::holds::release::release_own_tx;
use crate::inventory::holds::take::{
    Attempt, SeatShort, SeatsTaken, expire_account_holds, finish_attempt, take_seats_tx,
};
use crate::inventory::http::{admitted_for, counted};
use crate::inventory::model::{
    HoldKind, HoldStatus, Invalid, check_seat_list, is_plausible_hold_id,
};
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
    OpenApiRouter::new()
        .routes(routes!(create_hold))
        .routes(routes!(delete_hold))
}

/// A seat id: 1..=64 of A-Z a-z 0-9 `-` `_` `.` `:` (`model::is_valid_seat_id`).
#[derive(ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
#[expect(
    dead_code,
    reason = "a schema only: the seat id's form in the document"
)]
pub struct SeatId(String);

/// [`HoldRequest`] as the document states it: exactly one of `seats` and `best_available`
/// (the struct takes both as optional and refuses anything else with `422`).
#[derive(ToSchema)]
#[schema(as = HoldRequest)]
#[serde(untagged)]
#[expect(
    dead_code,
    reason = "a schema only: the request's one-of in the document"
)]
enum HoldRequestDoc {
    Seats(ExplicitSeats),
    Best(Best),
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "a schema only")]
struct ExplicitSeats {
    /// Explicit seats (distinct; at most `max_seats_per_hold`, 10 by default).
    #[schema(min_items = 1, max_items = 10)]
    seats: Vec<SeatId>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "a schema only")]
struct Best {
    best_available: BestAvailable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Explicit seats; exactly one of `seats` and `best_available`.
    #[serde(default)]
    pub seats: Option<Vec<String>>,
    /// Let booking choose ([`super::pick`]).
    #[serde(default)]
    pub best_available: Option<BestAvailable>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Hold)]
pub struct HoldResponse {
    pub hold_id: String,
    pub event: String,
    pub kind: HoldKind,
    pub seats: Vec<String>,
    pub held_until: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub total: i64,
}

/// Hold seats (one conditional statement: all or nothing)
///
/// `409` codes: `SEAT_TAKEN`, `ORPHAN_SEAT {seats}` (events with `no_orphans`),
/// `NO_SEATS_TOGETHER`, `SOLD_OUT`, `LIMIT_EXCEEDED`, `SALE_NOT_STARTED`.
#[utoipa::path(post, path = "/api/events/{event}/holds", tag = tags::INVENTORY,
    params(doc::EventPath),
    request_body = HoldRequestDoc,
    responses(
        (status = 201, description = "Held", body = HoldResponse),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn create_hold(
    State(state): State<InventoryState>,
    Path(event): Path<String>,
    admitted: Result<Admitted, ApiError>,
    body: Result<ApiJson<HoldRequest>, ApiError>,
) -> ApiResult<(StatusCode, SessionUntil, ApiJson<HoldResponse>)> {
    let r = async {
        let account = admitted_for(admitted, &event)?;
        let ApiJson(req) = body?;
        Ok(match (req.seats, req.best_available) {
            (Some(seats), None) => hold_seats(&state, &event, &account, seats).await?,
            (None, Some(best)) => hold_best(&state, &event, &account, best).await?,
            (Some(_), Some(_)) => {
                return Err(InventoryError::from(Invalid::field(
                    "seats",
                    "give either seats or best_available, not both",
                ))
                .into());
            }
            (None, None) => {
                return Err(InventoryError::from(Invalid::field(
                    "seats",
                    "give seats or best_available",
                ))
                .into());
            }
        })
    }
    .await;
    let (resp, until) = counted(&state, r)?;
    state.metrics.holds.with_label_values(&["seats"]).inc();
    Ok((
        StatusCode::CREATED,
        SessionUntil(Some(until)),
        ApiJson(resp),
    ))
}

async fn hold_seats(
    state: &InventoryState,
    event: &str,
    account: &str,
    seats: Vec<String>,
) -> Result<(HoldResponse, i64), InventoryError> {
    let n = check_seat_list(&seats, state.settings.max_seats_per_hold)?;
    // Events with `no_orphans` run the guarded statement (the same hold, plus the check that
    // it strands no seat, under its locks); others keep the plain one.
    let Some(guard) = state.events.no_orphans(&state.pool, event).await? else {
        return Err(InventoryError::UnknownEvent);
    };
    let pool = &state.hold_pool;
    let mut healed = false;
    let batched = !guard && state.hold_batcher.enabled();
    loop {
        // With others of the event's holds when they arrive together (`grouped.rs`); on its
        // own when batching is off, for the guarded statement, or when its batch failed.
        let served = match batched {
            true => state.hold_batcher.take(event, account, &seats, n).await,
            false => None,
        };
        let attempt = match served {
            Some(attempt) => finish_attempt(pool, attempt?).await,
            None => db::retry(1, || take_seats_tx(pool, event, account, &seats, n, guard)).await?,
        };
        match attempt {
            Attempt::Done(taken) => return Ok(taken_response(state, event, taken, seats)),
            Attempt::Limit if !healed => {
                // The account's own expired holds still count until swept; expire them now
                // (exactly like the sweeper would) and try once more.
                healed = true;
                // Try again even when it ended nothing itself: it may have waited for a
                // sweeper that was expiring the same hold and has now given the usage back.
                expire_account_holds(pool, event, account).await?;
            }
            Attempt::Limit => return Err(limit_refusal(pool, event, account, n).await),
            Attempt::NotOnSale => return Err(sale_not_started(pool, event).await),
            Attempt::Short(SeatShort::Free(free)) => {
                return Err(seat_refusal(pool, event, &seats, free).await);
            }
            Attempt::Short(SeatShort::Stranded(seats)) => {
                return Err(InventoryError::OrphanSeat { seats });
            }
        }
    }
}

/// The answer for a hold the statement took (explicit or best available), and its side
/// effects: the seat map is stale, reclaimed holds are counted.
pub(crate) fn taken_response(
    state: &InventoryState,
    event: &str,
    taken: SeatsTaken,
    seats: Vec<String>,
) -> (HoldResponse, i64) {
    state.seat_maps.changed(event);
    for kind in &taken.reclaimed {
        state
            .metrics
            .holds_expired
            .with_label_values(&[kind.as_str()])
            .inc();
    }
    let total = taken.seats.iter().map(|(_, p)| p).sum();
    let resp = HoldResponse {
        hold_id: taken.hold_id,
        event: event.to_owned(),
        kind: HoldKind::Seats,
        seats,
        held_until: taken.expires_at,
        expires_at: taken.expires_at,
        total,
    };
    (resp, taken.live_until_ms)
}

/// Release one's own hold (also when already released or expired)
#[utoipa::path(delete, path = "/api/holds/{hold}", tag = tags::INVENTORY,
    params(("hold" = String, Path)),
    responses(
        (status = 204, description = "Done, no body"),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
    ))]
async fn delete_hold(
    State(state): State<InventoryState>,
    Path(hold): Path<String>,
    admitted: Result<Admitted, ApiError>,
) -> ApiResult<(SessionUntil, StatusCode)> {
    let r = async {
        let admitted = admitted?;
        Ok(release_own_hold(&state, &hold, admitted.account(), admitted.event()).await?)
    }
    .await;
    counted(&state, r)
}

async fn release_own_hold(
    state: &InventoryState,
    hold: &str,
    account: &str,
    admission_event: &str,
) -> Result<(SessionUntil, StatusCode), InventoryError> {
    if !is_plausible_hold_id(hold) {
        return Err(InventoryError::HoldNotFound);
    }
    // A release locks shards in order and a GA hold at most one shard while waiting, but a
    // multi-unit hold racing releases can still deadlock (seen in ga_shards tests): retried.
    // One autocommit statement on the hold connections.
    let released = db::retry(4, || async {
        let mut conn = state
            .hold_pool
            .acquire()
            .await
            .during("acquire a hold connection")?;
        let r = release_own_tx(&mut conn, hold, account, admission_event).await;
        conn.ended_if(match &r {
            Err(InventoryError::Db { source, .. }) => crate::platform::kept::answered(source),
            _ => true,
        });
        r
    })
    .await?;
    if let Some(r) = released {
        if r.seats {
            state.seat_maps.changed(&r.event_id);
        }
        return Ok((SessionUntil(Some(r.live_until_ms)), StatusCode::NO_CONTENT));
    }
    // Nothing changed; say why (a read for the answer only; the middleware reads the end).
    let status = why_not_released(hold_status(&state.pool, hold).await?, account)?;
    Ok((SessionUntil(None), status))
}

/// The answer to a release that changed nothing, from the hold's status and owner: someone
/// else's hold does not exist for this caller; an order's hold is the order's to end; an
/// already released or expired hold makes the release idempotent.
fn why_not_released(
    row: Option<(HoldStatus, String)>,
    account: &str,
) -> Result<StatusCode, InventoryError> {
    match row {
        None => Err(InventoryError::HoldNotFound),
        Some((_, owner)) if owner != account => Err(InventoryError::HoldNotFound),
        Some((status, _)) if status.is_owned_by_order() => {
            Err(InventoryError::HoldOrdered { status })
        }
        Some(_) => Ok(StatusCode::NO_CONTENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(status: HoldStatus) -> Option<(HoldStatus, String)> {
        Some((status, "fan".to_owned()))
    }

    #[test]
    fn a_release_that_changed_nothing_is_explained() {
        assert!(matches!(
            why_not_released(None, "fan"),
            Err(InventoryError::HoldNotFound)
        ));
        // Another account's hold is not found, whatever its status: ids are not disclosed.
        assert!(matches!(
            why_not_released(owned(HoldStatus::Ordered), "thief"),
            Err(InventoryError::HoldNotFound)
        ));
        for status in [HoldStatus::Ordered, HoldStatus::Sold] {
            assert!(matches!(
                why_not_released(owned(status), "fan"),
                Err(InventoryError::HoldOrdered { status: s }) if s == status
            ));
        }
        for status in [HoldStatus::Released, HoldStatus::Expired] {
            assert_eq!(
                why_not_released(owned(status), "fan").ok(),
                Some(StatusCode::NO_CONTENT),
                "{status:?}"
            );
        }
    }
}
