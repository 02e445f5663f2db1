//! The seat map.
use crate::state::AppState;
use axum::Router;

/// In-memory cache of rendered seat maps.
#[derive(Default)]
pub struct SeatMapCache {}

/// A well-formed seat id: 1..=64 ASCII letters, digits, `-`, `_`, `.`, `:`.
pub fn is_valid_seat_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

pub fn router() -> Router<AppState> {
    Router::new()
}
