//! Who is calling. Booking verifies the admission token itself (defence in depth) and never
//! trusts identity headers from outside. Admin endpoints need an operator credential (checked
//! against Postgres on every call, so a revocation is in force as soon as it commits) or the
//! bootstrap admin secret (compared in constant time); failed checks are counted per client
//! address and refused for a minute past `[booking] admin_auth_failures_per_ip_per_min`.
//! Scan endpoints need a scanner credential ([`Auth::scanner`]), checked the same way against
//! Postgres on every call, and counted against the same per-address budget.

use crate::platform::audit::{Operator, actor_from};
use crate::platform::credentials;
use crate::platform::error::ApiError;
use crate::platform::revocation::RevocationList;
use axum::extract::ConnectInfo;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use prometheus::{IntCounterVec, Opts, Registry};
use secrecy::SecretString;
use shared::credentials::{AuthFailures, BOOTSTRAP_ACTOR, Role, Shape};
use shared::error::codes;
use shared::headers::ADMISSION_COOKIE;
use shared::token::{AdmissionClaims, AdmissionTokens, bearer, cookie};
use sqlx::PgPool;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    /// Operator credentials live here.
    pool: PgPool,
    /// Failed admin credential checks per client address.
    failures: AuthFailures,
    /// Refused admin calls, by reason.
    admin_failures: IntCounterVec,
    /// Refused scanner calls, by reason.
    scanner_failures: IntCounterVec,
}

/// The holder of a live scanner credential: the scanner's id, and the event and gate it was
/// provisioned for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannerCredential {
    pub id: String,
    pub event: String,
    pub gate: String,
    /// Revoked since it was issued: only [`Auth::scanner_upload`] lets such a scanner through
    /// (its offline decisions are facts, kept and flagged).
    pub revoked: bool,
}

impl ScannerCredential {
    /// `403 WRONG_EVENT` unless this scanner was provisioned for `event`.
    pub fn for_event(&self, event: &str) -> Result<(), ApiError> {
        if self.event == event {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            codes::WRONG_EVENT,
            "this scanner was provisioned for another event",
        ))
    }
}

/// What an admin refusal is counted as.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    Missing,
    Unknown,
    Expired,
    Revoked,
    Malformed,
    WrongType,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Unknown => "unknown",
            Refusal::Expired => "expired",
            Refusal::Revoked => "revoked",
            Refusal::Malformed => "malformed",
            Refusal::WrongType => "wrong_type",
        }
    }
}

impl Auth {
    pub fn new(
        tokens: AdmissionTokens,
        revocations: Arc<RevocationList>,
        admin_token: SecretString,
        pool: PgPool,
        failures_per_ip_per_min: u32,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let token_failures = IntCounterVec::new(
            Opts::new("token_failures_total", "Refused admission tokens by reason"),
            &["reason"],
        )?;
        registry.register(Box::new(token_failures.clone()))?;
        let admin_failures = IntCounterVec::new(
            Opts::new(
                "admin_auth_failures_total",
                "Refused admin calls by reason (missing, unknown, expired, revoked, malformed, \
                 wrong_type, role, rate_limited)",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(admin_failures.clone()))?;
        let scanner_failures = IntCounterVec::new(
            Opts::new(
                "scanner_auth_failures_total",
                "Refused scanner calls by reason (missing, unknown, expired, revoked, \
                 malformed, wrong_type, rate_limited)",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(scanner_failures.clone()))?;
        Ok(Self(Arc::new(AuthInner {
            tokens,
            revocations,
            admin_token,
            token_failures,
            pool,
            failures: AuthFailures::new(failures_per_ip_per_min),
            admin_failures,
            scanner_failures,
        })))
    }

    /// Who an admin call comes from: an operator credential's holder or the bootstrap secret.
    /// `401` for a missing, unknown, expired, revoked or malformed credential, `403
    /// WRONG_CREDENTIAL_TYPE` for a scanner's, `429` while the caller's address has failed too
    /// often (checked before the credential, so a brute force learns nothing more).
    pub async fn operator(&self, parts: &Parts) -> Result<Operator, ApiError> {
        let Some(presented) = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
        else {
            return Err(self.refuse_admin(Refusal::Missing, None));
        };
        let ip = client_ip(parts);
        if let Some(wait) = self.0.failures.blocked(ip) {
            self.0
                .admin_failures
                .with_label_values(&["rate_limited"])
                .inc();
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::TOO_MANY_FAILED_LOGINS,
                "too many failed credential checks from this address; retry later",
            )
            .retry_after(wait));
        }
        match shared::credentials::shape(presented) {
            Shape::Operator => {
                let hash = shared::credentials::hash(presented);
                let found = credentials::find_operator(&self.0.pool, &hash)
                    .await
                    .map_err(ApiError::from)?;
                let Some(found) = found else {
                    return Err(self.refuse_admin(Refusal::Unknown, Some(ip)));
                };
                if found.revoked_at.is_some() {
                    return Err(self.refuse_admin(Refusal::Revoked, Some(ip)));
                }
                if found.expires_at <= chrono::Utc::now() {
                    return Err(self.refuse_admin(Refusal::Expired, Some(ip)));
                }
                let role = Role::parse(&found.role).ok_or_else(|| {
                    ApiError::unexpected(anyhow::anyhow!(
                        "operator {} has an unknown role {}",
                        found.id,
                        found.role
                    ))
                })?;
                Ok(Operator {
                    name: found.name,
                    role: Some(role),
                    operator_id: Some(found.id),
                    note: None,
                })
            }
            Shape::Scanner => Err(self.refuse_admin(Refusal::WrongType, Some(ip))),
            Shape::Malformed => Err(self.refuse_admin(Refusal::Malformed, Some(ip))),
            Shape::Other if self.is_admin(presented) => Ok(Operator {
                name: BOOTSTRAP_ACTOR.to_owned(),
                role: Some(Role::Admin),
                operator_id: None,
                note: actor_from(parts),
            }),
            Shape::Other => Err(self.refuse_admin(Refusal::Unknown, Some(ip))),
        }
    }

    /// Who a scan call comes from: a live scanner credential (`fgsc_…`). `401 {reason}` for a
    /// missing, unknown, expired, revoked or malformed one; `403 WRONG_CREDENTIAL_TYPE` for an
    /// operator credential or the bootstrap secret (they open the admin API, never the door);
    /// `429` while the caller's address has failed too often. Read from Postgres on every
    /// call, so a revocation is in force as soon as it commits.
    pub async fn scanner(&self, parts: &Parts) -> Result<ScannerCredential, ApiError> {
        self.scanner_with(parts, false).await
    }

    /// [`Auth::scanner`] for an upload of offline decisions: a scanner revoked while it was
    /// offline is let through with `revoked: true` (what it decided happened at the door);
    /// unknown, malformed, expired and wrong-type credentials are refused as always.
    pub async fn scanner_upload(&self, parts: &Parts) -> Result<ScannerCredential, ApiError> {
        self.scanner_with(parts, true).await
    }

    async fn scanner_with(
        &self,
        parts: &Parts,
        accept_revoked: bool,
    ) -> Result<ScannerCredential, ApiError> {
        let Some(presented) = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
        else {
            return Err(self.refuse_scanner(Refusal::Missing, None));
        };
        let ip = client_ip(parts);
        if let Some(wait) = self.0.failures.blocked(ip) {
            self.0
                .scanner_failures
                .with_label_values(&["rate_limited"])
                .inc();
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::TOO_MANY_FAILED_LOGINS,
                "too many failed credential checks from this address; retry later",
            )
            .retry_after(wait));
        }
        match shared::credentials::shape(presented) {
            Shape::Scanner => {
                let hash = shared::credentials::hash(presented);
                let found = credentials::find_scanner(&self.0.pool, &hash)
                    .await
                    .map_err(ApiError::from)?;
                let Some(found) = found else {
                    return Err(self.refuse_scanner(Refusal::Unknown, Some(ip)));
                };
                if found.revoked_at.is_some() && !accept_revoked {
                    return Err(self.refuse_scanner(Refusal::Revoked, Some(ip)));
                }
                if found.expires_at <= chrono::Utc::now() {
                    return Err(self.refuse_scanner(Refusal::Expired, Some(ip)));
                }
                Ok(ScannerCredential {
                    id: found.id,
                    event: found.event_id,
                    gate: found.gate,
                    revoked: found.revoked_at.is_some(),
                })
            }
            Shape::Operator => Err(self.refuse_scanner(Refusal::WrongType, Some(ip))),
            Shape::Malformed => Err(self.refuse_scanner(Refusal::Malformed, Some(ip))),
            Shape::Other if self.is_admin(presented) => {
                Err(self.refuse_scanner(Refusal::WrongType, Some(ip)))
            }
            Shape::Other => Err(self.refuse_scanner(Refusal::Unknown, Some(ip))),
        }
    }

    /// Counts a refused scanner call (a failed check also against the caller's address).
    fn refuse_scanner(&self, why: Refusal, ip: Option<IpAddr>) -> ApiError {
        self.0
            .scanner_failures
            .with_label_values(&[why.as_str()])
            .inc();
        if let Some(ip) = ip {
            self.0.failures.failed(ip);
        }
        let unauthorized = || {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                codes::UNAUTHORIZED,
                "a scanner credential is required: Authorization: Bearer fgsc_…",
            )
        };
        match why {
            Refusal::WrongType => ApiError::new(
                StatusCode::FORBIDDEN,
                codes::WRONG_CREDENTIAL_TYPE,
                "only a scanner credential can scan; operator credentials open the admin API",
            ),
            other => unauthorized().with("reason", other.as_str()),
        }
    }

    /// `403 ROLE_FORBIDDEN` unless `op`'s role includes `required`.
    pub fn require(&self, op: &Operator, required: Role) -> Result<(), ApiError> {
        match op.role {
            Some(r) if r.allows(required) => Ok(()),
            role => {
                self.0.admin_failures.with_label_values(&["role"]).inc();
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    codes::ROLE_FORBIDDEN,
                    format!("this call needs the {required} role"),
                )
                .with("role", role.map_or("none", Role::as_str))
                .with("required_role", required.as_str()))
            }
        }
    }

    /// Counts a refused admin call; a failed check (not a missing credential) also counts
    /// against the caller's address.
    fn refuse_admin(&self, why: Refusal, ip: Option<IpAddr>) -> ApiError {
        self.0
            .admin_failures
            .with_label_values(&[why.as_str()])
            .inc();
        if let Some(ip) = ip {
            self.0.failures.failed(ip);
        }
        match why {
            Refusal::WrongType => ApiError::new(
                StatusCode::FORBIDDEN,
                codes::WRONG_CREDENTIAL_TYPE,
                "a scanner credential cannot call the admin API",
            ),
            Refusal::Missing => ApiError::unauthorized(),
            other => ApiError::unauthorized().with("reason", other.as_str()),
        }
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

/// The client's address: the TCP peer (booking's admin API is reached directly, never through
/// the gateway, so no forwarded header is trusted). Unknown (a router driven without a
/// listener) counts as one address.
fn client_ip(parts: &Parts) -> IpAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}
