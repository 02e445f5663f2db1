//! What the provider's answer does to a refund row, each with its audit entry: applied (the
//! order reversed or its lines returned), refused (the lines freed or handed to the order's
//! final refund) or left for a retry with the same key.

use super::{RETRY_S, RefundRow};
use crate::payments::PaymentClients;
use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::model::Reversal;
use crate::payments::reversal::{self, Reversed};
use crate::platform::audit::{self, Operator};
use serde_json::json;
use sqlx::PgConnection;

/// Takes the lock of the refund's order, which every claim, refusal and transition of its
/// payment takes first.
pub(super) async fn lock_order(conn: &mut PgConnection, order_id: &str) -> PaymentResult<()> {
    sqlx::query("SELECT 1 FROM orders WHERE id = $1 FOR UPDATE")
        .bind(order_id)
        .execute(conn)
        .await
        .statement("lock the refund's order")?;
    Ok(())
}

/// Records the provider's refund and reverses the order (once, whoever comes first), with the
/// audit entry, in the caller's transaction. Returns SKUs whose stock went back on sale.
pub(super) async fn apply_tx(
    conn: &mut PgConnection,
    row: &RefundRow,
    refund_id: &str,
    refunded: Option<i64>,
    actor: &Operator,
) -> PaymentResult<Vec<String>> {
    // The order's lock first, as every payment transition takes it.
    lock_order(conn, &row.order_id).await?;
    // A final refund's amount is what the provider refunded (it asked for the rest).
    let amount: Option<i64> = sqlx::query_scalar(
        "UPDATE order_refunds SET status = 'succeeded', provider_refund_id = $2,
                amount = CASE WHEN whole_payment THEN COALESCE($3, amount) ELSE amount END,
                attempts = attempts + 1, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'
         RETURNING amount",
    )
    .bind(&row.id)
    .bind(refund_id)
    .bind(refunded)
    .fetch_optional(&mut *conn)
    .await
    .statement("record the provider's refund")?;
    let Some(amount) = amount else {
        // Applied by another worker already.
        return Ok(Vec::new());
    };
    let (order_reversed, released) = if row.reverses_order {
        let reversal = Reversal::Refund {
            reference: format!("refund:{refund_id}"),
            full: true,
        };
        let reversed = reversal::apply_tx(
            conn,
            &row.payment_id,
            &row.provider_payment_id,
            None,
            &reversal,
        )
        .await?;
        match reversed {
            Reversed::Order { released_skus, .. } => (true, released_skus),
            _ => (false, Vec::new()),
        }
    } else {
        // Some lines only: they go back, the order stays PAID.
        let returned =
            reversal::lines::return_refund_lines_tx(conn, &row.order_id, &row.id).await?;
        (false, returned)
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
            "amount": amount,
            "stock": row.stock,
            "lines": row.lines,
            "reverses_order": row.reverses_order,
            "reason": row.reason,
            // False when the provider's webhook reversed the order first.
            "reversed_here": order_reversed,
        }),
    )
    .await
    .map_err(PaymentError::Ops)?;
    Ok(released)
}

/// The provider refused: nothing was refunded. The row's lines are free to refund again, or,
/// when the order's final refund is live (it waits for this one to settle), they become that
/// refund's: it asks for everything the provider still holds, their money included. Audited.
pub(super) async fn mark_failed(
    c: &PaymentClients,
    row: &RefundRow,
    why: &str,
) -> PaymentResult<()> {
    let mut tx = c.pool.begin().await.statement("begin the refusal")?;
    lock_order(&mut tx, &row.order_id).await?;
    let failed: Option<i32> = sqlx::query_scalar(
        "UPDATE order_refunds SET status = 'failed', last_error = $2,
                attempts = attempts + 1, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'
         RETURNING attempts",
    )
    .bind(&row.id)
    .bind(why)
    .fetch_optional(&mut *tx)
    .await
    .statement("mark the refund failed")?;
    let Some(attempts) = failed else {
        // Settled by another worker already.
        return Ok(());
    };
    let moved_to: Option<String> = sqlx::query_scalar(
        "WITH fin AS (
             SELECT id FROM order_refunds
              WHERE order_id = $2 AND reverses_order AND status <> 'failed' AND id <> $1),
         moved AS (
             UPDATE order_refund_lines l SET refund_id = fin.id
               FROM fin WHERE l.refund_id = $1
             RETURNING l.refund_id)
         SELECT id FROM fin",
    )
    .bind(&row.id)
    .bind(&row.order_id)
    .fetch_optional(&mut *tx)
    .await
    .statement("give the refused refund's lines to the order's final refund")?;
    if moved_to.is_none() {
        sqlx::query("DELETE FROM order_refund_lines WHERE refund_id = $1")
            .bind(&row.id)
            .execute(&mut *tx)
            .await
            .statement("free the refused refund's lines")?;
    }
    audit::record_tx(
        &mut tx,
        &Operator::from_stored(&row.actor, row.actor_detail.as_ref()),
        "order.refund.refused",
        &format!("order:{}", row.order_id),
        row.event_id.as_deref(),
        &json!({
            "refund_id": row.id,
            "amount": row.amount,
            "lines": row.lines,
            "reverses_order": row.reverses_order,
            "why": why,
            "attempts": attempts,
            // The order's final refund that now refunds these lines' money, if any.
            "lines_to": moved_to,
        }),
    )
    .await
    .map_err(PaymentError::Ops)?;
    tx.commit().await.statement("commit the refusal")?;
    Ok(())
}

/// The provider's outcome is unknown: the row stays pending and is asked again with the same
/// key after [`RETRY_S`]. Audited when the reason changes (the first retry, a new error), not
/// on every retry of an outage.
pub(super) async fn retry_later(
    c: &PaymentClients,
    row: &RefundRow,
    why: &str,
) -> PaymentResult<()> {
    let mut tx = c.pool.begin().await.statement("begin the refund retry")?;
    let changed: Option<(bool, i32)> = sqlx::query_as(
        "UPDATE order_refunds r SET last_error = $2, attempts = r.attempts + 1,
                leased_until = clock_timestamp() + make_interval(secs => $3),
                updated_at = clock_timestamp()
           FROM order_refunds before
          WHERE r.id = $1 AND before.id = r.id AND r.status = 'pending'
         RETURNING before.last_error IS DISTINCT FROM $2, r.attempts",
    )
    .bind(&row.id)
    .bind(why)
    .bind(RETRY_S as f64)
    .fetch_optional(&mut *tx)
    .await
    .statement("leave the refund for a retry")?;
    if let Some((true, attempts)) = changed {
        audit::record_tx(
            &mut tx,
            &Operator::from_stored(&row.actor, row.actor_detail.as_ref()),
            "order.refund.retrying",
            &format!("order:{}", row.order_id),
            row.event_id.as_deref(),
            &json!({
                "refund_id": row.id,
                "amount": row.amount,
                "why": why,
                "attempts": attempts,
                "retry_in_s": RETRY_S,
            }),
        )
        .await
        .map_err(PaymentError::Ops)?;
    }
    tx.commit().await.statement("commit the refund retry")?;
    Ok(())
}
