//! `/v1/payment_intents`: create (optionally with `confirm=true`), confirm, cancel, retrieve,
//! search (update is [`super::intent_update`], list [`super::lists`]).
//!
//! Test payment methods (Stripe's names where Stripe has one):
//! - `pm_card_visa`, `pm_card_mastercard`, `pm_card_amex`: succeed (subject to the configured
//!   decline and timeout rates);
//! - `pm_card_chargeDeclined` (`generic_decline`), `pm_card_chargeDeclinedInsufficientFunds`
//!   (`insufficient_funds`), `pm_card_chargeDeclinedExpiredCard` (`expired_card`): decline,
//!   `402 card_error` carrying the intent (`requires_payment_method`, `last_payment_error`);
//! - `pm_card_authenticationRequired`, `pm_card_threeDSecure2Required`: `requires_action`
//!   (3-D Secure: nothing is charged until the customer authenticates);
//! - `pm_card_sandbox_processing`: `processing` (the bank has not answered yet).
//!   The last two settle later through `POST /_sandbox/payment_intents/{id}/complete`;
//! - `pm_card_sandbox_timeout`: the charge succeeds but the response is held back
//!   `timeout_delay_ms` (a client timeout after the money moved);
//! - `pm_card_sandbox_error`: `500` before anything happens.

use super::{
    ApiErr, Halt, Shared, answer, authorize, begin, content_type, detached, halt, idempotency_key,
    injected_failure, request_id, simulate_latency,
};
use crate::SandboxInner;
use crate::config::SandboxSettings;
use crate::form::Form;
use crate::store::Intent;
use crate::webhooks::{self, Origin};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

enum Outcome {
    Succeed { delayed: bool },
    Decline(&'static str),
    RequiresAction,
    Processing,
}

fn decide(method: &str, s: &SandboxSettings) -> Option<Outcome> {
    let good = || {
        if rand::random::<f64>() < s.decline_rate {
            Outcome::Decline("generic_decline")
        } else {
            Outcome::Succeed {
                delayed: rand::random::<f64>() < s.timeout_rate,
            }
        }
    };
    Some(match method {
        "pm_card_visa" | "pm_card_mastercard" | "pm_card_amex" => good(),
        "pm_card_sandbox_timeout" => Outcome::Succeed { delayed: true },
        "pm_card_chargeDeclined" => Outcome::Decline("generic_decline"),
        "pm_card_chargeDeclinedInsufficientFunds" => Outcome::Decline("insufficient_funds"),
        "pm_card_chargeDeclinedExpiredCard" => Outcome::Decline("expired_card"),
        "pm_card_authenticationRequired" | "pm_card_threeDSecure2Required" => {
            Outcome::RequiresAction
        }
        "pm_card_sandbox_processing" => Outcome::Processing,
        // Known, but fails before anything happens (see `create`).
        "pm_card_sandbox_error" => good(),
        _ => return None,
    })
}

/// Stripe's checks of `amount` (create and update).
pub(super) fn check_amount(amount: i64) -> Result<(), ApiErr> {
    if amount < 1 {
        return Err(ApiErr::invalid(
            "parameter_invalid_integer",
            Some("amount"),
            "This value must be greater than or equal to 1.",
        ));
    }
    Ok(())
}

/// A three-letter code (the sandbox knows no list of currencies).
pub(super) fn check_currency(currency: &str) -> Result<(), ApiErr> {
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(ApiErr::invalid(
            "parameter_invalid",
            Some("currency"),
            &format!("Invalid currency: {currency}"),
        ));
    }
    Ok(())
}

/// A test payment method the sandbox knows (see the module's list).
pub(super) fn check_method(pm: &str, s: &SandboxSettings) -> Result<(), ApiErr> {
    match decide(pm, s) {
        Some(_) => Ok(()),
        None => Err(no_such_method(pm)),
    }
}

fn no_such_method(pm: &str) -> ApiErr {
    ApiErr::invalid(
        "resource_missing",
        Some("payment_method"),
        &format!("No such PaymentMethod: '{pm}'"),
    )
}

/// What confirming did: the answer, the event announcing it, and whether the answer is held
/// back (the timeout card).
pub struct Charged {
    status: StatusCode,
    body: Value,
    event: (&'static str, Value),
    delayed: bool,
}

/// The card error a decline carries (on the intent and in the `402`).
pub fn card_error(code: &str, pm: &str) -> Value {
    json!({
        "type": "card_error",
        "code": "card_declined",
        "decline_code": code,
        "message": "Your card was declined.",
        "param": "",
        "payment_method": {"id": pm, "object": "payment_method", "type": "card"},
    })
}

/// Confirms `intent` with its payment method: decides the card's answer and applies it.
/// Pure over the intent, so the caller can run it under the store's lock.
fn confirm_intent(intent: &mut Intent, settings: &SandboxSettings) -> Result<Charged, ApiErr> {
    let pm = intent.payment_method.clone().ok_or_else(|| {
        ApiErr::invalid(
            "payment_intent_unexpected_state",
            Some("payment_method"),
            "You cannot confirm this PaymentIntent because it's missing a payment method.",
        )
    })?;
    let outcome = decide(&pm, settings).ok_or_else(|| no_such_method(&pm))?;
    intent.last_payment_error = None;
    intent.next_action = None;
    let ok = |intent: &Intent, kind| {
        let body = serde_json::to_value(intent).unwrap_or(Value::Null);
        (StatusCode::OK, body.clone(), (kind, body))
    };
    let (status, body, event, delayed) = match outcome {
        Outcome::Succeed { delayed } => {
            intent.status = "succeeded".into();
            intent.amount_received = intent.amount;
            intent.latest_charge = Some(format!("ch_{}", shared::ids::new_id()));
            let (s, b, e) = ok(intent, "payment_intent.succeeded");
            (s, b, e, delayed)
        }
        Outcome::RequiresAction => {
            intent.status = "requires_action".into();
            intent.next_action = Some(json!({
                "type": "use_stripe_sdk",
                "use_stripe_sdk": {"type": "three_d_secure_redirect"},
            }));
            let (s, b, e) = ok(intent, "payment_intent.requires_action");
            (s, b, e, false)
        }
        Outcome::Processing => {
            intent.status = "processing".into();
            let (s, b, e) = ok(intent, "payment_intent.processing");
            (s, b, e, false)
        }
        Outcome::Decline(code) => {
            intent.status = "requires_payment_method".into();
            let error = card_error(code, &pm);
            intent.last_payment_error = Some(error.clone());
            let object = serde_json::to_value(&*intent).unwrap_or(Value::Null);
            let mut error = error;
            error["payment_intent"] = object.clone();
            (
                StatusCode::PAYMENT_REQUIRED,
                json!({"error": error}),
                ("payment_intent.payment_failed", object),
                false,
            )
        }
    };
    Ok(Charged {
        status,
        body,
        event,
        delayed,
    })
}

/// Stores the answer under its key, sends the event, holds the answer back if asked.
async fn finish(
    inner: &Arc<SandboxInner>,
    key: Option<&str>,
    request: &str,
    charged: Charged,
) -> Response {
    if let Some(k) = key {
        inner
            .store
            .idem_finish(k, charged.status.as_u16(), &charged.body);
    }
    let (kind, object) = charged.event;
    let origin = Origin {
        request_id: Some(request),
        idempotency_key: key,
    };
    webhooks::emit(inner, webhooks::event(kind, object, &origin)).await;
    if charged.delayed {
        let ms = inner.settings().timeout_delay_ms;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    answer(charged.status, charged.body, request)
}

/// Forgets the key of a request that did nothing, so that its retry runs afresh (as Stripe
/// does for errors before execution), and answers `e`.
pub(super) fn abandon(inner: &SandboxInner, key: Option<&str>, e: ApiErr) -> Halt {
    if let Some(k) = key {
        inner.store.idem_forget(k);
    }
    halt(e)
}

pub async fn create(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    detached(async move { create_inner(&inner, &headers, &body).await }).await
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, ApiErr> {
    v.ok_or_else(|| {
        ApiErr::invalid(
            "parameter_missing",
            Some(name),
            &format!("Missing required param: {name}."),
        )
    })
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
        let amount = required(form.take_i64("amount")?, "amount")?;
        let currency = required(form.take("currency")?, "currency")?;
        let payment_method = form.take("payment_method")?;
        let confirm = form.take_bool("confirm")?.unwrap_or(false);
        let metadata = form.take_metadata()?;
        let types = form.take_list("payment_method_types");
        let description = form.take("description")?.filter(|d| !d.is_empty());
        let receipt_email = form.take("receipt_email")?.filter(|e| !e.is_empty());
        // Accepted for Stripe compatibility; the sandbox has no use for them.
        let _ = form.take("return_url")?;
        let _ = form.take_map("automatic_payment_methods")?;
        if let Some(m) = form.take("capture_method")?
            && m != "automatic"
        {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                Some("capture_method"),
                "The sandbox captures automatically: capture_method must be automatic.",
            ));
        }
        std::mem::take(&mut form).finish()?;
        Ok::<_, ApiErr>((
            amount,
            currency,
            payment_method,
            confirm,
            metadata,
            types,
            description,
            receipt_email,
        ))
    })();
    let (amount, currency, payment_method, confirm, metadata, types, description, receipt_email) =
        parsed.map_err(halt)?;
    check_amount(amount).map_err(halt)?;
    check_currency(&currency).map_err(halt)?;
    if let Some(t) = types.iter().find(|t| *t != "card") {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid",
            Some("payment_method_types"),
            &format!("The sandbox takes card payments only, not {t}."),
        )));
    }
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "payment_intents.create", &fp)?;
    let settings = inner.settings();
    if payment_method.as_deref() == Some("pm_card_sandbox_error")
        || rand::random::<f64>() < settings.failure_rate
    {
        return Err(abandon(inner, key.as_deref(), injected_failure()));
    }
    if let Some(pm) = &payment_method
        && decide(pm, &settings).is_none()
    {
        return Err(abandon(inner, key.as_deref(), no_such_method(pm)));
    }
    let mut intent = Intent {
        id: format!("pi_{}", shared::ids::new_id()),
        object: "payment_intent",
        amount,
        amount_refunded: 0,
        amount_received: 0,
        currency: currency.to_ascii_lowercase(),
        status: if payment_method.is_some() {
            "requires_confirmation".into()
        } else {
            "requires_payment_method".into()
        },
        payment_method,
        payment_method_types: vec!["card".into()],
        capture_method: "automatic",
        confirmation_method: "automatic",
        livemode: false,
        metadata,
        description,
        receipt_email,
        created: webhooks::unix_now(),
        latest_charge: None,
        last_payment_error: None,
        next_action: None,
        canceled_at: None,
        cancellation_reason: None,
    };
    let request = request_id();
    if !confirm {
        let body = serde_json::to_value(&intent).unwrap_or(Value::Null);
        inner.store.insert_intent(intent);
        if let Some(k) = &key {
            inner.store.idem_finish(k, 200, &body);
        }
        return Ok(answer(StatusCode::OK, body, &request));
    }
    let charged = match confirm_intent(&mut intent, &settings) {
        Ok(c) => c,
        Err(e) => return Err(abandon(inner, key.as_deref(), e)),
    };
    inner.store.insert_intent(intent);
    Ok(finish(inner, key.as_deref(), &request, charged).await)
}

pub async fn confirm(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    detached(async move { confirm_inner(&inner, &headers, &id, &body).await }).await
}

async fn confirm_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let mut form = Form::parse(content_type(headers), body).map_err(halt)?;
    let fp = format!("{id}?{}", form.fingerprint());
    let parsed = (|| {
        let pm = form.take("payment_method")?;
        let _ = form.take("return_url")?;
        std::mem::take(&mut form).finish()?;
        Ok::<_, ApiErr>(pm)
    })();
    let payment_method = parsed.map_err(halt)?;
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "payment_intents.confirm", &fp)?;
    let settings = inner.settings();
    if payment_method.as_deref() == Some("pm_card_sandbox_error")
        || rand::random::<f64>() < settings.failure_rate
    {
        return Err(abandon(inner, key.as_deref(), injected_failure()));
    }
    // The status check and the charge are one step under the store's lock: two confirms of
    // one intent cannot both charge.
    let result = inner.store.update_intent(id, |intent| {
        if !matches!(
            intent.status.as_str(),
            "requires_payment_method" | "requires_confirmation"
        ) {
            let mut e = ApiErr::invalid(
                "payment_intent_unexpected_state",
                None,
                &format!(
                    "This PaymentIntent's status is {}, so it cannot be confirmed.",
                    intent.status
                ),
            );
            e.body["error"]["payment_intent"] = serde_json::to_value(&*intent).unwrap_or_default();
            return Err(e);
        }
        if let Some(pm) = &payment_method {
            if decide(pm, &settings).is_none() {
                return Err(no_such_method(pm));
            }
            intent.payment_method = Some(pm.clone());
        }
        confirm_intent(intent, &settings)
    });
    let charged = match result {
        None => {
            return Err(abandon(
                inner,
                key.as_deref(),
                ApiErr::missing("payment_intent", id),
            ));
        }
        Some(Err(e)) => return Err(abandon(inner, key.as_deref(), e)),
        Some(Ok(c)) => c,
    };
    Ok(finish(inner, key.as_deref(), &request_id(), charged).await)
}

pub async fn cancel(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    detached(async move { cancel_inner(&inner, &headers, &id, &body).await }).await
}

/// The statuses Stripe lets a PaymentIntent be canceled from.
const CANCELABLE: [&str; 5] = [
    "requires_payment_method",
    "requires_capture",
    "requires_confirmation",
    "requires_action",
    "processing",
];

const CANCELLATION_REASONS: [&str; 4] = [
    "duplicate",
    "fraudulent",
    "requested_by_customer",
    "abandoned",
];

/// `POST /v1/payment_intents/{id}/cancel` (optional `cancellation_reason`): as Stripe, only
/// an intent that has not taken money can be canceled (`canceled`, `canceled_at`, event
/// `payment_intent.canceled`); any other status is `400 payment_intent_unexpected_state`
/// carrying the intent. A canceled intent can no longer be confirmed or completed.
async fn cancel_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let mut form = Form::parse(content_type(headers), body).map_err(halt)?;
    let fp = format!("{id}?{}", form.fingerprint());
    let parsed = (|| {
        let reason = form.take("cancellation_reason")?;
        std::mem::take(&mut form).finish()?;
        Ok::<_, ApiErr>(reason)
    })();
    let reason = parsed.map_err(halt)?;
    if let Some(r) = &reason
        && !CANCELLATION_REASONS.contains(&r.as_str())
    {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid",
            Some("cancellation_reason"),
            &format!(
                "Invalid cancellation_reason: must be one of {}",
                CANCELLATION_REASONS.join(", ")
            ),
        )));
    }
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "payment_intents.cancel", &fp)?;
    // The status check and the change are one step under the store's lock: a cancel and a
    // completion of one intent cannot both happen.
    let result = inner.store.update_intent(id, |intent| {
        if !CANCELABLE.contains(&intent.status.as_str()) {
            let mut e = ApiErr::invalid(
                "payment_intent_unexpected_state",
                None,
                &format!(
                    "You cannot cancel this PaymentIntent because it has a status of {}. Only a \
                     PaymentIntent with one of the following statuses may be canceled: {}.",
                    intent.status,
                    CANCELABLE.join(", ")
                ),
            );
            e.body["error"]["payment_intent"] = serde_json::to_value(&*intent).unwrap_or_default();
            return Err(e);
        }
        intent.status = "canceled".into();
        intent.next_action = None;
        intent.canceled_at = Some(webhooks::unix_now());
        intent.cancellation_reason = reason.clone();
        Ok(serde_json::to_value(&*intent).unwrap_or(Value::Null))
    });
    let body = match result {
        None => {
            return Err(abandon(
                inner,
                key.as_deref(),
                ApiErr::missing("payment_intent", id),
            ));
        }
        Some(Err(e)) => return Err(abandon(inner, key.as_deref(), e)),
        Some(Ok(b)) => b,
    };
    let charged = Charged {
        status: StatusCode::OK,
        body: body.clone(),
        event: ("payment_intent.canceled", body),
        delayed: false,
    };
    Ok(finish(inner, key.as_deref(), &request_id(), charged).await)
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
    match inner.store.intent(&id) {
        Some(i) => axum::Json(i).into_response(),
        None => ApiErr::missing("payment_intent", &id).into_response(),
    }
}

/// Stripe search syntax, the one clause reconciliation needs: `metadata['key']:'value'`.
fn parse_metadata_query(q: &str) -> Option<(&str, &str)> {
    let rest = q.trim().strip_prefix("metadata['")?;
    let (key, rest) = rest.split_once("']:'")?;
    let value = rest.strip_suffix('\'')?;
    if key.is_empty() || value.contains('\'') {
        return None;
    }
    Some((key, value))
}

pub async fn search(
    State(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    simulate_latency(&inner).await;
    let Some((key, value)) = q.get("query").and_then(|q| parse_metadata_query(q)) else {
        return ApiErr::invalid(
            "parameter_invalid",
            Some("query"),
            "query must look like metadata['order_id']:'value'",
        )
        .into_response();
    };
    // The search index lags behind writes (see `search_lag_s`).
    let lag = i64::try_from(inner.settings().search_lag_s).unwrap_or(i64::MAX);
    let indexed_before = webhooks::unix_now().saturating_sub(lag);
    let data: Vec<Intent> = inner
        .store
        .search_metadata(key, value)
        .into_iter()
        .filter(|i| lag == 0 || i.created <= indexed_before)
        .collect();
    axum::Json(
        json!({"object": "search_result", "url": "/v1/payment_intents/search",
                      "data": data, "has_more": false, "next_page": null}),
    )
    .into_response()
}

/// Settles an intent left `requires_action` / `processing` (the customer authenticated, or
/// the bank answered): `succeeded` or declined, announced like a confirm's outcome.
pub fn settle(
    inner: &SandboxInner,
    id: &str,
    succeed: bool,
) -> Option<Result<(&'static str, Value), ApiErr>> {
    inner.store.update_intent(id, |intent| {
        if !matches!(intent.status.as_str(), "requires_action" | "processing") {
            return Err(ApiErr::invalid(
                "payment_intent_unexpected_state",
                None,
                &format!(
                    "This PaymentIntent's status is {}: nothing to complete.",
                    intent.status
                ),
            ));
        }
        intent.next_action = None;
        let kind = if succeed {
            intent.status = "succeeded".into();
            intent.amount_received = intent.amount;
            intent.latest_charge = Some(format!("ch_{}", shared::ids::new_id()));
            "payment_intent.succeeded"
        } else {
            intent.status = "requires_payment_method".into();
            let pm = intent.payment_method.clone().unwrap_or_default();
            intent.last_payment_error = Some(card_error("authentication_required", &pm));
            "payment_intent.payment_failed"
        };
        Ok((kind, serde_json::to_value(&*intent).unwrap_or(Value::Null)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_query() {
        assert_eq!(
            parse_metadata_query("metadata['order_id']:'abc'"),
            Some(("order_id", "abc"))
        );
        assert_eq!(parse_metadata_query("status:'succeeded'"), None);
        assert_eq!(parse_metadata_query("metadata['order_id']:'a'b'"), None);
    }
}
