//! Ops endpoints of payments (admin bearer + `X-Floodgate-Actor`):
//! `POST /admin/orders/{id}/refund`, `POST /admin/orders/{id}/cancel` (both with
//! `Idempotency-Key`), `POST /admin/events/{event}/cancel`,
//! `GET /admin/events/{event}/cancellation`.

use crate::orders::transitions::cancel_order_tx;
use crate::payments::PaymentsState;
use crate::payments::error::{PaymentError, Statement};
use crate::payments::ops::event_cancel::{self, Cancelled};
use crate::payments::ops::refund::{
    self, Claimed, Origin, ROW_COLUMNS, RefundAsk, RefundRow, Worked,
};
use crate::platform::audit::Viewer;
use crate::platform::audit::{self, AdminOp, Support};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey, OPS_ACCOUNT};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub const ORDER_NOT_REFUNDABLE: &str = "ORDER_NOT_REFUNDABLE";
pub const REFUND_REFUSED: &str = "REFUND_REFUSED";
const MAX_REASON: usize = 1000;

pub fn router() -> OpenApiRouter<PaymentsState> {
    OpenApiRouter::new()
        .routes(routes!(refund_order))
        .routes(routes!(cancel_order))
        .routes(routes!(cancel_event))
        .routes(routes!(cancellation))
}

/// The refund or cancel answer (built with `json!`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct Refunded {
    order_id: String,
    status: crate::orders::OrderStatus,
    /// `null` for a pending order cancelled (nothing was paid).
    #[schema(required = false)]
    refund: Option<RefundRow>,
}

/// `POST /admin/orders/{id}/cancel`'s body: [`RefundRequest`] without `items` (a cancel takes
/// the whole order; `items` is refused with `422`).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "a schema only: the request's shape in the document"
)]
struct CancelOrderRequest {
    /// default: the event's `refund_stock`
    stock: Option<StockChoice>,
    #[schema(min_length = 1, max_length = 1000, pattern = "\\S")]
    reason: Option<String>,
}

/// The event cancellation's answer (built with `json!`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct EventCancelled {
    cancelled_now: bool,
    refunds_queued_now: i64,
    progress: event_cancel::Progress,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StockChoice {
    Release,
    Kill,
}

impl StockChoice {
    fn as_str(self) -> &'static str {
        match self {
            StockChoice::Release => "release",
            StockChoice::Kill => "kill",
        }
    }
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// Order line numbers to refund (each once); absent: every line not refunded yet.
    #[schema(min_items = 1, max_items = 1000, value_type = Option<std::collections::BTreeSet<OrderLine>>)]
    pub items: Option<Vec<i32>>,
    /// default: the event's `refund_stock`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<StockChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 1000, pattern = "\\S")]
    pub reason: Option<String>,
}

/// An order line number.
#[derive(ToSchema)]
#[schema(value_type = i32, minimum = 1)]
#[expect(
    dead_code,
    reason = "a schema only: the line number's bounds in the document"
)]
struct OrderLine(i32);

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelEventRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 1000, pattern = "\\S")]
    pub reason: Option<String>,
}

fn check_reason(reason: &Option<String>) -> ApiResult<()> {
    match reason {
        Some(r) if r.trim().is_empty() || r.chars().count() > MAX_REASON => {
            Err(ApiError::validation("reason must be 1 to 1000 characters"))
        }
        _ => Ok(()),
    }
}

/// Most lines in one per-line refund.
const MAX_LINES: usize = 1000;

fn validate(req: &RefundRequest) -> ApiResult<()> {
    check_reason(&req.reason)?;
    let Some(items) = &req.items else {
        return Ok(());
    };
    let field = |e: ApiError| e.with("field", "items");
    if items.is_empty() || items.len() > MAX_LINES {
        return Err(field(ApiError::validation(format!(
            "items must name 1 to {MAX_LINES} order lines"
        ))));
    }
    if items.iter().any(|l| *l < 1) {
        return Err(field(ApiError::validation(
            "items are order line numbers (1 or more)",
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = items.iter().find(|l| !seen.insert(**l)) {
        return Err(field(
            ApiError::validation("items names a line twice").with("line", *twice),
        ));
    }
    Ok(())
}

/// Refund a paid order, in full or some of its lines (each line exactly once, whatever races it)
#[utoipa::path(post, path = "/admin/orders/{id}/refund", tag = tags::OPS, security(("admin" = ["support"])),
    params(doc::IdPath, doc::ActorHeader, doc::IdempotencyKey),
    request_body = RefundRequest,
    responses(
        (status = 200, description = "Refunded (or the first answer replayed)", body = inline(Refunded)),
        (status = 202, description = "Accepted: the order's final refund waits for an earlier refund of its lines to settle; the refund job completes it (`refund.status` `pending`)", body = inline(Refunded)),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 502, description = "The provider failed or refused the refund", body = doc::Error),
        (status = 503, response = doc::Unavailable),
    ))]
async fn refund_order(
    State(state): State<PaymentsState>,
    op: Support,
    key: IdempotencyKey,
    Path(order_id): Path<String>,
    ApiJson(req): ApiJson<RefundRequest>,
) -> ApiResult<Response> {
    validate(&req)?;
    let path = format!("/admin/orders/{order_id}/refund");
    idempotent(&state, &key, &path, &req, async {
        let ask = RefundAsk {
            stock: req.stock.map(StockChoice::as_str),
            reason: req.reason.as_deref(),
            actor: &op,
            origin: Origin::Ops,
        };
        let mut tx = state
            .pool
            .begin()
            .await
            .statement("begin the refund claim")?;
        let claimed = refund::claim_tx(&mut tx, &order_id, req.items.as_deref(), &ask).await?;
        tx.commit().await.statement("commit the refund claim")?;
        refund_answer(&state, &order_id, claimed).await
    })
    .await
}

/// Cancel an order: a pending one ends like an expiry, a paid one is refunded
#[utoipa::path(post, path = "/admin/orders/{id}/cancel", tag = tags::OPS, security(("admin" = ["support"])),
    params(doc::IdPath, doc::ActorHeader, doc::IdempotencyKey),
    request_body = inline(CancelOrderRequest),
    responses(
        (status = 200, description = "OK", body = inline(Refunded)),
        (status = 202, description = "Accepted: the refund waits for an earlier refund of the order's lines to settle (`refund.status` `pending`)", body = inline(Refunded)),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 502, description = "The provider failed or refused the refund", body = doc::Error),
        (status = 503, response = doc::Unavailable),
    ))]
async fn cancel_order(
    State(state): State<PaymentsState>,
    op: Support,
    key: IdempotencyKey,
    Path(order_id): Path<String>,
    ApiJson(req): ApiJson<RefundRequest>,
) -> ApiResult<Response> {
    if req.items.is_some() {
        return Err(ApiError::validation(
            "a cancel takes the whole order: no items",
        ));
    }
    check_reason(&req.reason)?;
    let path = format!("/admin/orders/{order_id}/cancel");
    idempotent(&state, &key, &path, &req, async {
        let mut tx = state.pool.begin().await.statement("begin the cancel")?;
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM orders WHERE id = $1 FOR UPDATE")
                .bind(&order_id)
                .fetch_optional(&mut *tx)
                .await
                .statement("lock the order to cancel")?;
        if status.as_deref() == Some("PENDING_PAYMENT") {
            // As an expiry does: the hold/units go back, the order ends.
            let ended = cancel_order_tx(&mut tx, &order_id).await.map_err(|e| {
                PaymentError::Ops(anyhow::Error::new(e).context("cancel the order"))
            })?;
            let event: Option<String> =
                sqlx::query_scalar("SELECT event_id FROM orders WHERE id = $1")
                    .bind(&order_id)
                    .fetch_one(&mut *tx)
                    .await
                    .statement("read the cancelled order's event")?;
            audit::record_tx(
                &mut tx,
                &op,
                "order.cancel",
                &format!("order:{order_id}"),
                event.as_deref(),
                &json!({"was": "PENDING_PAYMENT", "reason": req.reason, "cancelled": ended}),
            )
            .await
            .map_err(PaymentError::Ops)?;
            tx.commit().await.statement("commit the cancel")?;
            return Ok((
                StatusCode::OK,
                json!({"order_id": order_id, "status": "CANCELLED", "refund": null}),
            ));
        }
        let ask = RefundAsk {
            stock: req.stock.map(StockChoice::as_str),
            reason: req.reason.as_deref(),
            actor: &op,
            origin: Origin::Ops,
        };
        let claimed = refund::claim_tx(&mut tx, &order_id, None, &ask).await?;
        tx.commit()
            .await
            .statement("commit the cancel's refund claim")?;
        refund_answer(&state, &order_id, claimed).await
    })
    .await
}

/// Works the claimed refund and words the answer.
async fn refund_answer(
    state: &PaymentsState,
    order_id: &str,
    claimed: Claimed,
) -> Result<(StatusCode, Value), ApiError> {
    let row = match claimed {
        Claimed::NotFound => return Err(ApiError::not_found(codes::NOT_FOUND, "no such order")),
        Claimed::NotRefundable(status) => {
            return Err(ApiError::conflict(
                ORDER_NOT_REFUNDABLE,
                "only a paid order can be refunded",
            )
            .with("status", status));
        }
        Claimed::UnknownLines(lines) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::UNKNOWN_ORDER_LINES,
                "the order has no such lines; nothing was refunded",
            )
            .with("field", "items")
            .with("lines", lines));
        }
        Claimed::LinesTaken(lines) => {
            return Err(ApiError::conflict(
                codes::LINES_ALREADY_REFUNDED,
                "some lines are refunded already (or their refund is under way); nothing \
                 more was refunded",
            )
            .with("lines", lines));
        }
        Claimed::Row(row) => row,
    };
    let mut code = StatusCode::OK;
    match refund::work(&state.clients(), &state.redis, &row).await? {
        Worked::Done => {}
        // Accepted: the refund job asks the provider once the order's earlier refunds settled.
        Worked::Waiting => code = StatusCode::ACCEPTED,
        Worked::Retrying(why) => {
            tracing::warn!(order_id, refund = %row.id, why, "ops refund left for a retry");
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                codes::PAYMENT_PROVIDER_ERROR,
                "the payment provider did not confirm the refund; it is retried with the same \
                 key (never refunded twice): retry or watch the order",
            )
            .with("refund_id", row.id.clone()));
        }
        Worked::Failed(why) => {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                REFUND_REFUSED,
                "the payment provider refused the refund; nothing was refunded",
            )
            .with("refund_id", row.id.clone())
            .with("why", why));
        }
    }
    let (status, refund): (String, RefundRow) = {
        let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
            .bind(order_id)
            .fetch_one(&state.pool)
            .await
            .statement("read the refunded order")?;
        let refund: RefundRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {ROW_COLUMNS} FROM order_refunds WHERE id = $1"
        )))
        .bind(&row.id)
        .fetch_one(&state.pool)
        .await
        .statement("read the refund")?;
        (status, refund)
    };
    Ok((
        code,
        json!({"order_id": order_id, "status": status, "refund": refund}),
    ))
}

/// Runs `work` under the ops call's `Idempotency-Key`: a repeat gets the stored answer, a
/// failure or a `202` releases the key (a retry works the same refund row again).
async fn idempotent<F>(
    state: &PaymentsState,
    key: &IdempotencyKey,
    path: &str,
    req: &impl Serialize,
    work: F,
) -> ApiResult<Response>
where
    F: std::future::Future<Output = Result<(StatusCode, Value), ApiError>>,
{
    let body = serde_json::to_value(req).map_err(ApiError::unexpected)?;
    let fp = Fingerprint::of_json(&Method::POST, path, &body);
    let claim = match idempotency::begin(&state.idempotency, OPS_ACCOUNT, key, &fp).await? {
        Begin::Replay(stored) => return Ok(stored.into_response()),
        Begin::Started(claim) => claim,
    };
    match work.await {
        Ok((status, value)) => {
            let bytes = serde_json::to_vec(&value).map_err(ApiError::unexpected)?;
            if status == StatusCode::ACCEPTED {
                // Not an outcome yet: a retry with the key reports the refund's progress
                // (it finds the same refund row), not this answer again.
                claim.release(&state.pool).await;
                return Ok(idempotency::respond(status, bytes));
            }
            claim.complete(&state.pool, status, &bytes).await?;
            Ok(idempotency::respond(status, bytes))
        }
        Err(e) => {
            claim.release(&state.pool).await;
            Err(e)
        }
    }
}

/// Cancel an event: pending orders end, every paid order is refunded once by a resumable job
#[utoipa::path(post, path = "/admin/events/{event}/cancel", tag = tags::OPS, security(("admin" = ["admin"])),
    params(doc::EventPath, doc::ActorHeader),
    request_body = CancelEventRequest,
    responses(
        (status = 200, description = "Cancelled before: nothing new queued", body = inline(EventCancelled)),
        (status = 202, description = "Cancelled now: refunds queued", body = inline(EventCancelled)),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
async fn cancel_event(
    State(state): State<PaymentsState>,
    op: AdminOp,
    Path(event): Path<String>,
    ApiJson(req): ApiJson<CancelEventRequest>,
) -> ApiResult<Response> {
    check_reason(&req.reason)?;
    let (status, cancelled_now, queued) =
        match event_cancel::cancel_event(&state, &event, &op, req.reason.as_deref()).await? {
            Cancelled::NotFound => {
                return Err(ApiError::not_found(codes::NOT_FOUND, "no such event"));
            }
            Cancelled::Now { queued } => (StatusCode::ACCEPTED, true, queued),
            Cancelled::Before => (StatusCode::OK, false, 0),
        };
    let progress = event_cancel::progress(&state.pool, &event)
        .await?
        .ok_or_else(|| ApiError::not_found(codes::NOT_FOUND, "no such event"))?;
    Ok((
        status,
        axum::Json(json!({
            "cancelled_now": cancelled_now,
            "refunds_queued_now": queued,
            "progress": progress,
        })),
    )
        .into_response())
}

/// The progress of an event's cancellation
#[utoipa::path(get, path = "/admin/events/{event}/cancellation", tag = tags::OPS,
    security(("admin" = ["viewer"])),
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = event_cancel::Progress),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
async fn cancellation(
    State(state): State<PaymentsState>,
    _caller: Viewer,
    Path(event): Path<String>,
) -> ApiResult<axum::Json<event_cancel::Progress>> {
    event_cancel::progress(&state.pool, &event)
        .await?
        .map(axum::Json)
        .ok_or_else(|| ApiError::not_found(codes::NOT_FOUND, "no such event"))
}
