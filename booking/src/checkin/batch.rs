//! `POST /api/checkin/{event}/scans:batch` (class `scanner`): a scanner's offline decisions,
//! uploaded when the network returns.
//!
//! Guarantees:
//! - **The server's order decides.** Scans are applied one by one in the order the server
//!   receives them (a batch's scans in the batch's order), each through the same one-statement
//!   decision as an online scan (`super::repo`), so online scans and uploads racing for one
//!   ticket still give exactly one `ENTRY`. The device's clock is stored, never used to order.
//! - **Conflicts are recorded, not hidden.** When the device admitted (`ENTRY`/`EXIT`) and the
//!   server decides otherwise — the ticket was inside through another gate, void, not a code of
//!   ours — the scan is logged with both decisions and `conflict`; a ticket let in offline at
//!   two gates is one `ENTRY` and one conflict. A refusal the device made changed nothing at
//!   the door, so it is logged as the device decided and never applied.
//! - **Idempotent by `scan_id`** (required here): a replayed batch writes nothing and answers
//!   each scan's first result.
//! - **Whole-batch checks first**: the event, the size (≤ [`MAX_SCANS`] scans, ≤ 1 MiB), each
//!   scan's shape. A bad batch is a 4xx with nothing written; a bad *code* inside a good batch
//!   is that scan's `INVALID_CODE` result (it happened at the door and is kept).
//! - **A scanner revoked while offline** may still upload (what it decided happened): the
//!   scans are flagged `from_revoked_scanner`, counted and logged at warn as an alert.

use crate::checkin::CheckinState;
use crate::checkin::code::{self, Refused};
use crate::checkin::http::{MAX_SCAN_ID, count, valid_scan_id};
use crate::checkin::repo::{self, Decision, Direction, Scan, Written};
use crate::checkin::snapshot::SNAPSHOT_TTL_MIN;
use crate::platform::auth::{Auth, ScannerCredential};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Most scans in one batch (a scanner offline for long uploads several).
pub const MAX_SCANS: usize = 500;
/// Largest batch body.
const MAX_BATCH_BODY: usize = 1024 * 1024;
/// The results a device may have decided.
const DECIDED: [&str; 9] = [
    "ENTRY",
    "EXIT",
    "ALREADY_INSIDE",
    "REENTRY_NOT_ALLOWED",
    "NOT_INSIDE",
    "VOIDED",
    "WRONG_EVENT",
    "INVALID_CODE",
    "CODE_EXPIRED",
];

pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new()
        .routes(routes!(upload))
        .layer(DefaultBodyLimit::max(MAX_BATCH_BODY))
}

/// A caller holding a scanner credential that is live or was revoked (not expired, not
/// unknown): uploads only (`Auth::scanner_upload`).
pub struct Uploader(pub ScannerCredential);

impl<S> FromRequestParts<S> for Uploader
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Auth::from_ref(state)
            .scanner_upload(parts)
            .await
            .map(Uploader)
    }
}

/// Offline decisions, in the order the device made them.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 500 scans
    #[schema(min_items = 1, max_items = 500)]
    scans: Vec<OfflineScan>,
}

/// One decision the device made alone.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OfflineScan {
    /// The device's id of this scan (1 to 128 visible characters; required here)
    #[schema(min_length = 1, max_length = 128, pattern = "^[!-~]+$")]
    scan_id: String,
    /// The text the scanner read
    #[schema(max_length = 2100)]
    code: String,
    direction: Direction,
    /// The device's clock when it scanned (information; on rotating events the TOTP is checked
    /// at this time when it lies within the last 30 minutes, else at the server's)
    scanned_at: DateTime<Utc>,
    /// What the device decided: `ENTRY`, `EXIT` or a refusal code
    #[schema(example = "ENTRY")]
    decided: String,
}

/// The server's result of one uploaded scan.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    scan_id: String,
    /// The server's decision (`ENTRY`, `EXIT`, or a refusal code)
    result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The device admitted (or let out) and the server would not have
    conflict: bool,
    /// This scan was uploaded before (its first result)
    replayed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket: Option<String>,
    /// When the ticket's entry in force was made and where (for `ENTRY` and `ALREADY_INSIDE`)
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_gate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    /// One per scan, in the batch's order
    results: Vec<BatchResult>,
    /// Scans of this batch that conflicted
    conflicts: usize,
}

/// The batch's own checks, before anything is written: `Err` is the whole batch's 4xx.
fn validate(req: &BatchRequest) -> ApiResult<()> {
    if req.scans.is_empty() || req.scans.len() > MAX_SCANS {
        return Err(ApiError::validation(format!(
            "a batch holds 1 to {MAX_SCANS} scans; split it"
        ))
        .with("field", "scans"));
    }
    for (i, s) in req.scans.iter().enumerate() {
        if !valid_scan_id(&s.scan_id) {
            return Err(ApiError::validation(format!(
                "scans[{i}].scan_id must be 1 to {MAX_SCAN_ID} visible ASCII characters"
            ))
            .with("field", "scan_id")
            .with("index", i));
        }
        if !DECIDED.contains(&s.decided.as_str()) {
            return Err(ApiError::validation(format!(
                "scans[{i}].decided must be ENTRY, EXIT or a refusal code"
            ))
            .with("field", "decided")
            .with("index", i));
        }
        let consistent = match s.decided.as_str() {
            "ENTRY" | "ALREADY_INSIDE" | "REENTRY_NOT_ALLOWED" => s.direction == Direction::In,
            "EXIT" | "NOT_INSIDE" => s.direction == Direction::Out,
            _ => true,
        };
        if !consistent {
            return Err(ApiError::validation(format!(
                "scans[{i}].decided does not fit its direction"
            ))
            .with("field", "decided")
            .with("index", i));
        }
    }
    Ok(())
}

/// The time a rotating code's TOTP is checked at: the device's, when it is within the
/// snapshot's lifetime before now (an offline scan is up to that old) and not in the future;
/// otherwise the server's, which then finds an old TOTP expired.
fn totp_time(scanned_at: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    let earliest = now - Duration::minutes(SNAPSHOT_TTL_MIN);
    let latest = now + Duration::seconds(30);
    let at = if scanned_at >= earliest && scanned_at <= latest {
        scanned_at
    } else {
        now
    };
    u64::try_from(at.timestamp()).unwrap_or_default()
}

/// Upload a scanner's offline decisions (class `scanner`; also a scanner revoked since)
#[utoipa::path(post, path = "/api/checkin/{event}/scans:batch", tag = tags::CHECKIN,
    params(doc::EventPath),
    security(("scanner" = [])),
    request_body = BatchRequest,
    responses(
        (status = 200, description = "Each scan's server result, in order, with `conflict` where the device admitted and the server would not have", body = BatchAnswer),
        (status = 400, description = "A malformed body", body = doc::Error),
        (status = 401, description = "`UNAUTHORIZED {reason}`: missing, unknown, expired or malformed scanner credential (a revoked one may upload)", body = doc::Error),
        (status = 403, description = "`WRONG_EVENT`: a scanner of another event (nothing written); `WRONG_CREDENTIAL_TYPE`", body = doc::Error),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, description = "`VALIDATION_FAILED {field, index}`: empty or more than 500 scans, a bad `scan_id`, an unknown `decided` or one that does not fit its direction (nothing written); `IDEMPOTENCY_KEY_REUSED {index}`: a `scan_id` that was another scan", body = doc::Error),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn upload(
    State(state): State<CheckinState>,
    Uploader(scanner): Uploader,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<BatchRequest>,
) -> ApiResult<Response> {
    scanner.for_event(&event)?;
    validate(&req)?;
    if scanner.revoked {
        state
            .metrics
            .offline_revoked
            .inc_by(u64::try_from(req.scans.len()).unwrap_or(u64::MAX));
        tracing::warn!(
            alert = "checkin_revoked_scanner_upload",
            scanner.id = %scanner.id,
            scanner.gate = %scanner.gate,
            event = %event,
            scans = req.scans.len(),
            "a revoked scanner uploaded offline decisions; kept and flagged"
        );
    }
    let mut results = Vec::with_capacity(req.scans.len());
    for (i, s) in req.scans.iter().enumerate() {
        let r = apply(&state, &scanner, &event, s)
            .await
            .map_err(|e| e.with("index", i))?;
        results.push(r);
    }
    let conflicts = results.iter().filter(|r| r.conflict).count();
    let mut resp = ApiJson(BatchAnswer { results, conflicts }).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// One uploaded scan, decided (or replayed) and counted.
async fn apply(
    state: &CheckinState,
    scanner: &ScannerCredential,
    event: &str,
    s: &OfflineScan,
) -> ApiResult<BatchResult> {
    let scan = Scan {
        event,
        scanner,
        direction: s.direction,
        scan_id: Some(&s.scan_id),
        device_time: Some(s.scanned_at),
        offline_decided: Some(&s.decided),
        from_revoked: scanner.revoked,
    };
    let read = code::read(
        &state.keys,
        &s.code,
        event,
        totp_time(s.scanned_at, Utc::now()),
    );
    let ticket = match &read {
        Ok(c) => Some(c.tid.clone()),
        Err(Refused::WrongEvent(c) | Refused::Expired(c)) => Some(c.tid.clone()),
        Err(Refused::Invalid(_)) => None,
    };
    let admitted = matches!(s.decided.as_str(), "ENTRY" | "EXIT");
    let written = match &read {
        // The device admitted or let out: the server decides as for an online scan.
        Ok(c) if admitted => repo::decide(&state.pool, &scan, &c.tid, c.ver).await,
        // The device refused: nothing happened at the door; logged as it was decided.
        Ok(c) => {
            let t = Some((c.tid.as_str(), c.ver));
            repo::record(&state.pool, &scan, t, &s.decided, None).await
        }
        Err(Refused::Invalid(why)) => {
            repo::record(&state.pool, &scan, None, codes::INVALID_CODE, Some(*why)).await
        }
        Err(Refused::WrongEvent(c)) => {
            let t = Some((c.tid.as_str(), c.ver));
            repo::record(&state.pool, &scan, t, codes::WRONG_EVENT, None).await
        }
        Err(Refused::Expired(c)) => {
            let t = Some((c.tid.as_str(), c.ver));
            repo::record(&state.pool, &scan, t, codes::CODE_EXPIRED, None).await
        }
    }
    .map_err(ApiError::from)?;
    let (d, replayed) = match written {
        Written::New(d) => {
            count(state, event, &d);
            count_offline(state, event, &d);
            (d, false)
        }
        Written::Replayed(d) => {
            state.metrics.replays.inc();
            (d, true)
        }
    };
    if replayed && (d.direction != s.direction.as_str() || d.ticket_id != ticket) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this scan_id was another scan (another ticket or direction); send a new one",
        )
        .with("field", "scan_id"));
    }
    Ok(result(&s.scan_id, d, replayed))
}

fn count_offline(state: &CheckinState, event: &str, d: &Decision) {
    let m = &state.metrics;
    m.offline_scans
        .with_label_values(&[d.result.as_str()])
        .inc();
    if d.conflict {
        m.offline_conflicts
            .with_label_values(&[event, d.result.as_str()])
            .inc();
    }
}

fn result(scan_id: &str, d: Decision, replayed: bool) -> BatchResult {
    BatchResult {
        scan_id: scan_id.to_owned(),
        result: d.result,
        reason: d.reason,
        conflict: d.conflict,
        replayed,
        ticket: d.ticket_id,
        entry_gate: d.entry_gate,
        entry_at: d.entry_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(decided: &str, direction: Direction) -> OfflineScan {
        OfflineScan {
            scan_id: "s-1".into(),
            code: "x".into(),
            direction,
            scanned_at: Utc::now(),
            decided: decided.into(),
        }
    }

    #[test]
    fn batches_are_bounded_and_each_scan_shaped() {
        let ok = |scans| validate(&BatchRequest { scans }).is_ok();
        assert!(!ok(vec![]));
        assert!(ok(vec![scan("ENTRY", Direction::In)]));
        assert!(ok((0..MAX_SCANS)
            .map(|_| scan("EXIT", Direction::Out))
            .collect()));
        assert!(!ok((0..=MAX_SCANS)
            .map(|_| scan("ENTRY", Direction::In))
            .collect()));
        assert!(!ok(vec![scan("ENTER", Direction::In)]));
        assert!(!ok(vec![scan("ENTRY", Direction::Out)]));
        assert!(!ok(vec![scan("NOT_INSIDE", Direction::In)]));
        assert!(ok(vec![scan("VOIDED", Direction::Out)]));
        let mut bad_id = scan("ENTRY", Direction::In);
        bad_id.scan_id = "has space".into();
        assert!(!ok(vec![bad_id]));
    }

    #[test]
    fn the_totp_is_checked_at_the_device_time_only_within_the_offline_window() {
        let now = Utc::now();
        let secs = |t: DateTime<Utc>| u64::try_from(t.timestamp()).unwrap_or_default();
        let recent = now - Duration::minutes(5);
        assert_eq!(totp_time(recent, now), secs(recent));
        assert_eq!(totp_time(now - Duration::hours(2), now), secs(now));
        assert_eq!(totp_time(now + Duration::minutes(5), now), secs(now));
    }
}
