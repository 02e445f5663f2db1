//! The ops audit log: who changed what, when. Every ops action of booking's admin API writes
//! one entry with [`record_tx`] inside the transaction that makes the change, so an entry
//! exists exactly when its change committed.
//!
//! Who: the admin bearer secret is one shared secret, so it cannot tell operators apart. An
//! ops call names its operator in `X-Floodgate-Actor` ([`Operator`]); calls that change
//! something refuse to run without one (`400 ACTOR_REQUIRED`), so no change is anonymous.

use crate::platform::auth::{Admin, Auth};
use crate::platform::error::ApiError;
use anyhow::Context;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde_json::Value;
use sqlx::PgConnection;

/// The header that names the operator behind an admin call.
pub const ACTOR_HEADER: &str = "x-floodgate-actor";
/// Error code of a mutating admin call without an operator name.
pub const ACTOR_REQUIRED: &str = shared::error::codes::ACTOR_REQUIRED;
const MAX_ACTOR: usize = 200;

/// An admin caller (bearer admin secret) who named themselves in `X-Floodgate-Actor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

impl Operator {
    pub fn name(&self) -> &str {
        &self.0
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

impl<S> FromRequestParts<S> for Operator
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // The secret first: an unauthenticated caller learns nothing about the header rule.
        Admin::from_request_parts(parts, state).await?;
        actor_from(parts).map(Operator).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ACTOR_REQUIRED,
                "name the operator in X-Floodgate-Actor (1 to 200 characters)",
            )
        })
    }
}

/// The actor of an admin call that existed before the audit log (`POST /admin/events`,
/// `POST`/`PUT /admin/products...`): the admin bearer is required, the operator's name is
/// taken from `X-Floodgate-Actor` when given and is [`UNNAMED`] otherwise, so existing
/// callers (seeding, loadgen) keep working and their changes are still recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminCaller(pub Operator);

/// The actor recorded for an admin call that named no operator.
pub const UNNAMED: &str = "unnamed";

impl<S> FromRequestParts<S> for AdminCaller
where
    Auth: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Admin::from_request_parts(parts, state).await?;
        Ok(AdminCaller(Operator(
            actor_from(parts).unwrap_or_else(|| UNNAMED.to_owned()),
        )))
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
        "INSERT INTO ops_audit (actor, action, target, event_id, detail)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(actor.name())
    .bind(action)
    .bind(target)
    .bind(event)
    .bind(detail)
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
