//! Admin API for events: create with seat map and GA tiers, read counts.
use crate::state::AppState;
use axum::Router;

pub fn router() -> Router<AppState> {
    Router::new()
}
