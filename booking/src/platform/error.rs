//! The one error type every handler returns. It becomes `{"code", "message", ...details}`
//! with a stable `code`; internal error text never reaches the client. Server-side failures
//! are logged once, here, with their full cause chain.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use shared::error::{ErrorBody, codes};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A client-facing refusal with its status and body.
    #[error("{status}: {}", body.code)]
    Client {
        status: StatusCode,
        body: ErrorBody,
        retry_after_s: Option<u64>,
    },
    /// A dependency (Postgres, Redis, provider) is unreachable or overloaded: `503`.
    #[error("dependency unavailable")]
    Unavailable(#[source] anyhow::Error),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError::Client {
            status,
            body: ErrorBody::new(code, message),
            retry_after_s: None,
        }
    }

    /// Adds a detail field to a client error (no-op on server errors).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        if let ApiError::Client { body, .. } = &mut self {
            body.details.insert(key.to_owned(), value.into());
        }
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        if let ApiError::Client { retry_after_s, .. } = &mut self {
            *retry_after_s = Some(seconds);
        }
        self
    }

    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::VALIDATION_FAILED,
            message,
        )
    }

    pub fn not_found(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn conflict(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn admission_required() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            codes::ADMISSION_REQUIRED,
            "a valid admission token for this event is required; join the waiting room",
        )
    }

    /// A valid admission token, but for another event than the resource's: one admission
    /// opens one event (DESIGN.md section 8).
    pub fn wrong_event() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            codes::WRONG_EVENT,
            "this admission is for another event; join that event's waiting room",
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "admin credentials required",
        )
    }

    pub fn unexpected(e: impl Into<anyhow::Error>) -> Self {
        ApiError::Unexpected(e.into())
    }

    /// The machine code of this error (for metrics).
    pub fn code(&self) -> &str {
        match self {
            ApiError::Client { body, .. } => &body.code,
            ApiError::Unavailable(_) => codes::UNAVAILABLE,
            ApiError::Unexpected(_) => codes::INTERNAL,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Client { status, .. } => *status,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Database errors: pool exhaustion and connection failures are `503` (retry later); anything
/// else is a bug or an unexpected state and becomes a `500`.
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            // `Protocol`: what sqlx reports for a connection closed while it opens (EOF read
            // as a bad SSLRequest answer); a broken connection, not a bug.
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_) => {
                ApiError::Unavailable(anyhow::Error::new(e).context("database unavailable"))
            }
            // A deadlock or serialization failure that outlived its retries, a lock or
            // statement timeout: the transaction rolled back and a retry may well succeed, so
            // the caller gets "retry shortly", not an internal error.
            other if is_transient(&other) => ApiError::Unavailable(
                anyhow::Error::new(other).context("database contention, transaction rolled back"),
            ),
            other => ApiError::Unexpected(anyhow::Error::new(other).context("database error")),
        }
    }
}

/// Deadlock (40P01), serialization failure (40001), lock not available (55P03) and statement
/// timeout (57014): the transaction changed nothing and may succeed when retried.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40P01" | "40001" | "55P03" | "57014")
    )
}

/// Redis answers that say "not now" rather than "no", as redis-rs itself classifies them (its
/// retry method): a server still loading its dataset after a restart (`LOADING`), a failover
/// under way (`MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, `READONLY` from a demoted primary, a
/// sentinel without a primary yet). Nothing was written; a retry can succeed.
fn redis_busy(e: &redis::RedisError) -> bool {
    use redis::RetryMethod;
    matches!(
        e.retry_method(),
        RetryMethod::WaitAndRetry | RetryMethod::RefreshSlotsAndRetry
    )
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || redis_busy(&e)
        {
            ApiError::Unavailable(anyhow::Error::new(e).context("redis unavailable"))
        } else {
            ApiError::Unexpected(anyhow::Error::new(e).context("redis error"))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (body, retry_after) = match self {
            ApiError::Client {
                body,
                retry_after_s,
                ..
            } => (body, retry_after_s),
            ApiError::Unavailable(e) => {
                tracing::warn!(error = ?e, "dependency unavailable");
                (
                    ErrorBody::new(
                        codes::UNAVAILABLE,
                        "service temporarily unavailable, retry shortly",
                    ),
                    Some(1),
                )
            }
            ApiError::Unexpected(e) => {
                tracing::error!(error = ?e, "unexpected error");
                (ErrorBody::new(codes::INTERNAL, "internal error"), None)
            }
        };
        let mut resp = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_json(),
        )
            .into_response();
        if let Some(s) = retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    /// A Redis restarting (loading its dataset) or failing over answers "retry shortly"
    /// (`503` + `Retry-After`), not "internal error": before, a cart write during a Redis
    /// reload got `500` and an ERROR log line.
    #[test]
    fn a_redis_that_is_loading_or_failing_over_is_a_503() {
        for kind in [
            ServerErrorKind::BusyLoading,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::TryAgain,
        ] {
            let e = RedisError::from((ErrorKind::Server(kind), "busy"));
            let resp = ApiError::from(e).into_response();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{kind:?}");
            assert!(resp.headers().contains_key(header::RETRY_AFTER), "{kind:?}");
        }
        // A script bug or a wrong type stays an internal error.
        let e = RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "ERR"));
        assert_eq!(
            ApiError::from(e).into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
