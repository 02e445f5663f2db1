//! Who is calling. Booking verifies the admission token itself (defence in depth) and never
//! trusts identity headers from outside; admin endpoints need the admin bearer secret,
//! compared in constant time.

use crate::platform::error::ApiError;
use crate::platform::revocation::RevocationList;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use prometheus::{IntCounterVec, Opts, Registry};
use secrecy::SecretString;
use shared::headers::ADMISSION_COOKIE;
use shared::token::{AdmissionClaims, AdmissionTokens, bearer, cookie};
use std::sync::Arc;

/// What checks callers: the admission-token verifier, the revocations in force and the admin
/// secret. Handlers reach it through `FromRef`, so any domain state that can give an `Auth`
/// can use the extractors below. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Auth(Arc<AuthInner>);

struct AuthInner {
    tokens: AdmissionTokens,
    revocations: Arc<RevocationList>,
    admin_token: SecretString,
    /// Refused admission tokens, by reason.
    token_failures: IntCounterVec,
}

impl Auth {
    pub fn new(
        tokens: AdmissionTokens,
        revocations: Arc<RevocationList>,
        admin_token: SecretString,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let token_failures = IntCounterVec::new(
            Opts::new("token_failures_total", "Refused admission tokens by reason"),
            &["reason"],
        )?;
        registry.register(Box::new(token_failures.clone()))?;
        Ok(Self(Arc::new(AuthInner {
            tokens,
            revocations,
            admin_token,
            token_failures,
        })))
    }

    /// The claims of a valid, unrevoked admission token; a refusal names its reason.
    pub fn admit(&self, token: &str) -> Result<AdmissionClaims, ApiError> {
        match self.0.tokens.verify(token) {
            Ok(claims) if self.0.revocations.refuses(&claims) => Err(self.refuse("revoked")),
            Ok(claims) => Ok(claims),
            Err(e) => Err(self.refuse(e.reason())),
        }
    }

    /// The claims of a valid token, revoked or not (for answers that only add information).
    pub fn verify(&self, token: &str) -> Option<AdmissionClaims> {
        self.0.tokens.verify(token).ok()
    }

    /// Whether `presented` is the admin secret (constant time).
    pub fn is_admin(&self, presented: &str) -> bool {
        shared::config::admin_secret_matches(&self.0.admin_token, presented)
    }

    /// The token verifier (and minter, for tests and tools).
    pub fn tokens(&self) -> &AdmissionTokens {
        &self.0.tokens
    }

    /// The revocations in force (open connections watch them).
    pub fn revocations(&self) -> &Arc<RevocationList> {
        &self.0.revocations
    }

    /// A `401 ADMISSION_REQUIRED` naming `reason`, counted.
    pub fn refuse(&self, reason: &str) -> ApiError {
        self.0.token_failures.with_label_values(&[reason]).inc();
        ApiError::admission_required().with("reason", reason.to_owned())
    }
}

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

impl<S> FromRequestParts<S> for Admitted
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let auth = Auth::from_ref(state);
        let token = token_from_parts(parts).ok_or_else(|| auth.refuse("missing"))?;
        auth.admit(token).map(Admitted)
    }
}

/// An admin caller (bearer admin secret).
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl<S> FromRequestParts<S> for Admin
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .ok_or_else(ApiError::unauthorized)?;
        if Auth::from_ref(state).is_admin(presented) {
            Ok(Admin)
        } else {
            Err(ApiError::unauthorized())
        }
    }
}
