//! The ops API's read side (issue 18): order search (`GET /admin/orders`), one order with
//! everything that happened to it (`GET /admin/orders/{id}`) and the audit log reader
//! (`GET /admin/audit`), and the operators who may use the admin API (`operators`, which
//! writes).
//!
//! Layout: [`search`] (filters, keyset pages), [`detail`] (the order's items, payment
//! attempts, provider events, refunds, tickets and audit entries, read in one snapshot),
//! [`audit_log`] (the `ops_audit` reader), [`page`] (the ops page at `/ops/`, a static page
//! over this API). The writes of the ops API live with what they
//! change (seat kills in `inventory::kills`, refunds and cancellations in `payments`), each
//! recording its audit entry with `platform::audit::record_tx`.
//!
//! Reads run on the main pool (custom plans): the search builds its SQL from the filters
//! given, so each combination gets the plan of its own index.

pub mod audit_log;
pub mod detail;
pub mod operators;
pub mod page;
pub mod search;

use crate::platform::auth::Auth;
use crate::platform::error::{ApiError, ApiResult};
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What the ops handlers use.
#[derive(Clone)]
pub struct OpsState {
    pub pool: PgPool,
    pub auth: Auth,
    /// The waiting room's Redis, where the live operators are published for the gateway.
    pub queue_redis: std::sync::Arc<shared::redis_conn::Connector>,
    /// `redis.key_prefix`.
    pub redis_prefix: String,
}

impl axum::extract::FromRef<OpsState> for Auth {
    fn from_ref(state: &OpsState) -> Self {
        state.auth.clone()
    }
}

pub fn router() -> OpenApiRouter<OpsState> {
    OpenApiRouter::new()
        .routes(routes!(search::search_orders))
        .routes(routes!(detail::order_detail))
        .routes(routes!(audit_log::read_audit))
        .merge(operators::router())
}

/// A query string that does not parse (an unknown parameter, a limit that is no number) is a
/// `422` with the standard body.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::validation(format!("invalid query: {}", e.body_text())))
}

/// A filter given as `?x=` (empty) is refused rather than read as "no filter".
fn non_empty<'a>(field: &str, v: &'a Option<String>) -> ApiResult<Option<&'a str>> {
    match v.as_deref() {
        Some(s) if s.is_empty() || s.len() > 300 => Err(ApiError::validation(format!(
            "{field} must be 1 to 300 characters"
        ))
        .with("field", field)),
        other => Ok(other),
    }
}
