//! The payments repository: the SQL of the pay request, reconciliation and webhooks (the
//! transitions every path shares are in [`crate::payments::transitions`]). Functions take a
//! pool or a connection and return [`PaymentError`] naming the failed statement; the database
//! decides every race with one conditional statement.

use crate::orders::model::{OrderItemView, OrderRow};
use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::model::{Attempt, AttemptStatus, Payability, Unpayable, payability};
use crate::platform::db::{self, TxError};
use crate::platform::idempotency::{
    self, Begin, Claim, Fingerprint, IdempotencyKey, IdempotencySettings, Replay,
};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};

/// The columns of [`Attempt`], as a literal so the SQL using it stays `'static`.
macro_rules! attempt_columns {
    () => {
        "id, order_id, account_id, attempt, provider_key, amount, currency, payment_method, status"
    };
}

/// The event of `order_id` if it belongs to `account`: `None` for a missing (or someone
/// else's) order, `Some(None)` for an order recorded without an event.
pub async fn order_event(
    pool: &PgPool,
    order_id: &str,
    account: &str,
) -> PaymentResult<Option<Option<String>>> {
    sqlx::query_scalar("SELECT event_id FROM orders WHERE id = $1 AND account_id = $2")
        .bind(order_id)
        .bind(account)
        .fetch_optional(pool)
        .await
        .statement("read the order's event")
}

/// What starting a payment found.
#[derive(Debug)]
pub enum Start {
    /// Call the provider with this attempt (new, or the order's pending one).
    Charge(Attempt),
    /// An attempt of this order with another payment method is still pending.
    OtherAttemptPending { attempt: i32 },
    /// No such order (or someone else's).
    NotFound,
    /// The order can no longer be paid (expired, cancelled, hold lost); nothing new is
    /// charged. An attempt of it still open is resolved before answering.
    Unpayable(Unpayable),
    /// The order is already paid.
    AlreadyPaid,
    /// The `Idempotency-Key` already has an answer: replay it (nothing was done).
    Replay(Replay),
    /// The order belongs to another event than the admission's (nothing was done).
    WrongEvent,
}

/// One admission, one event: does an admission of event `admission` open an order of
/// `event`? Orders recorded without an event (cart orders from before orders had one) are
/// their owner's to pay.
fn opens(event: Option<&str>, admission: &str) -> bool {
    event.is_none_or(|e| e == admission)
}

/// The request's `Idempotency-Key`, claimed in the pay transaction.
pub struct KeyClaim<'a> {
    pub settings: &'a IdempotencySettings,
    pub account: &'a str,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a Fingerprint,
}

impl KeyClaim<'_> {
    /// Claims the key inside `conn`'s transaction ([`idempotency::claim_tx`]).
    pub async fn claim_tx(&self, conn: &mut PgConnection) -> PaymentResult<Begin> {
        match idempotency::claim_tx(
            conn,
            self.settings,
            self.account,
            self.key,
            self.fingerprint,
        )
        .await
        {
            Ok(begin) => Ok(begin),
            Err(TxError::Db(source)) => Err(PaymentError::Db {
                statement: "claim the Idempotency-Key",
                source,
            }),
            Err(TxError::Api(e)) => Err(PaymentError::KeyRefused(e)),
        }
    }
}

/// The pin-and-record transaction (step 2 of [`crate::payments::flow`]'s docs): claims the
/// request's `Idempotency-Key`, pins the order and its hold at least `pin_s` into the future
/// and records the attempt — or reuses the order's pending one — committing its provider key
/// (and the claim, in flight until the answer is stored) before any provider call. Every
/// other outcome rolls back, the claim with it. An order of another event than `admission`
/// is [`Start::WrongEvent`], checked on the pinned (or refused) order row itself.
pub async fn start_attempt(
    pool: &PgPool,
    claim: &KeyClaim<'_>,
    admission: &str,
    order_id: &str,
    method: &str,
    pin_s: f64,
    reconcile_after_s: f64,
) -> PaymentResult<(Start, Option<Claim>)> {
    let account = claim.account;
    db::retry(3, || async {
        let mut tx = pool.begin().await.statement("begin the pay transaction")?;
        let key = match claim.claim_tx(&mut tx).await? {
            Begin::Started(key) => key,
            Begin::Replay(stored) => return Ok((Start::Replay(stored), None)),
        };
        // The order row lock taken here also serialises concurrent pay requests for this
        // order through the attempt bookkeeping below. The order's pin and its hold's pin are
        // one statement: the hold part runs only for a pinned order that has a hold.
        let order: Option<PinnedOrder> = sqlx::query_as(PIN_ORDER_AND_HOLD)
            .bind(order_id)
            .bind(account)
            .bind(pin_s)
            .fetch_optional(&mut *tx)
            .await
            .statement("pin the order and its hold")?;
        let Some((hold_id, total, currency, event, hold_kept)) = order else {
            drop(tx);
            return Ok((not_payable(pool, order_id, account, admission).await?, None));
        };
        if !opens(event.as_deref(), admission) {
            // Dropping the transaction undoes the pin and the claim.
            return Ok((Start::WrongEvent, None));
        }
        if hold_id.is_some() && !hold_kept {
            // The statement may have changed rows: dropping the transaction undoes them.
            return Ok((Start::Unpayable(Unpayable::HoldLost), None));
        }
        let inserted: Option<Attempt> = sqlx::query_as(concat!(
            "INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount,
                                   currency, payment_method, next_check_at)
             SELECT $1, $2, $3, n, $2 || '-' || n, $4, $5, $6,
                    clock_timestamp() + make_interval(secs => $7)
               FROM (SELECT COALESCE(MAX(attempt), 0) + 1 AS n
                       FROM payments WHERE order_id = $2) a
             ON CONFLICT (order_id) WHERE status = 'pending' DO NOTHING
             RETURNING ",
            attempt_columns!()
        ))
        .bind(shared::ids::new_id())
        .bind(order_id)
        .bind(account)
        .bind(total)
        .bind(&currency)
        .bind(method)
        .bind(reconcile_after_s)
        .fetch_optional(&mut *tx)
        .await
        .statement("record the payment attempt")?;
        let attempt = match inserted {
            Some(a) => a,
            None => {
                // An attempt of this order is still pending (a double click, a retry after a
                // timeout): reuse it, and with it its provider key.
                let pending: Attempt = sqlx::query_as(concat!(
                    "SELECT ",
                    attempt_columns!(),
                    " FROM payments WHERE order_id = $1 AND status = 'pending'"
                ))
                .bind(order_id)
                .fetch_one(&mut *tx)
                .await
                .statement("read the order's pending attempt")?;
                if pending.payment_method != method {
                    return Ok((
                        Start::OtherAttemptPending {
                            attempt: pending.attempt,
                        },
                        None,
                    ));
                }
                pending
            }
        };
        tx.commit().await.statement("commit the pay transaction")?;
        Ok((Start::Charge(attempt), Some(key)))
    })
    .await
}

/// The pinned order: hold id, total, currency, event, and whether its hold (if any) still
/// holds all it held.
type PinnedOrder = (Option<String>, i64, String, Option<String>, bool);

/// Pins a payable order and its hold to at least now + `$3` seconds (never shortens), in ONE
/// statement: the order (only while `PENDING_PAYMENT` and unexpired; its row lock serialises
/// pay requests), then its `ordered` hold and the hold's seats (locked in `seat_id` order,
/// like every other seat path). No row when the order is not payable. The last column is
/// false when the hold no longer holds all its seats (or is gone): the statement may have
/// changed rows then, so the caller rolls its transaction back (it does: no pin, no attempt).
const PIN_ORDER_AND_HOLD: &str = concat!(
    "
WITH o AS (
    UPDATE orders
       SET expires_at = GREATEST(expires_at, clock_timestamp() + make_interval(secs => $3)),
           updated_at = clock_timestamp()
     WHERE id = $1 AND account_id = $2 AND status = 'PENDING_PAYMENT'
       AND expires_at > clock_timestamp()
    RETURNING hold_id, total, currency, event_id),
h AS (
    UPDATE holds
       SET expires_at = GREATEST(expires_at, clock_timestamp() + make_interval(secs => $3))
     WHERE id = (SELECT hold_id FROM o) AND status = 'ordered'
    RETURNING id, event_id, kind, quantity, expires_at),",
    crate::hold_seats_locked_sql!(),
    ",
upd AS (
    UPDATE seats s SET held_until = GREATEST(s.held_until, h.expires_at)
      FROM mine m, h
     WHERE s.event_id = m.event_id AND s.seat_id = m.seat_id
    RETURNING 1)
SELECT o.hold_id, o.total, o.currency, o.event_id,
       COALESCE((SELECT h.kind <> 'seats' OR (SELECT count(*) FROM upd) = h.quantity FROM h),
                false)
  FROM o"
);

/// Why an order cannot be paid now (read after the conditional pin changed nothing).
async fn not_payable(
    pool: &PgPool,
    order_id: &str,
    account: &str,
    admission: &str,
) -> PaymentResult<Start> {
    let row: Option<(String, bool, Option<String>)> = sqlx::query_as(
        "SELECT status, expires_at <= clock_timestamp(), event_id FROM orders
          WHERE id = $1 AND account_id = $2",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(pool)
    .await
    .statement("read why the order is not payable")?;
    Ok(match row {
        // Someone else's order looks exactly like a missing one.
        None => Start::NotFound,
        Some((_, _, event)) if !opens(event.as_deref(), admission) => Start::WrongEvent,
        Some((status, expired, _)) => match payability(&status, expired) {
            Payability::AlreadyPaid => Start::AlreadyPaid,
            Payability::Unpayable(why) => Start::Unpayable(why),
        },
    })
}

/// The order's attempt still `pending`, if any.
pub async fn open_attempt(
    pool: &PgPool,
    order_id: &str,
    account: &str,
) -> PaymentResult<Option<String>> {
    sqlx::query_scalar(
        "SELECT id FROM payments WHERE order_id = $1 AND account_id = $2 AND status = 'pending'",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(pool)
    .await
    .statement("look for the order's open attempt")
}

/// `pending → failed`: the provider provably never charged this attempt. False when it was
/// no longer pending.
pub async fn close_failed(pool: &PgPool, payment_id: &str) -> PaymentResult<bool> {
    let closed = sqlx::query(
        "UPDATE payments SET status = 'failed', updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .execute(pool)
    .await
    .statement("close a failed attempt")?
    .rows_affected();
    Ok(closed == 1)
}

/// A ticket of a paid order, as the pay answer lists it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TicketRow {
    pub id: String,
    pub event_id: String,
    pub seat_id: Option<String>,
    pub ga_tier: Option<String>,
}

/// The attempt that paid an order.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SettledPayment {
    pub id: String,
    pub attempt: i32,
    pub provider_payment_id: Option<String>,
}

/// An order of `account` with what the pay answer lists: its items (in line order), its
/// tickets (seats first in seat order) and the attempt that paid it.
#[derive(sqlx::FromRow)]
pub struct PaidOrder {
    #[sqlx(flatten)]
    pub order: OrderRow,
    pub items: Json<Vec<OrderItemView>>,
    pub tickets: Json<Vec<TicketRow>>,
    pub payment: Option<Json<SettledPayment>>,
    /// The account's checkout end in the order's event (`platform::session_until`); `None`
    /// for an order without an event.
    pub live_until_ms: Option<i64>,
}

/// [`PaidOrder`] in ONE statement (it was four reads).
pub async fn paid_order_tx(
    conn: &mut PgConnection,
    order_id: &str,
    account: &str,
) -> PaymentResult<Option<PaidOrder>> {
    sqlx::query_as(concat!(
        "SELECT o.id, o.account_id, o.status, o.source, o.hold_id, o.event_id, o.total,
                o.currency, o.expires_at, o.created_at, o.paid_at,
                (SELECT COALESCE(json_agg(json_build_object(
                            'kind', i.kind, 'sku', i.sku, 'seat_id', i.seat_id,
                            'ga_tier', i.ga_tier, 'name', i.name, 'quantity', i.quantity,
                            'unit_price', i.unit_price, 'amount', i.unit_price * i.quantity)
                          ORDER BY i.line), '[]'::json)
                   FROM order_items i WHERE i.order_id = o.id) AS items,
                (SELECT COALESCE(json_agg(json_build_object(
                            'id', t.id, 'event_id', t.event_id, 'seat_id', t.seat_id,
                            'ga_tier', t.ga_tier)
                          ORDER BY t.seat_id NULLS LAST, t.id), '[]'::json)
                   FROM tickets t WHERE t.order_id = o.id) AS tickets,
                (SELECT json_build_object('id', p.id, 'attempt', p.attempt,
                                          'provider_payment_id', p.provider_payment_id)
                   FROM payments p WHERE p.order_id = o.id AND p.status = 'succeeded') AS payment,
                CASE WHEN o.event_id IS NOT NULL THEN ",
        crate::live_until_ms_sql!("$2", "o.event_id", "NULL::timestamptz", "NULL"),
        " END AS live_until_ms
           FROM orders o WHERE o.id = $1 AND o.account_id = $2"
    ))
    .bind(order_id)
    .bind(account)
    .fetch_optional(conn)
    .await
    .statement("read the paid order")
}

// ---------------------------------------------------------------------------------------------
// Reconciliation
// ---------------------------------------------------------------------------------------------

/// An attempt reconciliation looks at.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Due {
    pub id: String,
    pub order_id: String,
    pub attempt: i32,
    pub status: AttemptStatus,
    pub provider_payment_id: Option<String>,
}

/// Claims up to `batch` attempts due for reconciliation: one statement (`FOR UPDATE SKIP
/// LOCKED` inside an `UPDATE` that pushes `next_check_at` forward by `lease_s`, a lease), so
/// any number of instances can run it.
pub async fn claim_due(pool: &PgPool, batch: i64, lease_s: f64) -> PaymentResult<Vec<Due>> {
    sqlx::query_as(
        "UPDATE payments p
            SET next_check_at = clock_timestamp() + make_interval(secs => $2)
          WHERE p.id IN (
                SELECT id FROM payments
                 WHERE status IN ('pending', 'refund_pending')
                   AND next_check_at <= clock_timestamp()
                   -- Disputed money goes back through the card network, not a refund.
                   AND (status = 'pending' OR dispute_id IS NULL)
                 ORDER BY next_check_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
         RETURNING p.id, p.order_id, p.attempt, p.status, p.provider_payment_id",
    )
    .bind(batch.max(1))
    .bind(lease_s)
    .fetch_all(pool)
    .await
    .statement("claim payments to reconcile")
}

/// Attempt `payment_id` if it is still pending.
pub async fn pending_due(pool: &PgPool, payment_id: &str) -> PaymentResult<Option<Due>> {
    sqlx::query_as(
        "SELECT id, order_id, attempt, status, provider_payment_id FROM payments
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(pool)
    .await
    .statement("read a pending attempt")
}

/// A pending attempt with what settling it needs: can its order still take money, and how
/// long ago did it start.
#[derive(Debug, sqlx::FromRow)]
pub struct UnseenAttempt {
    #[sqlx(flatten)]
    pub attempt: Attempt,
    pub payable: bool,
    pub age_s: f64,
}

pub async fn unseen_attempt(
    pool: &PgPool,
    payment_id: &str,
) -> PaymentResult<Option<UnseenAttempt>> {
    sqlx::query_as(
        "SELECT p.id, p.order_id, p.account_id, p.attempt, p.provider_key, p.amount,
                p.currency, p.payment_method, p.status,
                (o.status = 'PENDING_PAYMENT' AND o.expires_at > clock_timestamp()) AS payable,
                EXTRACT(EPOCH FROM clock_timestamp() - p.created_at)::float8 AS age_s
           FROM payments p JOIN orders o ON o.id = p.order_id
          WHERE p.id = $1 AND p.status = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(pool)
    .await
    .statement("load the attempt to settle")
}

#[cfg(test)]
mod tests {
    /// `Attempt` is decoded by name: the column list must name every field.
    #[test]
    fn attempt_columns_name_every_attempt_field() {
        let cols: Vec<&str> = attempt_columns!().split(", ").collect();
        assert_eq!(
            cols,
            [
                "id",
                "order_id",
                "account_id",
                "attempt",
                "provider_key",
                "amount",
                "currency",
                "payment_method",
                "status"
            ]
        );
    }
}
