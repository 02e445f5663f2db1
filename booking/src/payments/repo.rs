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
    /// `[payments] max_attempts` attempts of the order were made (nothing was done).
    Exhausted,
}

/// How far a pay request may reserve an order's inventory.
#[derive(Debug, Clone, Copy)]
pub struct PinLimits {
    /// The pin: at least this many seconds from now (`pay_pin_s`)...
    pub pin_s: f64,
    /// ...but never past the order's `created_at` plus this (`[orders] ttl_s +
    /// [payments] pay_grace_s`), however many pay calls.
    pub bound_s: f64,
    /// Attempts an order may have (`max_attempts`); a pending one is reused, not counted
    /// again.
    pub max_attempts: u32,
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

/// The pay request's start (step 2 of [`crate::payments::flow`]'s docs) in ONE autocommit
/// statement ([`START_ATTEMPT`]): claims the request's `Idempotency-Key`, pins the order and
/// its hold at least `pin_s` into the future and records the attempt — committing its
/// provider key (and the claim, in flight until the answer is stored) durably before any
/// provider call. An order that is not payable by this admission is not pinned and gets no
/// attempt; every outcome that calls no provider releases the claim (one `DELETE`, on the
/// refusal paths only). A pending attempt of the order is reused (its provider key with it).
pub async fn start_attempt(
    pool: &PgPool,
    claim: &KeyClaim<'_>,
    admission: &str,
    order_id: &str,
    method: &str,
    limits: PinLimits,
    reconcile_after_s: f64,
) -> PaymentResult<(Start, Option<Claim>)> {
    let account = claim.account;
    // Bounded: the key vanishing under us (its attempt released it) or a race with another
    // attempt's number each cost one more pass.
    for _ in 0..3 {
        let claim_id = shared::ids::new_id();
        let started = db::retry(3, || async {
            sqlx::query_as::<_, Started>(START_ATTEMPT)
                .bind(order_id)
                .bind(account)
                .bind(limits.pin_s)
                .bind(admission)
                .bind(claim.key.as_str())
                .bind(claim.fingerprint.as_bytes())
                .bind(&claim_id)
                .bind(f64::from(claim.settings.stale_after_s))
                .bind(shared::ids::new_id())
                .bind(method)
                .bind(reconcile_after_s)
                .bind(limits.bound_s)
                .bind(i64::from(limits.max_attempts))
                .fetch_one(pool)
                .await
                .statement("claim the key, pin the order and its hold, record the attempt")
        })
        .await;
        let started = match started {
            Ok(s) => s,
            // The statement's snapshot predates the commit of another request's attempt
            // (it waited on the order's row lock) whose number it then reused; nothing was
            // written: run it again with a fresh snapshot.
            Err(PaymentError::Db { source, .. }) if is_unique_violation(&source) => continue,
            Err(e) => return Err(e),
        };
        if !started.claimed {
            let mut conn = pool.acquire().await.statement("read the Idempotency-Key")?;
            match idempotency::existing(&mut conn, account, claim.key, claim.fingerprint)
                .await
                .statement("read the Idempotency-Key")?
            {
                Some(Ok(Begin::Replay(stored))) => return Ok((Start::Replay(stored), None)),
                Some(Ok(Begin::Started(_))) | None => continue,
                Some(Err(e)) => return Err(PaymentError::KeyRefused(e)),
            }
        }
        let key = Claim::claimed(account, claim.key, claim_id);
        if !started.pinned {
            key.release(pool).await;
            let why = not_payable(pool, order_id, account, admission, limits.max_attempts).await?;
            return Ok((why, None));
        }
        if !started.hold_kept {
            // The pins were written (they only move expiries forward, on an order that can
            // no longer be paid); no attempt was.
            key.release(pool).await;
            return Ok((Start::Unpayable(Unpayable::HoldLost), None));
        }
        if let Some(Json(attempt)) = started.attempt {
            return Ok((Start::Charge(attempt), Some(key)));
        }
        // An attempt of this order is still pending (a double click, a retry after a
        // timeout): reuse it, and with it its provider key.
        let pending: Option<Attempt> = sqlx::query_as(concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM payments WHERE order_id = $1 AND status = 'pending'"
        ))
        .bind(order_id)
        .fetch_optional(pool)
        .await
        .statement("read the order's pending attempt")?;
        match pending {
            Some(p) if p.payment_method == method => return Ok((Start::Charge(p), Some(key))),
            Some(p) => {
                key.release(pool).await;
                return Ok((Start::OtherAttemptPending { attempt: p.attempt }, None));
            }
            // Settled meanwhile: start again (a new attempt, or the order's new state).
            None => key.release(pool).await,
        }
    }
    Err(PaymentError::KeyRefused(Claim::lost()))
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// What [`START_ATTEMPT`] did.
#[derive(sqlx::FromRow)]
struct Started {
    /// This request owns the key now (else nothing was written).
    claimed: bool,
    /// The order was payable by this admission and is pinned.
    pinned: bool,
    /// The order has no hold, or its hold still holds all it held.
    hold_kept: bool,
    /// The new attempt; `None` when one of the order's is still pending.
    attempt: Option<Json<Attempt>>,
}

/// [`start_attempt`]'s statement. `$1` order, `$2` account, `$3` pin seconds, `$4` the
/// admission's event, `$5`..`$8` the key, fingerprint, claim id and `stale_after_s`
/// ([`crate::claim_key_sql!`]), `$9` the new attempt's id, `$10` payment method, `$11`
/// seconds until reconciliation asks about the attempt, `$12` the reservation bound after the
/// order's `created_at` (seconds), `$13` `max_attempts`.
///
/// Each step runs only if the one before it did: the claim; the order's pin (only while
/// `PENDING_PAYMENT`, unexpired, of the admission's event and with an attempt left — a
/// pending one, or fewer than `$13` made; its row lock serialises pay requests of one order;
/// the pin is at least `$3` from now but never past `created_at + $12`, and never shortens
/// anything); its `ordered` hold and the hold's seats (locked in `seat_id`
/// order, like every other seat path); the attempt (only if the hold kept all its seats;
/// none while another of the order's is pending). A refused key writes nothing.
const START_ATTEMPT: &str = concat!(
    "
WITH k AS (",
    crate::claim_key_sql!("$2", "$5", "$6", "$7", "$8"),
    "),
o AS (
    UPDATE orders
       SET expires_at = GREATEST(expires_at,
                                 LEAST(clock_timestamp() + make_interval(secs => $3),
                                       created_at + make_interval(secs => $12))),
           updated_at = clock_timestamp()
     WHERE id = $1 AND account_id = $2 AND status = 'PENDING_PAYMENT'
       AND expires_at > clock_timestamp()
       AND (event_id IS NULL OR event_id = $4)
       AND (EXISTS (SELECT 1 FROM payments WHERE order_id = $1 AND status = 'pending')
            OR (SELECT count(*) FROM payments WHERE order_id = $1) < $13)
       AND EXISTS (SELECT 1 FROM k)
    RETURNING hold_id, total, currency,
              LEAST(clock_timestamp() + make_interval(secs => $3),
                    created_at + make_interval(secs => $12)) AS pin_until),
h AS (
    UPDATE holds
       SET expires_at = GREATEST(expires_at, (SELECT pin_until FROM o))
     WHERE id = (SELECT hold_id FROM o) AND status = 'ordered'
    RETURNING id, event_id, kind, quantity, expires_at, seat_ids),",
    crate::hold_seats_locked_sql!(),
    ",
upd AS (
    UPDATE seats s SET held_until = GREATEST(s.held_until, h.expires_at)
      FROM mine m, h
     WHERE s.event_id = m.event_id AND s.seat_id = m.seat_id
    RETURNING 1),
kept AS (
    SELECT o.total, o.currency FROM o
     WHERE o.hold_id IS NULL
        OR COALESCE((SELECT h.kind <> 'seats' OR (SELECT count(*) FROM upd) = h.quantity
                       FROM h), false)),
ins AS (
    INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount, currency,
                          payment_method, next_check_at)
    SELECT $9, $1, $2, n, $1 || '-' || n, kept.total, kept.currency, $10,
           clock_timestamp() + make_interval(secs => $11)
      FROM kept, (SELECT COALESCE(MAX(attempt), 0) + 1 AS n FROM payments WHERE order_id = $1) a
    ON CONFLICT (order_id) WHERE status = 'pending' DO NOTHING
    RETURNING ",
    attempt_columns!(),
    ")
SELECT EXISTS (SELECT 1 FROM k) AS claimed,
       EXISTS (SELECT 1 FROM o) AS pinned,
       EXISTS (SELECT 1 FROM kept) AS hold_kept,
       (SELECT row_to_json(ins) FROM ins) AS attempt"
);

/// Why an order cannot be paid now (read after the conditional pin changed nothing).
async fn not_payable(
    pool: &PgPool,
    order_id: &str,
    account: &str,
    admission: &str,
    max_attempts: u32,
) -> PaymentResult<Start> {
    let row: Option<(String, bool, Option<String>, bool)> = sqlx::query_as(
        "SELECT status, expires_at <= clock_timestamp(), event_id,
                NOT EXISTS (SELECT 1 FROM payments p
                             WHERE p.order_id = o.id AND p.status = 'pending')
                AND (SELECT count(*) FROM payments p WHERE p.order_id = o.id) >= $3
           FROM orders o
          WHERE id = $1 AND account_id = $2",
    )
    .bind(order_id)
    .bind(account)
    .bind(i64::from(max_attempts))
    .fetch_optional(pool)
    .await
    .statement("read why the order is not payable")?;
    Ok(match row {
        // Someone else's order looks exactly like a missing one.
        None => Start::NotFound,
        Some((_, _, event, _)) if !opens(event.as_deref(), admission) => Start::WrongEvent,
        Some((status, false, _, true)) if status == "PENDING_PAYMENT" => Start::Exhausted,
        Some((status, expired, _, _)) => match payability(&status, expired) {
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

/// Records the provider's intent of a pending attempt that is not final yet (3-D Secure,
/// processing): from now on only that intent's success pays the attempt, and it is the one
/// canceled if the order ends first.
pub async fn record_intent(
    pool: &PgPool,
    payment_id: &str,
    provider_payment_id: &str,
) -> PaymentResult<()> {
    sqlx::query(
        "UPDATE payments SET provider_payment_id = $2, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending' AND provider_payment_id IS NULL",
    )
    .bind(payment_id)
    .bind(provider_payment_id)
    .execute(pool)
    .await
    .statement("record the attempt's intent")?;
    Ok(())
}

/// Can attempt `payment_id`'s order still take money?
pub async fn attempt_payable(pool: &PgPool, payment_id: &str) -> PaymentResult<bool> {
    let payable: Option<bool> = sqlx::query_scalar(
        "SELECT o.status = 'PENDING_PAYMENT' AND o.expires_at > clock_timestamp()
           FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.id = $1",
    )
    .bind(payment_id)
    .fetch_optional(pool)
    .await
    .statement("read whether the attempt's order is payable")?;
    Ok(payable.unwrap_or(false))
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

mod due;
pub use due::*;

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
