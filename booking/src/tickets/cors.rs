//! Cross-origin reads of the ticket endpoints, and only of them: the fan's ticket page is served
//! by the gateway's origin and calls booking's listener directly until the gateway's route
//! table exists (DESIGN section 9, "Who may call what").
//!
//! Why `Access-Control-Allow-Origin: *` is safe here, and would not be elsewhere: these
//! endpoints read no ambient credential. `public` ones need none; `identity` ones take the
//! login token from `Authorization: Bearer` only, never a cookie, so a foreign page can read a
//! fan's tickets only if it already holds the fan's token, in which case CORS protects nothing.
//! We never send `Access-Control-Allow-Credentials`, so a browser does not attach cookies or
//! TLS client certificates, and `*` cannot be combined with credentials by browsers anyway.
//! Listing origins would add configuration that guards nothing.
//!
//! Preflights (`OPTIONS` with `Access-Control-Request-Method`, sent because of the
//! `Authorization` header) are answered here with `204` before routing, which would answer `405`.
//! `Authorization` is named explicitly: the `*` wildcard of `Access-Control-Allow-Headers` does
//! not cover it (Fetch standard).

use axum::extract::Request;
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_METHOD,
};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// How long a browser may reuse a preflight's answer (seconds; Chromium caps it at 7200).
const PREFLIGHT_MAX_AGE_S: &str = "600";

/// The middleware of the ticket routes.
pub async fn cors(req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
    {
        return preflight();
    }
    let mut resp = next.run(req).await;
    resp.headers_mut()
        .insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    resp
}

/// The same answer to every preflight: the browser compares what it wants to send with these
/// lists and refuses anything else itself (a `PUT`, a `Content-Type`), so there is nothing to
/// decide per request.
fn preflight() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (ACCESS_CONTROL_ALLOW_METHODS, "GET, HEAD"),
            (ACCESS_CONTROL_ALLOW_HEADERS, "authorization"),
            (ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE_S),
        ],
    )
        .into_response()
}
