//! Seat kills and hold-backs (ops, issue 18): `POST /admin/events/{event}/seat-kills` takes
//! free seats out of sale, `POST /admin/events/{event}/seat-kills/release` (or `DELETE
//! .../seat-kills` with the same body) puts them back on sale, together with seats a refund
//! held back (`migrations/0007`).
//!
//! Guarantees:
//! - A kill is all or nothing, one statement: the seats are locked in `seat_id` order (like
//!   every seat path, so no deadlock with a hold), and only if every one exists and is
//!   `available` after its lock are they all set `held_back` with the kill's reason. A seat
//!   held (even by a hold past its TTL that the sweeper has not tidied yet) or sold is
//!   refused (`409 SEATS_NOT_FREE` naming them) and nothing changes. Of a kill and a hold
//!   racing on a seat, the row lock orders them and each re-checks the status: the seat ends
//!   killed or held, never both.
//! - A killed seat is `held_back`: the hold statement takes only `available` seats (or held
//!   ones past their TTL), and the seat map shows it as sold. The seat-map cache of this
//!   process is marked stale after the commit.
//! - Each change writes its audit entry in its own transaction (`platform::audit`), so the
//!   log has an entry exactly when the change committed; a refused request writes none.

use crate::inventory::InventoryState;
use crate::platform::audit::{self, Operator};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use anyhow::Context;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde::{Deserialize, Serialize};
use shared::error::codes;

/// `409`: some seats of a kill are held or sold.
pub const SEATS_NOT_FREE: &str = "SEATS_NOT_FREE";
/// `409`: some seats of a release are not held back.
pub const SEATS_NOT_HELD_BACK: &str = "SEATS_NOT_HELD_BACK";
/// Most seats in one kill or release.
pub const MAX_KILL_SEATS: usize = 2000;

pub fn router() -> Router<InventoryState> {
    Router::new()
        .route(
            "/admin/events/{event}/seat-kills",
            post(kill_seats).delete(release_seats),
        )
        .route(
            "/admin/events/{event}/seat-kills/release",
            post(release_seats),
        )
}

/// Why ops take seats out of sale.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    Production,
    Accessibility,
    Sponsor,
    Damaged,
    Other,
}

impl KillReason {
    fn as_str(self) -> &'static str {
        match self {
            KillReason::Production => "production",
            KillReason::Accessibility => "accessibility",
            KillReason::Sponsor => "sponsor",
            KillReason::Damaged => "damaged",
            KillReason::Other => "other",
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    seats: Vec<String>,
    reason: KillReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    seats: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct KillAnswer {
    event_id: String,
    /// The seats changed, sorted.
    seats: Vec<String>,
    status: &'static str,
}

/// The seat ids of a request: 1..=[`MAX_KILL_SEATS`], each 1..=64 characters, deduplicated
/// and sorted.
fn seat_ids(seats: &[String]) -> ApiResult<Vec<String>> {
    if seats.is_empty() || seats.len() > MAX_KILL_SEATS {
        return Err(ApiError::validation(format!(
            "seats must list 1 to {MAX_KILL_SEATS} seat ids"
        ))
        .with("field", "seats"));
    }
    if let Some(bad) = seats.iter().find(|s| s.is_empty() || s.len() > 64) {
        return Err(ApiError::validation("a seat id is 1 to 64 characters")
            .with("field", "seats")
            .with("seat", bad.chars().take(64).collect::<String>()));
    }
    let mut ids = seats.to_vec();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// What one kill or release statement found.
#[derive(sqlx::FromRow)]
struct Changed {
    changed: i64,
    unknown: Vec<String>,
    refused: Vec<String>,
}

/// One all-or-nothing seat change: `$1` event, `$2` sorted seat ids. The seats are locked in
/// `seat_id` order; they change only when every one exists and is `$from`; the answer names
/// the unknown ones and those not `$from`.
macro_rules! seat_change_sql {
    ($from:literal, $set:literal) => {
        concat!(
            "
WITH want AS (SELECT unnest($2::text[]) AS seat_id),
locked AS (
    SELECT s.seat_id, s.status FROM seats s JOIN want w ON w.seat_id = s.seat_id
     WHERE s.event_id = $1
     ORDER BY s.seat_id
     FOR UPDATE OF s),
verdict AS (
    SELECT count(*) = (SELECT count(*) FROM want)
           AND count(*) FILTER (WHERE status <> '",
            $from,
            "') = 0 AS ok
      FROM locked),
upd AS (
    UPDATE seats s SET ",
            $set,
            "
      FROM locked l, verdict v
     WHERE s.event_id = $1 AND s.seat_id = l.seat_id AND v.ok AND s.status = '",
            $from,
            "'
    RETURNING s.seat_id)
SELECT (SELECT count(*) FROM upd) AS changed,
       ARRAY(SELECT seat_id FROM want EXCEPT SELECT seat_id FROM locked ORDER BY 1) AS unknown,
       ARRAY(SELECT seat_id FROM locked WHERE status <> '",
            $from,
            "' ORDER BY 1) AS refused"
        )
    };
}

/// Free seats out of sale; `$3` reason, `$4` note.
const KILL: &str = seat_change_sql!(
    "available",
    "status = 'held_back', kill_reason = $3, kill_note = $4"
);

/// Killed and refund-held-back seats back on sale.
const RELEASE: &str = seat_change_sql!(
    "held_back",
    "status = 'available', order_id = NULL, hold_id = NULL,
                       held_until = NULL, kill_reason = NULL, kill_note = NULL"
);

#[derive(Clone, Copy)]
enum Change<'a> {
    Kill {
        reason: &'a str,
        note: Option<&'a str>,
    },
    Release,
}

async fn kill_seats(
    State(state): State<InventoryState>,
    op: Operator,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<KillRequest>,
) -> ApiResult<(StatusCode, ApiJson<KillAnswer>)> {
    let seats = seat_ids(&req.seats)?;
    if let Some(note) = &req.note
        && note.chars().count() > 500
    {
        return Err(ApiError::validation("note is at most 500 characters").with("field", "note"));
    }
    let detail = serde_json::json!({"seats": seats, "reason": req.reason, "note": req.note});
    let how = Change::Kill {
        reason: req.reason.as_str(),
        note: req.note.as_deref(),
    };
    let answer = change(&state, &op, &event, &seats, how, &detail).await?;
    Ok((StatusCode::OK, ApiJson(answer)))
}

async fn release_seats(
    State(state): State<InventoryState>,
    op: Operator,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> ApiResult<(StatusCode, ApiJson<KillAnswer>)> {
    let seats = seat_ids(&req.seats)?;
    let detail = serde_json::json!({"seats": seats});
    let answer = change(&state, &op, &event, &seats, Change::Release, &detail).await?;
    Ok((StatusCode::OK, ApiJson(answer)))
}

async fn change(
    state: &InventoryState,
    op: &Operator,
    event: &str,
    seats: &[String],
    how: Change<'_>,
    detail: &serde_json::Value,
) -> ApiResult<KillAnswer> {
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the seat change")?;
    let known: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)")
        .bind(event)
        .fetch_one(&mut *tx)
        .await
        .context("failed to read the event")?;
    if !known {
        return Err(ApiError::not_found(codes::UNKNOWN_EVENT, "no such event"));
    }
    let (sql, action, status) = match how {
        Change::Kill { .. } => (KILL, "seats.kill", "held_back"),
        Change::Release => (RELEASE, "seats.release", "available"),
    };
    let query = sqlx::query_as::<_, Changed>(sqlx::AssertSqlSafe(sql))
        .bind(event)
        .bind(seats);
    let query = match how {
        Change::Kill { reason, note } => query.bind(reason).bind(note),
        Change::Release => query,
    };
    let found = query
        .fetch_one(&mut *tx)
        .await
        .context("failed to change the seats")?;
    if !found.unknown.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::UNKNOWN_SEATS,
            "some seats do not exist in this event",
        )
        .with("seats", found.unknown));
    }
    if !found.refused.is_empty() || found.changed != seats.len() as i64 {
        return Err(match how {
            Change::Kill { .. } => ApiError::conflict(
                SEATS_NOT_FREE,
                "some seats are held or sold; nothing was killed",
            ),
            Change::Release => ApiError::conflict(
                SEATS_NOT_HELD_BACK,
                "some seats are not held back; nothing was released",
            ),
        }
        .with("seats", found.refused));
    }
    audit::record_tx(
        &mut tx,
        op,
        action,
        &format!("event:{event}"),
        Some(event),
        detail,
    )
    .await?;
    tx.commit()
        .await
        .context("failed to commit the seat change")?;
    state.seat_maps.changed(event);
    Ok(KillAnswer {
        event_id: event.to_owned(),
        seats: seats.to_vec(),
        status,
    })
}
