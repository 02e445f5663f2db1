//! Scanners (issue 44): `POST /admin/events/{event}/scanners` provisions a scanner device for
//! one event and gate with a `fgsc_…` credential (shown once), `GET` lists an event's
//! scanners, `DELETE …/scanners/{id}` revokes one. The credential machinery is the operators'
//! (`credentials`, kind `scanner`): only its SHA-256 is stored, it expires (24 hours by
//! default, at most 7 days), and a scanner credential opens nothing but its event's scans.
//!
//! Guarantees: the secret is in the `201` only, with `Cache-Control: no-store`, never logged
//! or audited; a revocation is in force as soon as it commits (every scan reads the
//! credential); every issue and revocation writes one audit entry in its own transaction, and
//! revoking a revoked scanner changes and records nothing.

use crate::checkin::CheckinState;
use crate::platform::audit::{self, AdminOp, Viewer};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared::credentials::{Kind, issue};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// How long a scanner credential lives unless `expires_at` says otherwise (one show day).
pub const DEFAULT_TTL_HOURS: i64 = 24;
/// The longest a scanner credential may live (a festival's week).
pub const MAX_TTL_DAYS: i64 = 7;
/// Longest gate name, in characters.
const MAX_GATE: usize = 64;

pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(revoke))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateScanner {
    /// The gate the device scans at, as shown in the counts (1 to 64 visible characters)
    #[schema(min_length = 1, max_length = 64, pattern = "\\S")]
    gate: String,
    /// When it stops working (RFC 3339; default 24 hours from now; at most 7 days)
    #[serde(default)]
    expires_at: Option<DateTime<Utc>>,
}

/// A new scanner and its credential (shown this once).
#[derive(Debug, Serialize, ToSchema)]
pub struct ScannerCreated {
    id: String,
    gate: String,
    event: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    /// `fgsc_…`: the device sends it as `Authorization: Bearer`; not retrievable later
    credential: String,
}

/// A scanner as listed (never the credential).
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct ScannerListed {
    id: String,
    gate: String,
    event: String,
    /// `active`, `expired` or `revoked`
    status: String,
    created_at: DateTime<Utc>,
    created_by: String,
    expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_by: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ScannerList {
    scanners: Vec<ScannerListed>,
}

/// `{event}` and `{id}`: an event and one of its scanners.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ScannerPath {
    /// event id (a slug)
    pub event: String,
    /// the id `POST /admin/events/{event}/scanners` answered
    pub id: String,
}

/// The gate, trimmed, or a `422`.
fn valid_gate(raw: &str) -> ApiResult<String> {
    let gate = raw.trim();
    if gate.is_empty() || gate.chars().count() > MAX_GATE || gate.chars().any(char::is_control) {
        return Err(
            ApiError::validation("gate must be 1 to 64 visible characters").with("field", "gate"),
        );
    }
    Ok(gate.to_owned())
}

/// The expiry asked for, or the default; a `422` when past or too far.
fn valid_expiry(asked: Option<DateTime<Utc>>, now: DateTime<Utc>) -> ApiResult<DateTime<Utc>> {
    let at = asked.unwrap_or(now + Duration::hours(DEFAULT_TTL_HOURS));
    if at <= now {
        return Err(
            ApiError::validation("expires_at must be in the future").with("field", "expires_at")
        );
    }
    if at > now + Duration::days(MAX_TTL_DAYS) {
        return Err(ApiError::validation(format!(
            "expires_at may be at most {MAX_TTL_DAYS} days away"
        ))
        .with("field", "expires_at"));
    }
    Ok(at)
}

fn unknown_event() -> ApiError {
    ApiError::not_found(codes::UNKNOWN_EVENT, "no such event")
}

/// Provision a scanner for one event and gate (the credential is in this answer only)
#[utoipa::path(post, path = "/admin/events/{event}/scanners", tag = tags::CHECKIN,
    security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader),
    request_body = CreateScanner,
    responses(
        (status = 201, description = "ScannerCreated; `credential` is shown this once", body = ScannerCreated,
            headers(("Cache-Control" = String, description = "no-store"))),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn create(
    State(state): State<CheckinState>,
    op: AdminOp,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<CreateScanner>,
) -> ApiResult<Response> {
    if !shared::ids::is_valid_slug(&event) {
        return Err(unknown_event());
    }
    let now = Utc::now();
    let gate = valid_gate(&req.gate)?;
    let expires_at = valid_expiry(req.expires_at, now)?;
    let issued = issue(Kind::Scanner)
        .map_err(|_| ApiError::unexpected(anyhow::anyhow!("the system random source failed")))?;
    let id = format!("sc_{}", shared::ids::new_id());
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin issuing a scanner")?;
    // The event must exist: the insert takes its id from the events row, or inserts nothing.
    let created_at: Option<DateTime<Utc>> = sqlx::query_scalar(
        "INSERT INTO credentials (id, kind, name, event_id, gate, hash, created_by, expires_at)
         SELECT $1, 'scanner', $3, e.id, $3, $4, $5, $6 FROM events e WHERE e.id = $2
         RETURNING created_at",
    )
    .bind(&id)
    .bind(&event)
    .bind(&gate)
    .bind(&issued.hash[..])
    .bind(op.name())
    .bind(expires_at)
    .fetch_optional(&mut *tx)
    .await
    .context("failed to store the scanner")?;
    let Some(created_at) = created_at else {
        return Err(unknown_event());
    };
    audit::record_tx(
        &mut tx,
        &op,
        "scanner.create",
        &format!("scanner:{id}"),
        Some(&event),
        &json!({"gate": gate, "expires_at": expires_at}),
    )
    .await?;
    tx.commit().await.context("failed to commit the scanner")?;
    let mut resp = (
        StatusCode::CREATED,
        ApiJson(ScannerCreated {
            id,
            gate,
            event,
            created_at,
            expires_at,
            credential: issued.secret,
        }),
    )
        .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// An event's scanners, newest first, with their status (never a credential)
#[utoipa::path(get, path = "/admin/events/{event}/scanners", tag = tags::CHECKIN,
    security(("admin" = ["viewer"])),
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = ScannerList),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn list(
    State(state): State<CheckinState>,
    _caller: Viewer,
    Path(event): Path<String>,
) -> ApiResult<ApiJson<ScannerList>> {
    let exists: bool = shared::ids::is_valid_slug(&event)
        && sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)")
            .bind(&event)
            .fetch_one(&state.pool)
            .await
            .context("failed to find the event")?;
    if !exists {
        return Err(unknown_event());
    }
    let scanners: Vec<ScannerListed> = sqlx::query_as(
        "SELECT id, gate, event_id AS event,
                CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
                     WHEN expires_at <= now() THEN 'expired'
                     ELSE 'active' END AS status,
                created_at, created_by, expires_at, revoked_at, revoked_by
           FROM credentials WHERE kind = 'scanner' AND event_id = $1
          ORDER BY created_at DESC, id DESC",
    )
    .bind(&event)
    .fetch_all(&state.pool)
    .await
    .context("failed to list the scanners")?;
    Ok(ApiJson(ScannerList { scanners }))
}

/// Revoke a scanner (in force at once: its next scan is refused)
#[utoipa::path(delete, path = "/admin/events/{event}/scanners/{id}", tag = tags::CHECKIN,
    security(("admin" = ["admin"])),
    params(ScannerPath, doc::ActorHeader),
    responses(
        (status = 204, description = "Revoked (or already revoked: nothing changed)"),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
async fn revoke(
    State(state): State<CheckinState>,
    op: AdminOp,
    Path((event, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the revocation")?;
    #[derive(sqlx::FromRow)]
    struct Outcome {
        found: bool,
        gate: Option<String>,
        revoked_now: bool,
    }
    // One statement: the scanner of this event, revoked unless it was (a second revocation
    // finds nothing to update and records nothing).
    let o: Outcome = sqlx::query_as(
        "WITH target AS (
             SELECT id, gate FROM credentials
              WHERE id = $1 AND kind = 'scanner' AND event_id = $2),
         done AS (
             UPDATE credentials c
                SET revoked_at = now(), revoked_by = $3,
                    generation = nextval('credential_generation')
              WHERE c.id IN (SELECT id FROM target) AND c.revoked_at IS NULL
             RETURNING c.id)
         SELECT EXISTS (SELECT 1 FROM target) AS found,
                (SELECT gate FROM target) AS gate,
                EXISTS (SELECT 1 FROM done) AS revoked_now",
    )
    .bind(&id)
    .bind(&event)
    .bind(op.name())
    .fetch_one(&mut *tx)
    .await
    .context("failed to revoke the scanner")?;
    if !o.found {
        return Err(ApiError::not_found(
            codes::UNKNOWN_SCANNER,
            "no scanner with this id for this event",
        ));
    }
    if !o.revoked_now {
        return Ok(StatusCode::NO_CONTENT);
    }
    audit::record_tx(
        &mut tx,
        &op,
        "scanner.revoke",
        &format!("scanner:{id}"),
        Some(&event),
        &json!({"gate": o.gate}),
    )
    .await?;
    tx.commit()
        .await
        .context("failed to commit the revocation")?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_are_visible_and_bounded() {
        assert_eq!(valid_gate("  North 1 ").ok().as_deref(), Some("North 1"));
        assert_eq!(valid_gate("東ゲート").ok().as_deref(), Some("東ゲート"));
        for bad in ["", "   ", "a\tb", "a\u{0}b"] {
            assert!(valid_gate(bad).is_err(), "{bad:?}");
        }
        assert!(valid_gate(&"g".repeat(64)).is_ok());
        assert!(valid_gate(&"g".repeat(65)).is_err());
    }

    #[test]
    fn expiry_defaults_to_a_day_and_is_at_most_a_week() {
        let now = Utc::now();
        assert_eq!(
            valid_expiry(None, now).ok(),
            Some(now + Duration::hours(DEFAULT_TTL_HOURS))
        );
        assert!(valid_expiry(Some(now - Duration::seconds(1)), now).is_err());
        assert!(valid_expiry(Some(now + Duration::days(8)), now).is_err());
        assert!(valid_expiry(Some(now + Duration::days(7)), now).is_ok());
    }
}
