//! The HTTP surface: every domain contributes its router here, and the cross-cutting work
//! wraps them all in ONE middleware ([`edge`]): the request id (taken from the gateway's
//! `x-request-id` or generated, echoed on the answer), a tracing span per request when `info`
//! is on, per-route metrics, panic catching (a panicking handler answers a clean `500`), the
//! request timeout (`503`) and the checkout-session header; then the body limit. One layer
//! rather than a `tower-http` layer each: on the Redis-only paths the layers cost more than
//! the handler (docs/decisions.md, issue 16).

use crate::app::state::AppState;
use crate::platform::error::ApiError;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use shared::error::codes;
use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

/// Longest request id taken from a caller; a longer one is replaced by a fresh id.
const MAX_REQUEST_ID: usize = 128;

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.booking.body_limit_bytes;
    let (routes, mut doc) = api(&state).split_for_parts();
    crate::platform::openapi::admin_refusals(&mut doc);
    // The document describes exactly what was just mounted (app/openapi.rs).
    crate::app::health::OPENAPI.get_or_init(|| crate::platform::openapi::render(&doc));
    routes
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), edge))
        .with_state(state)
}

/// Every domain's routes, each with its own state; the documented ones carry their OpenAPI
/// operations (`routes!`), so the document and the router come from this one list.
fn api(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::platform::openapi::ApiDoc::openapi())
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
        .merge(crate::payments::ops::router().with_state(state.payments.clone()))
        // Ops (issue 18): order search/detail, the audit log; seat kills.
        .merge(crate::ops::router().with_state(state.ops.clone()))
        .merge(crate::inventory::kills::router().with_state(state.inventory.clone()))
        // The ops page over that API (static, embedded; booking's listener only).
        .merge(OpenApiRouter::from(crate::ops::page::router()))
        .merge(crate::inventory::holdbacks::router().with_state(state.inventory.clone()))
        // Ticket codes (issue 43): the JWKS (public) and the fan's tickets (identity).
        .merge(crate::tickets::router().with_state(state.tickets.clone()))
        // Ticket e-mail (issue 43): resends, forgetting an address, the delivery list.
        .merge(crate::tickets::mail::http::admin_router().with_state(state.mail.clone()))
        // The door (issue 44): scanners (admin) and scans (class `scanner`).
        .merge(crate::checkin::router().with_state(state.checkin.clone()))
}

/// Everything a request passes through on its way in and out, in one middleware (one boxed
/// future instead of a layer each): the request id (the caller's `x-request-id` if it is
/// short text, else a fresh one; echoed on the answer), a span when tracing is on at `info`
/// (a disabled span builds nothing), panic catching (the standard `500` body), the request
/// timeout (the standard `503` body with `Retry-After`), the checkout-session header and the
/// per-route metrics.
async fn edge(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let request_id = request_id(req.headers_mut());
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = req.method().clone();
    let route_str = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let span =
        tracing::info_span!("http", request_id = ?request_id, method = %method, route = %route_str);
    let timeout = Duration::from_millis(state.config.booking.request_timeout_ms.max(1));
    let work = AssertUnwindSafe(crate::app::session::until(State(state.clone()), req, next))
        .catch_unwind();
    let mut resp = match tokio::time::timeout(timeout, work).instrument(span).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(panic)) => panicked(panic),
        Err(_) => {
            ApiError::Unavailable(anyhow::anyhow!("request timed out in booking")).into_response()
        }
    };
    resp.headers_mut().insert(request_id_header(), request_id);
    let status = resp.status();
    state
        .metrics
        .http_requests
        .with_label_values(&[method.as_str(), route_str, status.as_str()])
        .inc();
    state
        .metrics
        .http_latency
        .with_label_values(&[route_str])
        .observe(start.elapsed().as_secs_f64());
    if status.is_client_error() && status != StatusCode::NOT_FOUND {
        tracing::debug!(status = status.as_u16(), "request refused");
    }
    resp
}

/// The request's id: the caller's (the gateway's) when it is short text, else a fresh one
/// (it is logged and echoed, so it is bounded). Left on the request for the handlers' logs.
fn request_id(headers: &mut HeaderMap) -> HeaderValue {
    let name = request_id_header();
    if let Some(v) = headers.get(&name)
        && v.len() <= MAX_REQUEST_ID
        && v.to_str().is_ok()
    {
        return v.clone();
    }
    let fresh = HeaderValue::from_str(&shared::ids::new_id())
        .unwrap_or_else(|_| HeaderValue::from_static("invalid"));
    headers.insert(name, fresh.clone());
    fresh
}

fn request_id_header() -> HeaderName {
    HeaderName::from_static(shared::headers::REQUEST_ID)
}

async fn fallback() -> ApiError {
    ApiError::not_found(codes::NOT_FOUND, "no such endpoint")
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

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
