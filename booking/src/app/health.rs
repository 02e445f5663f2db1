//! `/healthz` (the process is alive), `/readyz` (Postgres reachable; Redis reported) and
//! `/metrics` (Prometheus text format), `/openapi.json` (the API's OpenAPI 3.1 document).

use crate::app::state::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;
use std::time::Duration;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
}

/// Booking's OpenAPI 3.1 document, built by `deploy/openapi/build.py` and kept true by the
/// route test (`booking/tests/openapi.rs`) and the schemathesis run (`deploy/tests/openapi.sh`).
pub const OPENAPI: &str = include_str!("../../../docs/openapi/booking.json");

async fn openapi() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "public, max-age=60"),
        ],
        OPENAPI,
    )
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let pg = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.pool),
    )
    .await
    .map(|r| r.is_ok())
    .unwrap_or(false);
    let redis = match tokio::time::timeout(Duration::from_secs(2), state.redis.conn()).await {
        Ok(Ok(mut conn)) => redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok(),
        _ => false,
    };
    // Postgres is the source of truth: without it we are not ready. Without Redis the
    // seat paths still work, so it is reported but does not fail readiness.
    let status = if pg {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"postgres": pg, "redis": redis, "ready": pg})),
    )
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
