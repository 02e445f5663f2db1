//! Full refunds booking asks the provider for: claim a durable `order_refunds` row, call the
//! provider outside any transaction with the row's own idempotency key, then apply it.
//!
//! Why this never refunds twice:
//! - At most one live refund row per order (partial unique index), inserted under the
//!   order's row lock: concurrent requests, the event-cancellation sweep and retries all share
//!   one row, hence one provider key `ops-refund-<row id>`.
//! - The provider refunds at most once per key and replays its answer; a crash between its
//!   answer and our commit leaves the row `pending`, and the next worker (the refund job once
//!   the lease ends) replays the same key.
//! - Applying is [`reversal::apply_tx`] with a full refund, the same conditional
//!   `PAID → REFUNDED` the provider's `charge.refunded` webhook runs, so whichever of the
//!   ops answer and the webhook comes first reverses the order and the other changes nothing.
//!   The stock choice of the row (`release` / `kill`) is read by that statement either way.

use crate::payments::PaymentClients;
use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::model::{Reversal, already_refunded_id};
use crate::payments::provider::ProviderError;
use crate::payments::reversal::{self, Reversed};
use crate::platform::audit::{self, Operator};
use crate::platform::db;
use crate::platform::redis::Redis;
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;
use std::time::Duration;

/// How long a worker owns a pending row before another may take it over.
pub const LEASE_S: i64 = 60;
/// Wait before the job retries a refund whose outcome was unknown.
pub const RETRY_S: i64 = 5;

/// Where a refund row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Ops,
    EventCancel,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Ops => "ops",
            Origin::EventCancel => "event_cancel",
        }
    }
}

/// A refund row as the workers and answers see it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RefundRow {
    pub id: String,
    pub order_id: String,
    pub event_id: Option<String>,
    #[serde(skip)]
    pub payment_id: String,
    #[serde(skip)]
    pub provider_payment_id: String,
    pub amount: i64,
    pub stock: String,
    pub origin: String,
    pub status: String,
    pub provider_refund_id: Option<String>,
    pub actor: String,
    pub reason: Option<String>,
    pub attempts: i32,
}

pub const ROW_COLUMNS: &str = "id, order_id, event_id, payment_id, provider_payment_id, amount, \
     stock, origin, status, provider_refund_id, actor, reason, attempts";

/// What claiming a refund of an order found.
#[derive(Debug)]
pub enum Claimed {
    /// The order's live refund (new, or the one already under way or done).
    Row(Box<RefundRow>),
    /// The order is not paid (and has no refund of ours): its status.
    NotRefundable(String),
    NotFound,
}

/// The refund request, validated.
#[derive(Debug, Clone)]
pub struct RefundAsk<'a> {
    /// `release` | `kill`; `None`: the event's `refund_stock`.
    pub stock: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub actor: &'a str,
    pub origin: Origin,
}

/// Under the order's lock: the order's live refund row, inserted if the order is `PAID` and
/// has none. The new row is leased to the caller (it calls the provider next).
pub async fn claim_tx(
    conn: &mut PgConnection,
    order_id: &str,
    ask: &RefundAsk<'_>,
) -> PaymentResult<Claimed> {
    let order: Option<(String,)> =
        sqlx::query_as("SELECT status FROM orders WHERE id = $1 FOR UPDATE")
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await
            .statement("lock the order to refund")?;
    let Some((status,)) = order else {
        return Ok(Claimed::NotFound);
    };
    let live: Option<RefundRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {ROW_COLUMNS} FROM order_refunds WHERE order_id = $1 AND status <> 'failed'"
    )))
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await
    .statement("read the order's refund")?;
    if let Some(row) = live {
        return Ok(Claimed::Row(Box::new(row)));
    }
    if status != "PAID" {
        return Ok(Claimed::NotRefundable(status));
    }
    // The order is locked and has no live row: this insert cannot conflict.
    let row: Option<RefundRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO order_refunds (id, order_id, event_id, payment_id, provider_payment_id,
                                    amount, stock, origin, actor, reason, leased_until)
         SELECT 'rf_' || replace(gen_random_uuid()::text, '-', ''), o.id, o.event_id, p.id,
                p.provider_payment_id, p.amount,
                COALESCE($2, CASE e.refund_stock WHEN 'hold_back' THEN 'kill' ELSE 'release' END,
                         'release'),
                $3, $4, $5, clock_timestamp() + make_interval(secs => $6)
           FROM orders o
           JOIN payments p ON p.order_id = o.id AND p.status = 'succeeded'
           LEFT JOIN events e ON e.id = o.event_id
          WHERE o.id = $1
          LIMIT 1
         RETURNING {ROW_COLUMNS}"
    )))
    .bind(order_id)
    .bind(ask.stock)
    .bind(ask.origin.as_str())
    .bind(ask.actor)
    .bind(ask.reason)
    .bind(LEASE_S as f64)
    .fetch_optional(&mut *conn)
    .await
    .statement("record the refund before calling the provider")?;
    Ok(match row {
        Some(row) => Claimed::Row(Box::new(row)),
        // PAID without a succeeded attempt: nothing of ours to refund.
        None => Claimed::NotRefundable(status),
    })
}

/// How working a refund row ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Worked {
    /// Refunded and applied (now or before).
    Done,
    /// The provider's outcome is unknown or it was unreachable: still pending, retried with
    /// the same key.
    Retrying(String),
    /// The provider refused the refund itself (never refunded): the row is `failed`.
    Failed(String),
}

/// Calls the provider for `row` (same key on every try) and applies the answer. Nothing here
/// holds a transaction across the provider call.
pub async fn work(c: &PaymentClients, redis: &Redis, row: &RefundRow) -> PaymentResult<Worked> {
    let actor = Operator(row.actor.clone());
    if row.status == "succeeded" {
        return Ok(Worked::Done);
    }
    if row.status == "failed" {
        return Ok(Worked::Failed(row.id.clone()));
    }
    let key = provider_key(&row.id);
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    let refund_id = loop {
        tries += 1;
        match c.provider.refund(&key, &row.provider_payment_id).await {
            Ok(r) => break r.id,
            // Refunded before (in the dashboard, say): the money is back all the same.
            Err(ProviderError::Rejected { code, .. }) if code == "charge_already_refunded" => {
                break already_refunded_id(&row.provider_payment_id);
            }
            // The same key still running (another worker): wait for its answer.
            Err(ProviderError::InProgress) if tries < 20 => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(ProviderError::Rejected { status, code }) => {
                let why = format!("provider refused the refund: {status} {code}");
                mark_failed(c, &row.id, &why).await?;
                return Ok(Worked::Failed(why));
            }
            Err(e) => {
                let why = e.to_string();
                retry_later(c, &row.id, &why).await?;
                return Ok(Worked::Retrying(why));
            }
        }
    };
    let released = db::retry(3, || async {
        let mut tx = c.pool.begin().await.statement("begin the refund apply")?;
        let released = apply_tx(&mut tx, row, &refund_id, &actor).await?;
        tx.commit().await.statement("commit the refund apply")?;
        Ok::<_, PaymentError>(released)
    })
    .await?;
    for sku in released {
        // Returned units of hot SKUs: let the flash gate admit them again.
        if let Err(e) = crate::orders::flash::reconcile(&c.pool, redis, &sku).await {
            tracing::warn!(error = ?e, sku, "flash gate reconcile after an ops refund failed");
        }
    }
    Ok(Worked::Done)
}

/// The provider idempotency key of a refund row.
pub fn provider_key(refund_id: &str) -> String {
    format!("ops-refund-{refund_id}")
}

/// Records the provider's refund and reverses the order (once, whoever comes first), with the
/// audit entry, in the caller's transaction. Returns SKUs whose stock went back on sale.
async fn apply_tx(
    conn: &mut PgConnection,
    row: &RefundRow,
    refund_id: &str,
    actor: &Operator,
) -> PaymentResult<Vec<String>> {
    // The order's lock first, as every payment transition takes it.
    sqlx::query("SELECT 1 FROM orders WHERE id = $1 FOR UPDATE")
        .bind(&row.order_id)
        .execute(&mut *conn)
        .await
        .statement("lock the refunded order")?;
    let recorded = sqlx::query(
        "UPDATE order_refunds SET status = 'succeeded', provider_refund_id = $2,
                attempts = attempts + 1, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(&row.id)
    .bind(refund_id)
    .execute(&mut *conn)
    .await
    .statement("record the provider's refund")?
    .rows_affected();
    if recorded == 0 {
        // Applied by another worker already.
        return Ok(Vec::new());
    }
    let reversal = Reversal::Refund {
        reference: format!("refund:{refund_id}"),
        full: true,
    };
    let reversed =
        reversal::apply_tx(conn, &row.payment_id, &row.provider_payment_id, &reversal).await?;
    let (order_reversed, released) = match reversed {
        Reversed::Order { released_skus, .. } => (true, released_skus),
        _ => (false, Vec::new()),
    };
    let action = match row.origin.as_str() {
        "event_cancel" => "event.cancel.refund",
        _ => "order.refund",
    };
    audit::record_tx(
        conn,
        actor,
        action,
        &format!("order:{}", row.order_id),
        row.event_id.as_deref(),
        &json!({
            "refund_id": row.id,
            "provider_refund_id": refund_id,
            "amount": row.amount,
            "stock": row.stock,
            "reason": row.reason,
            // False when the provider's webhook reversed the order first.
            "reversed_here": order_reversed,
        }),
    )
    .await
    .map_err(PaymentError::Ops)?;
    Ok(released)
}

async fn mark_failed(c: &PaymentClients, id: &str, why: &str) -> PaymentResult<()> {
    sqlx::query(
        "UPDATE order_refunds SET status = 'failed', last_error = $2, attempts = attempts + 1,
                updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(why)
    .execute(&c.pool)
    .await
    .statement("mark the refund failed")?;
    Ok(())
}

async fn retry_later(c: &PaymentClients, id: &str, why: &str) -> PaymentResult<()> {
    sqlx::query(
        "UPDATE order_refunds SET last_error = $2, attempts = attempts + 1,
                leased_until = clock_timestamp() + make_interval(secs => $3),
                updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(why)
    .bind(RETRY_S as f64)
    .execute(&c.pool)
    .await
    .statement("leave the refund for a retry")?;
    Ok(())
}
