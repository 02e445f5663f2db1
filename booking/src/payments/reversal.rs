//! Refunds and disputes made on the provider's side (an operator in the dashboard, a card
//! holder's bank), announced by `charge.refunded` / `charge.dispute.created`.
//!
//! Guarantees:
//! - A paid order is reversed **once**: `PAID → REFUNDED | DISPUTED` is one conditional
//!   `UPDATE ... WHERE status = 'PAID'`, taken under the order's row lock, and everything
//!   else happens in that same transaction: its tickets are voided (kept, marked, never
//!   deleted), the account's per-event usage is given back, its seats/GA units/SKU stock go
//!   back on sale or are held back per the event's `refund_stock`, and `order.refunded` /
//!   `order.disputed` goes to the outbox. A second refund, a dispute after a refund, a refund
//!   after a dispute, or any duplicate finds the order no longer `PAID` and changes nothing.
//! - Arrival order does not matter. The order row is locked first (as every payment
//!   transition does), so a success and a reversal of the same order serialise; a reversal
//!   that arrives before its payment's success (the `succeeded` webhook or the pay answer still
//!   on its way) first applies that success — a refund or dispute proves the money was taken —
//!   and then reverses it, and the late success finds nothing left to do.
//! - Only the payment that paid the order reverses it. A full refund of money the order could
//!   not take (a second attempt, an expired order: `refund_pending`) is recorded as such
//!   ([`super::transitions::apply_refunded_tx`]) and leaves the order alone; a partial one
//!   closes nothing (the attempt stays `refund_pending` and reconciliation refunds the rest).
//! - A partial refund is recorded by the provider but changes no order here (per-line
//!   refunds are an ops feature); only a full refund reverses the order.

pub mod holders;
pub mod lines;

use crate::inventory::holds;
use crate::orders::stock::{self, StockMove};
use crate::outbox;
use crate::payments::error::{PaymentResult, Statement};
pub use crate::payments::model::Reversal;
use crate::payments::model::{Charge, ReversalStep, Success, reversal_step};
use crate::payments::transitions::{self, attempt_status_tx};
use serde_json::json;
use sqlx::PgConnection;

/// What applying a reversal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reversed {
    /// This transaction reversed the paid order. `released_skus`: SKUs whose stock went back
    /// on sale (their flash gates are reconciled after the commit).
    Order {
        order_id: String,
        status: &'static str,
        tickets_voided: usize,
        released_skus: Vec<String>,
    },
    /// A refund of money the order never kept, recorded (`refund_pending → refunded`).
    RefundRecorded,
    /// A partial refund: nothing changes here.
    Partial,
    /// Applied before, or nothing to reverse (a dispute of refunded money...).
    Unchanged,
    /// Not one of our payments.
    Unknown,
}

/// Applies a provider-side refund/dispute of attempt `payment_id` inside the caller's
/// transaction (see the module docs). `charge`: the reversed charge (its intent, amount and
/// currency), which must match the attempt for a reversal that overtook its success to apply
/// that success; `None` where the caller knows the success was applied (ops refunds of paid
/// orders).
pub async fn apply_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    provider_payment_id: &str,
    charge: Option<&Charge>,
    reversal: &Reversal,
) -> PaymentResult<Reversed> {
    // order_id never changes: reading it unlocked is safe.
    let order_id: Option<String> =
        sqlx::query_scalar("SELECT order_id FROM payments WHERE id = $1")
            .bind(payment_id)
            .fetch_optional(&mut *conn)
            .await
            .statement("read the reversed attempt's order")?;
    let Some(order_id) = order_id else {
        return Ok(Reversed::Unknown);
    };
    // The order's lock first, like every payment transition: from here on this
    // transaction sees the latest committed state of the order and its payments.
    sqlx::query("SELECT 1 FROM orders WHERE id = $1 FOR UPDATE")
        .bind(&order_id)
        .execute(&mut *conn)
        .await
        .statement("lock the reversed order")?;
    let mut status = attempt_status_tx(conn, payment_id).await?;
    if status.success_unapplied() {
        // The reversal overtook the success: the money was taken, apply that first — if it
        // is this attempt's own charge (a reversal of another intent pays nothing).
        let Some(charge) = charge else {
            return Ok(Reversed::Unknown);
        };
        if let Success::Unknown | Success::Mismatch { .. } =
            transitions::apply_success_tx(conn, payment_id, charge).await?
        {
            return Ok(Reversed::Unknown);
        }
        status = attempt_status_tx(conn, payment_id).await?;
    }
    match reversal_step(status, reversal) {
        ReversalStep::RecordRefund => {
            let recorded =
                transitions::apply_refunded_tx(conn, payment_id, reversal.reference()).await?;
            Ok(if recorded {
                Reversed::RefundRecorded
            } else {
                Reversed::Unchanged
            })
        }
        ReversalStep::StopRefund => {
            // The bank takes this money back itself: a refund of ours would return it twice.
            // Reconciliation leaves disputed refund_pending payments alone.
            record_dispute_tx(conn, payment_id, reversal.reference()).await?;
            Ok(Reversed::Unchanged)
        }
        ReversalStep::Partial => Ok(Reversed::Partial),
        ReversalStep::ReverseOrder => {
            match reversal {
                Reversal::Refund { reference, .. } => {
                    sqlx::query(
                        "UPDATE payments
                            SET status = 'refunded', refund_id = $2,
                                updated_at = clock_timestamp()
                          WHERE id = $1 AND status = 'succeeded'",
                    )
                    .bind(payment_id)
                    .bind(reference)
                    .execute(&mut *conn)
                    .await
                    .statement("mark the paying attempt refunded")?;
                }
                Reversal::Dispute { reference } => {
                    record_dispute_tx(conn, payment_id, reference).await?;
                }
            }
            reverse_order_tx(conn, &order_id, payment_id, provider_payment_id, reversal).await
        }
        ReversalStep::Nothing => Ok(Reversed::Unchanged),
    }
}

/// Marks the attempt's money as disputed (the first dispute id stays).
async fn record_dispute_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    dispute_id: &str,
) -> PaymentResult<()> {
    sqlx::query(
        "UPDATE payments SET dispute_id = COALESCE(dispute_id, $2),
                             updated_at = clock_timestamp()
          WHERE id = $1",
    )
    .bind(payment_id)
    .bind(dispute_id)
    .execute(conn)
    .await
    .statement("record the dispute on the attempt")?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct ReversedOrder {
    account_id: String,
    source: String,
    hold_id: Option<String>,
    event_id: Option<String>,
    total: i64,
    refund_stock: String,
}

/// `PAID → REFUNDED | DISPUTED` once, and everything that goes with it (module docs).
async fn reverse_order_tx(
    conn: &mut PgConnection,
    order_id: &str,
    payment_id: &str,
    provider_payment_id: &str,
    reversal: &Reversal,
) -> PaymentResult<Reversed> {
    let order: Option<ReversedOrder> = sqlx::query_as(
        "UPDATE orders o
            SET status = $2, reversed_at = clock_timestamp(), updated_at = clock_timestamp()
          WHERE o.id = $1 AND o.status = 'PAID'
         RETURNING o.account_id, o.source, o.hold_id, o.event_id, o.total,
                   -- A refund booking asked for (ops, event cancellation) says what happens to
                   -- the stock, whichever of its answer and its webhook applies it.
                   COALESCE((SELECT CASE r.stock WHEN 'kill' THEN 'hold_back' ELSE 'release' END
                               FROM order_refunds r
                              WHERE r.order_id = o.id AND r.status <> 'failed'
                                AND r.reverses_order),
                            (SELECT e.refund_stock FROM events e WHERE e.id = o.event_id),
                            'release') AS refund_stock",
    )
    .bind(order_id)
    .bind(reversal.order_status())
    .fetch_optional(&mut *conn)
    .await
    .statement("reverse the paid order")?;
    let Some(order) = order else {
        // Reversed before (a refund after a dispute, a duplicate under another event id).
        return Ok(Reversed::Unchanged);
    };
    let release = order.refund_stock == "release";
    let mut released_skus = Vec::new();
    let mut event_id = order.event_id.clone();
    // Lines refunded on their own went back already: return only the rest, line by line.
    let by_line = lines::any_returned_tx(conn, order_id).await?;
    if by_line {
        released_skus = lines::return_rest_tx(conn, order_id, release).await?;
    } else {
        lines::mark_all_returned_tx(conn, order_id).await?;
    }
    if let Some(hold_id) = order.hold_id.as_ref().filter(|_| !by_line) {
        let hold: Option<(String, String, Option<String>, i32)> =
            sqlx::query_as("SELECT event_id, kind, ga_tier, quantity FROM holds WHERE id = $1")
                .bind(hold_id)
                .fetch_optional(&mut *conn)
                .await
                .statement("read the reversed order's hold")?;
        if let Some((hold_event, kind, ga_tier, quantity)) = hold {
            if kind == "seats" {
                // Seats locked in seat_id order, like every other seat path.
                sqlx::query(
                    "WITH mine AS (
                         SELECT seat_id FROM seats
                          WHERE event_id = $1 AND order_id = $2 AND status = 'sold'
                          ORDER BY seat_id
                          FOR UPDATE)
                     UPDATE seats s
                        SET status = CASE WHEN $3 THEN 'available' ELSE 'held_back' END,
                            order_id = CASE WHEN $3 THEN NULL ELSE s.order_id END,
                            hold_id = NULL, held_until = NULL
                       FROM mine m
                      WHERE s.event_id = $1 AND s.seat_id = m.seat_id",
                )
                .bind(&hold_event)
                .bind(order_id)
                .bind(release)
                .execute(&mut *conn)
                .await
                .statement("give the seats back")?;
            } else {
                holds::return_ga_units_tx(conn, hold_id, &hold_event, ga_tier.as_deref(), release)
                    .await
                    .statement("give the GA units back")?;
            }
            // The fan no longer holds these tickets: they count against the limit no more.
            // Transferred tickets' usage goes back to their holders (`holders`).
            holders::release_usage_tx(
                conn,
                order_id,
                &hold_event,
                &order.account_id,
                quantity,
                holders::Which::All,
            )
            .await?;
            event_id = Some(hold_event);
        }
    }
    if order.source == "cart" && !by_line {
        // The units go back to the shard rows the order took them from.
        let how = if release {
            StockMove::Release
        } else {
            StockMove::HoldBack
        };
        let skus = stock::move_order_stock_tx(conn, &[order_id.to_owned()], how)
            .await
            .map_err(sqlx::Error::from)
            .statement("give the SKU stock back")?;
        if release {
            released_skus = skus;
        }
    }
    // The void notices go with the void (one per voided ticket version, to the order's
    // address if it has one): `tickets::mail` sends them.
    let voided: Vec<String> = sqlx::query_scalar(
        "WITH v AS (
           UPDATE tickets SET voided_at = clock_timestamp(), void_reason = $2, version = version + 1
            WHERE order_id = $1 AND voided_at IS NULL
           RETURNING id, version),
         notice AS (
           INSERT INTO mail_deliveries (kind, key, order_id)
           SELECT 'void', v.id || '.v' || v.version, $1 FROM v
            WHERE EXISTS (SELECT 1 FROM order_contacts c
                           WHERE c.order_id = $1 AND c.email IS NOT NULL)
               -- A transferred ticket's notice goes to its receiver (`tickets::mail`).
               OR EXISTS (SELECT 1 FROM ticket_transfers x
                           WHERE x.ticket_id = v.id AND x.status = 'accepted'
                             AND x.receiver_email IS NOT NULL)
           ON CONFLICT (kind, key) DO NOTHING)
         SELECT id FROM v",
    )
    .bind(order_id)
    .bind(reversal.void_reason())
    .fetch_all(&mut *conn)
    .await
    .statement("void the order's tickets")?;
    outbox::write_tx(
        conn,
        reversal.topic(),
        order_id,
        &json!({
            "order_id": order_id,
            "account_id": order.account_id,
            "event": event_id,
            "status": reversal.order_status(),
            "origin": "provider",
            "payment_id": payment_id,
            "provider_payment_id": provider_payment_id,
            "reference": reversal.reference(),
            "amount": order.total,
            "tickets_voided": voided,
            "refund_stock": order.refund_stock,
        }),
    )
    .await
    .statement("write the reversal to the outbox")?;
    Ok(Reversed::Order {
        order_id: order_id.to_owned(),
        status: reversal.order_status(),
        tickets_voided: voided.len(),
        released_skus,
    })
}
