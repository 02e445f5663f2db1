//! Inventory: events and their seat maps, seat holds, general-admission counters, the hold
//! sweeper and the storefront's event view.

pub mod events;
pub mod ga;
pub mod holds;
pub mod seats;
pub mod storefront;
pub mod sweeper;

/// Everything the inventory domain's handlers and jobs use; the app layer builds it and handlers take
/// it with `State<InventoryState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct InventoryState {
    pub pool: sqlx::PgPool,
    pub redis: crate::platform::redis::Redis,
    pub auth: crate::platform::auth::Auth,
}

impl axum::extract::FromRef<InventoryState> for crate::platform::auth::Auth {
    fn from_ref(state: &InventoryState) -> Self {
        state.auth.clone()
    }
}
