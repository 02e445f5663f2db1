//! The mail endpoints: the fan's resend (class `identity`, mounted by `tickets::http`), ops'
//! resend and "forget this address" (support role, audited without the address), and the
//! ops list of deliveries by state (viewer role).
//!
//! A resend is a new `mail_deliveries` row (its own key, so its own Message-ID) built from the
//! tickets as they are when it is sent. Fans get [`FAN_RESENDS_PER_HOUR`] per order, counted
//! in Postgres under the order's row lock, so the limit holds across instances and
//! concurrent requests.

use crate::platform::audit::{Support, Viewer};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::tickets::TicketsState;
use crate::tickets::http::Fan;
use crate::tickets::mail::{MailState, retention};
use anyhow::Context;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Resends a fan may ask for per order per hour.
pub const FAN_RESENDS_PER_HOUR: i64 = 3;
/// The order has no address (never given, or erased).
pub const NO_EMAIL: &str = "NO_EMAIL";
/// The order is not paid: there are no tickets to send.
pub const NOT_PAID: &str = "ORDER_NOT_PAID";

pub fn admin_router() -> OpenApiRouter<MailState> {
    OpenApiRouter::new()
        .routes(routes!(list_mail))
        .routes(routes!(ops_resend))
        .routes(routes!(forget_email))
}

/// A resend was queued.
#[derive(Debug, Serialize, ToSchema)]
pub struct Queued {
    /// The delivery row (`GET /admin/mail`).
    pub delivery: i64,
}

fn not_found() -> ApiError {
    ApiError::not_found(codes::NOT_FOUND, "no such order")
}

fn valid_id(id: &str) -> ApiResult<()> {
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    Ok(())
}

/// Locks the order (serialising resends of one order), checks it is `account`'s (when
/// given) and paid and has an address. Returns nothing; errors are the answers.
async fn check_resendable(
    conn: &mut PgConnection,
    order_id: &str,
    account: Option<&str>,
) -> ApiResult<()> {
    let row: Option<(String, String, bool)> = sqlx::query_as(
        "SELECT o.account_id, o.status,
                EXISTS (SELECT 1 FROM order_contacts c
                         WHERE c.order_id = o.id AND c.email IS NOT NULL)
           FROM orders o WHERE o.id = $1 FOR UPDATE OF o",
    )
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await
    .context("failed to read the order")?;
    let Some((owner, status, has_email)) = row else {
        return Err(not_found());
    };
    if account.is_some_and(|a| a != owner) {
        // Another fan's order: indistinguishable from none.
        return Err(not_found());
    }
    if status != "PAID" {
        return Err(ApiError::conflict(
            NOT_PAID,
            "the order is not paid: no tickets to send",
        ));
    }
    if !has_email {
        return Err(ApiError::conflict(
            NO_EMAIL,
            "the order has no e-mail address (never given, or erased)",
        ));
    }
    Ok(())
}

async fn insert_resend(conn: &mut PgConnection, order_id: &str, key: &str) -> ApiResult<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO mail_deliveries (kind, key, order_id) VALUES ('resend', $1, $2)
         RETURNING id",
    )
    .bind(key)
    .bind(order_id)
    .fetch_one(&mut *conn)
    .await
    .context("failed to queue a resend")?;
    Ok(id)
}

fn accepted(delivery: i64) -> Response {
    (StatusCode::ACCEPTED, ApiJson(Queued { delivery })).into_response()
}

/// Mail one's tickets again (at most 3 an hour per order)
#[utoipa::path(post, path = "/api/orders/{id}/tickets/resend", tag = tags::TICKETS,
    params(doc::IdPath),
    security(("identity" = [])),
    responses(
        (status = 202, description = "Queued: a new message with the current codes", body = Queued),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 429, response = doc::RateLimited),
    ))]
pub async fn fan_resend(
    State(state): State<TicketsState>,
    Fan(account): Fan,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    valid_id(&id)?;
    let mut tx = state.pool.begin().await?;
    check_resendable(&mut tx, &id, Some(&account)).await?;
    // Under the order's lock: concurrent resends of one order count each other.
    let (recent, retry_after_s): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*),
                min(3600 - extract(epoch FROM clock_timestamp() - created_at))::float8
           FROM (SELECT created_at FROM mail_deliveries
                  WHERE order_id = $1 AND kind = 'resend' AND key LIKE 'fan-%'
                    AND created_at > clock_timestamp() - interval '1 hour'
                  ORDER BY created_at DESC LIMIT $2) r",
    )
    .bind(&id)
    .bind(FAN_RESENDS_PER_HOUR)
    .fetch_one(&mut *tx)
    .await
    .context("failed to count the order's resends")?;
    if recent >= FAN_RESENDS_PER_HOUR {
        // The oldest of the last three leaves the window first.
        let wait = retry_after_s.map_or(3600, |s| s.ceil().max(1.0) as u64);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            codes::RATE_LIMITED,
            "at most 3 resends an hour per order",
        )
        .retry_after(wait));
    }
    let delivery = insert_resend(&mut tx, &id, &format!("fan-{}", shared::ids::new_id())).await?;
    tx.commit().await.context("failed to commit a resend")?;
    Ok(accepted(delivery))
}

/// Mail an order's tickets again (audited)
#[utoipa::path(post, path = "/admin/orders/{id}/tickets/resend", tag = tags::OPS,
    security(("admin" = ["support"])),
    params(doc::IdPath, doc::ActorHeader),
    responses(
        (status = 202, description = "Queued", body = Queued),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
    ))]
pub async fn ops_resend(
    caller: Support,
    State(state): State<MailState>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    valid_id(&id)?;
    let mut tx = state.pool.begin().await?;
    check_resendable(&mut tx, &id, None).await?;
    let delivery = insert_resend(&mut tx, &id, &format!("ops-{}", shared::ids::new_id())).await?;
    crate::platform::audit::record_tx(
        &mut tx,
        &caller,
        "order.resend_tickets",
        &format!("order:{id}"),
        None,
        &serde_json::json!({ "delivery": delivery }),
    )
    .await?;
    tx.commit().await.context("failed to commit a resend")?;
    Ok(accepted(delivery))
}

/// The address was erased.
#[derive(Debug, Serialize, ToSchema)]
pub struct Forgotten {
    pub order_id: String,
    /// `false`: there was no address to erase (none given, or already erased).
    pub erased: bool,
}

/// Erase an order's e-mail address now (audited, without the address)
#[utoipa::path(post, path = "/admin/orders/{id}/forget-email", tag = tags::OPS,
    security(("admin" = ["support"])),
    params(doc::IdPath, doc::ActorHeader),
    responses(
        (status = 200, description = "Erased (or there was none)", body = Forgotten),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
pub async fn forget_email(
    caller: Support,
    State(state): State<MailState>,
    Path(id): Path<String>,
) -> ApiResult<ApiJson<Forgotten>> {
    valid_id(&id)?;
    let mut tx = state.pool.begin().await?;
    let Some(erased) = retention::forget_tx(&mut tx, &caller, &id).await? else {
        return Err(not_found());
    };
    tx.commit()
        .await
        .context("failed to commit forgetting an address")?;
    if erased {
        state.metrics.erased.with_label_values(&["forget"]).inc();
    }
    Ok(ApiJson(Forgotten {
        order_id: id,
        erased,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MailQuery {
    /// `pending`, `sending`, `sent` or `dead`; all states when left out.
    #[param(pattern = "^(pending|sending|sent|dead)$")]
    pub state: Option<String>,
    /// Only this order's deliveries.
    pub order_id: Option<String>,
    /// At most this many, newest first (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// One e-mail delivery as ops see it (never the address).
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct MailDelivery {
    pub id: i64,
    /// `tickets` (the paid order's message) or `resend`.
    pub kind: String,
    pub order_id: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub smtp_reply: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MailList {
    pub deliveries: Vec<MailDelivery>,
}

/// Ticket e-mail deliveries by state (dead letters: `?state=dead`)
#[utoipa::path(get, path = "/admin/mail", tag = tags::OPS, security(("admin" = ["viewer"])),
    params(MailQuery),
    responses(
        (status = 200, description = "Newest first", body = MailList),
        (status = 401, response = doc::Unauthorized),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn list_mail(
    _caller: Viewer,
    State(state): State<MailState>,
    q: Result<Query<MailQuery>, QueryRejection>,
) -> ApiResult<ApiJson<MailList>> {
    let Query(q) =
        q.map_err(|e| ApiError::validation(format!("invalid query: {}", e.body_text())))?;
    if let Some(s) = q.state.as_deref()
        && !["pending", "sending", "sent", "dead"].contains(&s)
    {
        return Err(
            ApiError::validation("state must be pending, sending, sent or dead")
                .with("field", "state"),
        );
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::validation("limit must be 1 to 500").with("field", "limit"));
    }
    // No order id holds a NUL (Postgres text cannot) or is longer than 64: such a filter
    // matches nothing, and is answered so without asking Postgres, which would refuse the NUL.
    if q.order_id
        .as_deref()
        .is_some_and(|id| id.len() > 64 || id.contains('\0'))
    {
        return Ok(ApiJson(MailList {
            deliveries: Vec::new(),
        }));
    }
    let rows: Vec<MailDelivery> = sqlx::query_as(
        "SELECT id, kind, order_id, state, attempts, next_attempt_at, last_error, smtp_reply,
                created_at, sent_at
           FROM mail_deliveries
          WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR order_id = $2)
          ORDER BY created_at DESC, id DESC LIMIT $3",
    )
    .bind(q.state.as_deref())
    .bind(q.order_id.as_deref())
    .bind(limit)
    .fetch_all(&state.pool)
    .await
    .context("failed to list ticket e-mails")?;
    Ok(ApiJson(MailList { deliveries: rows }))
}
