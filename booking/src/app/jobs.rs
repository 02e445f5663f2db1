//! Every background job of the process, assembled here (the domains define them; the
//! platform runs them). All stop with the process's stop signal.

use crate::app::state::AppState;
use crate::platform::idempotency::PurgeKeys;
use crate::platform::jobs::spawn_periodic;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub fn spawn_all(state: AppState, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let sweep_every = Duration::from_millis(state.config.booking.sweeper_interval_ms.max(100));
    let mut jobs = crate::auctions::spawn_jobs(&state, &stop);
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::orders::jobs(&state.orders),
        &stop,
    ));
    jobs.extend(crate::payments::spawn_jobs(&state, &stop));
    jobs.push(crate::platform::jobs::spawn(
        Arc::new(PurgeKeys(state.idempotency.clone())),
        stop.clone(),
    ));
    jobs.push(spawn_periodic("hold-sweeper", sweep_every, stop, {
        let state = state.clone();
        move || {
            let state = state.clone();
            async move {
                crate::inventory::sweeper::sweep_all(&state).await?;
                Ok(())
            }
        }
    }));
    jobs
}
