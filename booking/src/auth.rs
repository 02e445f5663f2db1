//! Who is calling. Booking verifies the admission token itself (defence in depth) and never
//! trusts identity headers from outside; admin endpoints need the admin bearer secret,
//! compared in constant time.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use shared::headers::ADMISSION_COOKIE;
use shared::token::{AdmissionClaims, bearer, cookie};

/// A caller holding a valid admission token (any event). Every admitted path checks the
/// token's event against the resource's: [`Admitted::for_event`] on event-scoped paths,
/// [`Admitted::opens`] for a resource (product, auction) whose event comes from the database.
#[derive(Debug, Clone)]
pub struct Admitted(pub AdmissionClaims);

impl Admitted {
    pub fn account(&self) -> &str {
        &self.0.sub
    }

    pub fn event(&self) -> &str {
        &self.0.evt
    }

    /// Refuses a token issued for another event (`403 WRONG_EVENT`).
    pub fn for_event(&self, event: &str) -> Result<&Self, ApiError> {
        if self.0.evt == event {
            Ok(self)
        } else {
            Err(ApiError::wrong_event())
        }
    }

    /// Refuses a token that does not open a resource of `event`. A resource without an event
    /// (a product or auction created before events were required) opens for no token: it
    /// fails closed until ops assign it an event.
    pub fn opens(&self, event: Option<&str>) -> Result<(), ApiError> {
        match event {
            Some(e) if e == self.0.evt => Ok(()),
            _ => Err(ApiError::wrong_event()),
        }
    }
}

fn token_from_parts(parts: &Parts) -> Option<&str> {
    token_from_headers(&parts.headers)
}

/// The admission token of a request: `Authorization: Bearer` first, then the cookie.
pub fn token_from_headers(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok())
        && let Some(t) = bearer(v)
    {
        return Some(t);
    }
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| cookie(v, ADMISSION_COOKIE))
}

impl FromRequestParts<AppState> for Admitted {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = token_from_parts(parts).ok_or_else(|| {
            state
                .metrics
                .token_failures
                .with_label_values(&["missing"])
                .inc();
            ApiError::admission_required().with("reason", "missing")
        })?;
        match state.tokens.verify(token) {
            Ok(claims) if state.revocations.refuses(&claims) => {
                state
                    .metrics
                    .token_failures
                    .with_label_values(&["revoked"])
                    .inc();
                Err(ApiError::admission_required().with("reason", "revoked"))
            }
            Ok(claims) => Ok(Admitted(claims)),
            Err(e) => {
                state
                    .metrics
                    .token_failures
                    .with_label_values(&[e.reason()])
                    .inc();
                Err(ApiError::admission_required().with("reason", e.reason()))
            }
        }
    }
}

/// An admin caller (bearer admin secret).
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .ok_or_else(ApiError::unauthorized)?;
        if shared::config::admin_secret_matches(&state.config.admin_token, presented) {
            Ok(Admin)
        } else {
            Err(ApiError::unauthorized())
        }
    }
}
