//! Stripe's HTTP API as the sandbox speaks it — form-encoded bodies ([`crate::form`]), the
//! `Stripe-Version` header, PaymentIntents ([`intents`]: create, confirm, cancel, retrieve,
//! search; [`intent_update`]; list in [`lists`]), Refunds ([`refunds`]: create, retrieve;
//! list in [`lists`]), idempotency keys and Stripe's error objects — and the `/_sandbox/*`
//! test/operator endpoints ([`dashboard`], JSON bodies: they are not Stripe's).
//!
//! Any other path, or another method on a known one, is Stripe's `404 invalid_request_error`
//! "Unrecognized request URL (METHOD: /path)…" (after the key check, as at Stripe), never a
//! bare status: Stripe's libraries read every answer as JSON, and a non-JSON one becomes
//! "Invalid JSON received from the Stripe API" instead of an error the caller can act on.
//!
//! Errors are Stripe's: `{"error": {"type", "code", "message", "param"?, "decline_code"?,
//! "payment_intent"?}}` with Stripe's statuses: `400 invalid_request_error` (bad or unknown
//! parameter, JSON body, bad `Stripe-Version`), `400 idempotency_error` (a key reused with
//! other parameters), `401 authentication_error`, `402 card_error` (declined),
//! `404 invalid_request_error resource_missing`, `409 idempotency_error` (the key's first
//! request still running), `500 api_error` (the sandbox's injected faults).

mod dashboard;
mod intent_update;
mod intents;
mod lists;
mod refunds;

use crate::SandboxInner;
use crate::store::IdemBegin;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub use dashboard::FlushOptions;

type Shared = axum::extract::State<Arc<SandboxInner>>;

pub fn router(inner: Arc<SandboxInner>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route(
            "/v1/payment_intents",
            post(intents::create).get(lists::payment_intents),
        )
        .route("/v1/payment_intents/search", get(intents::search))
        .route(
            "/v1/payment_intents/{id}",
            get(intents::retrieve).post(intent_update::update),
        )
        .route("/v1/payment_intents/{id}/confirm", post(intents::confirm))
        .route("/v1/payment_intents/{id}/cancel", post(intents::cancel))
        .route("/v1/refunds", post(refunds::create).get(lists::refunds))
        .route("/v1/refunds/{id}", get(refunds::retrieve))
        .route("/_sandbox/orders/{order_id}", get(dashboard::order_summary))
        .route(
            "/_sandbox/payment_intents/{id}/refund",
            post(dashboard::refund),
        )
        .route(
            "/_sandbox/payment_intents/{id}/dispute",
            post(dashboard::dispute),
        )
        .route(
            "/_sandbox/payment_intents/{id}/complete",
            post(dashboard::complete),
        )
        .route("/_sandbox/stats", get(dashboard::stats))
        .route("/_sandbox/webhooks", get(dashboard::deliveries))
        .route("/_sandbox/webhooks/flush", post(dashboard::flush))
        // Both after every route: the method fallback applies to the routes added before it.
        .fallback(unrecognized)
        .method_not_allowed_fallback(unrecognized)
        .with_state(inner)
}

/// Stripe's answer to a path it does not serve (or a method it does not take there), with
/// Stripe's wording; the key is checked first, as Stripe does.
async fn unrecognized(
    State(inner): Shared,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize(&inner, &headers) {
        return e.into_response();
    }
    let message = format!(
        "Unrecognized request URL ({method}: {}). Please see https://stripe.com/docs or we \
         can help at https://support.stripe.com/.",
        uri.path()
    );
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": {"type": "invalid_request_error", "message": message}})),
    )
        .into_response()
}

/// A Stripe error object and its status.
#[derive(Debug)]
pub struct ApiErr {
    pub status: StatusCode,
    pub body: Value,
}

impl ApiErr {
    pub fn new(status: StatusCode, kind: &str, code: &str, message: &str) -> Self {
        Self {
            status,
            body: json!({"error": {"type": kind, "code": code, "message": message}}),
        }
    }

    /// `400 invalid_request_error`, naming the parameter when there is one.
    pub fn invalid(code: &str, param: Option<&str>, message: &str) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        );
        if let Some(p) = param {
            e.body["error"]["param"] = json!(p);
        }
        e
    }

    pub fn missing(kind: &str, id: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "resource_missing",
            &format!("No such {kind}: '{id}'"),
        );
        e.body["error"]["param"] = json!("id");
        e
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

/// `Bearer <key>` (Stripe's libraries) or HTTP basic with the key as user name (curl -u).
fn presented_key(headers: &HeaderMap) -> String {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(token) = value.strip_prefix("Bearer ") {
        return token.to_owned();
    }
    value
        .strip_prefix("Basic ")
        .and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|s| s.split_once(':').map(|(user, _)| user.to_owned()))
        .unwrap_or_default()
}

/// The API key, then the `Stripe-Version` header if one is sent: Stripe refuses versions
/// that do not exist; the sandbox refuses what does not look like one (`YYYY-MM-DD` with an
/// optional `.name`) and answers every version with the same shapes.
pub fn authorize(inner: &SandboxInner, headers: &HeaderMap) -> Result<(), ApiErr> {
    use subtle::ConstantTimeEq;
    let presented = presented_key(headers);
    let settings = inner.settings();
    let expected = settings.api_key.expose_secret().as_bytes();
    if expected.is_empty() || !bool::from(expected.ct_eq(presented.as_bytes())) {
        return Err(ApiErr::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "Invalid API Key provided.",
        ));
    }
    if let Some(v) = headers.get("stripe-version") {
        let v = v.to_str().unwrap_or("");
        if !valid_api_version(v) {
            return Err(ApiErr::invalid(
                "api_version_invalid",
                None,
                &format!("Invalid Stripe API version: {v}"),
            ));
        }
    }
    Ok(())
}

fn valid_api_version(v: &str) -> bool {
    let (date, name) = v.split_once('.').unwrap_or((v, "a"));
    let d = date.as_bytes();
    d.len() == 10
        && d.iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        })
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase())
}

pub async fn simulate_latency(inner: &SandboxInner) {
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

pub fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiErr> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) if !s.is_empty() && s.len() <= 255 => Ok(Some(s.to_owned())),
            _ => Err(ApiErr::invalid(
                "idempotency_key_invalid",
                None,
                "Idempotency-Key must be 1 to 255 characters.",
            )),
        },
    }
}

pub fn injected_failure() -> ApiErr {
    ApiErr::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "api_error",
        "sandbox_injected_failure",
        "An error occurred with our connection to the provider (sandbox-injected).",
    )
}

/// A request id (`req_...`): answered in `Request-Id` and named by the events it causes.
pub fn request_id() -> String {
    format!("req_{}", shared::ids::new_id())
}

/// A JSON answer with Stripe's `Request-Id` header.
pub fn answer(status: StatusCode, body: Value, request: &str) -> Response {
    let mut resp = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(request) {
        resp.headers_mut().insert("request-id", v);
    }
    resp
}

/// An early answer (refusal or replay), boxed to keep `Result`s small.
pub type Halt = Box<Response>;

pub fn halt(r: impl IntoResponse) -> Halt {
    Box::new(r.into_response())
}

/// Claims the key; `Err` carries the response for a replay or a refusal.
pub fn begin(
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

/// Runs a mutating request in its own task: a real provider finishes what it started when
/// the merchant's client gives up, so a client timeout (a dropped connection) must not cancel
/// a charge or a refund halfway through the simulated latency.
pub async fn detached<F>(f: F) -> Response
where
    F: std::future::Future<Output = Result<Response, Halt>> + Send + 'static,
{
    tokio::spawn(async move {
        match f.await {
            Ok(r) => r,
            Err(r) => *r,
        }
    })
    .await
    .unwrap_or_else(|_| injected_failure().into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_and_basic_auth() {
        assert!(valid_api_version("2026-10-28.endive"));
        assert!(valid_api_version("2020-08-27"));
        assert!(!valid_api_version("2020-8-27"));
        assert!(!valid_api_version("latest"));
        assert!(!valid_api_version("2026-10-28."));
        let mut h = HeaderMap::new();
        // "sk_test_x:" in base64, as curl -u sk_test_x: sends it.
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic c2tfdGVzdF94Og=="),
        );
        assert_eq!(presented_key(&h), "sk_test_x");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk_1"),
        );
        assert_eq!(presented_key(&h), "sk_1");
    }
}
