//! `POST /webhooks/payments`: provider events, authenticated by their signature alone (the
//! gateway forwards this path without an admission token).
//!
//! Guarantees:
//! - The `Stripe-Signature` header (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`) is checked
//!   against HMAC-SHA256(secret, `"<t>.<raw body>"`) for every configured secret (rotation)
//!   and every `v1` signature, in constant time, before the body is even parsed
//!   ([`signature`]). A missing, malformed, wrong or stale (more than `webhook_tolerance_s`
//!   from now) signature is `400 INVALID_SIGNATURE` and changes nothing.
//! - Each provider event is applied once: its id is inserted into `payment_webhook_events`
//!   in the same transaction as the change it causes, so a duplicate (providers retry for
//!   days) is a no-op and a rolled-back change leaves the event to be applied by the retry.
//! - Events go through the same conditional transitions as the pay request
//!   ([`crate::payments::transitions`]): whichever of the two arrives first wins, the other changes
//!   nothing, whatever the order of arrival. A success for an order that can no longer take
//!   it is refunded, never resurrected.
//! - `charge.refunded` / `charge.dispute.created` for a paid order reverse it once
//!   ([`crate::payments::reversal`]): `REFUNDED` / `DISPUTED`, tickets voided, stock back on
//!   sale or held back, whatever the order and duplication of the events.

mod repo;
pub mod signature;

use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::model::{Charge, Reversal, Success};
use crate::payments::provider::ProviderError;
use crate::payments::reversal::{self, Reversed};
use crate::payments::{PaymentsState, flow, transitions};
use crate::platform::db;
use crate::platform::error::ApiResult;
use crate::platform::openapi::{self as doc, tags};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::{SystemTime, UNIX_EPOCH};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use signature::{SignatureError, verify_signature};

pub const SIGNATURE_HEADER: &str = "stripe-signature";

pub fn router() -> OpenApiRouter<PaymentsState> {
    OpenApiRouter::new().routes(routes!(receive))
}

/// The acknowledgement (built with `json!`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct Received {
    received: bool,
    #[schema(required = false)]
    duplicate: bool,
}

#[derive(Debug, Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Debug, Deserialize)]
struct EventData {
    object: Value,
}

/// What a provider event asks of booking.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Incoming {
    /// `payment_intent.succeeded` / `payment_intent.payment_failed` of attempt `payment_id`.
    Outcome {
        payment_id: String,
        intent_id: String,
        /// `None` for a success; the decline code for a failure.
        declined: Option<String>,
    },
    /// `charge.refunded` / `charge.dispute.created` of payment intent `intent_id`.
    Reversal {
        intent_id: String,
        reversal: Reversal,
    },
    /// Another event type, or one that names no payment of ours.
    Ignored,
}

/// The money an event's object (an intent, a charge or a dispute) says moved: compared with
/// the attempt before it pays anything ([`crate::payments::model::charge_matches`]). A missing
/// amount or currency matches no attempt.
fn charge_of(object: &Value, intent_id: &str) -> Charge {
    Charge {
        intent_id: intent_id.to_owned(),
        amount: object.get("amount").and_then(Value::as_i64).unwrap_or(-1),
        currency: str_field(object, "currency").to_owned(),
    }
}

fn meta<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object.get("metadata")?.get(key)?.as_str()
}

fn str_field<'a>(object: &'a Value, key: &str) -> &'a str {
    object.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Reads an event (already authenticated) into what it asks for. Pure.
fn classify(kind: &str, object: &Value) -> Incoming {
    match kind {
        "payment_intent.succeeded" | "payment_intent.payment_failed" => {
            let (Some(payment_id), intent_id) =
                (meta(object, "payment_id"), str_field(object, "id"))
            else {
                return Incoming::Ignored;
            };
            if intent_id.is_empty() {
                return Incoming::Ignored;
            }
            let declined = (kind == "payment_intent.payment_failed").then(|| {
                object
                    .pointer("/last_payment_error/decline_code")
                    .and_then(Value::as_str)
                    .unwrap_or("generic_decline")
                    .to_owned()
            });
            Incoming::Outcome {
                payment_id: payment_id.to_owned(),
                intent_id: intent_id.to_owned(),
                declined,
            }
        }
        "charge.refunded" | "charge.dispute.created" => {
            let intent_id = str_field(object, "payment_intent");
            if intent_id.is_empty() || intent_id.len() > 255 {
                return Incoming::Ignored;
            }
            let object_id = str_field(object, "id");
            let reversal = if kind == "charge.refunded" {
                Reversal::refund_of_charge(
                    object_id,
                    object.get("refunded").and_then(Value::as_bool),
                    object.get("amount").and_then(Value::as_i64),
                    object.get("amount_refunded").and_then(Value::as_i64),
                )
            } else {
                Reversal::Dispute {
                    reference: object_id.to_owned(),
                }
            };
            Incoming::Reversal {
                intent_id: intent_id.to_owned(),
                reversal,
            }
        }
        _ => Incoming::Ignored,
    }
}

/// How an authenticated event was taken; its label is the `result` of
/// `payment_webhooks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Applied,
    Duplicate,
    Ignored,
}

impl Answer {
    fn label(self) -> &'static str {
        match self {
            Answer::Applied => "applied",
            Answer::Duplicate => "duplicate",
            Answer::Ignored => "ignored",
        }
    }

    fn body(self) -> Value {
        match self {
            Answer::Applied => json!({"received": true}),
            Answer::Duplicate => json!({"received": true, "duplicate": true}),
            Answer::Ignored => json!({"received": true, "ignored": true}),
        }
    }
}

fn unix_now() -> i64 {
    // The signature's freshness is judged against the provider's clock, so the local clock
    // is the right reference here (not a business deadline; see docs/decisions.md).
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn count(state: &PaymentsState, result: &str) {
    state.metrics.webhooks.with_label_values(&[result]).inc();
}

/// A signed payment-provider event (`Stripe-Signature`)
#[utoipa::path(post, path = "/webhooks/payments", tag = tags::PAYMENTS, security(),
    params(("Stripe-Signature" = String, Header)),
    request_body = Object,
    responses(
        (status = 200, description = "OK", body = inline(Received)),
        (status = 400, response = doc::BadRequest),
        (status = 413, response = doc::TooLarge),
        (status = 503, response = doc::Unavailable),
    ))]
async fn receive(
    State(state): State<PaymentsState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<axum::Json<Value>> {
    let settings = &state.settings;
    let header = headers
        .get(SIGNATURE_HEADER)
        .map(|v| v.to_str().map_err(|_| SignatureError::Malformed))
        .transpose();
    let verified = header.and_then(|h| {
        verify_signature(
            h,
            &body,
            &settings.webhook_secrets,
            unix_now(),
            settings.webhook_tolerance_s,
        )
    });
    if let Err(e) = verified {
        count(&state, "bad_signature");
        return Err(PaymentError::BadSignature(e).into());
    }
    let event: Event = serde_json::from_slice(&body).map_err(|_| PaymentError::MalformedEvent)?;
    let answer = match classify(&event.kind, &event.data.object) {
        Incoming::Outcome {
            payment_id,
            intent_id,
            declined,
        } => apply_outcome(&state, &event, &payment_id, &intent_id, declined.as_deref()).await?,
        Incoming::Reversal {
            intent_id,
            reversal,
        } => apply_reversal(&state, &event, &intent_id, &reversal).await?,
        Incoming::Ignored => Answer::Ignored,
    };
    count(&state, answer.label());
    Ok(axum::Json(answer.body()))
}

/// `payment_intent.succeeded` / `payment_intent.payment_failed`: the attempt's outcome.
async fn apply_outcome(
    state: &PaymentsState,
    event: &Event,
    payment_id: &str,
    intent_id: &str,
    declined: Option<&str>,
) -> PaymentResult<Answer> {
    let charge = charge_of(&event.data.object, intent_id);
    let charge = &charge;
    if declined.is_none() {
        // One statement instead of a transaction for the success that follows a pay answer.
        match repo::record_settled_success(
            &state.pool,
            &event.id,
            &event.kind,
            payment_id,
            intent_id,
        )
        .await?
        {
            repo::Settled::Recorded => return Ok(Answer::Applied),
            repo::Settled::Duplicate => return Ok(Answer::Duplicate),
            repo::Settled::Open => {}
        }
    }
    let applied = db::retry(3, || async {
        let mut tx = state
            .pool
            .begin()
            .await
            .statement("begin the webhook transaction")?;
        let Some(attempt) =
            repo::record_outcome_event_tx(&mut tx, &event.id, &event.kind, payment_id).await?
        else {
            return Ok::<_, PaymentError>(None);
        };
        let outcome = match declined {
            None => {
                let outcome =
                    transitions::apply_success_seen_tx(&mut tx, payment_id, attempt, charge)
                        .await?;
                if let Success::Mismatch { .. } = outcome {
                    // Nothing is kept, not even the event's id: it is recorded only once its
                    // money is back, so a failed refund is retried with the event.
                    return Ok(Some(outcome));
                }
                outcome
            }
            Some(code) => {
                transitions::apply_decline_tx(&mut tx, payment_id, intent_id, code).await?;
                Success::Unknown
            }
        };
        tx.commit()
            .await
            .statement("commit the webhook transaction")?;
        Ok(Some(outcome))
    })
    .await?;
    let Some(outcome) = applied else {
        return Ok(Answer::Duplicate);
    };
    if let Success::Mismatch { intent_id } = &outcome {
        if !flow::refund_mismatch(&state.clients(), payment_id, intent_id, "webhook").await {
            // Answer non-2xx: the provider retries the event (the refund's key makes every
            // retry the same refund).
            return Err(PaymentError::ProviderLookup(ProviderError::Unavailable {
                status: None,
            }));
        }
        let mut conn = state
            .pool
            .acquire()
            .await
            .statement("acquire a connection")?;
        repo::record_event_tx(&mut conn, &event.id, &event.kind, payment_id).await?;
        return Ok(Answer::Applied);
    }
    if let Success::RefundNeeded {
        payment_id,
        provider_payment_id,
    } = &outcome
    {
        // A failed refund stays refund_pending for reconciliation; the event itself is applied.
        let _refunded = flow::refund(&state.clients(), payment_id, provider_payment_id).await;
    }
    Ok(Answer::Applied)
}

/// `charge.refunded` / `charge.dispute.created`: a refund or dispute at the provider
/// ([`reversal`]). The charge or dispute names its payment intent; the attempt is found by
/// the payment's metadata, by the intent id we recorded, or — when this event overtook the
/// success that would have recorded it — by asking the provider for the intent.
async fn apply_reversal(
    state: &PaymentsState,
    event: &Event,
    intent_id: &str,
    reversal: &Reversal,
) -> PaymentResult<Answer> {
    let Some(payment_id) = find_payment(state, &event.data.object, intent_id).await? else {
        return Ok(Answer::Ignored);
    };
    let applied = db::retry(3, || async {
        let mut tx = state
            .pool
            .begin()
            .await
            .statement("begin the webhook transaction")?;
        if !repo::record_event_tx(&mut tx, &event.id, &event.kind, &payment_id).await? {
            return Ok::<_, PaymentError>(None);
        }
        let charge = charge_of(&event.data.object, intent_id);
        let outcome =
            reversal::apply_tx(&mut tx, &payment_id, intent_id, Some(&charge), reversal).await?;
        tx.commit()
            .await
            .statement("commit the webhook transaction")?;
        Ok(Some(outcome))
    })
    .await?;
    let Some(outcome) = applied else {
        return Ok(Answer::Duplicate);
    };
    match &outcome {
        Reversed::Order {
            order_id,
            status,
            tickets_voided,
            released_skus,
        } => {
            tracing::info!(order_id = %order_id, payment_id = %payment_id, status, tickets_voided,
                "paid order reversed at the provider");
            state.metrics.reversals.with_label_values(&[*status]).inc();
            // Returned units of hot SKUs: let the flash gate admit them again.
            for sku in released_skus {
                if let Err(e) =
                    crate::orders::flash::reconcile(&state.pool, &state.redis, sku).await
                {
                    tracing::warn!(error = ?e, sku, "flash gate reconcile after a refund failed");
                }
            }
        }
        Reversed::Partial => {
            tracing::warn!(payment_id = %payment_id, "partial refund at the provider: order kept");
        }
        other => {
            tracing::info!(payment_id = %payment_id, outcome = ?other, "reversal changed nothing")
        }
    }
    Ok(Answer::Applied)
}

/// Our attempt behind a provider payment intent, or `None` when it is not ours.
async fn find_payment(
    state: &PaymentsState,
    object: &Value,
    intent_id: &str,
) -> PaymentResult<Option<String>> {
    if let Some(id) = meta(object, "payment_id") {
        return Ok(Some(id.to_owned()));
    }
    if let Some(known) = repo::payment_by_provider_id(&state.pool, intent_id).await? {
        return Ok(Some(known));
    }
    // Not recorded yet (this event overtook the success): the intent carries our metadata.
    match state.provider.retrieve(intent_id).await {
        Ok(p) => Ok(p.meta("payment_id").map(str::to_owned)),
        Err(ProviderError::Rejected { status: 404, .. }) => Ok(None),
        // Answer non-2xx: the provider retries the event later.
        Err(e) => Err(PaymentError::ProviderLookup(e)),
    }
}

#[cfg(test)]
mod tests;
