//! `POST /api/checkin/{event}/scans` (class `scanner`; on booking's listener until the
//! gateway's route table exists): a scanner's online scan, answered `200 ENTRY|EXIT` or a
//! refusal with a stable code. The code's checks that need no database come first
//! (`super::code`); the ticket's state is decided by `super::repo::decide`, one statement.
//! Every decision is logged and counted; a replayed `scan_id` answers the first answer with
//! `Idempotent-Replayed: true`.

use crate::checkin::CheckinState;
use crate::checkin::code::{self, Refused};
use crate::checkin::repo::{self, Decision, Direction, Scan, Written};
use crate::platform::auth::{Auth, ScannerCredential};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Largest scan body: a code is about 300 bytes (at most 2 KiB is read), the rest is small.
const MAX_SCAN_BODY: usize = 4 * 1024;
/// Longest `scan_id`.
pub(crate) const MAX_SCAN_ID: usize = 128;

pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new()
        .routes(routes!(scan))
        .layer(DefaultBodyLimit::max(MAX_SCAN_BODY))
}

/// A caller holding a live scanner credential (`platform::auth::Auth::scanner`).
pub struct Scanner(pub ScannerCredential);

impl<S> FromRequestParts<S> for Scanner
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Auth::from_ref(state).scanner(parts).await.map(Scanner)
    }
}

/// One scan.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScanRequest {
    /// The text the scanner read: a ticket code, or on rotating events the code, `~` and the
    /// 8-digit TOTP
    #[schema(max_length = 2100)]
    code: String,
    direction: Direction,
    /// The scanner's own id of this scan (1 to 128 visible characters): sent again, the same
    /// scan is answered the same and changes nothing
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128, pattern = "^[!-~]+$")]
    scan_id: Option<String>,
    /// The scanner's clock when it scanned (RFC 3339): kept as information, never used to
    /// decide
    #[serde(default)]
    scanned_at: Option<DateTime<Utc>>,
}

/// The ticket a decision is about.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScannedTicket {
    id: String,
    /// Reserved seating: the seat id
    #[serde(skip_serializing_if = "Option::is_none")]
    seat: Option<String>,
    /// General admission: the tier
    #[serde(skip_serializing_if = "Option::is_none")]
    tier: Option<String>,
    /// The gate of this scan
    gate: String,
    /// When this scan was decided (server time)
    at: DateTime<Utc>,
}

/// A scan that admitted or let out.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScanAnswer {
    /// `ENTRY` or `EXIT`
    #[schema(example = "ENTRY")]
    result: String,
    ticket: ScannedTicket,
}

/// Check a ticket in or out at the door (class `scanner`)
#[utoipa::path(post, path = "/api/checkin/{event}/scans", tag = tags::CHECKIN,
    params(doc::EventPath),
    security(("scanner" = [])),
    request_body = ScanRequest,
    responses(
        (status = 200, description = "`ENTRY` or `EXIT` (a replayed `scan_id` answers the first answer, with `Idempotent-Replayed: true`)", body = ScanAnswer),
        (status = 400, description = "`INVALID_CODE {reason}`: forged, truncated, unknown key, bad signature, not a code, a rotating ticket's code without its TOTP; or a malformed body", body = doc::Error),
        (status = 401, description = "`UNAUTHORIZED {reason}`: missing, unknown, expired, revoked or malformed scanner credential", body = doc::Error),
        (status = 403, description = "`WRONG_EVENT`: a scanner of another event, or a good code of another event; `WRONG_CREDENTIAL_TYPE`: not a scanner credential", body = doc::Error),
        (status = 409, description = "`ALREADY_INSIDE {at, gate, ticket}`, `REENTRY_NOT_ALLOWED {ticket}`, `NOT_INSIDE {ticket}` (an exit of a ticket not inside), `CODE_EXPIRED` (a rotating code's TOTP outside the current step ±1)", body = doc::Error),
        (status = 410, description = "`VOIDED {reason, ticket}`: `refunded`, `disputed`, or `reissued` (the code names an older version of the ticket)", body = doc::Error),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, description = "`VALIDATION_FAILED {field}` (a bad `scan_id`); `IDEMPOTENCY_KEY_REUSED`: this `scan_id` was another ticket's or direction's scan", body = doc::Error),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn scan(
    State(state): State<CheckinState>,
    Scanner(scanner): Scanner,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<ScanRequest>,
) -> ApiResult<Response> {
    scanner.for_event(&event)?;
    if let Some(id) = &req.scan_id
        && !valid_scan_id(id)
    {
        return Err(
            ApiError::validation("scan_id must be 1 to 128 visible ASCII characters")
                .with("field", "scan_id"),
        );
    }
    let s = Scan {
        event: &event,
        scanner: &scanner,
        direction: req.direction,
        scan_id: req.scan_id.as_deref(),
        device_time: req.scanned_at,
        offline_decided: None,
        from_revoked: false,
    };
    let now = u64::try_from(Utc::now().timestamp()).unwrap_or_default();
    let read = code::read(&state.keys, &req.code, &event, now);
    // The ticket this scan is about, when its code's signature was good.
    let ticket = match &read {
        Ok(c) => Some(c.tid.clone()),
        Err(Refused::WrongEvent(c) | Refused::Expired(c)) => Some(c.tid.clone()),
        Err(Refused::Invalid(_)) => None,
    };
    let written = match &read {
        Ok(c) => repo::decide(&state.pool, &s, &c.tid, c.ver).await,
        Err(Refused::Invalid(why)) => {
            repo::record(&state.pool, &s, None, codes::INVALID_CODE, Some(*why)).await
        }
        Err(Refused::WrongEvent(c)) => {
            let t = Some((c.tid.as_str(), c.ver));
            repo::record(&state.pool, &s, t, codes::WRONG_EVENT, None).await
        }
        Err(Refused::Expired(c)) => {
            let t = Some((c.tid.as_str(), c.ver));
            repo::record(&state.pool, &s, t, codes::CODE_EXPIRED, None).await
        }
    }
    // Pool and connection failures stay `503` (retry the scan), not `500`.
    .map_err(ApiError::from)?;
    let (decision, replayed) = match written {
        Written::New(d) => {
            count(&state, &event, &d);
            (d, false)
        }
        Written::Replayed(d) => {
            state.metrics.replays.inc();
            (d, true)
        }
    };
    // A replay must be the same scan: the same direction, and the same ticket (or, for a code
    // that named none, again none).
    if replayed && (decision.direction != req.direction.as_str() || decision.ticket_id != ticket) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this scan_id was another scan (another ticket or direction); send a new one",
        )
        .with("field", "scan_id"));
    }
    let mut resp = answer(decision).into_response();
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// A scanner's id of a scan: 1 to 128 visible ASCII characters.
pub(crate) fn valid_scan_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_SCAN_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Counts a new decision (scans by result, entries and exits by event and gate).
pub(crate) fn count(state: &CheckinState, event: &str, d: &Decision) {
    state
        .metrics
        .scans
        .with_label_values(&[d.result.as_str()])
        .inc();
    match d.result.as_str() {
        "ENTRY" => state
            .metrics
            .entries
            .with_label_values(&[event, d.gate.as_str()])
            .inc(),
        "EXIT" => state
            .metrics
            .exits
            .with_label_values(&[event, d.gate.as_str()])
            .inc(),
        _ => {}
    }
}

/// The HTTP answer of a logged decision (the same for its replays).
fn answer(d: Decision) -> ApiResult<ApiJson<ScanAnswer>> {
    let ticket = d.ticket_id.clone().map(|id| ScannedTicket {
        id,
        seat: d.seat_id.clone(),
        tier: d.ga_tier.clone(),
        gate: d.gate.clone(),
        at: d.received_at,
    });
    let ticket_json = ticket
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(serde_json::Value::Null);
    let refusal = |status: StatusCode, code: &str, message: &str| {
        let e = ApiError::new(status, code, message);
        if ticket_json.is_null() {
            e
        } else {
            e.with("ticket", ticket_json.clone())
        }
    };
    let reason = d.reason.clone().unwrap_or_default();
    Err(match (d.result.as_str(), ticket) {
        ("ENTRY" | "EXIT", Some(ticket)) => {
            return Ok(ApiJson(ScanAnswer {
                result: d.result.clone(),
                ticket,
            }));
        }
        ("ALREADY_INSIDE", _) => refusal(
            StatusCode::CONFLICT,
            codes::ALREADY_INSIDE,
            "this ticket is inside already",
        )
        .with("at", json!(d.entry_at))
        .with("gate", json!(d.entry_gate)),
        ("REENTRY_NOT_ALLOWED", _) => refusal(
            StatusCode::CONFLICT,
            codes::REENTRY_NOT_ALLOWED,
            "this ticket went out, and this event does not allow re-entry",
        ),
        ("NOT_INSIDE", _) => refusal(
            StatusCode::CONFLICT,
            codes::NOT_INSIDE,
            "this ticket is not inside, so it cannot go out",
        ),
        ("VOIDED", _) => refusal(
            StatusCode::GONE,
            codes::VOIDED,
            "this ticket is void: do not admit",
        )
        .with("reason", reason),
        ("CODE_EXPIRED", _) => refusal(
            StatusCode::CONFLICT,
            codes::CODE_EXPIRED,
            "this code's time part is not current: ask the fan to show the live ticket page",
        ),
        ("WRONG_EVENT", _) => ApiError::new(
            StatusCode::FORBIDDEN,
            codes::WRONG_EVENT,
            "this ticket is for another event",
        ),
        ("INVALID_CODE", _) => {
            ApiError::bad_request(codes::INVALID_CODE, "not a valid ticket code of this event")
                .with("reason", reason)
        }
        (other, _) => ApiError::unexpected(anyhow::anyhow!(
            "a logged scan has an unknown result {other}"
        )),
    })
}
