//! The seat map.
use crate::state::AppState;
use axum::Router;

/// In-memory cache of rendered seat maps.
#[derive(Default)]
pub struct SeatMapCache {}

pub fn router() -> Router<AppState> {
    Router::new()
}
