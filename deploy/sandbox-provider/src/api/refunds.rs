//! `POST /v1/refunds` (`payment_intent` or `charge`, optional `amount`, `reason`,
//! `metadata`), at most once per idempotency key and never past the charge; `GET
//! /v1/refunds/{id}` (listing is [`super::lists`]); and the Charge object that
//! `charge.refunded` carries.

use super::{
    ApiErr, Halt, Shared, answer, authorize, begin, content_type, detached, halt, idempotency_key,
    injected_failure, request_id, simulate_latency,
};
use crate::SandboxInner;
use crate::form::Form;
use crate::store::{Intent, Refund, RefundError};
use crate::webhooks::{self, Origin};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

const REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

pub async fn create(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    detached(async move { create_inner(&inner, &headers, &body).await }).await
}

async fn create_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let mut form = Form::parse(content_type(headers), body).map_err(halt)?;
    let fp = form.fingerprint().to_owned();
    let parsed = (|| {
        let intent = form.take("payment_intent")?;
        let charge = form.take("charge")?;
        let amount = form.take_i64("amount")?;
        let reason = form.take("reason")?;
        let metadata = form.take_metadata()?;
        std::mem::take(&mut form).finish()?;
        Ok::<_, ApiErr>((intent, charge, amount, reason, metadata))
    })();
    let (intent_id, charge, amount, reason, metadata) = parsed.map_err(halt)?;
    if matches!(amount, Some(a) if a < 1) {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid_integer",
            Some("amount"),
            "This value must be greater than or equal to 1.",
        )));
    }
    if let Some(r) = &reason
        && !REASONS.contains(&r.as_str())
    {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid",
            Some("reason"),
            &format!("Invalid reason: must be one of {}", REASONS.join(", ")),
        )));
    }
    let intent_id = match (intent_id, charge) {
        (Some(pi), None) => pi,
        (None, Some(ch)) => match inner.store.intent_by_charge(&ch) {
            Some(i) => i.id,
            None => return Err(halt(ApiErr::missing("charge", &ch))),
        },
        _ => {
            return Err(halt(ApiErr::invalid(
                "parameter_missing",
                Some("payment_intent"),
                "Give exactly one of payment_intent or charge.",
            )));
        }
    };
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "refunds.create", &fp)?;
    if rand::random::<f64>() < inner.settings().failure_rate {
        if let Some(k) = &key {
            inner.store.idem_forget(k);
        }
        return Err(halt(injected_failure()));
    }
    let request = request_id();
    let (status, body, event) = match refund(inner, &intent_id, amount, reason, metadata) {
        Ok((refund, charge)) => (StatusCode::OK, refund, Some(charge)),
        Err(e) => (e.status, e.body, None),
    };
    if let Some(k) = &key {
        inner.store.idem_finish(k, status.as_u16(), &body);
    }
    if let Some(charge) = event {
        let origin = Origin {
            request_id: Some(&request),
            idempotency_key: key.as_deref(),
        };
        webhooks::emit(inner, webhooks::event("charge.refunded", charge, &origin)).await;
    }
    Ok(answer(status, body, &request))
}

pub async fn retrieve(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    simulate_latency(&inner).await;
    match inner.store.refund_by_id(&id) {
        Some(r) => axum::Json(r).into_response(),
        None => ApiErr::missing("refund", &id).into_response(),
    }
}

/// Refunds `amount` (default: the rest) of an intent in one locked step; returns the refund
/// and the charge as `charge.refunded` carries it.
pub fn refund(
    inner: &SandboxInner,
    intent_id: &str,
    amount: Option<i64>,
    reason: Option<String>,
    metadata: BTreeMap<String, String>,
) -> Result<(Value, Value), ApiErr> {
    let refund = Refund {
        id: format!("re_{}", shared::ids::new_id()),
        object: "refund",
        amount: amount.unwrap_or(0),
        currency: String::new(),
        payment_intent: intent_id.to_owned(),
        charge: None,
        reason,
        status: "succeeded",
        created: webhooks::unix_now(),
        metadata,
    };
    match inner.store.refund(intent_id, refund) {
        Ok((refund, intent)) => {
            let refunds = inner.store.refunds_of(&intent.id);
            let body = serde_json::to_value(&refund).unwrap_or(Value::Null);
            Ok((body, charge_object(&intent, &refunds)))
        }
        Err(e) => Err(refund_error(&e, intent_id)),
    }
}

/// The charge behind a succeeded intent, as `charge.*` events carry it (Stripe's Charge:
/// `payment_intent`, `amount`, `amount_refunded`, `refunded`, and its `refunds` list).
pub fn charge_object(intent: &Intent, refunds: &[Refund]) -> Value {
    json!({
        "id": intent.latest_charge,
        "object": "charge",
        "amount": intent.amount,
        "amount_captured": intent.amount,
        "amount_refunded": intent.amount_refunded,
        "captured": true,
        "currency": intent.currency,
        "livemode": false,
        "paid": true,
        "payment_intent": intent.id,
        "payment_method": intent.payment_method,
        "refunded": intent.amount_refunded >= intent.amount,
        "refunds": {
            "object": "list",
            "data": refunds,
            "has_more": false,
            "total_count": refunds.len(),
            "url": format!("/v1/charges/{}/refunds", intent.latest_charge.as_deref().unwrap_or("")),
        },
        "status": "succeeded",
        "created": intent.created,
        "metadata": intent.metadata,
    })
}

pub fn refund_error(e: &RefundError, intent_id: &str) -> ApiErr {
    match e {
        RefundError::NoSuchIntent => ApiErr::missing("payment_intent", intent_id),
        RefundError::NotCharged => ApiErr::invalid(
            "charge_not_succeeded",
            Some("payment_intent"),
            &e.to_string(),
        ),
        RefundError::AlreadyRefunded => {
            ApiErr::invalid("charge_already_refunded", None, &e.to_string())
        }
        RefundError::TooMuch => ApiErr::invalid("amount_too_large", Some("amount"), &e.to_string()),
    }
}
