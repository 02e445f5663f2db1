//! Who is calling the admin listener, and may they make this call (DESIGN section 9,
//! "Credentials"): an operator credential (`fgop_…`, checked against booking's published
//! list, `operators.rs`) or the bootstrap admin secret, and the role each route needs.
//!
//! Guarantees: a scanner credential is never accepted here; an operator credential is never
//! compared with the bootstrap secret (nor the other way round), and is refused `503` rather
//! than checked against a list older than `operators::MAX_STALE`; an address that failed too
//! many checks is refused before its credential is looked at (`AdminApp::authenticate`);
//! a refusal says why only as far as the caller may know (`reason` on an expired credential,
//! the roles on a role refusal), and nothing here logs a credential.

use super::operators::{Lookup, Operators};
use crate::respond::Reply;
use crate::routes::AdminRoute;
use secrecy::SecretString;
use shared::credentials::{BOOTSTRAP_ACTOR, Role, Shape, hash_hex, shape};
use shared::error::{ErrorBody, codes};
use std::time::Instant;

/// A caller whose credential checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The operator's name, or [`BOOTSTRAP_ACTOR`].
    pub actor: String,
    pub role: Role,
    /// The operator credential's id; `None` for the bootstrap secret.
    pub operator_id: Option<String>,
}

impl Caller {
    pub fn is_bootstrap(&self) -> bool {
        self.operator_id.is_none()
    }
}

/// Why a call was refused before its handler ran (`admin_auth_failures_total{reason}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not a bearer, or a typed credential of the wrong
    /// length or alphabet.
    Malformed,
    /// Neither a published operator nor the bootstrap secret.
    Unknown,
    Expired,
    /// A scanner credential.
    WrongType,
    /// The operator list is older than `operators::MAX_STALE` (or was never read).
    Unavailable,
    /// This address failed too many checks; seconds until its window ends.
    RateLimited(u64),
    /// A valid credential whose role is below the route's.
    Role {
        role: Role,
        required: Role,
    },
}

impl Refusal {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Unknown => "unknown",
            Refusal::Expired => "expired",
            Refusal::WrongType => "wrong_type",
            Refusal::Unavailable => "unavailable",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::Role { .. } => "role",
        }
    }

    /// Whether this counts against the caller's address (`AuthFailures`): a presented
    /// credential that did not check out. Not a missing one (nothing was tried), not a
    /// stale list (not the caller's doing), not a role refusal (the credential is valid).
    pub fn is_failed_check(&self) -> bool {
        matches!(
            self,
            Refusal::Malformed | Refusal::Unknown | Refusal::Expired | Refusal::WrongType
        )
    }

    pub fn reply(&self) -> Reply {
        let unauthorized = |message: &str| {
            Reply::error(401, codes::UNAUTHORIZED, message).header("www-authenticate", "Bearer")
        };
        match self {
            Refusal::Missing => {
                unauthorized("an operator credential or the admin secret is required")
            }
            Refusal::Malformed | Refusal::Unknown => unauthorized("credential not accepted"),
            Refusal::Expired => Reply::from_error(
                401,
                ErrorBody::new(codes::UNAUTHORIZED, "this credential has expired")
                    .with("reason", "expired"),
            )
            .header("www-authenticate", "Bearer"),
            Refusal::WrongType => Reply::error(
                403,
                codes::WRONG_CREDENTIAL_TYPE,
                "a scanner credential cannot use the admin listener",
            ),
            Refusal::Unavailable => Reply::error(
                503,
                codes::UNAVAILABLE,
                "operator credentials cannot be checked right now; retry shortly",
            )
            .retry_after(2),
            Refusal::RateLimited(s) => Reply::error(
                429,
                codes::TOO_MANY_FAILED_LOGINS,
                "too many failed credential checks from this address; retry later",
            )
            .retry_after(*s),
            Refusal::Role { role, required } => Reply::from_error(
                403,
                ErrorBody::new(
                    codes::ROLE_FORBIDDEN,
                    "this credential's role may not make this call; nothing changed",
                )
                .with("role", role.as_str())
                .with("required_role", required.as_str()),
            ),
        }
    }
}

/// Checks the `Authorization` header's value (`None`: absent) as of `now` (`now_ms`: unix
/// ms, for expiry).
pub fn check(
    authorization: Option<&[u8]>,
    bootstrap: Option<&SecretString>,
    operators: &Operators,
    now: Instant,
    now_ms: i64,
) -> Result<Caller, Refusal> {
    let header = authorization.ok_or(Refusal::Missing)?;
    let presented = std::str::from_utf8(header)
        .ok()
        .and_then(shared::token::bearer)
        .ok_or(Refusal::Malformed)?;
    match shape(presented) {
        Shape::Malformed => Err(Refusal::Malformed),
        Shape::Scanner => Err(Refusal::WrongType),
        Shape::Operator => match operators.lookup(&hash_hex(presented), now) {
            Lookup::Stale => Err(Refusal::Unavailable),
            Lookup::Unknown => Err(Refusal::Unknown),
            Lookup::Known(k) if k.expires_ms <= now_ms => Err(Refusal::Expired),
            Lookup::Known(k) => Ok(Caller {
                actor: k.name,
                role: k.role,
                operator_id: Some(k.id),
            }),
        },
        Shape::Other => {
            let ok = bootstrap.is_some_and(|s| shared::config::admin_secret_matches(s, presented));
            if ok {
                Ok(Caller {
                    actor: BOOTSTRAP_ACTOR.to_owned(),
                    role: Role::Admin,
                    operator_id: None,
                })
            } else {
                Err(Refusal::Unknown)
            }
        }
    }
}

/// The role a route needs: reads are `viewer`, revoking a fan's admission is `support`,
/// every other change is `admin`. `None`: answered without credentials, or refused before a
/// role matters (unknown event id, wrong method).
pub fn required_role(route: &AdminRoute<'_>) -> Option<Role> {
    match route {
        AdminRoute::Healthz
        | AdminRoute::Readyz
        | AdminRoute::OpenApi
        | AdminRoute::Metrics
        | AdminRoute::NotFound
        | AdminRoute::UnknownEvent
        | AdminRoute::MethodNotAllowed => None,
        AdminRoute::GetConfig(_)
        | AdminRoute::GetRegistrations(_)
        | AdminRoute::Audit(_)
        | AdminRoute::Schedule(_)
        | AdminRoute::Change(..) => Some(Role::Viewer),
        AdminRoute::Revoke(_) => Some(Role::Support),
        AdminRoute::PutConfig(_)
        | AdminRoute::SoldOut(_)
        | AdminRoute::PutRegistrations(_)
        | AdminRoute::AddChange(_)
        | AdminRoute::EditChange(..)
        | AdminRoute::CancelChange(..) => Some(Role::Admin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::credentials::{Kind, Published, PublishedOperator, issue};

    const SECRET: &str = "bootstrap-secret-0123456789";

    struct World {
        ops: Operators,
        viewer: String,
        expired: String,
        now: Instant,
    }

    fn world() -> World {
        let viewer = issue(Kind::Operator).expect("random").secret;
        let expired = issue(Kind::Operator).expect("random").secret;
        let op = |secret: &str, name: &str, expires_ms| PublishedOperator {
            id: format!("id-{name}"),
            name: name.into(),
            role: Role::Viewer,
            hash: hash_hex(secret),
            expires_ms,
        };
        let list = Published {
            generation: 1,
            published_ms: 0,
            operators: vec![op(&viewer, "vera", 2_000), op(&expired, "old", 1_000)],
        };
        let ops = Operators::default();
        let now = Instant::now();
        ops.install(Some(&serde_json::to_string(&list).expect("json")), now);
        World {
            ops,
            viewer,
            expired,
            now,
        }
    }

    fn run(w: &World, header: Option<&str>) -> Result<Caller, Refusal> {
        let secret = SecretString::from(SECRET);
        check(
            header.map(str::as_bytes),
            Some(&secret),
            &w.ops,
            w.now,
            1_000,
        )
    }

    #[test]
    fn credentials_by_shape() {
        let w = world();
        let bearer = |s: &str| format!("Bearer {s}");
        assert_eq!(run(&w, None), Err(Refusal::Missing));
        assert_eq!(run(&w, Some("Basic abc")), Err(Refusal::Malformed));
        assert_eq!(
            run(&w, Some(&bearer("fgop_short"))),
            Err(Refusal::Malformed)
        );
        let scanner = issue(Kind::Scanner).expect("random").secret;
        assert_eq!(run(&w, Some(&bearer(&scanner))), Err(Refusal::WrongType));
        let stranger = issue(Kind::Operator).expect("random").secret;
        assert_eq!(run(&w, Some(&bearer(&stranger))), Err(Refusal::Unknown));
        assert_eq!(run(&w, Some(&bearer(&w.expired))), Err(Refusal::Expired));
        let vera = run(&w, Some(&bearer(&w.viewer))).expect("vera");
        assert_eq!(
            (vera.actor.as_str(), vera.role, vera.operator_id.as_deref()),
            ("vera", Role::Viewer, Some("id-vera"))
        );
        let boot = run(&w, Some(&bearer(SECRET))).expect("bootstrap");
        assert!(boot.is_bootstrap());
        assert_eq!((boot.actor.as_str(), boot.role), ("bootstrap", Role::Admin));
        assert_eq!(run(&w, Some(&bearer("wrong"))), Err(Refusal::Unknown));
        // The bootstrap secret is never compared with an operator-shaped credential.
        let unset = check(Some(bearer(SECRET).as_bytes()), None, &w.ops, w.now, 0);
        assert_eq!(unset, Err(Refusal::Unknown));
    }

    #[test]
    fn a_stale_list_refuses_operators_but_not_the_bootstrap_secret() {
        let w = world();
        let later = w.now + super::super::operators::MAX_STALE * 2;
        let secret = SecretString::from(SECRET);
        let at = |s: &str| check(Some(s.as_bytes()), Some(&secret), &w.ops, later, 0);
        assert_eq!(
            at(&format!("Bearer {}", w.viewer)),
            Err(Refusal::Unavailable)
        );
        assert!(at(&format!("Bearer {SECRET}")).is_ok());
    }

    #[test]
    fn refusals_answer_as_documented() {
        let cases = [
            (Refusal::Missing, 401, true),
            (Refusal::Malformed, 401, true),
            (Refusal::Unknown, 401, true),
            (Refusal::Expired, 401, true),
            (Refusal::WrongType, 403, true),
            (Refusal::Unavailable, 503, false),
            (Refusal::RateLimited(7), 429, false),
            (
                Refusal::Role {
                    role: Role::Viewer,
                    required: Role::Admin,
                },
                403,
                false,
            ),
        ];
        for (r, status, counted) in cases {
            assert_eq!(r.reply().status, status, "{r:?}");
            assert_eq!(
                r.is_failed_check(),
                counted && r != Refusal::Missing,
                "{r:?}"
            );
        }
    }
}
