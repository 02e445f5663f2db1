//! A fan's own orders in Postgres: one page of the list, and the cancel of a pending order.
//!
//! The cancel is one locked transaction, never a read-then-write race with a pay request:
//! 1. `SELECT ... FOR UPDATE` locks the order row. The pay request's start is one statement
//!    that updates this very row (its pin) and inserts the attempt, so it either committed
//!    before the lock was granted, or waits behind it and then finds the order no longer
//!    `PENDING_PAYMENT` and creates no attempt, calls no provider.
//! 2. A new statement (READ COMMITTED: a fresh snapshot, taken after the lock) looks for an
//!    attempt still `pending`. One exists from the moment its provider key commits until the
//!    provider's outcome is applied, so a charge in flight or of unknown outcome refuses the
//!    cancel (`409 PAYMENT_IN_PROGRESS`): the money may be taken, the order must stay payable.
//! 3. The expiry's own transition ([`end_orders_tx`], `OrderEnd::Cancelled`): one conditional
//!    `UPDATE ... WHERE status = 'PENDING_PAYMENT'` that returns the stock or the hold.

use super::{During, OrderError};
use crate::orders::cursor::OrderCursor;
use crate::orders::model::{OrderEnd, OrderSource, OrderStatus};
use crate::orders::transitions::end_orders_tx;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use utoipa::ToSchema;

/// One line of a fan's order list (the items are in `GET /api/orders/{id}`).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, ToSchema)]
pub struct OrderSummary {
    pub id: String,
    pub status: OrderStatus,
    pub source: OrderSource,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// integer minor units
    pub total: i64,
    pub currency: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

/// Up to `limit` of `account`'s orders (of `event` if given) strictly before `after`, newest
/// first (index `orders_account`).
pub async fn list_own(
    conn: &mut PgConnection,
    account: &str,
    event: Option<&str>,
    after: Option<&OrderCursor>,
    limit: i64,
) -> Result<Vec<OrderSummary>, OrderError> {
    sqlx::query_as(
        "SELECT id, status, source, event_id, total, currency, created_at, expires_at, paid_at
           FROM orders
          WHERE account_id = $1
            AND ($2::text IS NULL OR event_id = $2)
            AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4))
          ORDER BY created_at DESC, id DESC
          LIMIT $5",
    )
    .bind(account)
    .bind(event)
    .bind(after.map(|c| c.created_at))
    .bind(after.map(|c| c.id.as_str()))
    .bind(limit)
    .fetch_all(conn)
    .await
    .during("read the account's orders")
}

/// What a fan's cancel did.
#[derive(Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// No such order of this account (someone else's looks the same).
    NotFound,
    /// The order belongs to another event than the admission's.
    WrongEvent,
    /// Not `PENDING_PAYMENT` any more (paid, expired, cancelled...).
    NotPending(OrderStatus),
    /// Attempt `attempt` is still open at the provider: the money may be taken.
    PaymentInProgress { attempt: i32 },
    /// Cancelled; the SKUs whose stock came back (their flash gates need a reconcile).
    Cancelled { skus: Vec<String> },
}

/// Cancels `account`'s pending order `order_id` (see the module doc), in the caller's
/// transaction; the caller commits on [`CancelOutcome::Cancelled`] only.
pub async fn cancel_own_tx(
    conn: &mut PgConnection,
    order_id: &str,
    account: &str,
    admission_event: &str,
) -> Result<CancelOutcome, OrderError> {
    let locked: Option<(OrderStatus, Option<String>)> = sqlx::query_as(
        "SELECT status, event_id FROM orders WHERE id = $1 AND account_id = $2 FOR UPDATE",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(&mut *conn)
    .await
    .during("lock the order to cancel")?;
    let Some((status, event)) = locked else {
        return Ok(CancelOutcome::NotFound);
    };
    if event.as_deref().is_some_and(|e| e != admission_event) {
        return Ok(CancelOutcome::WrongEvent);
    }
    if status != OrderStatus::PendingPayment {
        return Ok(CancelOutcome::NotPending(status));
    }
    let open: Option<i32> = sqlx::query_scalar(
        "SELECT attempt FROM payments WHERE order_id = $1 AND status = 'pending'",
    )
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await
    .during("look for a payment in flight")?;
    if let Some(attempt) = open {
        return Ok(CancelOutcome::PaymentInProgress { attempt });
    }
    let (ended, skus) = end_orders_tx(conn, &[order_id.to_owned()], OrderEnd::Cancelled).await?;
    // The row is locked by this transaction and was pending: the transition cannot miss.
    if ended.is_empty() {
        return Ok(CancelOutcome::NotPending(status));
    }
    Ok(CancelOutcome::Cancelled { skus })
}
