//! `POST /api/orders/{id}/pay` and the state transitions every payment path shares.
//!
//! # The pay request
//! 1. The `Idempotency-Key` is claimed (a repeat of a finished request replays its answer).
//! 2. One transaction pins the order and its hold (`expires_at`/`held_until` moved to at
//!    least now + `pay_pin_s`, never shortened, only while the order is still
//!    `PENDING_PAYMENT` and unexpired: one conditional `UPDATE` each) and records the payment
//!    attempt — or reuses the order's attempt that is still pending. The attempt's provider
//!    idempotency key, `<order id>-<attempt>`, is committed before the provider is called.
//! 3. The provider is called outside any transaction. A retry of the same attempt (same key,
//!    another click, a retry after a timeout) sends the same provider key, so the customer is
//!    charged at most once; an attempt after a decline is a new attempt with a new key.
//! 4. The answer is applied in one transaction: success via [`apply_success_tx`] (the order's
//!    `PENDING_PAYMENT → PAID` transition, seats sold and tickets issued or reserved stock
//!    sold, the attempt `succeeded`, `order.paid` in the outbox); a decline marks the attempt
//!    `declined` (`402`, hold kept until its TTL); a timeout or `5xx` leaves it pending
//!    (`504`/`502`, the order stays `PENDING_PAYMENT`).
//!
//! # Money that cannot be honoured
//! When a success arrives for an order that is no longer payable — expired, cancelled, paid by
//! another attempt, or whose hold lost a seat — the attempt becomes `refund_pending` in the
//! same transaction that discovered it, and [`refund`] then refunds it at the provider with
//! the key `refund-<payment id>` and, in one conditional step, marks it `refunded` and writes
//! `order.refunded`. The order is never resurrected; a refund that fails is retried by
//! reconciliation.

use crate::app::state::AppState;
use crate::inventory::holds::{self, SellOutcome};
use crate::orders;
use crate::outbox;
use crate::payments::provider::{CreatePayment, PaymentStatus, ProviderError, ProviderPayment};
use crate::platform::auth::Admitted;
use crate::platform::db::{self, TxError};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Claim, Fingerprint, IdempotencyKey};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shared::error::codes;
use sqlx::{Acquire, PgConnection};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/orders/{id}/pay", post(pay))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PayRequest {
    /// A provider payment method id (`pm_...`).
    pub payment_method: String,
}

fn valid_payment_method(pm: &str) -> bool {
    pm.len() <= 100
        && pm.starts_with("pm_")
        && pm.len() > 3
        && pm.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A recorded payment attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Attempt {
    pub id: String,
    pub order_id: String,
    pub account_id: String,
    pub attempt: i32,
    pub provider_key: String,
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    pub status: String,
}

/// The columns of [`Attempt`], as a literal so the SQL using it stays `'static`.
macro_rules! attempt_columns {
    () => {
        "id, order_id, account_id, attempt, provider_key, amount, currency, payment_method, status"
    };
}

/// What starting a payment found.
enum Start {
    /// Call the provider with this attempt.
    Charge(Attempt),
    /// Nothing to charge; answer with this.
    Answer(ApiError),
    /// The order can no longer be paid (expired, cancelled, hold lost); nothing new is
    /// charged. An attempt of it still open is resolved before answering.
    Unpayable(ApiError),
    /// The order is already paid: answer with the order.
    AlreadyPaid,
}

async fn pay(
    State(state): State<AppState>,
    admitted: Admitted,
    key: IdempotencyKey,
    Path(order_id): Path<String>,
    ApiJson(req): ApiJson<PayRequest>,
) -> ApiResult<Response> {
    if !valid_payment_method(&req.payment_method) {
        return Err(ApiError::validation(
            "payment_method must be a provider payment method id such as pm_card_visa",
        ));
    }
    if order_id.is_empty() || order_id.len() > 64 {
        return Err(ApiError::not_found(codes::NOT_FOUND, "no such order"));
    }
    let account = admitted.account().to_owned();
    check_order_event(&state, &admitted, &order_id).await?;
    let body = serde_json::to_value(&req).map_err(ApiError::unexpected)?;
    let path = format!("/api/orders/{order_id}/pay");
    let fp = Fingerprint::of_json(&Method::POST, &path, &body);
    let claim = match idempotency::begin(&state.idempotency, &account, &key, &fp).await? {
        Begin::Replay(stored) => return Ok(axum::response::IntoResponse::into_response(stored)),
        Begin::Started(claim) => claim,
    };
    let result = pay_claimed(&state, &claim, &account, &order_id, &req.payment_method).await;
    match result {
        Ok(Done::Stored(status, body)) => Ok(idempotency::respond(status, body)),
        Ok(Done::Released(e)) | Err(e) => {
            claim.release(&state.pool).await;
            record(&state, outcome_label(&e));
            Err(e)
        }
    }
}

/// One admission, one event: an order is paid only with an admission token of its event
/// (`403 WRONG_EVENT` before anything is claimed or charged). An order's event never changes,
/// so reading it first is not a race. Orders without an event (cart orders created before
/// orders recorded one) are their owner's to pay; someone else's order or a missing one is
/// left to the pay flow's `404`.
async fn check_order_event(state: &AppState, admitted: &Admitted, order_id: &str) -> ApiResult<()> {
    let event: Option<Option<String>> =
        sqlx::query_scalar("SELECT event_id FROM orders WHERE id = $1 AND account_id = $2")
            .bind(order_id)
            .bind(admitted.account())
            .fetch_optional(&state.pool)
            .await?;
    match event {
        Some(Some(event)) => admitted.opens(Some(&event)),
        _ => Ok(()),
    }
}

/// How a pay request ended.
enum Done {
    /// A response stored under the idempotency key (state changed).
    Stored(StatusCode, Vec<u8>),
    /// A refusal or an unknown outcome: the key is released so a retry runs again.
    Released(ApiError),
}

fn record(state: &AppState, outcome: &str) {
    state
        .metrics
        .payments
        .attempts
        .with_label_values(&[outcome])
        .inc();
}

fn outcome_label(e: &ApiError) -> &'static str {
    match e.code() {
        c if c == codes::PAYMENT_PROVIDER_TIMEOUT => "timeout",
        c if c == codes::PAYMENT_PROVIDER_ERROR => "provider_error",
        c if c == codes::PAYMENT_IN_PROGRESS => "in_progress",
        c if c == codes::ORDER_NOT_PAYABLE => "not_payable",
        _ => "refused",
    }
}

async fn pay_claimed(
    state: &AppState,
    claim: &Claim,
    account: &str,
    order_id: &str,
    method: &str,
) -> ApiResult<Done> {
    let attempt = match start_attempt(state, account, order_id, method).await? {
        Start::Charge(a) => a,
        Start::Answer(e) => return Ok(Done::Released(e)),
        Start::Unpayable(e) => {
            return match settle_open_attempt(state, order_id, account, e).await {
                Ok(e) => Ok(Done::Released(e)),
                // The open attempt had been charged and the order was still pending.
                Err(Paid) => {
                    let body = paid_body(state, order_id, account).await?;
                    store(state, claim, StatusCode::OK, body).await
                }
            };
        }
        Start::AlreadyPaid => {
            let body = paid_body(state, order_id, account).await?;
            return store(state, claim, StatusCode::OK, body).await;
        }
    };
    let outcome = call_provider(state, &attempt).await;
    match outcome {
        Ok(p) => match &p.status {
            PaymentStatus::Succeeded => finish_success(state, claim, &attempt, &p).await,
            PaymentStatus::Declined { decline_code } => {
                finish_decline(state, claim, &attempt, &p.id, decline_code).await
            }
            PaymentStatus::Other(s) => {
                tracing::warn!(payment_id = %attempt.id, provider_status = %s, "payment not final");
                Ok(Done::Released(in_progress()))
            }
        },
        Err(e) => Ok(Done::Released(provider_failure(state, &attempt, e).await)),
    }
}

fn in_progress() -> ApiError {
    ApiError::conflict(
        codes::PAYMENT_IN_PROGRESS,
        "a payment for this order is still being processed; check the order shortly",
    )
    .retry_after(2)
}

/// The pin-and-record transaction (step 2 of the module docs).
async fn start_attempt(
    state: &AppState,
    account: &str,
    order_id: &str,
    method: &str,
) -> ApiResult<Start> {
    let pin_s = state.config.payments.pay_pin_s.max(1) as f64;
    let reconcile_s = state.config.payments.reconcile_after_s as f64;
    let started = db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        // The order row lock taken here also serialises concurrent pay requests for this
        // order through the attempt bookkeeping below.
        let order: Option<(Option<String>, i64, String)> = sqlx::query_as(
            "UPDATE orders
                SET expires_at = GREATEST(expires_at,
                                          clock_timestamp() + make_interval(secs => $3)),
                    updated_at = clock_timestamp()
              WHERE id = $1 AND account_id = $2 AND status = 'PENDING_PAYMENT'
                AND expires_at > clock_timestamp()
             RETURNING hold_id, total, currency",
        )
        .bind(order_id)
        .bind(account)
        .bind(pin_s)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((hold_id, total, currency)) = order else {
            drop(tx);
            return Ok(not_payable(state, order_id, account).await?);
        };
        if let Some(hold_id) = &hold_id
            && !extend_hold_tx(&mut tx, hold_id, pin_s).await?
        {
            return Ok(Start::Unpayable(ApiError::conflict(
                codes::HOLD_EXPIRED,
                "the seats of this order are no longer held",
            )));
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
        .bind(reconcile_s)
        .fetch_optional(&mut *tx)
        .await?;
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
                .await?;
                if pending.payment_method != method {
                    return Ok(Start::Answer(
                        in_progress().with("attempt", pending.attempt),
                    ));
                }
                pending
            }
        };
        tx.commit().await?;
        Ok::<_, TxError>(Start::Charge(attempt))
    })
    .await?;
    Ok(started)
}

/// Extends an ordered hold and its seats to at least now + `pin_s` (never shortens). False
/// when the hold no longer holds all its seats (nothing was changed then).
async fn extend_hold_tx(conn: &mut PgConnection, hold_id: &str, pin_s: f64) -> sqlx::Result<bool> {
    let mut sp = conn.begin().await?;
    let hold: Option<(String, String, i32, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "UPDATE holds
            SET expires_at = GREATEST(expires_at, clock_timestamp() + make_interval(secs => $2))
          WHERE id = $1 AND status = 'ordered'
         RETURNING event_id, kind, quantity, expires_at",
    )
    .bind(hold_id)
    .bind(pin_s)
    .fetch_optional(&mut *sp)
    .await?;
    let Some((event_id, kind, quantity, until)) = hold else {
        sp.rollback().await?;
        return Ok(false);
    };
    if kind == "seats" {
        // Seats locked in seat_id order, like every other seat path.
        let extended = sqlx::query(
            "WITH mine AS (
                 SELECT seat_id FROM seats
                  WHERE event_id = $1 AND hold_id = $2 AND status = 'held'
                  ORDER BY seat_id
                  FOR UPDATE)
             UPDATE seats s SET held_until = GREATEST(s.held_until, $3)
               FROM mine m
              WHERE s.event_id = $1 AND s.seat_id = m.seat_id",
        )
        .bind(&event_id)
        .bind(hold_id)
        .bind(until)
        .execute(&mut *sp)
        .await?
        .rows_affected();
        if i64::try_from(extended).ok() != Some(i64::from(quantity)) {
            sp.rollback().await?;
            return Ok(false);
        }
    }
    sp.commit().await?;
    Ok(true)
}

/// Why an order cannot be paid now (read after the conditional pin changed nothing).
async fn not_payable(state: &AppState, order_id: &str, account: &str) -> ApiResult<Start> {
    let row: Option<(String, bool)> = sqlx::query_as(
        "SELECT status, expires_at <= clock_timestamp() FROM orders
          WHERE id = $1 AND account_id = $2",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(&state.pool)
    .await?;
    Ok(match row {
        // Someone else's order looks exactly like a missing one.
        None => Start::Answer(ApiError::not_found(codes::NOT_FOUND, "no such order")),
        Some((status, _)) if status == "PAID" => Start::AlreadyPaid,
        Some((status, expired)) => {
            let status = if status == "PENDING_PAYMENT" && expired {
                "EXPIRED".to_owned()
            } else {
                status
            };
            Start::Unpayable(
                ApiError::conflict(codes::ORDER_NOT_PAYABLE, "this order can no longer be paid")
                    .with("status", status),
            )
        }
    })
}

/// An open attempt turned out to have paid the order.
struct Paid;

/// Before telling the fan an order cannot be paid: if one of its attempts is still open (a
/// timeout earlier), ask the provider about it — never charging anew — so money taken for it
/// is refunded now rather than by the reconciliation job, and say so.
async fn settle_open_attempt(
    state: &AppState,
    order_id: &str,
    account: &str,
    e: ApiError,
) -> Result<ApiError, Paid> {
    let open: Result<Option<String>, sqlx::Error> = sqlx::query_scalar(
        "SELECT id FROM payments WHERE order_id = $1 AND account_id = $2 AND status = 'pending'",
    )
    .bind(order_id)
    .bind(account)
    .fetch_optional(&state.pool)
    .await;
    let payment_id = match open {
        Ok(Some(id)) => id,
        Ok(None) => return Ok(e),
        Err(err) => {
            tracing::warn!(error = ?err, order_id, "could not look for an open attempt");
            return Ok(e);
        }
    };
    match super::reconcile::resolve_pending(state, &payment_id).await {
        Ok("refunded") => Ok(e.with("refunded", true)),
        Ok("refund_pending") => Ok(e.with("refund_pending", true)),
        Ok("completed") => Err(Paid),
        Ok(outcome) => {
            tracing::info!(order_id, payment_id = %payment_id, outcome, "open attempt of an unpayable order");
            Ok(e)
        }
        Err(err) => {
            tracing::warn!(error = ?err, order_id, "could not resolve an open attempt; reconciliation will");
            Ok(e)
        }
    }
}

/// Calls the provider, waiting out a concurrent request with the same key (another click of
/// the same attempt) for up to `in_progress_wait_ms`. Every call for one attempt sends the
/// same key and parameters, so a repeat replays the provider's first outcome (reconciliation
/// asks about an attempt this way).
pub(crate) async fn call_provider(
    state: &AppState,
    a: &Attempt,
) -> Result<ProviderPayment, ProviderError> {
    let req = CreatePayment {
        idempotency_key: a.provider_key.clone(),
        amount: a.amount,
        currency: a.currency.clone(),
        payment_method: a.payment_method.clone(),
        metadata: BTreeMap::from([
            ("order_id".to_owned(), a.order_id.clone()),
            ("attempt".to_owned(), a.attempt.to_string()),
            ("payment_id".to_owned(), a.id.clone()),
        ]),
    };
    let deadline =
        Instant::now() + Duration::from_millis(state.config.payments.in_progress_wait_ms);
    let mut pause = Duration::from_millis(20);
    loop {
        match state.payments.create_payment(&req).await {
            Err(ProviderError::InProgress) if Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// Maps a provider failure to the client's answer; an attempt the provider provably never
/// charged is closed so the next pay starts a fresh attempt.
async fn provider_failure(state: &AppState, a: &Attempt, e: ProviderError) -> ApiError {
    let proven_not_charged = matches!(
        e,
        ProviderError::NotSent(_) | ProviderError::Rejected { .. }
    );
    if proven_not_charged {
        if let ProviderError::Rejected { status, code } = &e {
            tracing::error!(payment_id = %a.id, status, code = %code, "provider refused a payment request");
        }
        let closed = sqlx::query(
            "UPDATE payments SET status = 'failed', updated_at = clock_timestamp()
              WHERE id = $1 AND status = 'pending'",
        )
        .bind(&a.id)
        .execute(&state.pool)
        .await;
        if let Err(err) = closed {
            // Left pending: reconciliation closes it later.
            tracing::warn!(error = ?err, payment_id = %a.id, "could not close a failed attempt");
        }
    } else {
        tracing::warn!(payment_id = %a.id, error = %e, "payment outcome unknown; attempt stays pending");
    }
    match e {
        ProviderError::Timeout => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            codes::PAYMENT_PROVIDER_TIMEOUT,
            "the payment provider did not answer in time; retry: you will not be charged twice",
        )
        .with("attempt", a.attempt),
        ProviderError::InProgress => in_progress().with("attempt", a.attempt),
        _ => ApiError::new(
            StatusCode::BAD_GATEWAY,
            codes::PAYMENT_PROVIDER_ERROR,
            "the payment provider failed; retry: you will not be charged twice",
        )
        .with("attempt", a.attempt),
    }
}

/// Stores `body` under the idempotency key (its own small transaction: the state change it
/// describes is already committed) and answers with it.
async fn store(
    state: &AppState,
    claim: &Claim,
    status: StatusCode,
    body: Value,
) -> ApiResult<Done> {
    let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
    claim.complete(&state.pool, status, &bytes).await?;
    Ok(Done::Stored(status, bytes))
}

async fn finish_success(
    state: &AppState,
    claim: &Claim,
    a: &Attempt,
    p: &ProviderPayment,
) -> ApiResult<Done> {
    let outcome = db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        let outcome = apply_success_tx(&mut tx, &a.id, &p.id).await?;
        let (status, body) = match &outcome {
            Success::Paid { .. } | Success::AlreadyPaid => (
                StatusCode::OK,
                paid_body_tx(&mut tx, &a.order_id, &a.account_id).await?,
            ),
            Success::RefundNeeded { .. } | Success::Unknown => (
                StatusCode::CONFLICT,
                serde_json::to_value(
                    shared::error::ErrorBody::new(
                        codes::PAYMENT_REFUNDED,
                        "the order could no longer be fulfilled (it expired or its seats were \
                         taken); the payment is being refunded",
                    )
                    .with("order_id", a.order_id.clone())
                    .with("payment_id", a.id.clone()),
                )
                .map_err(ApiError::unexpected)?,
            ),
        };
        let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
        claim.complete_tx(&mut tx, status, &bytes).await?;
        tx.commit().await?;
        Ok::<_, TxError>((outcome, status, bytes))
    })
    .await;
    let (outcome, status, bytes) = outcome?;
    match outcome {
        Success::Paid { .. } => record(state, "paid"),
        Success::AlreadyPaid => record(state, "already_paid"),
        Success::RefundNeeded { .. } | Success::Unknown => record(state, "refunded"),
    }
    if let Success::RefundNeeded {
        payment_id,
        provider_payment_id,
    } = &outcome
    {
        // The stored answer says "being refunded"; a refund that fails now stays
        // refund_pending and is retried by reconciliation.
        let _refunded = refund(state, payment_id, provider_payment_id).await;
    }
    Ok(Done::Stored(status, bytes))
}

async fn finish_decline(
    state: &AppState,
    claim: &Claim,
    a: &Attempt,
    provider_payment_id: &str,
    decline_code: &str,
) -> ApiResult<Done> {
    let body = serde_json::to_value(
        shared::error::ErrorBody::new(codes::CARD_DECLINED, "the card was declined")
            .with("decline_code", decline_code)
            .with("attempt", a.attempt)
            .with("order_id", a.order_id.clone()),
    )
    .map_err(ApiError::unexpected)?;
    let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
    db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        apply_decline_tx(&mut tx, &a.id, provider_payment_id, decline_code).await?;
        claim
            .complete_tx(&mut tx, StatusCode::PAYMENT_REQUIRED, &bytes)
            .await?;
        tx.commit().await?;
        Ok::<_, TxError>(())
    })
    .await?;
    record(state, "declined");
    Ok(Done::Stored(StatusCode::PAYMENT_REQUIRED, bytes))
}

// ---------------------------------------------------------------------------------------------
// Transitions shared by the pay request, webhooks and reconciliation
// ---------------------------------------------------------------------------------------------

/// What applying a provider success did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Success {
    /// This transaction moved the order to `PAID` (tickets issued, `order.paid` written).
    Paid { order_id: String, tickets: usize },
    /// The order was already paid by this very payment (the other path won): nothing to do.
    AlreadyPaid,
    /// Money was taken for an order that cannot take it: refund it after the commit.
    RefundNeeded {
        payment_id: String,
        provider_payment_id: String,
    },
    /// Not one of our payments.
    Unknown,
}

/// Applies "the provider took the money for attempt `payment_id`" inside the caller's
/// transaction. The order moves `PENDING_PAYMENT → PAID` by one conditional `UPDATE`, so of
/// the pay request, the webhook and reconciliation exactly one does it; the others get
/// [`Success::AlreadyPaid`].
pub async fn apply_success_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    provider_payment_id: &str,
) -> sqlx::Result<Success> {
    // order_id/account_id never change, so reading them unlocked is safe.
    let payment: Option<(String, String)> =
        sqlx::query_as("SELECT order_id, account_id FROM payments WHERE id = $1")
            .bind(payment_id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((order_id, account_id)) = payment else {
        return Ok(Success::Unknown);
    };
    let mut sp = conn.begin().await?;
    if let Some(order) = orders::mark_paid_tx(&mut sp, &order_id).await? {
        let mut tickets: Vec<Value> = Vec::new();
        let mut event_id: Option<String> = None;
        if let Some(hold_id) = &order.hold_id {
            match holds::sell_hold_tx(&mut sp, hold_id, &order_id, &account_id).await? {
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
                    sp.rollback().await?;
                    orders::cancel_order_tx(&mut *conn, &order_id).await?;
                    return mark_refund_pending_tx(conn, payment_id, provider_payment_id).await;
                }
            }
        }
        let marked = sqlx::query(
            "UPDATE payments
                SET status = 'succeeded', provider_payment_id = $2, updated_at = clock_timestamp()
              WHERE id = $1 AND status IN ('pending', 'failed')",
        )
        .bind(payment_id)
        .bind(provider_payment_id)
        .execute(&mut *sp)
        .await?
        .rows_affected();
        if marked != 1 {
            // The attempt was already declined/refunded: a provider contradiction. Keep the
            // order as it was and refund this money rather than guess.
            tracing::error!(
                payment_id,
                "success for an attempt that is no longer pending"
            );
            sp.rollback().await?;
            return mark_refund_pending_tx(conn, payment_id, provider_payment_id).await;
        }
        let n = tickets.len();
        outbox::write_tx(
            &mut sp,
            "order.paid",
            &order_id,
            &json!({
                "order_id": order_id,
                "account_id": account_id,
                "event": event_id,
                "source": order.source,
                "total": order.total,
                "payment_id": payment_id,
                "provider_payment_id": provider_payment_id,
                "tickets": tickets,
            }),
        )
        .await?;
        sp.commit().await?;
        return Ok(Success::Paid {
            order_id: order_id.clone(),
            tickets: n,
        });
    }
    sp.rollback().await?;
    // The order was not pending. Paid by this very attempt → the other path won.
    let status: String = sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
        .bind(payment_id)
        .fetch_one(&mut *conn)
        .await?;
    if status == "succeeded" {
        return Ok(Success::AlreadyPaid);
    }
    mark_refund_pending_tx(conn, payment_id, provider_payment_id).await
}

/// The attempt's money must go back (see [`apply_success_tx`]).
async fn mark_refund_pending_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    provider_payment_id: &str,
) -> sqlx::Result<Success> {
    let status: Option<String> = sqlx::query_scalar(
        "UPDATE payments
            SET status = 'refund_pending', provider_payment_id = $2,
                next_check_at = clock_timestamp() + interval '30 seconds',
                updated_at = clock_timestamp()
          WHERE id = $1 AND status IN ('pending', 'failed', 'declined', 'refund_pending')
         RETURNING status",
    )
    .bind(payment_id)
    .bind(provider_payment_id)
    .fetch_optional(&mut *conn)
    .await?;
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
) -> sqlx::Result<bool> {
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
    .await?
    .rows_affected()
        == 1)
}

/// Records a refund the provider confirmed: `refund_pending → refunded` plus
/// `order.refunded`, once (the conditional `UPDATE` makes every repeat a no-op).
pub async fn apply_refunded_tx(
    conn: &mut PgConnection,
    payment_id: &str,
    refund_id: &str,
) -> sqlx::Result<bool> {
    let row: Option<(String, String, i64, Option<String>)> = sqlx::query_as(
        "UPDATE payments
            SET status = 'refunded', refund_id = $2, updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'refund_pending'
         RETURNING order_id, account_id, amount, provider_payment_id",
    )
    .bind(payment_id)
    .bind(refund_id)
    .fetch_optional(&mut *conn)
    .await?;
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
    .await?;
    Ok(true)
}

/// Refunds a `refund_pending` attempt at the provider (key `refund-<payment id>`, so every
/// retry is the same refund) and records it. Failures are logged and left to
/// reconciliation, which calls this again. True when the money is back (now or before).
pub async fn refund(state: &AppState, payment_id: &str, provider_payment_id: &str) -> bool {
    let key = format!("refund-{payment_id}");
    let refund_id = match state.payments.refund(&key, provider_payment_id).await {
        Ok(r) => r.id,
        // Refunded already (by an operator, say): nothing left to give back.
        Err(ProviderError::Rejected { code, .. }) if code == "charge_already_refunded" => {
            format!("already-refunded:{provider_payment_id}")
        }
        Err(e) => {
            tracing::warn!(payment_id, error = %e, "refund failed; reconciliation will retry");
            return false;
        }
    };
    let applied = db::retry(3, || async {
        let mut tx = state.pool.begin().await?;
        let applied = apply_refunded_tx(&mut tx, payment_id, &refund_id).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(applied)
    })
    .await;
    match applied {
        Ok(true) => {
            state.metrics.payments.refunds.inc();
            tracing::info!(payment_id, "payment refunded");
            true
        }
        // Recorded by someone else (the charge.refunded webhook, another instance).
        Ok(false) => true,
        Err(e) => {
            // The provider refunded; recording it is retried (same key, replayed answer).
            tracing::warn!(payment_id, error = ?e, "could not record a refund; will retry");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Response bodies
// ---------------------------------------------------------------------------------------------

/// The order (as `GET /api/orders/{id}` shows it) plus its tickets and settled payment.
async fn paid_body_tx(
    conn: &mut PgConnection,
    order_id: &str,
    account: &str,
) -> Result<Value, TxError> {
    let Some((_, view)) = orders::load_order(&mut *conn, order_id, Some(account)).await? else {
        return Err(TxError::Api(ApiError::not_found(
            codes::NOT_FOUND,
            "no such order",
        )));
    };
    let tickets: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT id, event_id, seat_id, ga_tier FROM tickets
          WHERE order_id = $1 ORDER BY seat_id NULLS LAST, id",
    )
    .bind(order_id)
    .fetch_all(&mut *conn)
    .await?;
    let payment: Option<(String, i32, Option<String>)> = sqlx::query_as(
        "SELECT id, attempt, provider_payment_id FROM payments
          WHERE order_id = $1 AND status = 'succeeded'",
    )
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await?;
    let mut body = serde_json::to_value(&view).map_err(ApiError::unexpected)?;
    body["tickets"] = tickets
        .into_iter()
        .map(|(id, event_id, seat_id, ga_tier)| {
            json!({"id": id, "event_id": event_id, "seat_id": seat_id, "ga_tier": ga_tier})
        })
        .collect();
    body["payment"] = match payment {
        Some((id, attempt, provider_payment_id)) => json!({
            "id": id, "attempt": attempt, "status": "succeeded",
            "provider_payment_id": provider_payment_id,
        }),
        None => Value::Null,
    };
    Ok(body)
}

async fn paid_body(state: &AppState, order_id: &str, account: &str) -> ApiResult<Value> {
    let mut conn = state.pool.acquire().await?;
    Ok(paid_body_tx(&mut conn, order_id, account).await?)
}
