//! Order transitions in Postgres (for payments and the expiry job), inside the caller's
//! transaction. Each is one conditional `UPDATE orders ... WHERE status = <from>`, so of two
//! racing transitions exactly one changes the row and the stock moves exactly once.

use crate::inventory::holds;
use crate::orders::model::{EndedOrder, OrderEnd, OrderId, OrderSource};
use crate::orders::repo::{During, OrderError, write_outbox};
use crate::orders::stock::{self, StockMove};
use sqlx::PgConnection;

/// Moves a cart order's reserved units to sold (`reserved -= q, sold += q` on the shard rows
/// its lines took from, rows locked in (SKU, shard) order). Call it in the transaction that
/// won the order's `PENDING_PAYMENT → PAID` transition. Returns the number of SKUs updated (0
/// for hold orders, whose seats/GA units are sold by `holds::sell_hold_tx`).
pub async fn commit_reserved_stock_tx(
    conn: &mut PgConnection,
    order_id: &str,
) -> Result<u64, OrderError> {
    let skus = stock::move_order_stock_tx(conn, &[order_id.to_owned()], StockMove::Sell).await?;
    Ok(skus.len() as u64)
}

/// `PENDING_PAYMENT → PAID` (one conditional `UPDATE`) and, for cart orders, reserved units
/// to sold. `None` when the order was not pending (expired, cancelled, already paid): nothing
/// changed. Hold orders: the caller sells the hold (`holds::sell_hold_tx`) in the same
/// transaction. Does not look at `expires_at`: a pending order still owns its units until the
/// expiry job ends it.
pub async fn mark_paid_tx(
    conn: &mut PgConnection,
    order_id: &str,
) -> Result<Option<EndedOrder>, OrderError> {
    let won: Option<EndedOrder> = sqlx::query_as(
        "UPDATE orders SET status = 'PAID', paid_at = clock_timestamp(),
                           updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'PENDING_PAYMENT'
         RETURNING id, account_id, source, hold_id, total",
    )
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await
    .during("mark the order paid")?;
    if let Some(o) = &won
        && o.source == OrderSource::Cart
    {
        commit_reserved_stock_tx(conn, order_id).await?;
    }
    Ok(won)
}

/// Ends the given pending orders (`EXPIRED` or `CANCELLED`), returns their units (aggregated
/// per SKU) and holds, and writes one outbox row each. Expiry ends only orders whose
/// `expires_at` has passed. Returns the orders ended and the SKUs whose stock came back.
pub async fn end_orders_tx(
    conn: &mut PgConnection,
    ids: &[String],
    end: OrderEnd,
) -> Result<(Vec<EndedOrder>, Vec<String>), OrderError> {
    let ended: Vec<EndedOrder> = sqlx::query_as(
        "UPDATE orders SET status = $2, updated_at = clock_timestamp()
          WHERE id = ANY($1) AND status = 'PENDING_PAYMENT'
            AND (NOT $3 OR expires_at <= clock_timestamp())
         RETURNING id, account_id, source, hold_id, total",
    )
    .bind(ids)
    .bind(end.status().as_str())
    .bind(end.due_only())
    .fetch_all(&mut *conn)
    .await
    .during("end the pending orders")?;
    if ended.is_empty() {
        return Ok((ended, Vec::new()));
    }
    let cart_ids: Vec<String> = ended
        .iter()
        .filter(|o| o.source == OrderSource::Cart)
        .map(|o| o.id.clone())
        .collect();
    let mut skus = Vec::new();
    if !cart_ids.is_empty() {
        skus = stock::move_order_stock_tx(conn, &cart_ids, StockMove::Return).await?;
    }
    let mut hold_ids: Vec<&str> = ended.iter().filter_map(|o| o.hold_id.as_deref()).collect();
    hold_ids.sort_unstable();
    for hold_id in hold_ids {
        holds::release_hold_tx(
            conn,
            hold_id,
            &[holds::HoldStatus::Ordered],
            end.hold_status(),
        )
        .await
        .during("release the ended order's hold")?;
    }
    for o in &ended {
        let payload = serde_json::json!({
            "order_id": o.id,
            "account_id": o.account_id,
            "status": end.status(),
            "source": o.source,
            "hold_id": o.hold_id,
            "total": o.total,
        });
        write_outbox(conn, end.topic(), OrderId::new(&o.id), &payload)
            .await
            .during("write the order's end event")?;
    }
    Ok((ended, skus))
}

/// Expires one order if it is still `PENDING_PAYMENT` and due, returning its units/hold.
/// `false` when nothing changed (paid, already ended, or not due yet).
pub async fn expire_order_tx(conn: &mut PgConnection, order_id: &str) -> Result<bool, OrderError> {
    let (ended, _) = end_orders_tx(conn, &[order_id.to_owned()], OrderEnd::Expired).await?;
    Ok(!ended.is_empty())
}

/// Cancels one `PENDING_PAYMENT` order now (due or not), returning its units/hold.
pub async fn cancel_order_tx(conn: &mut PgConnection, order_id: &str) -> Result<bool, OrderError> {
    let (ended, _) = end_orders_tx(conn, &[order_id.to_owned()], OrderEnd::Cancelled).await?;
    Ok(!ended.is_empty())
}
