//! `GET /api/checkin/{event}/snapshot` (class `scanner`, a live scanner of this event only):
//! what a scanner needs to decide alone while the network is down — the event's ticket keys,
//! every ticket's current version and door state, the voided ones with their reason, the
//! event's `reentry`, and on rotating events the door key (scanners only, never fans).
//!
//! Compact: one array per ticket (`columns` names the fields), gzip when the client accepts
//! it. Incremental: `?since=<cursor>` answers only the tickets written since, plus the next
//! cursor. Guarantee: **no write is ever missed** by a scanner that keeps following the cursor.
//! Every write of a ticket stamps the row with its transaction id (`tickets.door_xid`, by a
//! trigger); the snapshot is read in one REPEATABLE READ transaction and its cursor is that
//! transaction's snapshot xmin, below which every transaction had finished and was visible to
//! the read; the next read asks for `door_xid >= cursor`. A transaction that took its id
//! earlier but committed later is still at or above the cursor. Rows may be sent twice (the
//! overlap between xmin and the read); the client applies rows by ticket id, so that is
//! harmless (docs/decisions.md).

use crate::checkin::CheckinState;
use crate::checkin::http::Scanner;
use crate::inventory::seats::encode::{accepts_gzip, gzip};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::openapi::{self as doc, tags};
use crate::tickets::code::{Jwks, b64};
use anyhow::Context;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// How long a scanner may decide from a snapshot without a newer one.
pub const SNAPSHOT_TTL_MIN: i64 = 30;
/// Bodies smaller than this are sent plain (gzip would save next to nothing).
const GZIP_FROM: usize = 1024;
/// The cursor's prefix, so its format can change without old cursors being misread.
const CURSOR_PREFIX: &str = "x1.";

pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new().routes(routes!(snapshot))
}

/// `?since=`: the `cursor` of an earlier snapshot.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SnapshotQuery {
    /// The `cursor` of the last snapshot applied: only tickets written since are sent
    since: Option<String>,
}

/// The field names of the rows, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct Columns {
    /// `["id", "ver", "seat", "tier", "door", "gate", "at"]`
    tickets: [&'static str; 7],
    /// `["id", "reason"]`
    voided: [&'static str; 2],
}

const COLUMNS: Columns = Columns {
    tickets: ["id", "ver", "seat", "tier", "door", "gate", "at"],
    voided: ["id", "reason"],
};

/// A valid ticket: `[id, ver, seat|null, tier|null, door, gate|null, at|null]`, `door` 0 (never
/// entered), 1 (inside) or 2 (entered, went out); `gate` and `at` (unix seconds) are its latest
/// entry's.
type TicketRow = (
    String,
    i32,
    Option<String>,
    Option<String>,
    u8,
    Option<String>,
    Option<i64>,
);

/// What a scanner decides from (see the module docs).
#[derive(Debug, Serialize, ToSchema)]
pub struct Snapshot {
    event: String,
    /// Server time of the read
    generated_at: DateTime<Utc>,
    /// Do not decide from this snapshot after this time (fetch a newer one)
    expires_at: DateTime<Utc>,
    /// Send as `?since=` to get only what changed after this snapshot
    cursor: String,
    /// `true`: every ticket of the event (replace what you hold); `false`: only tickets
    /// written since `since` (apply each row by ticket id; a ticket is in `tickets` or
    /// `voided`, never both; a row may repeat one sent before)
    full: bool,
    /// Whether a ticket that went out may come back in
    reentry: bool,
    /// `static` or `rotating`
    ticket_code: String,
    /// The public keys that verify the event's codes (as `GET /api/events/{event}/ticket-keys`)
    keys: Jwks,
    /// Rotating events only: the event's door key (base64url), from which each ticket's TOTP
    /// secret is derived. Given to scanners only, never to fans
    #[serde(skip_serializing_if = "Option::is_none")]
    door_key: Option<String>,
    columns: Columns,
    #[schema(value_type = Vec<Vec<serde_json::Value>>)]
    tickets: Vec<TicketRow>,
    #[schema(value_type = Vec<Vec<String>>)]
    voided: Vec<(String, String)>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    version: i32,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    void_reason: Option<String>,
    inside: bool,
    entries: i32,
    entered_gate: Option<String>,
    entered_at: Option<DateTime<Utc>>,
}

/// The transaction-id horizon a cursor holds, or `None` for a string that is not a cursor.
fn parse_cursor(s: &str) -> Option<u64> {
    let digits = s.strip_prefix(CURSOR_PREFIX)?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn cursor(xmin: u64) -> String {
    format!("{CURSOR_PREFIX}{xmin}")
}

/// Rows into the two lists (a voided ticket carries only its id and reason).
fn split(rows: Vec<Row>) -> (Vec<TicketRow>, Vec<(String, String)>) {
    let mut tickets = Vec::with_capacity(rows.len());
    let mut voided = Vec::new();
    for r in rows {
        if let Some(reason) = r.void_reason {
            voided.push((r.id, reason));
            continue;
        }
        let door = match (r.inside, r.entries) {
            (true, _) => 1,
            (false, 0) => 0,
            (false, _) => 2,
        };
        let (gate, at) = if door == 0 {
            (None, None)
        } else {
            (r.entered_gate, r.entered_at.map(|t| t.timestamp()))
        };
        tickets.push((r.id, r.version, r.seat_id, r.ga_tier, door, gate, at));
    }
    (tickets, voided)
}

/// A scanner's offline snapshot of its event (full, or changes since a cursor)
#[utoipa::path(get, path = "/api/checkin/{event}/snapshot", tag = tags::CHECKIN,
    params(doc::EventPath, SnapshotQuery),
    security(("scanner" = [])),
    responses(
        (status = 200, description = "The snapshot (gzip with `Accept-Encoding: gzip`); `Cache-Control: private, no-store`", body = Snapshot),
        (status = 401, description = "`UNAUTHORIZED {reason}`: missing, unknown, expired, revoked or malformed scanner credential", body = doc::Error),
        (status = 403, description = "`WRONG_EVENT`: a scanner of another event; `WRONG_CREDENTIAL_TYPE`: not a scanner credential", body = doc::Error),
        (status = 422, description = "`VALIDATION_FAILED {field: since}`: not a cursor this server gave", body = doc::Error),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn snapshot(
    State(state): State<CheckinState>,
    Scanner(scanner): Scanner,
    Path(event): Path<String>,
    headers: HeaderMap,
    q: Result<Query<SnapshotQuery>, QueryRejection>,
) -> ApiResult<Response> {
    scanner.for_event(&event)?;
    let q = q
        .map(|Query(v)| v)
        .map_err(|e| ApiError::validation(format!("invalid query: {}", e.body_text())))?;
    let since = match q.since.as_deref() {
        None => None,
        Some(s) => Some(parse_cursor(s).ok_or_else(|| {
            ApiError::validation("since is not a cursor of a snapshot").with("field", "since")
        })?),
    };
    // One snapshot for the horizon and the rows, so the cursor covers exactly what was read.
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the snapshot read")?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .context("failed to set the snapshot's isolation")?;
    let (xmin, reentry, ticket_code, now): (String, bool, String, DateTime<Utc>) = sqlx::query_as(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, reentry, ticket_code, now()
               FROM events WHERE id = $1",
    )
    .bind(&event)
    .fetch_one(&mut *tx)
    .await
    .context("failed to read the event's snapshot horizon")?;
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, version, seat_id, ga_tier, void_reason, inside, entries, entered_gate,
                entered_at
           FROM tickets
          WHERE event_id = $1 AND ($2::text IS NULL OR door_xid >= $2::text::xid8)
          ORDER BY id",
    )
    .bind(&event)
    .bind(since.map(|s| s.to_string()))
    .fetch_all(&mut *tx)
    .await
    .context("failed to read the event's tickets")?;
    tx.commit()
        .await
        .context("failed to end the snapshot read")?;
    let xmin: u64 = xmin.parse().context("pg_snapshot_xmin was not a number")?;
    let (tickets, voided) = split(rows);
    let rotating = ticket_code == "rotating";
    let body = Snapshot {
        event: event.clone(),
        generated_at: now,
        expires_at: now + Duration::minutes(SNAPSHOT_TTL_MIN),
        cursor: cursor(xmin),
        full: since.is_none(),
        reentry,
        ticket_code,
        keys: state.keys.jwks(),
        door_key: rotating.then(|| b64(&state.keys.door_key(&event))),
        columns: COLUMNS,
        tickets,
        voided,
    };
    let json = serde_json::to_vec(&body).context("failed to encode the snapshot")?;
    Ok(encoded(json, accepts_gzip(&headers)))
}

/// The body, gzipped when accepted and worth it, never cached (it may hold the door key).
fn encoded(json: Vec<u8>, gzip_ok: bool) -> Response {
    let zipped = (gzip_ok && json.len() >= GZIP_FROM)
        .then(|| gzip(&json))
        .flatten();
    let mut resp = match zipped {
        Some(z) => {
            let mut r = z.into_response();
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        }
        None => json.into_response(),
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_junk_is_refused() {
        assert_eq!(parse_cursor(&cursor(0)), Some(0));
        assert_eq!(parse_cursor(&cursor(u64::MAX)), Some(u64::MAX));
        for bad in [
            "",
            "x1.",
            "123",
            "x1.-1",
            "x1.1a",
            "x2.5",
            "x1.99999999999999999999",
        ] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
    }

    #[test]
    fn rows_split_into_valid_with_door_state_and_voided() {
        let at = Utc::now();
        let row = |id: &str, void: Option<&str>, inside: bool, entries: i32| Row {
            id: id.into(),
            version: 2,
            seat_id: Some("S1".into()),
            ga_tier: None,
            void_reason: void.map(Into::into),
            inside,
            entries,
            entered_gate: (entries > 0).then(|| "North".into()),
            entered_at: (entries > 0).then_some(at),
        };
        let (t, v) = split(vec![
            row("a", None, false, 0),
            row("b", None, true, 1),
            row("c", None, false, 1),
            row("d", Some("refunded"), false, 0),
        ]);
        assert_eq!(v, vec![("d".to_owned(), "refunded".to_owned())]);
        let doors: Vec<(u8, Option<&str>)> = t.iter().map(|r| (r.4, r.5.as_deref())).collect();
        assert_eq!(doors, [(0, None), (1, Some("North")), (2, Some("North"))]);
        assert_eq!(t[1].6, Some(at.timestamp()));
    }
}
