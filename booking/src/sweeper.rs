//! Expired-hold sweeper.
use crate::state::AppState;

pub async fn sweep_all(_state: &AppState) -> anyhow::Result<u64> {
    Ok(0)
}
