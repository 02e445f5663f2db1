//! The pay answer of a paid order: the order as `GET /api/orders/{id}` shows it, plus its
//! tickets and the attempt that paid it, read in one statement.

use crate::payments::PaymentClients;
use crate::payments::error::PaymentError;
use crate::payments::repo::{self, PaidOrder};
use crate::platform::db::TxError;
use crate::platform::error::{ApiError, ApiResult};
use serde_json::{Value, json};
use sqlx::PgConnection;
use sqlx::types::Json;

/// The order (as `GET /api/orders/{id}` shows it) plus its tickets and settled payment, and
/// the account's checkout end (`platform::session_until`; `None`: the middleware reads it).
pub(super) async fn paid_body_tx(
    conn: &mut PgConnection,
    order_id: &str,
    account: &str,
) -> Result<(Value, Option<i64>), TxError> {
    let Some(paid) = repo::paid_order_tx(&mut *conn, order_id, account).await? else {
        return Err(TxError::Api(PaymentError::OrderNotFound.into()));
    };
    paid_body_of(paid).map_err(TxError::Api)
}

/// The pay answer of `paid` (read after the sale, or returned by the sale's own statement).
pub(super) fn paid_body_of(paid: PaidOrder) -> ApiResult<(Value, Option<i64>)> {
    let row = paid.order;
    let view = crate::orders::model::OrderView {
        id: row.id,
        status: row.status,
        source: row.source,
        hold_id: row.hold_id,
        event_id: row.event_id,
        total: row.total,
        currency: row.currency,
        items: paid.items.0,
        expires_at: row.expires_at,
        created_at: row.created_at,
        paid_at: row.paid_at,
    };
    let mut body = serde_json::to_value(&view).map_err(ApiError::unexpected)?;
    body["tickets"] = paid
        .tickets
        .0
        .into_iter()
        .map(|t| {
            json!({"id": t.id, "event_id": t.event_id, "seat_id": t.seat_id, "ga_tier": t.ga_tier})
        })
        .collect();
    body["payment"] = match paid.payment {
        Some(Json(p)) => json!({
            "id": p.id, "attempt": p.attempt, "status": "succeeded",
            "provider_payment_id": p.provider_payment_id,
        }),
        None => Value::Null,
    };
    Ok((body, paid.live_until_ms))
}

pub(super) async fn paid_body(
    c: &PaymentClients,
    order_id: &str,
    account: &str,
) -> ApiResult<(Value, Option<i64>)> {
    let mut conn = c.pool.acquire().await?;
    Ok(paid_body_tx(&mut conn, order_id, account).await?)
}
