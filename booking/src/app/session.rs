//! Admission lasts through checkout (booking's half; the gateway's is `gateway/src/session.rs`).
//!
//! The admission token is short-lived, but a fan's holds and pending orders live longer. On
//! every successful checkout write (creating or releasing a hold, creating or paying an
//! order) booking tells the gateway how long the fan's checkout still lasts:
//! `x-floodgate-session-until: <unix ms>`, the latest end of the caller's live holds and
//! `PENDING_PAYMENT` orders in the token's event, `0` when none is left. The gateway then
//! re-mints the token and keeps the `max_active` slot until then, or frees the slot at once.
//! Reads and failed writes say nothing (no header). Holds, releases and orders read the answer
//! in the statement that made the write (`platform::session_until`) and set the header
//! themselves; for any other checkout write this middleware measures it after the write
//! committed, with one more query.

use crate::app::state::AppState;
use crate::platform::auth::token_from_headers;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use shared::headers::SESSION_UNTIL;

/// The checkout writes (method, route template): an explicit list, not a pattern, so a new
/// route is a checkout write only when it is added here. The gateway's twin is
/// `gateway/src/slots.rs::checkout` (same routes).
const CHECKOUT_WRITES: [(Method, &str); 6] = [
    (Method::POST, "/api/events/{event}/holds"),
    (Method::POST, "/api/events/{event}/ga-holds"),
    (Method::DELETE, "/api/holds/{hold}"),
    (Method::POST, "/api/orders"),
    (Method::POST, "/api/orders/{id}/pay"),
    (Method::POST, "/api/orders/{id}/cancel"),
];

/// Whether a request (method, matched route template) is a checkout write: holds, GA holds,
/// a hold's release, orders, their payment and cancellation.
pub fn is_checkout_write(method: &Method, route: &str) -> bool {
    CHECKOUT_WRITES
        .iter()
        .any(|(m, r)| m == method && *r == route)
}

/// Middleware: adds `x-floodgate-session-until` to successful checkout writes.
pub async fn until(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let checkout = req
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| is_checkout_write(req.method(), p.as_str()));
    if !checkout {
        return next.run(req).await;
    }
    // The caller's credentials, kept for after the handler (refcounted copies of the header
    // bytes). The token is verified only if the answer still needs the header: holds,
    // releases and orders set it themselves from their own statement, and their handler has
    // verified the token already (a second verification was ~6 % of booking's CPU per hold).
    let credentials = credentials(req.headers());
    let mut resp = next.run(req).await;
    // A refused write says nothing; a write whose own statement read the answer has set it
    // (`platform::session_until`).
    if !resp.status().is_success() || resp.headers().contains_key(SESSION_UNTIL) {
        return resp;
    }
    let Some((account, event)) = token_from_headers(&credentials)
        .and_then(|t| state.auth.verify(t))
        .map(|c| (c.sub, c.evt))
    else {
        return resp;
    };
    match crate::platform::session_until::live_until_ms(&state.pool, &account, &event).await {
        Ok(ms) => {
            resp.headers_mut()
                .insert(SESSION_UNTIL, HeaderValue::from(ms));
        }
        // Without the header the admission simply is not extended by this answer.
        Err(e) => tracing::warn!(error = %e, "reading the checkout's end failed"),
    }
    resp
}

/// The headers a token can come in (`token_from_headers` reads these and no others).
fn credentials(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    if let Some(v) = headers.get(AUTHORIZATION) {
        kept.insert(AUTHORIZATION, v.clone());
    }
    for v in headers.get_all(COOKIE) {
        kept.append(COOKIE, v.clone());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::is_checkout_write;
    use axum::http::Method;

    #[test]
    fn checkout_writes() {
        for (m, r) in [
            (Method::POST, "/api/events/{event}/holds"),
            (Method::POST, "/api/events/{event}/ga-holds"),
            (Method::DELETE, "/api/holds/{hold}"),
            (Method::POST, "/api/orders"),
            (Method::POST, "/api/orders/{id}/pay"),
            (Method::POST, "/api/orders/{id}/cancel"),
        ] {
            assert!(is_checkout_write(&m, r), "{m} {r}");
        }
        for (m, r) in [
            (Method::GET, "/api/orders/{id}"),
            (Method::GET, "/api/events/{event}/seats"),
            (Method::PUT, "/api/cart/items/{sku}"),
            (Method::POST, "/api/auctions/{id}/bids"),
            (Method::POST, "/admin/orders"),
            // Routes that merely contain a checkout word are not checkout writes.
            (Method::POST, "/api/events/{event}/orders"),
            (Method::POST, "/api/orders/{id}/notes"),
            (Method::PATCH, "/api/orders/{id}"),
            (Method::GET, "/api/orders"),
            (Method::POST, "/api/holds/{hold}"),
        ] {
            assert!(!is_checkout_write(&m, r), "{m} {r}");
        }
    }
}
