//! Background jobs (sweeper, order expiry, outbox relay, auction closer, ...). Each runs a
//! loop until the stop signal flips; every job is safe to run on many instances at once
//! because it claims rows with `FOR UPDATE SKIP LOCKED`.

use crate::state::AppState;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub fn spawn_all(state: AppState, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let sweep_every = Duration::from_millis(state.config.booking.sweeper_interval_ms.max(100));
    let mut jobs = crate::auctions::spawn_jobs(&state, &stop);
    jobs.extend(crate::orders::spawn_jobs(&state, &stop));
    jobs.extend(crate::payments::spawn_jobs(&state, &stop));
    jobs.push(spawn_periodic("hold-sweeper", sweep_every, stop, {
        let state = state.clone();
        move || {
            let state = state.clone();
            async move {
                crate::sweeper::sweep_all(&state).await?;
                Ok(())
            }
        }
    }));
    jobs
}

/// Runs `tick` every `every` until `stop` is set; errors are logged and the loop goes on.
pub fn spawn_periodic<F, Fut>(
    name: &'static str,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    mut tick: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {
                    if let Err(e) = tick().await {
                        tracing::warn!(job = name, error = ?e, "background job failed; will retry");
                    }
                }
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        tracing::debug!(job = name, "background job stopped");
    })
}
