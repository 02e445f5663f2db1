//! The HTTP surface: every domain contributes its router here, and the cross-cutting layers
//! wrap them all. From the outside in: the request id (taken from the gateway's
//! `x-request-id` or generated, echoed on the answer), one tracing span per request, per-route
//! metrics, panic catching (a panicking handler answers a clean `500`), the request timeout
//! (`503`), the body limit and the checkout-session header. The standard parts are
//! `tower-http`'s; only the metrics and the session header are ours.

use crate::app::state::AppState;
use crate::platform::error::ApiError;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use shared::error::codes;
use std::any::Any;
use std::time::{Duration, Instant};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// Longest request id taken from a caller; a longer one is replaced by a fresh id.
const MAX_REQUEST_ID: usize = 128;

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.booking.body_limit_bytes;
    let timeout = Duration::from_millis(state.config.booking.request_timeout_ms.max(1));
    Router::new()
        .merge(crate::app::health::router())
        .merge(crate::inventory::events::router().with_state(state.inventory.clone()))
        .merge(crate::inventory::seats::router().with_state(state.inventory.clone()))
        .merge(crate::inventory::holds::router().with_state(state.inventory.clone()))
        .merge(crate::inventory::ga::router().with_state(state.inventory.clone()))
        .merge(crate::orders::products::router().with_state(state.orders.clone()))
        .merge(crate::orders::cart::router().with_state(state.orders.clone()))
        .merge(crate::orders::router().with_state(state.orders.clone()))
        .merge(crate::auctions::router().with_state(state.auctions.clone()))
        .merge(crate::inventory::storefront::router().with_state(state.inventory.clone()))
        .merge(crate::payments::router().with_state(state.payments.clone()))
        .merge(crate::payments::webhooks::router().with_state(state.payments.clone()))
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::app::session::until,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            timeout,
        ))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(TraceLayer::new_for_http().make_span_with(span_for))
        .layer(PropagateRequestIdLayer::new(request_id_header()))
        .layer(SetRequestIdLayer::new(request_id_header(), NewRequestId))
        .layer(middleware::map_request(drop_overlong_request_id))
        .with_state(state)
}

fn request_id_header() -> HeaderName {
    HeaderName::from_static(shared::headers::REQUEST_ID)
}

async fn fallback() -> ApiError {
    ApiError::not_found(codes::NOT_FOUND, "no such endpoint")
}

/// Fresh request ids: the same shape as every other id here (UUIDv7, simple form).
#[derive(Clone, Copy)]
struct NewRequestId;

impl MakeRequestId for NewRequestId {
    fn make_request_id<B>(&mut self, _req: &axum::http::Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(&shared::ids::new_id())
            .ok()
            .map(RequestId::new)
    }
}

/// A caller's request id is logged and echoed, so it is bounded: an overlong (or non-text)
/// one is dropped and replaced by a fresh id.
async fn drop_overlong_request_id(mut req: Request) -> Request {
    let name = request_id_header();
    let keep = req
        .headers()
        .get(&name)
        .is_some_and(|v| v.len() <= MAX_REQUEST_ID && v.to_str().is_ok());
    if !keep {
        req.headers_mut().remove(&name);
    }
    req
}

/// One span per request with its id, method and route template (bounded cardinality).
fn span_for(req: &axum::http::Request<Body>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str());
    let request_id = req
        .headers()
        .get(shared::headers::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("http", request_id = %request_id, method = %req.method(), route = %route)
}

/// A panicking handler: logged, and the caller gets the standard `500` body.
fn panicked(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    ApiError::unexpected(anyhow::anyhow!("handler panicked: {detail}")).into_response()
}

/// Per-route metrics with the matched path template, and the standard body on an empty `503`
/// (the timeout layer answers with a bare status).
async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().as_str().to_owned();
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE
        && !resp.headers().contains_key(header::CONTENT_TYPE)
    {
        resp =
            ApiError::Unavailable(anyhow::anyhow!("request timed out in booking")).into_response();
    }
    let status = resp.status();
    state
        .metrics
        .http_requests
        .with_label_values(&[method.as_str(), route.as_str(), status.as_str()])
        .inc();
    state
        .metrics
        .http_latency
        .with_label_values(&[route.as_str()])
        .observe(start.elapsed().as_secs_f64());
    if status.is_client_error() && status != StatusCode::NOT_FOUND {
        tracing::debug!(status = status.as_u16(), "request refused");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_the_standard_500_body() {
        for payload in [
            Box::new("static str") as Box<dyn Any + Send>,
            Box::new(String::from("formatted")),
            Box::new(42_u8),
        ] {
            let resp = panicked(payload);
            assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            let bytes = axum::body::to_bytes(resp.into_body(), 4096)
                .await
                .expect("body");
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
            assert_eq!(body["code"], codes::INTERNAL);
            // Internal detail never reaches the client.
            assert!(!body.to_string().contains("formatted"));
        }
    }
}
