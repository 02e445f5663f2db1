//! The ops audit log: who changed what, when. Every ops action of booking's admin API writes
//! one entry with [`record_tx`] inside the transaction that makes the change, so an entry
//! exists exactly when its change committed.
//!
//! Who: the credential decides (`platform::auth`). An operator credential (`fgop_…`) makes
//! the operator's name the actor, with their role and credential id; the shared bootstrap
//! admin secret is recorded as `bootstrap`, and the name it sends in `X-Floodgate-Actor` is
//! kept as a note, never as the actor. The extractors below also decide what a role may do:
//! [`Viewer`] reads, [`Support`] acts on orders, [`AdminOp`] changes events, rooms and
//! operators.

use crate::platform::auth::Auth;
use crate::platform::error::ApiError;
use anyhow::Context;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde_json::{Value, json};
pub use shared::credentials::Role;
use sqlx::PgConnection;

/// The header the bootstrap secret's callers name themselves in (kept as a note).
pub const ACTOR_HEADER: &str = "x-floodgate-actor";
/// Error code of a bootstrap call that must name its operator and did not.
pub const ACTOR_REQUIRED: &str = shared::error::codes::ACTOR_REQUIRED;
const MAX_ACTOR: usize = 200;

/// Who made a change: an operator, the bootstrap secret, or booking itself (`payments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The operator's name, `bootstrap`, or a system actor's name.
    pub name: String,
    /// `None` for a system actor.
    pub role: Option<Role>,
    /// The operator credential's id (`None`: bootstrap or system).
    pub operator_id: Option<String>,
    /// What the bootstrap secret's caller wrote in `X-Floodgate-Actor`.
    pub note: Option<String>,
}

impl Operator {
    /// Booking itself (a job, the payment flow).
    pub fn system(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            role: None,
            operator_id: None,
            note: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is the bootstrap admin secret.
    pub fn is_bootstrap(&self) -> bool {
        self.operator_id.is_none() && self.name == shared::credentials::BOOTSTRAP_ACTOR
    }

    /// The role, id and note, for a row that is audited later under this actor (a refund
    /// the refund job finishes).
    pub fn detail(&self) -> Value {
        json!({
            "role": self.role.map(Role::as_str),
            "operator_id": self.operator_id,
            "note": self.note,
        })
    }

    /// The actor a row recorded with [`Operator::detail`] (or, before that existed, with its
    /// name only).
    pub fn from_stored(name: &str, detail: Option<&Value>) -> Self {
        let field = |k: &str| {
            detail
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Self {
            name: name.to_owned(),
            role: field("role").as_deref().and_then(Role::parse),
            operator_id: field("operator_id"),
            note: field("note"),
        }
    }
}

/// The operator's name from the header: 1..=200 visible characters (spaces inside allowed),
/// trimmed. `None` when missing or unusable.
pub fn actor_from(parts: &Parts) -> Option<String> {
    let raw = parts.headers.get(ACTOR_HEADER)?.to_str().ok()?.trim();
    let ok =
        !raw.is_empty() && raw.chars().count() <= MAX_ACTOR && raw.chars().all(|c| !c.is_control());
    ok.then(|| raw.to_owned())
}

/// The role codes of [`Caller`]'s `ROLE` parameter.
pub const VIEWER: u8 = 0;
pub const SUPPORT: u8 = 1;
pub const ADMIN: u8 = 2;

const fn role_of(code: u8) -> Role {
    match code {
        VIEWER => Role::Viewer,
        SUPPORT => Role::Support,
        _ => Role::Admin,
    }
}

/// An admin caller whose credential holds at least role `ROLE`. With `NAMED`, a call made
/// with the bootstrap secret must name its operator in `X-Floodgate-Actor` (`400
/// ACTOR_REQUIRED`), so no change made with the shared secret is anonymous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller<const ROLE: u8, const NAMED: bool>(pub Operator);

/// Reads: orders, the audit log, events, products.
pub type Viewer = Caller<VIEWER, false>;
/// Order actions: refunds, cancellations.
pub type Support = Caller<SUPPORT, true>;
/// Event, inventory and operator changes.
pub type AdminOp = Caller<ADMIN, true>;
/// An admin change that existed before the audit log (`POST /admin/events`, products): the
/// bootstrap secret may leave `X-Floodgate-Actor` out, so seeding and loadgen keep working.
pub type AdminCaller = Caller<ADMIN, false>;

impl<const ROLE: u8, const NAMED: bool> Caller<ROLE, NAMED> {
    pub fn into_inner(self) -> Operator {
        self.0
    }
}

impl<const ROLE: u8, const NAMED: bool> std::ops::Deref for Caller<ROLE, NAMED> {
    type Target = Operator;
    fn deref(&self) -> &Operator {
        &self.0
    }
}

impl<S, const ROLE: u8, const NAMED: bool> FromRequestParts<S> for Caller<ROLE, NAMED>
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // The credential first: an unauthenticated caller learns nothing about the rules.
        let auth = Auth::from_ref(state);
        let op = auth.operator(parts).await?;
        auth.require(&op, role_of(ROLE))?;
        // Present but unusable is bad input for every caller (an operator's is ignored, not
        // waved through).
        if parts.headers.contains_key(ACTOR_HEADER) && actor_from(parts).is_none() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ACTOR_REQUIRED,
                "X-Floodgate-Actor must be 1 to 200 visible characters",
            ));
        }
        if NAMED && op.is_bootstrap() && op.note.is_none() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ACTOR_REQUIRED,
                "with the bootstrap admin secret, name the operator in X-Floodgate-Actor (1 to \
                 200 characters), or use an operator credential",
            ));
        }
        Ok(Caller(op))
    }
}

/// One audit entry: `action` (a dotted name such as `order.refund`) on `target` (such as
/// `order:ord_1`), in `event` if it belongs to one, with `detail` (the validated request and
/// what it changed). Call it inside the transaction of the change.
pub async fn record_tx(
    conn: &mut PgConnection,
    actor: &Operator,
    action: &str,
    target: &str,
    event: Option<&str>,
    detail: &Value,
) -> anyhow::Result<()> {
    insert_tx(conn, actor, action, target, event, detail)
        .await
        .with_context(|| format!("failed to record the audit entry {action} on {target}"))
}

/// [`record_tx`] with the database error as is, for repositories that name the failed
/// statement in their own error type.
pub async fn insert_tx(
    conn: &mut PgConnection,
    actor: &Operator,
    action: &str,
    target: &str,
    event: Option<&str>,
    detail: &Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO ops_audit (actor, action, target, event_id, detail, role, operator_id, note)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(actor.name())
    .bind(action)
    .bind(target)
    .bind(event)
    .bind(detail)
    .bind(actor.role.map(Role::as_str))
    .bind(actor.operator_id.as_deref())
    .bind(actor.note.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(value: Option<&str>) -> Parts {
        let mut b = Request::builder();
        if let Some(v) = value {
            b = b.header(ACTOR_HEADER, v);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn the_actor_is_trimmed_bounded_and_visible() {
        assert_eq!(
            actor_from(&parts(Some("  alice@promoter "))).as_deref(),
            Some("alice@promoter")
        );
        assert_eq!(
            actor_from(&parts(Some("Ops Desk 2"))).as_deref(),
            Some("Ops Desk 2")
        );
        assert_eq!(actor_from(&parts(None)), None);
        assert_eq!(actor_from(&parts(Some("   "))), None);
        assert_eq!(actor_from(&parts(Some(&"a".repeat(201)))), None);
        assert!(actor_from(&parts(Some(&"a".repeat(200)))).is_some());
        assert_eq!(actor_from(&parts(Some("bob\tx"))), None);
    }
}
