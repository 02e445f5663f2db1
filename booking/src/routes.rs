//! The HTTP surface: every module contributes its router here, and the cross-cutting layers
//! (body limit, request id, tracing span, metrics) wrap them all.

use crate::error::ApiError;
use crate::state::AppState;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use shared::error::codes;
use std::time::Instant;
use tracing::Instrument;

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.booking.body_limit_bytes;
    Router::new()
        .merge(crate::health::router())
        .merge(crate::events::router())
        .merge(crate::seats::router())
        .merge(crate::holds::router())
        .merge(crate::ga::router())
        .merge(crate::products::router())
        .merge(crate::cart::router())
        .merge(crate::orders::router())
        .merge(crate::auctions::router())
        .merge(crate::storefront::router())
        .merge(crate::payments::router())
        .merge(crate::webhooks::router())
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::session::until,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

async fn fallback() -> ApiError {
    ApiError::not_found(codes::NOT_FOUND, "no such endpoint")
}

/// Request id (taken from the gateway's `x-request-id` or generated), one span per request,
/// and per-route metrics with the matched path template (bounded label cardinality).
async fn observe(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().as_str().to_owned();
    let request_id = req
        .headers()
        .get(shared::headers::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(shared::ids::new_id);
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        req.headers_mut().insert(shared::headers::REQUEST_ID, v);
    }
    let span =
        tracing::info_span!("http", request_id = %request_id, method = %method, route = %route);
    let mut resp = next.run(req).instrument(span.clone()).await;
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
        span.in_scope(|| tracing::debug!(status = status.as_u16(), "request refused"));
    }
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(shared::headers::REQUEST_ID, v);
    }
    resp.into_response()
}
