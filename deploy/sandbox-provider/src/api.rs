//! The Stripe-style HTTP API (JSON bodies instead of Stripe's form encoding) and the
//! `/_sandbox/*` test/operator endpoints.
//!
//! Test payment methods (Stripe's names where Stripe has one):
//! - `pm_card_visa`, `pm_card_mastercard`, `pm_card_amex`: succeed (subject to the configured
//!   decline and timeout rates);
//! - `pm_card_chargeDeclined` (`generic_decline`), `pm_card_chargeDeclinedInsufficientFunds`
//!   (`insufficient_funds`), `pm_card_chargeDeclinedExpiredCard` (`expired_card`): decline;
//! - `pm_card_sandbox_timeout`: the charge succeeds but the response is held back
//!   `timeout_delay_ms` (a client timeout after the money moved);
//! - `pm_card_sandbox_error`: `500` before anything happens.
//!
//! "Dashboard" actions (what an operator or the card network does on the provider's side,
//! outside the merchant's API calls), each announced by its Stripe-shaped webhook:
//! - `POST /_sandbox/payment_intents/{id}/refund` (`{"amount": n}` optional, default the
//!   rest) → `charge.refunded` with the charge as `data.object`;
//! - `POST /_sandbox/payment_intents/{id}/dispute` (`{"reason": "..."}` optional) →
//!   `charge.dispute.created` with the dispute (`charge`, `payment_intent`) as `data.object`.

use crate::SandboxInner;
use crate::store::{Dispute, DisputeError, IdemBegin, Intent, Refund, RefundError};
use crate::webhooks;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

type Shared = State<Arc<SandboxInner>>;

pub fn router(inner: Arc<SandboxInner>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/v1/payment_intents", post(create_intent))
        .route("/v1/payment_intents/search", get(search_intents))
        .route("/v1/payment_intents/{id}", get(get_intent))
        .route("/v1/refunds", post(create_refund))
        .route("/_sandbox/orders/{order_id}", get(order_summary))
        .route(
            "/_sandbox/payment_intents/{id}/refund",
            post(dashboard_refund),
        )
        .route(
            "/_sandbox/payment_intents/{id}/dispute",
            post(dashboard_dispute),
        )
        .route("/_sandbox/stats", get(stats))
        .route("/_sandbox/webhooks", get(deliveries))
        .route("/_sandbox/webhooks/flush", post(flush))
        .with_state(inner)
}

/// A Stripe-shaped error: `{"error": {"type", "code", "message", ...}}`.
#[derive(Debug)]
pub struct ApiErr {
    status: StatusCode,
    body: Value,
}

impl ApiErr {
    fn new(status: StatusCode, kind: &str, code: &str, message: &str) -> Self {
        Self {
            status,
            body: json!({"error": {"type": kind, "code": code, "message": message}}),
        }
    }

    fn invalid(code: &str, message: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

fn authorize(inner: &SandboxInner, headers: &HeaderMap) -> Result<(), ApiErr> {
    use subtle::ConstantTimeEq;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let settings = inner.settings();
    let expected = settings.api_key.expose_secret().as_bytes();
    if !expected.is_empty() && bool::from(expected.ct_eq(presented.as_bytes())) {
        Ok(())
    } else {
        Err(ApiErr::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "Invalid API Key provided.",
        ))
    }
}

async fn simulate_latency(inner: &SandboxInner) {
    let s = inner.settings();
    let jitter = if s.latency_jitter_ms > 0 {
        rand::random::<u64>() % (s.latency_jitter_ms + 1)
    } else {
        0
    };
    let ms = s.latency_ms + jitter;
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Parses a JSON body into `T`, keeping the canonical text (sorted keys) as the idempotency
/// fingerprint.
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<(T, String), ApiErr> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|_| ApiErr::invalid("parameter_invalid", "Request body is not valid JSON."))?;
    let fingerprint = value.to_string();
    let parsed = serde_json::from_value(value)
        .map_err(|e| ApiErr::invalid("parameter_invalid", &format!("Invalid parameters: {e}")))?;
    Ok((parsed, fingerprint))
}

/// A body that may be left out: empty means every parameter takes its default.
fn parse_optional_body<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiErr> {
    if body.is_empty() {
        return Ok(T::default());
    }
    parse_body(body).map(|(parsed, _)| parsed)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiErr> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) if !s.is_empty() && s.len() <= 255 => Ok(Some(s.to_owned())),
            _ => Err(ApiErr::invalid(
                "idempotency_key_invalid",
                "Idempotency-Key must be 1 to 255 characters.",
            )),
        },
    }
}

fn injected_failure() -> ApiErr {
    ApiErr::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "api_error",
        "sandbox_injected_failure",
        "An error occurred with our connection to the provider (sandbox-injected).",
    )
}

/// An early answer (refusal or replay), boxed to keep `Result`s small.
type Halt = Box<Response>;

fn halt(r: impl IntoResponse) -> Halt {
    Box::new(r.into_response())
}

/// Claims the key; `Err` carries the response for a replay or a refusal.
fn begin(
    inner: &SandboxInner,
    key: Option<&str>,
    endpoint: &'static str,
    fp: &str,
) -> Result<(), Halt> {
    let Some(key) = key else { return Ok(()) };
    match inner.store.idem_begin(key, endpoint, fp) {
        IdemBegin::Run => Ok(()),
        IdemBegin::Replay { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut resp = (status, axum::Json(body)).into_response();
            resp.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Err(Box::new(resp))
        }
        IdemBegin::Mismatch => Err(halt(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            "idempotency_key_reused",
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        ))),
        IdemBegin::InFlight => Err(halt(ApiErr::new(
            StatusCode::CONFLICT,
            "idempotency_error",
            "idempotency_key_in_use",
            "There is currently another in-progress request using this Idempotent Key.",
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateIntent {
    amount: i64,
    currency: String,
    payment_method: String,
    #[serde(default)]
    confirm: Option<bool>,
    /// Accepted for Stripe compatibility; the sandbox has no use for it.
    #[serde(default, rename = "description")]
    _description: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

enum Outcome {
    Succeed { delayed: bool },
    Decline(&'static str),
}

fn decide(method: &str, s: &crate::config::SandboxSettings) -> Result<Outcome, ApiErr> {
    let good = |s: &crate::config::SandboxSettings| {
        if rand::random::<f64>() < s.decline_rate {
            Outcome::Decline("generic_decline")
        } else {
            Outcome::Succeed {
                delayed: rand::random::<f64>() < s.timeout_rate,
            }
        }
    };
    Ok(match method {
        "pm_card_visa" | "pm_card_mastercard" | "pm_card_amex" => good(s),
        "pm_card_sandbox_timeout" => Outcome::Succeed { delayed: true },
        "pm_card_chargeDeclined" => Outcome::Decline("generic_decline"),
        "pm_card_chargeDeclinedInsufficientFunds" => Outcome::Decline("insufficient_funds"),
        "pm_card_chargeDeclinedExpiredCard" => Outcome::Decline("expired_card"),
        other => {
            return Err(ApiErr::invalid(
                "resource_missing",
                &format!("No such PaymentMethod: '{other}'"),
            ));
        }
    })
}

async fn create_intent(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    // A real provider finishes what it started when the merchant's client gives up: run the
    // request in its own task so a client timeout (a dropped connection) does not cancel the
    // charge halfway through the simulated latency.
    let run = tokio::spawn(async move {
        match create_intent_inner(&inner, &headers, &body).await {
            Ok(r) => r,
            Err(r) => *r,
        }
    });
    run.await
        .unwrap_or_else(|_| injected_failure().into_response())
}

async fn create_intent_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let (params, fp): (CreateIntent, String) = parse_body(body).map_err(halt)?;
    if params.amount < 1 {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid_integer",
            "amount must be at least 1",
        )));
    }
    if params.currency.len() != 3 || !params.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid",
            "currency must be a 3-letter ISO code",
        )));
    }
    if params.confirm == Some(false) {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid",
            "the sandbox only supports confirm=true (charge immediately)",
        )));
    }
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "payment_intents.create", &fp)?;
    let settings = inner.settings();
    if params.payment_method == "pm_card_sandbox_error"
        || rand::random::<f64>() < settings.failure_rate
    {
        // Nothing happened: forget the key so the retry runs afresh (as Stripe does for
        // errors before execution).
        if let Some(k) = &key {
            inner.store.idem_forget(k);
        }
        return Err(halt(injected_failure()));
    }
    let outcome = match decide(&params.payment_method, &settings) {
        Ok(o) => o,
        Err(e) => {
            if let Some(k) = &key {
                inner.store.idem_forget(k);
            }
            return Err(halt(e));
        }
    };
    let id = format!("pi_{}", shared::ids::new_id());
    let mut intent = Intent {
        id,
        object: "payment_intent",
        amount: params.amount,
        amount_refunded: 0,
        currency: params.currency.to_ascii_lowercase(),
        status: String::new(),
        payment_method: params.payment_method.clone(),
        metadata: params.metadata,
        created: webhooks::unix_now(),
        latest_charge: None,
        last_payment_error: None,
    };
    let (status, body, event, delayed) = match outcome {
        Outcome::Succeed { delayed } => {
            intent.status = "succeeded".into();
            intent.latest_charge = Some(format!("ch_{}", shared::ids::new_id()));
            let body = serde_json::to_value(&intent).unwrap_or(Value::Null);
            let ev = webhooks::event("payment_intent.succeeded", body.clone());
            (StatusCode::OK, body, ev, delayed)
        }
        Outcome::Decline(code) => {
            intent.status = "requires_payment_method".into();
            let error = json!({
                "type": "card_error",
                "code": "card_declined",
                "decline_code": code,
                "message": "Your card was declined.",
                "payment_method": params.payment_method,
            });
            intent.last_payment_error = Some(error.clone());
            let object = serde_json::to_value(&intent).unwrap_or(Value::Null);
            let mut error = error;
            error["payment_intent"] = object.clone();
            let ev = webhooks::event("payment_intent.payment_failed", object);
            (
                StatusCode::PAYMENT_REQUIRED,
                json!({"error": error}),
                ev,
                false,
            )
        }
    };
    inner.store.insert_intent(intent);
    if let Some(k) = &key {
        inner.store.idem_finish(k, status.as_u16(), &body);
    }
    webhooks::emit(inner, event).await;
    if delayed {
        tokio::time::sleep(Duration::from_millis(settings.timeout_delay_ms)).await;
    }
    Ok((status, axum::Json(body)).into_response())
}

async fn get_intent(State(inner): Shared, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    simulate_latency(&inner).await;
    match inner.store.intent(&id) {
        Some(i) => axum::Json(i).into_response(),
        None => ApiErr::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "resource_missing",
            &format!("No such payment_intent: '{id}'"),
        )
        .into_response(),
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

async fn search_intents(
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
    axum::Json(json!({"object": "search_result", "data": data, "has_more": false})).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRefund {
    payment_intent: String,
    #[serde(default)]
    amount: Option<i64>,
    /// Accepted for Stripe compatibility; the sandbox has no use for it.
    #[serde(default, rename = "reason")]
    _reason: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

async fn create_refund(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    // As for charges: a client timeout does not cancel the refund at the provider.
    let run = tokio::spawn(async move {
        match create_refund_inner(&inner, &headers, &body).await {
            Ok(r) => r,
            Err(r) => *r,
        }
    });
    run.await
        .unwrap_or_else(|_| injected_failure().into_response())
}

async fn create_refund_inner(
    inner: &Arc<SandboxInner>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Halt> {
    authorize(inner, headers).map_err(halt)?;
    simulate_latency(inner).await;
    let (params, fp): (CreateRefund, String) = parse_body(body).map_err(halt)?;
    if matches!(params.amount, Some(a) if a < 1) {
        return Err(halt(ApiErr::invalid(
            "parameter_invalid_integer",
            "amount must be at least 1",
        )));
    }
    let key = idempotency_key(headers).map_err(halt)?;
    begin(inner, key.as_deref(), "refunds.create", &fp)?;
    let settings = inner.settings();
    if rand::random::<f64>() < settings.failure_rate {
        if let Some(k) = &key {
            inner.store.idem_forget(k);
        }
        return Err(halt(injected_failure()));
    }
    let refund = Refund {
        id: format!("re_{}", shared::ids::new_id()),
        object: "refund",
        amount: params.amount.unwrap_or(0),
        currency: String::new(),
        payment_intent: params.payment_intent.clone(),
        charge: None,
        status: "succeeded",
        created: webhooks::unix_now(),
        metadata: params.metadata,
    };
    let (status, body, event) = match inner.store.refund(&params.payment_intent, refund) {
        Ok((mut refund, intent)) => {
            refund.currency = intent.currency.clone();
            refund.charge = intent.latest_charge.clone();
            let body = serde_json::to_value(&refund).unwrap_or(Value::Null);
            (
                StatusCode::OK,
                body,
                Some(webhooks::event("charge.refunded", charge_object(&intent))),
            )
        }
        Err(e) => {
            let err = refund_error(&e);
            (err.status, err.body, None)
        }
    };
    if let Some(k) = &key {
        inner.store.idem_finish(k, status.as_u16(), &body);
    }
    if let Some(ev) = event {
        webhooks::emit(inner, ev).await;
    }
    Ok((status, axum::Json(body)).into_response())
}

/// The charge behind a succeeded intent, as `charge.*` events carry it.
fn charge_object(intent: &Intent) -> Value {
    json!({
        "id": intent.latest_charge,
        "object": "charge",
        "amount": intent.amount,
        "amount_refunded": intent.amount_refunded,
        "currency": intent.currency,
        "payment_intent": intent.id,
        "refunded": intent.amount_refunded >= intent.amount,
        "metadata": intent.metadata,
    })
}

fn refund_error(e: &RefundError) -> ApiErr {
    let (status, code) = match e {
        RefundError::NoSuchIntent => (StatusCode::NOT_FOUND, "resource_missing"),
        RefundError::NotCharged => (StatusCode::BAD_REQUEST, "charge_not_succeeded"),
        RefundError::AlreadyRefunded => (StatusCode::BAD_REQUEST, "charge_already_refunded"),
        RefundError::TooMuch => (StatusCode::BAD_REQUEST, "amount_too_large"),
    };
    ApiErr::new(status, "invalid_request_error", code, &e.to_string())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DashboardRefund {
    /// Minor units; the whole remaining amount when absent.
    amount: Option<i64>,
}

/// A refund made by an operator in the provider's dashboard (no merchant API call, no
/// idempotency key): refunds the intent and sends `charge.refunded`.
async fn dashboard_refund(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let params: DashboardRefund = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    if matches!(params.amount, Some(a) if a < 1) {
        return ApiErr::invalid("parameter_invalid_integer", "amount must be at least 1")
            .into_response();
    }
    let refund = Refund {
        id: format!("re_{}", shared::ids::new_id()),
        object: "refund",
        amount: params.amount.unwrap_or(0),
        currency: String::new(),
        payment_intent: id.clone(),
        charge: None,
        status: "succeeded",
        created: webhooks::unix_now(),
        metadata: BTreeMap::from([("source".to_owned(), "dashboard".to_owned())]),
    };
    match inner.store.refund(&id, refund) {
        Ok((mut refund, intent)) => {
            refund.currency = intent.currency.clone();
            refund.charge = intent.latest_charge.clone();
            webhooks::emit(
                &inner,
                webhooks::event("charge.refunded", charge_object(&intent)),
            )
            .await;
            axum::Json(refund).into_response()
        }
        Err(e) => refund_error(&e).into_response(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DashboardDispute {
    reason: Option<String>,
}

/// A chargeback opened by the card holder's bank: records the dispute and sends
/// `charge.dispute.created` whose `data.object` is the dispute (it names the charge and the
/// payment intent; like Stripe's, its metadata is its own, not the payment's).
async fn dashboard_dispute(
    State(inner): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let params: DashboardDispute = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let dispute = Dispute {
        id: format!("dp_{}", shared::ids::new_id()),
        object: "dispute",
        amount: 0,
        currency: String::new(),
        charge: None,
        payment_intent: id.clone(),
        reason: params.reason.unwrap_or_else(|| "fraudulent".into()),
        status: "needs_response",
        created: webhooks::unix_now(),
        metadata: BTreeMap::new(),
    };
    match inner.store.dispute(&id, dispute) {
        Ok(d) => {
            let object = serde_json::to_value(&d).unwrap_or(Value::Null);
            webhooks::emit(&inner, webhooks::event("charge.dispute.created", object)).await;
            axum::Json(d).into_response()
        }
        Err(e) => {
            let (status, code) = match e {
                DisputeError::NoSuchIntent => (StatusCode::NOT_FOUND, "resource_missing"),
                DisputeError::NotCharged => (StatusCode::BAD_REQUEST, "charge_not_succeeded"),
                DisputeError::AlreadyDisputed => {
                    (StatusCode::BAD_REQUEST, "charge_already_disputed")
                }
            };
            ApiErr::new(status, "invalid_request_error", code, &e.to_string()).into_response()
        }
    }
}

async fn order_summary(
    State(inner): Shared,
    headers: HeaderMap,
    Path(order_id): Path<String>,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(inner.store.order_summary(&order_id)).into_response()
}

async fn stats(State(inner): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(inner.store.stats()).into_response()
}

async fn deliveries(State(inner): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    axum::Json(json!({"deliveries": inner.deliveries(), "queued": inner.queued()})).into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlushOptions {
    /// Deliver the queued events newest first.
    pub reverse: bool,
    /// Deliver every queued event twice.
    pub duplicate: bool,
}

async fn flush(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let opts: FlushOptions = match parse_optional_body(&body) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let delivered = crate::flush_webhooks(&inner, &opts).await;
    axum::Json(json!({"delivered": delivered})).into_response()
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
