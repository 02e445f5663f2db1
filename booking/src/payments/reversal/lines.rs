//! Order lines going back one refund at a time (per-line refunds by ops, issue 18).
//!
//! Guarantees:
//! - A line's seats/units go back on sale (or are held back) and its tickets are voided
//!   **once**: `order_refund_lines.returned_at` is set by one conditional `UPDATE ... WHERE
//!   returned_at IS NULL`, in the same statement that picks the lines to return, under the
//!   order's row lock (the caller's). Whoever comes first — the line's own refund, or the
//!   order's reversal (its last refund, a provider-side full refund, a dispute) — returns it;
//!   the other finds it returned.
//! - A line refund returns its lines only while the order is `PAID`: once the order was
//!   reversed, everything already went back.
//! - The order's reversal returns, line by line, only what is still out
//!   ([`return_rest_tx`]) once any line went back on its own; otherwise it keeps the
//!   whole-order path of [`super::reverse_order_tx`].

use crate::inventory::holds;
use crate::orders::stock::{self, StockMove};
use crate::payments::error::{PaymentResult, Statement};
use sqlx::PgConnection;

/// One order line to give back.
#[derive(sqlx::FromRow)]
struct Line {
    kind: String,
    sku: Option<String>,
    seat_id: Option<String>,
    quantity: i32,
    /// Back on sale; false: held back.
    release: bool,
}

/// Returns the lines of refund `refund_id` of `order_id` not returned yet, if the order is
/// still `PAID` (caller holds the order's lock). Returns SKUs whose stock went back on sale.
pub async fn return_refund_lines_tx(
    conn: &mut PgConnection,
    order_id: &str,
    refund_id: &str,
) -> PaymentResult<Vec<String>> {
    let lines: Vec<Line> = sqlx::query_as(
        "WITH marked AS (
             UPDATE order_refund_lines l SET returned_at = clock_timestamp()
               FROM order_refunds r, orders o
              WHERE l.order_id = $1 AND l.refund_id = $2 AND l.returned_at IS NULL
                AND r.id = l.refund_id AND o.id = l.order_id AND o.status = 'PAID'
             RETURNING l.line, r.stock = 'release' AS release)
         SELECT i.kind, i.sku, i.seat_id, i.quantity, m.release
           FROM marked m JOIN order_items i ON i.order_id = $1 AND i.line = m.line",
    )
    .bind(order_id)
    .bind(refund_id)
    .fetch_all(&mut *conn)
    .await
    .statement("mark the refund's lines returned")?;
    return_lines_tx(conn, order_id, &lines).await
}

/// True when some line of `order_id` went back on its own (a per-line refund).
pub async fn any_returned_tx(conn: &mut PgConnection, order_id: &str) -> PaymentResult<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM order_refund_lines
                         WHERE order_id = $1 AND returned_at IS NOT NULL)",
    )
    .bind(order_id)
    .fetch_one(&mut *conn)
    .await
    .statement("read whether lines of the order went back")
}

/// Marks every line of `order_id` that a refund took as returned (the whole-order reversal
/// returned them).
pub async fn mark_all_returned_tx(conn: &mut PgConnection, order_id: &str) -> PaymentResult<()> {
    sqlx::query(
        "UPDATE order_refund_lines SET returned_at = clock_timestamp()
          WHERE order_id = $1 AND returned_at IS NULL",
    )
    .bind(order_id)
    .execute(&mut *conn)
    .await
    .statement("mark the order's refunded lines returned")?;
    Ok(())
}

/// The order's reversal once some lines went back: returns every line still out (the stock
/// choice of the refund that took it, else `release`). Returns SKUs back on sale.
pub async fn return_rest_tx(
    conn: &mut PgConnection,
    order_id: &str,
    release: bool,
) -> PaymentResult<Vec<String>> {
    let lines: Vec<Line> = sqlx::query_as(
        "WITH marked AS (
             UPDATE order_refund_lines l SET returned_at = clock_timestamp()
              WHERE l.order_id = $1 AND l.returned_at IS NULL
             RETURNING l.line, l.refund_id)
         SELECT i.kind, i.sku, i.seat_id, i.quantity,
                COALESCE((SELECT r.stock = 'release' FROM marked m
                            JOIN order_refunds r ON r.id = m.refund_id
                           WHERE m.line = i.line), $2) AS release
           FROM order_items i
          WHERE i.order_id = $1
            -- Statement snapshot: the lines returned before this statement.
            AND NOT EXISTS (SELECT 1 FROM order_refund_lines l
                             WHERE l.order_id = $1 AND l.line = i.line
                               AND l.returned_at IS NOT NULL)",
    )
    .bind(order_id)
    .bind(release)
    .fetch_all(&mut *conn)
    .await
    .statement("mark the order's remaining lines returned")?;
    return_lines_tx(conn, order_id, &lines).await
}

/// Gives `lines` back: seats and GA units to sale or held back, the account's ticket usage,
/// SKU stock to the shard rows it came from, tickets voided (`refunded`).
async fn return_lines_tx(
    conn: &mut PgConnection,
    order_id: &str,
    lines: &[Line],
) -> PaymentResult<Vec<String>> {
    if lines.is_empty() {
        return Ok(Vec::new());
    }
    let order: (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT o.account_id, o.hold_id, h.event_id, h.kind, h.ga_tier
               FROM orders o LEFT JOIN holds h ON h.id = o.hold_id
              WHERE o.id = $1",
    )
    .bind(order_id)
    .fetch_one(&mut *conn)
    .await
    .statement("read the refunded lines' order")?;
    let (account, hold_id, hold_event, hold_kind, ga_tier) = order;
    let mut seats: Vec<(&str, bool)> = lines
        .iter()
        .filter(|l| l.kind == "seat")
        .filter_map(|l| Some((l.seat_id.as_deref()?, l.release)))
        .collect();
    seats.sort_unstable();
    if let (Some(event), false) = (&hold_event, seats.is_empty()) {
        let (ids, release): (Vec<&str>, Vec<bool>) = seats.iter().copied().unzip();
        // Seats locked in seat_id order, like every other seat path.
        sqlx::query(
            "WITH w AS (SELECT * FROM unnest($3::text[], $4::bool[]) AS w(seat_id, release)),
             mine AS (
                 SELECT s.seat_id, w.release FROM seats s JOIN w ON w.seat_id = s.seat_id
                  WHERE s.event_id = $1 AND s.order_id = $2 AND s.status = 'sold'
                  ORDER BY s.seat_id
                  FOR UPDATE OF s)
             UPDATE seats s
                SET status = CASE WHEN m.release THEN 'available' ELSE 'held_back' END,
                    order_id = CASE WHEN m.release THEN NULL ELSE s.order_id END,
                    hold_id = NULL, held_until = NULL
               FROM mine m
              WHERE s.event_id = $1 AND s.seat_id = m.seat_id",
        )
        .bind(event)
        .bind(order_id)
        .bind(&ids)
        .bind(&release)
        .execute(&mut *conn)
        .await
        .statement("give the refunded lines' seats back")?;
    }
    // A GA hold is one line (one tier): it goes back whole, from the shards it took.
    if let (Some(hold), Some(event), Some("ga"), Some(ga)) = (
        &hold_id,
        &hold_event,
        hold_kind.as_deref(),
        lines.iter().find(|l| l.kind == "ga"),
    ) {
        holds::return_ga_units_tx(conn, hold, event, ga_tier.as_deref(), ga.release)
            .await
            .statement("give the refunded line's GA units back")?;
    }
    let tickets: i32 = lines
        .iter()
        .filter(|l| l.kind != "sku")
        .map(|l| l.quantity)
        .sum();
    let seat_ids: Vec<&str> = seats.iter().map(|(s, _)| *s).collect();
    let ga_line = lines.iter().any(|l| l.kind == "ga");
    if let (Some(event), true) = (&hold_event, tickets > 0) {
        // Transferred tickets' usage goes back to their holders.
        super::holders::release_usage_tx(
            conn,
            order_id,
            event,
            &account,
            tickets,
            super::holders::Which::Lines {
                seats: &seat_ids,
                ga: ga_line,
            },
        )
        .await?;
    }
    let mut released = Vec::new();
    for release in [true, false] {
        let skus: Vec<String> = lines
            .iter()
            .filter(|l| l.kind == "sku" && l.release == release)
            .filter_map(|l| l.sku.clone())
            .collect();
        let how = if release {
            StockMove::Release
        } else {
            StockMove::HoldBack
        };
        let moved = stock::move_order_lines_stock_tx(conn, order_id, &skus, how)
            .await
            .map_err(sqlx::Error::from)
            .statement("give the refunded lines' SKU stock back")?;
        if release {
            released = moved;
        }
    }
    // With a void notice per voided ticket version (see `reversal.rs`).
    sqlx::query(
        "WITH v AS (
           UPDATE tickets SET voided_at = clock_timestamp(), void_reason = 'refunded',
                  version = version + 1
            WHERE order_id = $1 AND voided_at IS NULL
              AND (seat_id = ANY($2) OR ($3 AND ga_tier IS NOT NULL))
           RETURNING id, version)
         INSERT INTO mail_deliveries (kind, key, order_id)
         SELECT 'void', v.id || '.v' || v.version, $1 FROM v
          WHERE EXISTS (SELECT 1 FROM order_contacts c
                         WHERE c.order_id = $1 AND c.email IS NOT NULL)
             OR EXISTS (SELECT 1 FROM ticket_transfers x
                         WHERE x.ticket_id = v.id AND x.status = 'accepted'
                           AND x.receiver_email IS NOT NULL)
         ON CONFLICT (kind, key) DO NOTHING",
    )
    .bind(order_id)
    .bind(&seat_ids)
    .bind(ga_line)
    .execute(&mut *conn)
    .await
    .statement("void the refunded lines' tickets")?;
    Ok(released)
}
