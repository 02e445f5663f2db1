//! Operators (issue 42): `POST /admin/operators` issues a named credential with a role (shown
//! once), `GET /admin/operators` lists them, `DELETE /admin/operators/{id}` revokes one,
//! `GET /admin/operators/me` says who the caller is (the ops page's sign-in).
//!
//! Guarantees:
//! - The secret is returned once, in the `201`, with `Cache-Control: no-store`; only its
//!   SHA-256 is stored, and neither is ever logged or written to the audit log.
//! - A revocation is in force on booking as soon as it commits (every admin call reads the
//!   credential) and on the gateway's admin listener within two seconds (the live operators
//!   are published to Redis right after the change, and every second by every instance).
//! - The last live admin cannot be revoked (`409 LAST_ADMIN`): revocations of admins take one
//!   transaction-scoped advisory lock, so two admins revoking each other cannot both win.
//! - Every issue and revocation writes one audit entry in its transaction.

use crate::ops::OpsState;
use crate::platform::audit::{self, AdminOp, Operator, Role, Viewer};
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

/// How long an operator credential lives unless `expires_at` says otherwise.
pub const DEFAULT_TTL_DAYS: i64 = 90;
/// The longest an operator credential may live.
pub const MAX_TTL_DAYS: i64 = 366;
/// Names that would read as someone else in the audit log.
const RESERVED: [&str; 4] = ["bootstrap", "payments", "floodgate", "unnamed"];

pub fn router() -> OpenApiRouter<OpsState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(me))
        .routes(routes!(revoke))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOperator {
    /// Who holds it: shown as the actor of everything they do (1 to 200 visible characters)
    #[schema(min_length = 1, max_length = 200, pattern = "^[ -~]*[!-~][ -~]*$")]
    name: String,
    role: OperatorRole,
    /// When it stops working (RFC 3339; default 90 days from now; at most 366 days)
    #[serde(default)]
    expires_at: Option<DateTime<Utc>>,
}

/// An operator's role: `viewer` reads; `support` also refunds and cancels orders; `admin` also
/// changes events, inventory, rooms and operators.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperatorRole {
    Viewer,
    Support,
    Admin,
}

impl From<OperatorRole> for Role {
    fn from(r: OperatorRole) -> Role {
        match r {
            OperatorRole::Viewer => Role::Viewer,
            OperatorRole::Support => Role::Support,
            OperatorRole::Admin => Role::Admin,
        }
    }
}

/// A new operator and their credential (shown this once).
#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorCreated {
    id: String,
    name: String,
    #[schema(value_type = OperatorRole)]
    role: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    /// `fgop_…`: send as `Authorization: Bearer`; not retrievable later
    credential: String,
}

/// An operator as listed (never the credential).
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct OperatorListed {
    id: String,
    name: String,
    #[schema(value_type = OperatorRole)]
    role: String,
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
pub struct OperatorList {
    operators: Vec<OperatorListed>,
}

/// The caller, as the admin API sees them.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorMe {
    /// The operator's name, or `bootstrap`
    name: String,
    #[schema(value_type = OperatorRole)]
    role: String,
    /// The credential's id (absent for the bootstrap secret)
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<DateTime<Utc>>,
    bootstrap: bool,
}

/// The name, trimmed, or a `422` naming the rule it broke.
fn valid_name(raw: &str) -> ApiResult<String> {
    let name = raw.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(
            ApiError::validation("name must be 1 to 200 visible characters").with("field", "name"),
        );
    }
    if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(ApiError::validation(format!(
            "{name} is reserved for what booking records itself"
        ))
        .with("field", "name"));
    }
    Ok(name.to_owned())
}

/// The expiry asked for, or the default; a `422` when past or too far.
fn valid_expiry(asked: Option<DateTime<Utc>>, now: DateTime<Utc>) -> ApiResult<DateTime<Utc>> {
    let at = asked.unwrap_or(now + Duration::days(DEFAULT_TTL_DAYS));
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

/// Publishes the live operators now rather than at the next tick (the gateway learns of the
/// change within its refresh); a failure is left to the every-second job.
fn publish_soon(state: &OpsState) {
    let (pool, redis, prefix) = (
        state.pool.clone(),
        state.queue_redis.clone(),
        state.redis_prefix.clone(),
    );
    tokio::spawn(async move {
        if let Err(e) = crate::platform::credentials::publish(&pool, &redis, &prefix).await {
            tracing::warn!(error = %e, "could not publish the operators now; the job retries");
        }
    });
}

/// Issue an operator credential with a role (the secret is in this answer only)
#[utoipa::path(post, path = "/admin/operators", tag = tags::OPS, security(("admin" = ["admin"])),
    params(doc::ActorHeader),
    request_body = CreateOperator,
    responses(
        (status = 201, description = "OperatorCreated; `credential` is shown this once", body = OperatorCreated),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 503, response = doc::Unavailable),
    ))]
async fn create(
    State(state): State<OpsState>,
    op: AdminOp,
    ApiJson(req): ApiJson<CreateOperator>,
) -> ApiResult<Response> {
    let now = Utc::now();
    let name = valid_name(&req.name)?;
    let expires_at = valid_expiry(req.expires_at, now)?;
    let role = Role::from(req.role);
    let issued = issue(Kind::Operator)
        .map_err(|_| ApiError::unexpected(anyhow::anyhow!("the system random source failed")))?;
    let id = format!("op_{}", shared::ids::new_id());
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin issuing an operator")?;
    let created_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO credentials (id, kind, name, role, hash, created_by, expires_at)
         VALUES ($1, 'operator', $2, $3, $4, $5, $6) RETURNING created_at",
    )
    .bind(&id)
    .bind(&name)
    .bind(role.as_str())
    .bind(&issued.hash[..])
    .bind(op.name())
    .bind(expires_at)
    .fetch_one(&mut *tx)
    .await
    .context("failed to store the operator")?;
    audit::record_tx(
        &mut tx,
        &op,
        "operator.create",
        &format!("operator:{id}"),
        None,
        &json!({"name": name, "role": role.as_str(), "expires_at": expires_at}),
    )
    .await?;
    tx.commit().await.context("failed to commit the operator")?;
    publish_soon(&state);
    let mut resp = (
        StatusCode::CREATED,
        ApiJson(OperatorCreated {
            id,
            name,
            role: role.as_str().to_owned(),
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

/// Every operator, newest first, with its status (never a credential)
#[utoipa::path(get, path = "/admin/operators", tag = tags::OPS, security(("admin" = ["admin"])),
    responses(
        (status = 200, description = "OK", body = OperatorList),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable),
    ))]
async fn list(
    State(state): State<OpsState>,
    _caller: AdminOnlyRead,
) -> ApiResult<ApiJson<OperatorList>> {
    let operators: Vec<OperatorListed> = sqlx::query_as(
        "SELECT id, name, role,
                CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
                     WHEN expires_at <= now() THEN 'expired'
                     ELSE 'active' END AS status,
                created_at, created_by, expires_at, revoked_at, revoked_by
           FROM credentials WHERE kind = 'operator'
          ORDER BY created_at DESC, id DESC",
    )
    .fetch_all(&state.pool)
    .await
    .context("failed to list the operators")?;
    Ok(ApiJson(OperatorList { operators }))
}

/// Listing operators is an admin's read: no `X-Floodgate-Actor` asked of the bootstrap secret.
type AdminOnlyRead = audit::AdminCaller;

/// Who the caller is: name, role and expiry of the credential presented
#[utoipa::path(get, path = "/admin/operators/me", tag = tags::OPS, security(("admin" = ["viewer"])),
    responses(
        (status = 200, description = "OK", body = OperatorMe),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable),
    ))]
async fn me(State(state): State<OpsState>, caller: Viewer) -> ApiResult<ApiJson<OperatorMe>> {
    let op: &Operator = &caller;
    let expires_at = match &op.operator_id {
        None => None,
        Some(id) => sqlx::query_scalar("SELECT expires_at FROM credentials WHERE id = $1")
            .bind(id)
            .fetch_optional(&state.pool)
            .await
            .context("failed to read the caller's credential")?,
    };
    Ok(ApiJson(OperatorMe {
        name: op.name.clone(),
        role: op.role.map_or("viewer", Role::as_str).to_owned(),
        id: op.operator_id.clone(),
        expires_at,
        bootstrap: op.is_bootstrap(),
    }))
}

/// `{id}`: an operator's id.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OperatorPath {
    /// the id `POST /admin/operators` answered
    pub id: String,
}

/// Revoke an operator's credential (at once here, within two seconds on the gateway); `409 LAST_ADMIN` for the last live admin
#[utoipa::path(delete, path = "/admin/operators/{id}", tag = tags::OPS,
    security(("admin" = ["admin"])),
    params(OperatorPath, doc::ActorHeader),
    responses(
        (status = 204, description = "Revoked (or already revoked: nothing changed)"),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 503, response = doc::Unavailable),
    ))]
async fn revoke(
    State(state): State<OpsState>,
    op: AdminOp,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let mut tx = state
        .pool
        .begin()
        .await
        .context("failed to begin the revocation")?;
    // One lock for every revocation: "another live admin exists" stays true until commit.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('floodgate.credentials.revoke'))")
        .execute(&mut *tx)
        .await
        .context("failed to take the revocation lock")?;
    #[derive(sqlx::FromRow)]
    struct Outcome {
        found: bool,
        revoked_now: bool,
        last_admin: bool,
        name: Option<String>,
        role: Option<String>,
    }
    let o: Outcome = sqlx::query_as(
        "WITH target AS (
             SELECT id, name, role, revoked_at, expires_at FROM credentials
              WHERE id = $1 AND kind = 'operator'),
         others AS (
             SELECT count(*) AS n FROM credentials
              WHERE kind = 'operator' AND role = 'admin' AND revoked_at IS NULL
                AND expires_at > now() AND id <> $1),
         done AS (
             UPDATE credentials c
                SET revoked_at = now(), revoked_by = $2,
                    generation = nextval('credential_generation')
               FROM target t, others o
              WHERE c.id = t.id AND t.revoked_at IS NULL
                AND (t.role <> 'admin' OR t.expires_at <= now() OR o.n > 0)
             RETURNING c.id)
         SELECT EXISTS (SELECT 1 FROM target) AS found,
                EXISTS (SELECT 1 FROM done) AS revoked_now,
                EXISTS (SELECT 1 FROM target t, others o
                         WHERE t.revoked_at IS NULL AND t.role = 'admin'
                           AND t.expires_at > now() AND o.n = 0)
                  AS last_admin,
                (SELECT name FROM target) AS name,
                (SELECT role FROM target) AS role",
    )
    .bind(&id)
    .bind(op.name())
    .fetch_one(&mut *tx)
    .await
    .context("failed to revoke the operator")?;
    if !o.found {
        return Err(ApiError::not_found(
            codes::UNKNOWN_OPERATOR,
            "no operator with this id",
        ));
    }
    if o.last_admin {
        return Err(ApiError::conflict(
            codes::LAST_ADMIN,
            "this is the last live admin: issue another admin first",
        ));
    }
    if !o.revoked_now {
        // Revoked before: nothing changed, nothing to record.
        return Ok(StatusCode::NO_CONTENT);
    }
    audit::record_tx(
        &mut tx,
        &op,
        "operator.revoke",
        &format!("operator:{id}"),
        None,
        &json!({"name": o.name, "role": o.role}),
    )
    .await?;
    tx.commit()
        .await
        .context("failed to commit the revocation")?;
    publish_soon(&state);
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_visible_bounded_and_not_reserved() {
        assert_eq!(valid_name("  Ana Ops ").ok().as_deref(), Some("Ana Ops"));
        for bad in ["", "   ", "a\tb", "Bootstrap", "payments"] {
            assert!(valid_name(bad).is_err(), "{bad:?}");
        }
        assert!(valid_name(&"x".repeat(201)).is_err());
    }

    #[test]
    fn expiry_defaults_to_ninety_days_and_is_bounded() {
        let now = Utc::now();
        assert_eq!(
            valid_expiry(None, now).ok(),
            Some(now + Duration::days(DEFAULT_TTL_DAYS))
        );
        assert!(valid_expiry(Some(now - Duration::seconds(1)), now).is_err());
        assert!(valid_expiry(Some(now + Duration::days(400)), now).is_err());
        assert!(valid_expiry(Some(now + Duration::hours(1)), now).is_ok());
    }
}
