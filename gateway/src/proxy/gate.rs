//! The admission decision of a forwarded request, pure over its headers and the gateway's
//! state: which token it carries, whether that token admits it, and the refusal otherwise.

use crate::fasttoken::FastVerifier;
use crate::live::Live;
use crate::respond::Reply;
use http::HeaderMap;
use shared::error::{ErrorBody, codes};
use shared::headers;
use shared::token::{AdmissionClaims, TokenError};
use std::sync::Arc;

/// `POST /api/orders/{id}/pay` (one path segment for the id).
pub fn is_pay(method: &http::Method, path: &str) -> bool {
    crate::slots::checkout(method, path) == Some(crate::slots::Checkout::Pay)
}

/// `409 ROOM_FULL`: a fan whose `max_active` slot was freed found every slot taken; nothing
/// was forwarded. The waiting room is where they get one again.
pub fn room_full(event: &str) -> Reply {
    Reply::from_error(
        409,
        ErrorBody::new(
            codes::ROOM_FULL,
            "every shopping slot of this room is taken; join the waiting room again",
        )
        .with("waiting_room_url", format!("/e/{event}")),
    )
}

/// The admission token of a request: `Authorization: Bearer` first, then the cookie.
pub fn admission_token(h: &HeaderMap) -> Option<&str> {
    if let Some(t) = h
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(shared::token::bearer)
    {
        return Some(t);
    }
    h.get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| shared::token::cookie(v, headers::ADMISSION_COOKIE))
}

/// The whole admission decision for a forwarded request (pure over headers and state).
pub fn check_admission(
    tokens: &FastVerifier,
    live: &Live,
    h: &HeaderMap,
    path_event: Option<&str>,
    now: i64,
) -> std::result::Result<Arc<AdmissionClaims>, TokenError> {
    let token = admission_token(h).ok_or(TokenError::Missing)?;
    let claims = match path_event {
        Some(e) => tokens.verify_cached_for_event(token, e, now)?,
        None => tokens.verify_cached(token, now)?,
    };
    if live.is_revoked(&claims) {
        return Err(TokenError::Revoked);
    }
    Ok(claims)
}

pub(super) fn wants_html(h: &HeaderMap) -> bool {
    h.get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

/// The answer to a refused admission: browsers go back to the waiting room, API clients get
/// `401 ADMISSION_REQUIRED`, or `403 WRONG_EVENT` for a valid token of another event than the
/// path's (one admission, one event: DESIGN.md section 8, booking answers the same).
pub fn refusal(e: &TokenError, html: bool, event: Option<&str>) -> Reply {
    if html {
        return match event {
            Some(ev) if shared::ids::is_valid_slug(ev) => Reply::redirect(&format!("/e/{ev}")),
            _ => Reply::redirect("/"),
        };
    }
    if *e == TokenError::WrongEvent {
        return Reply::from_error(
            403,
            ErrorBody::new(
                codes::WRONG_EVENT,
                "this admission is for another event; join that event's waiting room",
            ),
        );
    }
    Reply::from_error(
        401,
        ErrorBody::new(
            codes::ADMISSION_REQUIRED,
            "an admission from the waiting room is required",
        )
        .with("reason", e.reason()),
    )
    .header("www-authenticate", "Bearer")
}
