//! The HTTP layer of payments: `POST /api/orders/{id}/pay` (the steps are documented in
//! [`crate::payments::flow`]) and the one mapping of [`PaymentError`] to `ApiError`. The
//! webhook handler ([`crate::payments::webhooks`]) answers through the same mapping.

use crate::orders::OrderView;
use crate::payments::error::PaymentError;
use crate::payments::flow::{self, Paid};
use crate::payments::model::{
    Attempt, Charge, OpenAttempt, Success, Unpayable, outcome_label, plausible_order_id,
    valid_payment_method,
};
use crate::payments::provider::{PaymentStatus, ProviderPayment};
use crate::payments::repo::{self, KeyClaim, PinLimits, Start};
use crate::payments::{PaymentClients, PaymentsState, transitions};
use crate::platform::auth::Admitted;
use crate::platform::db::{self, TxError, is_retryable};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Claim, Fingerprint, IdempotencyKey, Replay};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::platform::session_until::SessionUntil;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod errors;
mod paid;

use paid::{paid_body, paid_body_of, paid_body_tx};

pub fn router() -> OpenApiRouter<PaymentsState> {
    OpenApiRouter::new().routes(routes!(pay))
}

/// A paid order: the order as `GET /api/orders/{id}` shows it, with its tickets and its
/// settled payment (`paid::paid_body_of`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct PaidOrder {
    #[serde(flatten)]
    order: OrderView,
    tickets: Vec<PaidTicket>,
    payment: Option<SettledPayment>,
}

#[derive(ToSchema)]
#[expect(dead_code, reason = "a schema only")]
struct PaidTicket {
    id: String,
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
}

#[derive(ToSchema)]
#[expect(dead_code, reason = "a schema only")]
struct SettledPayment {
    id: String,
    attempt: i64,
    status: String,
    provider_payment_id: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PayRequest {
    /// A provider payment method id (`pm_...`).
    #[schema(pattern = "^pm_[A-Za-z0-9_]{1,97}$")]
    pub payment_method: String,
}

/// Pay an order (never charges twice)
#[utoipa::path(post, path = "/api/orders/{id}/pay", tag = tags::PAYMENTS,
    params(doc::IdPath, doc::IdempotencyKey),
    request_body = PayRequest,
    responses(
        (status = 200, description = "Paid (or already paid)", body = PaidOrder),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 402, description = "Card declined (`CARD_DECLINED`)", body = doc::Error),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
        (status = 502, description = "Provider error, outcome unknown", body = doc::Error),
        (status = 503, response = doc::Unavailable),
        (status = 504, description = "Provider timeout, outcome unknown", body = doc::Error),
    ))]
async fn pay(
    State(state): State<PaymentsState>,
    admitted: Admitted,
    key: IdempotencyKey,
    Path(order_id): Path<String>,
    ApiJson(req): ApiJson<PayRequest>,
) -> ApiResult<Response> {
    if !valid_payment_method(&req.payment_method) {
        return Err(PaymentError::InvalidPaymentMethod.into());
    }
    if !plausible_order_id(&order_id) {
        return Err(PaymentError::OrderNotFound.into());
    }
    let account = admitted.account().to_owned();
    let body = serde_json::to_value(&req).map_err(ApiError::unexpected)?;
    let path = format!("/api/orders/{order_id}/pay");
    let fp = Fingerprint::of_json(&Method::POST, &path, &body);
    let clients = state.clients();
    let claim = KeyClaim {
        settings: &state.idempotency.settings,
        account: &account,
        key: &key,
        fingerprint: &fp,
    };
    let result = pay_claimed(
        &clients,
        &claim,
        admitted.event(),
        &order_id,
        &req.payment_method,
    );
    match result.await {
        Ok(Done::Stored(status, body, until)) => {
            Ok((SessionUntil(until), idempotency::respond(status, body)).into_response())
        }
        Ok(Done::Replay(stored)) => {
            // The event check comes first for every answer, a replay included.
            check_order_event(&state, &admitted, &order_id).await?;
            Ok(axum::response::IntoResponse::into_response(stored))
        }
        // The key refused (reused, in flight): no attempt was made.
        Err(e)
            if e.code() == codes::IDEMPOTENCY_KEY_REUSED
                || e.code() == codes::IDEMPOTENCY_IN_FLIGHT =>
        {
            check_order_event(&state, &admitted, &order_id).await?;
            Err(e)
        }
        Ok(Done::Released(e)) if e.code() == codes::WRONG_EVENT => Err(e),
        Ok(Done::Released(e)) | Err(e) => {
            record(&clients, outcome_label(e.code()));
            Err(e)
        }
    }
}

/// One admission, one event: an order is paid only with an admission token of its event
/// (`403 WRONG_EVENT`, nothing claimed or charged). The pay transaction checks it on the
/// order row it pins ([`Start::WrongEvent`]); an answer decided before that row is read (a
/// replay, a refused key) is checked here. An order's event never changes, so either is not
/// a race. Orders without an event (cart orders created before orders recorded one) are their
/// owner's to pay; someone else's order or a missing one is left to the pay flow's `404`.
async fn check_order_event(
    state: &PaymentsState,
    admitted: &Admitted,
    order_id: &str,
) -> ApiResult<()> {
    match repo::order_event(&state.pool, order_id, admitted.account()).await? {
        Some(Some(event)) => admitted.opens(Some(&event)),
        _ => Ok(()),
    }
}

/// How a pay request ended.
enum Done {
    /// A response stored under the idempotency key (state changed), with the account's
    /// checkout end when the answer's own read had it.
    Stored(StatusCode, Vec<u8>, Option<i64>),
    /// The key's earlier answer.
    Replay(Replay),
    /// A refusal or an unknown outcome: the key is not kept, so a retry runs again.
    Released(ApiError),
}

fn record(c: &PaymentClients, outcome: &str) {
    c.metrics.attempts.with_label_values(&[outcome]).inc();
}

/// The key is claimed by the statement that starts the attempt ([`repo::start_attempt`]);
/// every outcome that does not call the provider released it. After a provider call the
/// answer is stored under it, or it is released.
async fn pay_claimed(
    c: &PaymentClients,
    key: &KeyClaim<'_>,
    admission: &str,
    order_id: &str,
    method: &str,
) -> ApiResult<Done> {
    let limits = PinLimits {
        pin_s: c.settings.pay_pin_s.max(1) as f64,
        bound_s: c.reserve_bound_s(),
        max_attempts: c.settings.max_attempts.max(1),
    };
    let reconcile_s = c.settings.reconcile_after_s as f64;
    let account = key.account;
    let (started, claim) = repo::start_attempt(
        &c.pool,
        key,
        admission,
        order_id,
        method,
        limits,
        reconcile_s,
    )
    .await?;
    let (attempt, claim) = match (started, claim) {
        (Start::Charge(a), Some(claim)) => (a, claim),
        (Start::Replay(stored), _) => return Ok(Done::Replay(stored)),
        (Start::NotFound, _) => return Ok(Done::Released(PaymentError::OrderNotFound.into())),
        (Start::WrongEvent, _) => return Ok(Done::Released(ApiError::wrong_event())),
        (Start::Exhausted, _) => {
            return Ok(Done::Released(
                PaymentError::AttemptsExhausted {
                    max: limits.max_attempts,
                }
                .into(),
            ));
        }
        (Start::OtherAttemptPending { attempt }, _) => {
            return Ok(Done::Released(
                PaymentError::InProgress {
                    attempt: Some(attempt),
                }
                .into(),
            ));
        }
        (Start::Unpayable(why), _) => {
            return match flow::settle_open_attempt(c, order_id, account, why).await {
                Ok(e) => Ok(Done::Released(e.into())),
                // The open attempt had been charged and the order was still pending.
                Err(Paid) => {
                    let (body, until) = paid_body(c, order_id, account).await?;
                    store(c, key, StatusCode::OK, body, until).await
                }
            };
        }
        (Start::AlreadyPaid, _) => {
            let (body, until) = paid_body(c, order_id, account).await?;
            return store(c, key, StatusCode::OK, body, until).await;
        }
        (Start::Charge(_), None) => {
            return Err(ApiError::unexpected(anyhow::anyhow!(
                "a payment attempt started without its idempotency claim"
            )));
        }
    };
    let done = charge(c, &claim, &attempt).await;
    match done {
        Ok(Done::Released(e)) | Err(e) => {
            claim.release(&c.pool).await;
            Ok(Done::Released(e))
        }
        stored => stored,
    }
}

/// Calls the provider for a started attempt and applies its answer.
async fn charge(c: &PaymentClients, claim: &Claim, attempt: &Attempt) -> ApiResult<Done> {
    match flow::call_provider(c, attempt).await {
        Ok(p) => match &p.status {
            PaymentStatus::Succeeded => finish_success(c, claim, attempt, &p).await,
            PaymentStatus::Declined { decline_code } => {
                finish_decline(c, claim, attempt, &p.id, decline_code).await
            }
            PaymentStatus::Other(s) => {
                tracing::warn!(payment_id = %attempt.id, provider_status = %s, "payment not final");
                // Only this intent may complete the attempt now (and it is the one canceled
                // if the order ends first).
                if let Err(e) = repo::record_intent(&c.pool, &attempt.id, &p.id).await {
                    tracing::warn!(error = ?e, payment_id = %attempt.id, "could not record the attempt's intent");
                }
                Ok(Done::Released(
                    PaymentError::InProgress { attempt: None }.into(),
                ))
            }
        },
        Err(e) => Ok(Done::Released(
            flow::provider_failure(c, attempt, e).await.into(),
        )),
    }
}

/// Stores `body` under the request's key in a transaction of its own (the state change it
/// describes is already committed): the key's claim and its answer at once.
async fn store(
    c: &PaymentClients,
    key: &KeyClaim<'_>,
    status: StatusCode,
    body: Value,
    until: Option<i64>,
) -> ApiResult<Done> {
    let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
    let mut tx = c.pool.begin().await?;
    let claim = match key.claim_tx(&mut tx).await? {
        Begin::Started(claim) => claim,
        Begin::Replay(stored) => return Ok(Done::Replay(stored)),
    };
    claim.complete_tx(&mut tx, status, &bytes).await?;
    tx.commit().await?;
    Ok(Done::Stored(status, bytes, until))
}

async fn finish_success(
    c: &PaymentClients,
    claim: &Claim,
    a: &Attempt,
    p: &ProviderPayment,
) -> ApiResult<Done> {
    let charge = Charge::of(p);
    let charge = &charge;
    let outcome = db::retry(3, || async {
        let mut tx = c.pool.begin().await?;
        // The common case in one statement that also returns the answer; anything else (a
        // cart order, a lost race, a lost seat) changed nothing and takes the general path.
        if let Some(paid) =
            transitions::settle_hold_order_tx(&mut tx, &a.id, &a.order_id, &a.account_id, charge)
                .await?
        {
            let tickets = paid.tickets.0.len();
            let (body, until) = paid_body_of(paid)?;
            let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
            claim.complete_tx(&mut tx, StatusCode::OK, &bytes).await?;
            tx.commit().await?;
            let outcome = Success::Paid {
                order_id: a.order_id.clone(),
                tickets,
            };
            return Ok::<_, TxError>((outcome, StatusCode::OK, bytes, until));
        }
        let outcome =
            transitions::apply_success_of_tx(&mut tx, &a.id, &a.order_id, &a.account_id, charge)
                .await?;
        if let Success::Mismatch { .. } = &outcome {
            // The provider answered the attempt's own key with another payment (amount,
            // currency): nothing was written; it is refunded below and the fan told the
            // provider failed.
            return Ok::<_, TxError>((outcome, StatusCode::BAD_GATEWAY, Vec::new(), None));
        }
        let (status, (body, until)) = match &outcome {
            Success::Paid { .. } | Success::AlreadyPaid => (
                StatusCode::OK,
                paid_body_tx(&mut tx, &a.order_id, &a.account_id).await?,
            ),
            Success::RefundNeeded { .. } | Success::Unknown | Success::Mismatch { .. } => (
                StatusCode::CONFLICT,
                (
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
                    None,
                ),
            ),
        };
        let bytes = serde_json::to_vec(&body).map_err(ApiError::unexpected)?;
        claim.complete_tx(&mut tx, status, &bytes).await?;
        tx.commit().await?;
        Ok::<_, TxError>((outcome, status, bytes, until))
    })
    .await;
    let (outcome, status, bytes, until) = outcome?;
    if let Success::Mismatch { intent_id } = &outcome {
        flow::refund_mismatch(c, &a.id, intent_id, "pay").await;
        return Ok(Done::Released(
            PaymentError::ProviderFailed { attempt: a.attempt }.into(),
        ));
    }
    match outcome {
        Success::Mismatch { .. } => {}
        Success::Paid { .. } => record(c, "paid"),
        Success::AlreadyPaid => record(c, "already_paid"),
        Success::RefundNeeded { .. } | Success::Unknown => record(c, "refunded"),
    }
    if let Success::RefundNeeded {
        payment_id,
        provider_payment_id,
    } = &outcome
    {
        // The stored answer says "being refunded"; a refund that fails now stays
        // refund_pending and is retried by reconciliation.
        let _refunded = flow::refund(c, payment_id, provider_payment_id).await;
    }
    Ok(Done::Stored(status, bytes, until))
}

async fn finish_decline(
    c: &PaymentClients,
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
        let mut tx = c.pool.begin().await?;
        transitions::apply_decline_tx(&mut tx, &a.id, provider_payment_id, decline_code).await?;
        claim
            .complete_tx(&mut tx, StatusCode::PAYMENT_REQUIRED, &bytes)
            .await?;
        tx.commit().await?;
        Ok::<_, TxError>(())
    })
    .await?;
    record(c, "declined");
    Ok(Done::Stored(StatusCode::PAYMENT_REQUIRED, bytes, None))
}

#[cfg(test)]
mod tests;
