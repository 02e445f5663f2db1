//! `/healthz` (the process is alive), `/readyz` (Postgres reachable; Redis reported) and
//! `/metrics` (Prometheus text format), `/openapi.json` (the API's OpenAPI 3.1 document).

use crate::app::state::AppState;
use crate::platform::openapi::tags;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;
use serde_json::json;
use std::sync::OnceLock;
use std::time::Duration;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .route("/metrics", get(metrics))
        .routes(routes!(openapi))
}

/// Booking's OpenAPI 3.1 document as `routes::router` generated it from the mounted routes
/// (`app/openapi.rs`); set once per process, before the listener serves.
pub static OPENAPI: OnceLock<String> = OnceLock::new();

/// This document
#[utoipa::path(get, path = "/openapi.json", tag = tags::HEALTH, security(),
    responses((status = 200, description = "OK", body = Object)))]
async fn openapi() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "public, max-age=60"),
        ],
        OPENAPI.get().map_or("", String::as_str),
    )
}

#[derive(Serialize, ToSchema)]
struct Liveness {
    status: String,
}

/// Liveness
#[utoipa::path(get, path = "/healthz", tag = tags::HEALTH, security(),
    responses((status = 200, description = "OK", body = Liveness)))]
async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

#[derive(Serialize, ToSchema)]
struct Readiness {
    postgres: bool,
    redis: bool,
    ready: bool,
}

/// Readiness (Postgres reachable; Redis reported)
#[utoipa::path(get, path = "/readyz", tag = tags::HEALTH, security(),
    responses(
        (status = 200, description = "OK", body = Readiness),
        (status = 503, description = "Not ready: Postgres unreachable", body = Readiness),
    ))]
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
