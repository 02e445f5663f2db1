//! The transitions the pay request, webhooks and reconciliation share. Each runs inside the
//! caller's transaction and is one conditional `UPDATE`, so whichever path arrives first
//! makes the change and every other one (a duplicate webhook, a late pay answer, another
//! instance's reconciliation) finds nothing left to do:
//!
//! - success ([`apply_success_tx`]): the order `PENDING_PAYMENT → PAID`, seats sold and
//!   tickets issued (or reserved stock sold), the attempt `succeeded`, `order.paid` in the
//!   outbox. Money for an order that can no longer take it makes the attempt
//!   `refund_pending` instead; the order is never resurrected. A success that is not the
//!   attempt's own intent (once one is recorded), amount and currency changes nothing
//!   ([`Success::Mismatch`]): the caller refunds it.
//! - decline ([`apply_decline_tx`]): a pending attempt becomes `declined`.
//! - refund confirmed ([`apply_refunded_tx`]): `refund_pending → refunded` and
//!   `order.refunded`, once.

use crate::inventory::holds::{self, SellOutcome};
use crate::orders;
use crate::orders::model::{EndedOrder, OrderSource};
use crate::outbox;
use crate::payments::error::{PaymentResult, Statement};
use crate::payments::model::{AttemptStatus, Charge, Success, charge_matches};
use crate::payments::repo::PaidOrder;
use serde_json::{Value, json};
use sqlx::PgConnection;

/// Applies "the provider took the money for attempt `payment_id`" inside the caller's
/// transaction. The order moves `PENDING_PAYMENT → PAID` by one conditional `UPDATE`, so of
/// the pay request, the webhook and reconciliation exactly one does it; the others get
/// [`Success::AlreadyPaid`].
pub async fn apply_success_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    charge: &Charge,
) -> PaymentResult<Success> {
    // order_id/account_id never change, so reading them unlocked is safe.
    let payment: Option<(String, String, AttemptStatus)> =
        sqlx::query_as("SELECT order_id, account_id, status FROM payments WHERE id = $1")
            .bind(payment_id)
            .fetch_optional(&mut *conn)
            .await
            .statement("read the paid attempt")?;
    apply_success_seen_tx(conn, payment_id, payment, charge).await
}

/// [`apply_success_tx`] with the attempt already read (`None`: no such attempt), by the
/// webhook's first statement (`webhooks/repo.rs`, `record_outcome_event_tx`).
pub async fn apply_success_seen_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    attempt: Option<(String, String, AttemptStatus)>,
    charge: &Charge,
) -> PaymentResult<Success> {
    let Some((order_id, account_id, status)) = attempt else {
        return Ok(Success::Unknown);
    };
    if !matches_attempt_tx(conn, payment_id, charge).await? {
        return Ok(Success::Mismatch {
            intent_id: charge.intent_id.clone(),
        });
    }
    if status == AttemptStatus::Succeeded {
        // This attempt paid its order already (`succeeded` is only ever set together with
        // the order's PAID): the other path won, exactly what the order update below would
        // conclude after finding the order no longer pending. The common case of the webhook
        // that follows a pay answer, decided without a savepoint or touching the order.
        return Ok(Success::AlreadyPaid);
    }
    apply_success_of_tx(conn, payment_id, &order_id, &account_id, charge).await
}

/// Is `charge` attempt `payment_id`'s own intent (or is none recorded yet), for its amount
/// and currency ([`charge_matches`])? Amount and currency never change; the recorded intent
/// only goes from none to one, and the statements that act on it repeat the condition.
async fn matches_attempt_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    charge: &Charge,
) -> PaymentResult<bool> {
    let row: Option<(i64, String, Option<String>)> =
        sqlx::query_as("SELECT amount, currency, provider_payment_id FROM payments WHERE id = $1")
            .bind(payment_id)
            .fetch_optional(&mut *conn)
            .await
            .statement("read the attempt's terms")?;
    Ok(row.is_some_and(|(amount, currency, recorded)| {
        charge_matches(amount, &currency, recorded.as_deref(), charge)
    }))
}

/// [`apply_success_tx`] for a caller that knows the attempt's order and account (they never
/// change): the pay request, right after its provider call, without reading the attempt
/// first. An attempt another path completed meanwhile is found out by the order update, as
/// in [`apply_success_tx`].
pub async fn apply_success_of_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    order_id: &str,
    account_id: &str,
    charge: &Charge,
) -> PaymentResult<Success> {
    if !matches_attempt_tx(conn, payment_id, charge).await? {
        return Ok(Success::Mismatch {
            intent_id: charge.intent_id.clone(),
        });
    }
    let provider_payment_id = charge.intent_id.as_str();
    let (order_id, account_id) = (order_id.to_owned(), account_id.to_owned());
    // No savepoint: the one write that can be followed by a refusal (the order's PAID, when
    // the hold turns out lost) is undone by hand below; everything else is decided by the
    // locks this statement takes before it writes.
    let won: Option<EndedOrder> = sqlx::query_as(MARK_PAID_BY_OPEN_ATTEMPT)
        .bind(&order_id)
        .bind(payment_id)
        .bind(provider_payment_id)
        .fetch_optional(&mut *conn)
        .await
        .statement("mark the order paid by its open attempt")?;
    let Some(order) = won else {
        // The order was not pending, or the attempt not open: nothing was written. Paid by
        // this very attempt → the other path won.
        if attempt_status_tx(conn, payment_id).await? == AttemptStatus::Succeeded {
            return Ok(Success::AlreadyPaid);
        }
        return mark_refund_pending_tx(conn, payment_id, provider_payment_id).await;
    };
    if order.source == OrderSource::Cart {
        orders::commit_reserved_stock_tx(&mut *conn, &order_id)
            .await
            .map_err(sqlx::Error::from)
            .statement("sell the order's reserved stock")?;
    }
    let mut tickets: Vec<Value> = Vec::new();
    let mut event_id: Option<String> = None;
    if let Some(hold_id) = &order.hold_id {
        match holds::sell_hold_tx(&mut *conn, hold_id, &order_id, &account_id)
            .await
            .statement("sell the order's hold")?
        {
            SellOutcome::Sold {
                event_id: evt,
                tickets: issued,
            } => {
                event_id = Some(evt);
                tickets = issued
                    .iter()
                    .map(|t| json!({"id": t.id, "seat_id": t.seat_id, "ga_tier": t.ga_tier}))
                    .collect();
            }
            lost @ (SellOutcome::Lost { .. } | SellOutcome::NotOrdered) => {
                tracing::warn!(order_id = %order_id, outcome = ?lost,
                    "payment succeeded but the hold lost its seats; cancelling and refunding");
                // The sale wrote nothing (all or nothing); undo this transaction's PAID (the
                // row is ours, locked since the statement above), then cancel.
                sqlx::query(
                    "UPDATE orders SET status = 'PENDING_PAYMENT', paid_at = NULL
                      WHERE id = $1 AND status = 'PAID'",
                )
                .bind(&order_id)
                .execute(&mut *conn)
                .await
                .statement("undo the order's PAID")?;
                orders::cancel_order_tx(&mut *conn, &order_id)
                    .await
                    .map_err(sqlx::Error::from)
                    .statement("cancel the order whose hold was lost")?;
                return mark_refund_pending_tx(conn, payment_id, provider_payment_id).await;
            }
        }
    }
    let n = tickets.len();
    let paid = json!({
        "order_id": order_id,
        "account_id": account_id,
        "event": event_id,
        "source": order.source,
        "total": order.total,
        "payment_id": payment_id,
        "provider_payment_id": provider_payment_id,
        "tickets": tickets,
    });
    // The attempt `succeeded` and `order.paid` in the outbox (the row outbox::write_tx
    // writes), in one statement. The attempt is locked open since the first statement.
    let marked: i64 = sqlx::query_scalar(
        "WITH p AS (
             UPDATE payments
                SET status = 'succeeded', provider_payment_id = $2,
                    updated_at = clock_timestamp()
              WHERE id = $1 AND status IN ('pending', 'failed')
             RETURNING id),
         e AS (
             INSERT INTO outbox (event_id, topic, aggregate_id, payload)
             SELECT $3, 'order.paid', $4, $5 FROM p)
         SELECT count(*) FROM p",
    )
    .bind(payment_id)
    .bind(provider_payment_id)
    .bind(shared::ids::new_id())
    .bind(&order_id)
    .bind(&paid)
    .fetch_one(&mut *conn)
    .await
    .statement("mark the attempt succeeded and write order.paid")?;
    if marked != 1 {
        // Cannot happen (the attempt row is locked open); fail the whole transaction rather
        // than commit a paid order without its attempt.
        return Err(sqlx::Error::Protocol(format!(
            "attempt {payment_id} changed under its row lock"
        )))
        .statement("mark the attempt succeeded and write order.paid");
    }
    Ok(Success::Paid {
        order_id: order_id.clone(),
        tickets: n,
    })
}

/// Ticket ids made in Rust (UUIDv7, like every other id) for [`SETTLE_HOLD_ORDER`]; a hold
/// larger than this (a limit raised after it was made) gets random ids for the rest.
const SETTLE_TICKET_IDS: usize = 10;

/// [`apply_success_of_tx`] for the pay request's common case, a hold order, in ONE statement
/// that also returns the pay answer ([`PaidOrder`]): `None` when the statement found anything
/// else — a cart order, an order no longer pending, an attempt no longer open, a hold that
/// lost a seat — and wrote nothing; the caller then runs [`apply_success_of_tx`], which
/// decides those cases, in the same transaction.
pub async fn settle_hold_order_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    order_id: &str,
    account_id: &str,
    charge: &Charge,
) -> PaymentResult<Option<PaidOrder>> {
    let ticket_ids: Vec<String> = (0..SETTLE_TICKET_IDS)
        .map(|_| shared::ids::new_id())
        .collect();
    sqlx::query_as(SETTLE_HOLD_ORDER)
        .bind(order_id)
        .bind(payment_id)
        .bind(&charge.intent_id)
        .bind(shared::ids::new_id())
        .bind(&ticket_ids)
        .bind(account_id)
        .bind(charge.amount)
        .bind(&charge.currency)
        .fetch_optional(conn)
        .await
        .statement("settle the paid hold order")
}

/// [`settle_hold_order_tx`]'s statement: `$1` order, `$2` attempt, `$3` the provider's
/// payment id, `$4` the outbox event id, `$5` ticket ids, `$6` the account, `$7`/`$8` the
/// charge's amount and currency. Locks in the order every path takes them: the order
/// (pending, from a hold), the attempt (open, and `$3` its own intent for its amount and
/// currency: anything else is left to [`apply_success_of_tx`]), the hold
/// (`ordered`), its seats in `seat_id` order or its GA shards in shard order. Writes only if
/// all of them passed and the hold still holds every seat: the order `PAID`, the hold and its
/// seats sold (or the GA shards' `sold`), the tickets, the attempt `succeeded`, `order.paid`
/// in the outbox (the payload [`apply_success_of_tx`] writes). Returns the order as
/// [`crate::payments::repo::paid_order_tx`] reads it after the commit (this statement's snapshot predates its
/// own writes, so the tickets and the payment come from the CTEs that wrote them).
const SETTLE_HOLD_ORDER: &str = concat!(
    "
WITH o AS (
    SELECT id, hold_id FROM orders
     WHERE id = $1 AND status = 'PENDING_PAYMENT' AND source = 'hold'
     FOR UPDATE),
a AS (
    SELECT id FROM payments
     WHERE id = $2 AND status IN ('pending', 'failed') AND EXISTS (SELECT 1 FROM o)
       AND amount = $7 AND lower(currency) = lower($8)
       AND (provider_payment_id IS NULL OR provider_payment_id = $3)
     FOR UPDATE),
h AS (
    SELECT id, event_id, kind, ga_tier, quantity, seat_ids FROM holds
     WHERE id = (SELECT hold_id FROM o) AND account_id = $6 AND status = 'ordered'
       AND EXISTS (SELECT 1 FROM a)
     FOR UPDATE),",
    crate::hold_seats_locked_sql!(),
    ",
gal AS (
    SELECT c.shard, i.quantity
      FROM h JOIN hold_ga_items i ON i.hold_id = h.id
      JOIN ga_counters c ON c.event_id = h.event_id AND c.tier = h.ga_tier AND c.shard = i.shard
     WHERE h.kind <> 'seats'
     ORDER BY c.shard
     FOR UPDATE OF c),
ok AS (
    SELECT id, event_id, kind, ga_tier, quantity FROM h
     WHERE kind <> 'seats' OR (SELECT count(*) FROM mine) = quantity),
paid AS (
    UPDATE orders
       SET status = 'PAID', paid_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE id = $1 AND EXISTS (SELECT 1 FROM ok)
    RETURNING id, account_id, status, source, hold_id, event_id, total, currency, expires_at,
              created_at, paid_at),
sold AS (
    UPDATE holds SET status = 'sold' FROM ok WHERE holds.id = ok.id),
su AS (
    UPDATE seats s SET status = 'sold', order_id = $1, held_until = NULL
      FROM mine m, ok
     WHERE s.event_id = m.event_id AND s.seat_id = m.seat_id
    RETURNING s.seat_id),
gu AS (
    UPDATE ga_counters c SET sold = c.sold + l.quantity
      FROM gal l, ok
     WHERE c.event_id = ok.event_id AND c.tier = ok.ga_tier AND c.shard = l.shard),
tk AS (
    SELECT COALESCE(($5::text[])[row_number() OVER (ORDER BY x.seat_id)],
                    replace(gen_random_uuid()::text, '-', '')) AS id,
           x.seat_id, x.ga_tier
      FROM (SELECT seat_id, NULL::text AS ga_tier FROM su
            UNION ALL
            SELECT NULL, ok.ga_tier FROM ok, generate_series(1, ok.quantity)
             WHERE ok.kind <> 'seats') x),
ti AS (
    INSERT INTO tickets (id, event_id, seat_id, ga_tier, order_id, account_id, holder_account)
    SELECT tk.id, ok.event_id, tk.seat_id, tk.ga_tier, $1, $6, $6 FROM tk, ok
    RETURNING id, event_id, seat_id, ga_tier),
p AS (
    UPDATE payments
       SET status = 'succeeded', provider_payment_id = $3, updated_at = clock_timestamp()
     WHERE id = $2 AND EXISTS (SELECT 1 FROM paid)
    RETURNING id, attempt, provider_payment_id),
e AS (
    INSERT INTO outbox (event_id, topic, aggregate_id, payload)
    SELECT $4, 'order.paid', $1, jsonb_build_object(
               'order_id', $1::text, 'account_id', $6::text, 'event', paid.event_id,
               'source', paid.source, 'total', paid.total, 'payment_id', $2::text,
               'provider_payment_id', $3::text,
               'tickets', (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                                      'id', ti.id, 'seat_id', ti.seat_id, 'ga_tier', ti.ga_tier)
                                    ORDER BY ti.seat_id NULLS LAST, ti.id), '[]'::jsonb)
                             FROM ti))
      FROM p, paid)
SELECT paid.id, paid.account_id, paid.status, paid.source, paid.hold_id, paid.event_id,
       paid.total, paid.currency, paid.expires_at, paid.created_at, paid.paid_at,
       (SELECT COALESCE(json_agg(json_build_object(
                   'kind', i.kind, 'sku', i.sku, 'seat_id', i.seat_id,
                   'ga_tier', i.ga_tier, 'name', i.name, 'quantity', i.quantity,
                   'unit_price', i.unit_price, 'amount', i.unit_price * i.quantity)
                 ORDER BY i.line), '[]'::json)
          FROM order_items i WHERE i.order_id = paid.id) AS items,
       (SELECT COALESCE(json_agg(json_build_object(
                   'id', ti.id, 'event_id', ti.event_id, 'seat_id', ti.seat_id,
                   'ga_tier', ti.ga_tier)
                 ORDER BY ti.seat_id NULLS LAST, ti.id), '[]'::json)
          FROM ti) AS tickets,
       (SELECT json_build_object('id', p.id, 'attempt', p.attempt,
                                 'provider_payment_id', p.provider_payment_id)
          FROM p) AS payment,
       CASE WHEN paid.event_id IS NOT NULL THEN ",
    crate::live_until_ms_sql!("$6", "paid.event_id", "NULL::timestamptz", "NULL", "$1"),
    " END AS live_until_ms
  FROM paid"
);

/// `PENDING_PAYMENT → PAID` by attempt `$2`, only while that attempt is still open
/// (`pending` or `failed`) and `$3` is its own intent (or none is recorded): the order's row is locked first, then the attempt's (the order
/// every path locks them in), and the update happens only if both passed, so no later step of
/// the success can find either changed. No row: nothing was written.
const MARK_PAID_BY_OPEN_ATTEMPT: &str = "
WITH o AS (
    SELECT id FROM orders WHERE id = $1 AND status = 'PENDING_PAYMENT' FOR UPDATE),
a AS (
    SELECT id FROM payments
     WHERE id = $2 AND status IN ('pending', 'failed') AND EXISTS (SELECT 1 FROM o)
       AND (provider_payment_id IS NULL OR provider_payment_id = $3)
     FOR UPDATE)
UPDATE orders SET status = 'PAID', paid_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE id = $1 AND status = 'PENDING_PAYMENT' AND EXISTS (SELECT 1 FROM a)
RETURNING id, account_id, source, hold_id, total";

/// The stored status of attempt `payment_id` (which must exist).
pub async fn attempt_status_tx(
    conn: &mut PgConnection,
    payment_id: &str,
) -> PaymentResult<AttemptStatus> {
    sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
        .bind(payment_id)
        .fetch_one(conn)
        .await
        .statement("read the attempt's status")
}

/// The attempt's money must go back (see [`apply_success_tx`]).
async fn mark_refund_pending_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    provider_payment_id: &str,
) -> PaymentResult<Success> {
    let status: Option<AttemptStatus> = sqlx::query_scalar(
        "UPDATE payments
            SET status = 'refund_pending', provider_payment_id = $2,
                next_check_at = clock_timestamp() + interval '30 seconds',
                updated_at = clock_timestamp()
          WHERE id = $1 AND status IN ('pending', 'failed', 'declined', 'refund_pending')
            AND (provider_payment_id IS NULL OR provider_payment_id = $2)
         RETURNING status",
    )
    .bind(payment_id)
    .bind(provider_payment_id)
    .fetch_optional(&mut *conn)
    .await
    .statement("mark the attempt refund_pending")?;
    Ok(match status {
        Some(_) => Success::RefundNeeded {
            payment_id: payment_id.to_owned(),
            provider_payment_id: provider_payment_id.to_owned(),
        },
        // Already refunded (or succeeded, handled above): nothing more to do.
        None => Success::AlreadyPaid,
    })
}

/// Applies a decline: a pending attempt becomes `declined` (no-op otherwise).
pub async fn apply_decline_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    provider_payment_id: &str,
    decline_code: &str,
) -> PaymentResult<bool> {
    Ok(sqlx::query(
        "UPDATE payments
            SET status = 'declined', decline_code = $3,
                provider_payment_id = COALESCE(provider_payment_id, $2),
                updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .bind(provider_payment_id)
    .bind(decline_code)
    .execute(conn)
    .await
    .statement("mark the attempt declined")?
    .rows_affected()
        == 1)
}

/// Records a refund the provider confirmed: `refund_pending → refunded` plus
/// `order.refunded`, once (the conditional `UPDATE` makes every repeat a no-op).
pub async fn apply_refunded_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    refund_id: &str,
) -> PaymentResult<bool> {
    let row: Option<(String, String, i64, Option<String>)> = sqlx::query_as(
        "UPDATE payments
            SET status = 'refunded', refund_id = $2, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'refund_pending'
         RETURNING order_id, account_id, amount, provider_payment_id",
    )
    .bind(payment_id)
    .bind(refund_id)
    .fetch_optional(&mut *conn)
    .await
    .statement("mark the attempt refunded")?;
    let Some((order_id, account_id, amount, provider_payment_id)) = row else {
        return Ok(false);
    };
    outbox::write_tx(
        conn,
        "order.refunded",
        &order_id,
        &json!({
            "order_id": order_id,
            "account_id": account_id,
            "payment_id": payment_id,
            "provider_payment_id": provider_payment_id,
            "refund_id": refund_id,
            "amount": amount,
        }),
    )
    .await
    .statement("write order.refunded to the outbox")?;
    Ok(true)
}
