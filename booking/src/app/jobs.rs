//! Every background job of the process, assembled here (the domains define them; the
//! platform runs them). All stop with the process's stop signal.

use crate::app::state::AppState;
use crate::platform::idempotency::PurgeKeys;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub fn spawn_all(state: AppState, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let mut jobs = crate::platform::jobs::spawn_all(crate::auctions::jobs(&state.auctions), &stop);
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::orders::jobs(&state.orders),
        &stop,
    ));
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::outbox::jobs(&state.outbox),
        &stop,
    ));
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::payments::jobs(&state.payments),
        &stop,
    ));
    jobs.push(crate::platform::jobs::spawn(
        Arc::new(PurgeKeys(state.idempotency.clone())),
        stop.clone(),
    ));
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::inventory::jobs(&state.inventory),
        &stop,
    ));
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::tickets::mail::jobs(&state.mail),
        &stop,
    ));
    jobs.extend(crate::platform::jobs::spawn_all(
        crate::checkin::jobs(&state.checkin),
        &stop,
    ));
    jobs
}
