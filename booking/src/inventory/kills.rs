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
//! - With an `Idempotency-Key` (optional) the key is claimed by the change's first statement
//!   and its answer stored before the commit ([`idempotency::claim_tx`]): a retry of a kill
//!   that went through replays its answer instead of `409 SEATS_NOT_FREE`, the same key with
//!   another body is `422 IDEMPOTENCY_KEY_REUSED`, and a refusal stores nothing.

use crate::inventory::InventoryState;
use crate::platform::audit::{self, AdminOp, Operator};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey, OPS_ACCOUNT};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// `409`: some seats of a kill are held or sold.
pub const SEATS_NOT_FREE: &str = "SEATS_NOT_FREE";
/// `409`: some seats of a release are not held back.
pub const SEATS_NOT_HELD_BACK: &str = "SEATS_NOT_HELD_BACK";
/// Most seats in one kill or release.
pub const MAX_KILL_SEATS: usize = 2000;

pub fn router() -> OpenApiRouter<InventoryState> {
    OpenApiRouter::new()
        .routes(routes!(kill_seats, release_seats_delete))
        .routes(routes!(release_seats))
}

/// Why ops take seats out of sale.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    Production,
    Accessibility,
    Sponsor,
    Damaged,
    Other,
}

impl KillReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            KillReason::Production => "production",
            KillReason::Accessibility => "accessibility",
            KillReason::Sponsor => "sponsor",
            KillReason::Damaged => "damaged",
            KillReason::Other => "other",
        }
    }
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    #[schema(min_items = 1, max_items = 2000, value_type = Vec<KillSeatId>)]
    seats: Vec<String>,
    reason: KillReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    note: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    #[schema(min_items = 1, max_items = 2000, value_type = Vec<KillSeatId>)]
    seats: Vec<String>,
}

/// A seat id in a kill or release: 1..=64 characters (unknown ones are named in the `409`).
#[derive(ToSchema)]
#[schema(value_type = String, min_length = 1, max_length = 64)]
#[expect(
    dead_code,
    reason = "a schema only: the seat id's bounds in the document"
)]
struct KillSeatId(String);

#[derive(Debug, Serialize, ToSchema)]
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

/// The request's key and fingerprint (method, path, body), when it carries a key.
pub(crate) fn keyed(
    key: Option<IdempotencyKey>,
    method: &Method,
    uri: &OriginalUri,
    body: &impl Serialize,
) -> ApiResult<Option<(IdempotencyKey, Fingerprint)>> {
    let Some(key) = key else { return Ok(None) };
    let body = serde_json::to_value(body).map_err(ApiError::unexpected)?;
    Ok(Some((key, Fingerprint::of_json(method, uri.path(), &body))))
}

/// Claims the request's key as the transaction's first statement. `Some(response)`: the key
/// answered before (the caller rolls back and returns it).
pub(crate) async fn claim_key(
    state: &InventoryState,
    conn: &mut sqlx::PgConnection,
    keyed: &Option<(IdempotencyKey, Fingerprint)>,
) -> ApiResult<Result<Option<idempotency::Claim>, Response>> {
    let Some((key, fp)) = keyed else {
        return Ok(Ok(None));
    };
    match idempotency::claim_tx(conn, &state.idempotency.settings, OPS_ACCOUNT, key, fp).await {
        Ok(Begin::Started(claim)) => Ok(Ok(Some(claim))),
        Ok(Begin::Replay(stored)) => Ok(Err(stored.into_response())),
        Err(e) => Err(ApiError::from(e)),
    }
}

/// Stores `answer` under the claimed key in the caller's transaction.
pub(crate) async fn complete_key(
    conn: &mut sqlx::PgConnection,
    claim: Option<&idempotency::Claim>,
    status: StatusCode,
    answer: &impl Serialize,
) -> ApiResult<Response> {
    let bytes = serde_json::to_vec(answer).map_err(ApiError::unexpected)?;
    if let Some(claim) = claim {
        claim
            .complete_tx(conn, status, &bytes)
            .await
            .map_err(ApiError::from)?;
    }
    Ok(idempotency::respond(status, bytes))
}

/// Take free seats out of sale (all or nothing; `409 SEATS_NOT_FREE` names the others)
#[utoipa::path(post, path = "/admin/events/{event}/seat-kills", tag = tags::OPS,
    security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader, doc::OptionalIdempotencyKey),
    request_body = KillRequest,
    responses(
        (status = 200, description = "OK", body = KillAnswer),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
async fn kill_seats(
    State(state): State<InventoryState>,
    op: AdminOp,
    key: Option<IdempotencyKey>,
    method: Method,
    uri: OriginalUri,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<KillRequest>,
) -> ApiResult<Response> {
    let seats = seat_ids(&req.seats)?;
    if let Some(note) = &req.note
        && note.chars().count() > 500
    {
        return Err(ApiError::validation("note is at most 500 characters").with("field", "note"));
    }
    let keyed = keyed(key, &method, &uri, &req)?;
    let detail = serde_json::json!({"seats": seats, "reason": req.reason, "note": req.note});
    let how = Change::Kill {
        reason: req.reason.as_str(),
        note: req.note.as_deref(),
    };
    change(&state, &op, &event, &seats, how, &detail, &keyed).await
}

/// Put killed or held-back seats back on sale (all or nothing)
#[utoipa::path(delete, path = "/admin/events/{event}/seat-kills", tag = tags::OPS,
    operation_id = "release_seats_delete",
    security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader, doc::OptionalIdempotencyKey),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "OK", body = KillAnswer),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
async fn release_seats_delete(
    state: State<InventoryState>,
    op: AdminOp,
    key: Option<IdempotencyKey>,
    method: Method,
    uri: OriginalUri,
    event: Path<String>,
    req: ApiJson<ReleaseRequest>,
) -> ApiResult<Response> {
    release_seats(state, op, key, method, uri, event, req).await
}

/// Put killed or held-back seats back on sale (all or nothing)
#[utoipa::path(post, path = "/admin/events/{event}/seat-kills/release", tag = tags::OPS,
    security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader, doc::OptionalIdempotencyKey),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "OK", body = KillAnswer),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
async fn release_seats(
    State(state): State<InventoryState>,
    op: AdminOp,
    key: Option<IdempotencyKey>,
    method: Method,
    uri: OriginalUri,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> ApiResult<Response> {
    let seats = seat_ids(&req.seats)?;
    let keyed = keyed(key, &method, &uri, &req)?;
    let detail = serde_json::json!({"seats": seats});
    change(
        &state,
        &op,
        &event,
        &seats,
        Change::Release,
        &detail,
        &keyed,
    )
    .await
}

async fn change(
    state: &InventoryState,
    op: &Operator,
    event: &str,
    seats: &[String],
    how: Change<'_>,
    detail: &serde_json::Value,
    keyed: &Option<(IdempotencyKey, Fingerprint)>,
) -> ApiResult<Response> {
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the seat change")?;
    let claim = match claim_key(state, &mut tx, keyed).await? {
        Ok(claim) => claim,
        // Dropping the transaction rolls the claim statement back.
        Err(replay) => return Ok(replay),
    };
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
    let answer = KillAnswer {
        event_id: event.to_owned(),
        seats: seats.to_vec(),
        status,
    };
    let resp = complete_key(&mut tx, claim.as_ref(), StatusCode::OK, &answer).await?;
    tx.commit()
        .await
        .context("failed to commit the seat change")?;
    state.seat_maps.changed(event);
    Ok(resp)
}
