//! A fan's own orders: `GET /api/orders` (the admission's account, newest first, keyset
//! pages, optionally `?event=`) and `POST /api/orders/{id}/cancel` of a `PENDING_PAYMENT`
//! order (the SQL and its guarantee are in `orders/repo/fans.rs`).

use crate::orders::cursor::{OrderCursor, page_limit};
use crate::orders::repo::fans::{self, CancelOutcome, OrderSummary};
use crate::orders::repo::{During, load_order};
use crate::orders::{OrderView, OrdersState, flash};
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use utoipa::{IntoParams, ToSchema};

/// `409`: the order is not `PENDING_PAYMENT` (its `status` is in the body).
pub const ORDER_NOT_CANCELLABLE: &str = "ORDER_NOT_CANCELLABLE";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only orders of this event.
    event: Option<String>,
    #[param(minimum = 1, maximum = 200, default = 50)]
    limit: Option<i64>,
    /// the `next_cursor` of the previous page (opaque)
    cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OrderPage {
    orders: Vec<OrderSummary>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// A query string that does not parse (unknown parameter, a limit that is no number) is a
/// `422` with the standard body.
pub fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::validation(format!("invalid query: {}", e.body_text())))
}

/// Decodes an optional cursor (`422` when it is not one of ours).
pub fn cursor(raw: Option<&str>) -> ApiResult<Option<OrderCursor>> {
    raw.map(|c| {
        OrderCursor::decode(c).ok_or_else(|| {
            ApiError::validation("cursor is not a next_cursor from this list")
                .with("field", "cursor")
        })
    })
    .transpose()
}

/// One's own orders (newest first, keyset pages)
#[utoipa::path(get, path = "/api/orders", tag = tags::ORDERS,
    params(ListQuery),
    responses(
        (status = 200, description = "OK", body = OrderPage),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn list_orders(
    State(state): State<OrdersState>,
    admitted: Admitted,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<ApiJson<OrderPage>> {
    let q = query(q)?;
    let limit = page_limit(q.limit).map_err(|m| ApiError::validation(m).with("field", "limit"))?;
    let after = cursor(q.cursor.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    // One more row than the page says whether there is a next page.
    let mut orders = fans::list_own(
        &mut conn,
        admitted.account(),
        q.event.as_deref(),
        after.as_ref(),
        limit + 1,
    )
    .await?;
    let next_cursor = (orders.len() as i64 > limit).then(|| {
        orders.truncate(limit as usize);
        orders.last().map(|o| {
            OrderCursor {
                created_at: o.created_at,
                id: o.id.clone(),
            }
            .encode()
        })
    });
    Ok(ApiJson(OrderPage {
        orders,
        next_cursor: next_cursor.flatten(),
    }))
}

/// Cancel one's own pending order (never one whose payment may be under way)
///
/// `409 ORDER_NOT_CANCELLABLE {status}` or `409 PAYMENT_IN_PROGRESS`.
#[utoipa::path(post, path = "/api/orders/{id}/cancel", tag = tags::ORDERS,
    operation_id = "cancel_own_order",
    params(doc::IdPath),
    responses(
        (status = 200, description = "OK", body = OrderView),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 503, response = doc::Unavailable),
    ))]
#[tracing::instrument(skip_all, fields(account = %admitted.account(), order = %id))]
pub async fn cancel_order(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path(id): Path<String>,
) -> ApiResult<ApiJson<OrderView>> {
    let not_found = || ApiError::not_found(codes::NOT_FOUND, "no such order");
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let mut tx = state
        .pool
        .begin()
        .await
        .during("begin the cancel transaction")?;
    let outcome = fans::cancel_own_tx(&mut tx, &id, admitted.account(), admitted.event()).await?;
    let skus = match outcome {
        CancelOutcome::Cancelled { skus } => skus,
        // Nothing was written: the transaction rolls back on drop.
        CancelOutcome::NotFound => return Err(not_found()),
        CancelOutcome::WrongEvent => return Err(ApiError::wrong_event()),
        CancelOutcome::NotPending(status) => {
            return Err(ApiError::conflict(
                ORDER_NOT_CANCELLABLE,
                format!("only a PENDING_PAYMENT order can be cancelled; this one is {status}"),
            )
            .with("status", status.as_str()));
        }
        CancelOutcome::PaymentInProgress { attempt } => {
            return Err(ApiError::conflict(
                codes::PAYMENT_IN_PROGRESS,
                "a payment of this order is in progress; its outcome decides the order",
            )
            .with("attempt", attempt));
        }
    };
    tx.commit().await.during("commit the cancel")?;
    state.metrics.orders.with_label_values(&["cancelled"]).inc();
    // As after an expiry: the stock is back in Postgres, the flash gates follow (best effort,
    // their reconcile job corrects a miss).
    for sku in &skus {
        if let Err(e) = flash::reconcile(&state.pool, &state.redis, sku).await {
            tracing::warn!(error = ?e, sku, "flash gate reconcile after cancel failed");
        }
    }
    let mut conn = state.pool.acquire().await?;
    match load_order(&mut conn, &id, Some(admitted.account())).await? {
        Some((_, view)) => Ok(ApiJson(view)),
        None => Err(not_found()),
    }
}
