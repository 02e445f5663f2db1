//! The gateway's in-memory view of every event's live config, sold-out flag and
//! revocations, refreshed from Redis every `refresh_ms` (so a change reaches every instance
//! within a second) by [`Refresher`], a pingora background service.
//!
//! When Redis is down the last known view stays in force: admitted fans keep working and
//! revocations already seen keep being enforced.

use crate::auto::UpstreamWindow;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::store::{EventSnapshot, Store};
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use shared::token::AdmissionClaims;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Live {
    events: RwLock<HashMap<String, Arc<EventSnapshot>>>,
}

impl Live {
    pub fn get(&self, event: &str) -> Option<Arc<EventSnapshot>> {
        self.events
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(event)
            .cloned()
    }

    pub fn event_ids(&self) -> Vec<String> {
        self.events
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    pub fn upsert(&self, event: &str, snap: EventSnapshot) {
        self.events
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(event.to_owned(), Arc::new(snap));
    }

    fn replace(&self, all: Vec<(String, EventSnapshot)>) {
        let map = all
            .into_iter()
            .filter(|(_, s)| s.config.is_some())
            .map(|(e, s)| (e, Arc::new(s)))
            .collect();
        *self.events.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    /// True when ops revoked this token's account or session after its admission (a token
    /// re-minted during checkout carries the admission time, so it is refused too).
    pub fn is_revoked(&self, c: &AdmissionClaims) -> bool {
        let guard = self.events.read().unwrap_or_else(|p| p.into_inner());
        let Some(s) = guard.get(&c.evt) else {
            return false;
        };
        let hit = |at: Option<&i64>| at.is_some_and(|at| c.revoked_by(*at));
        hit(s.revoked_accounts.get(&c.sub)) || hit(s.revoked_sessions.get(&c.sid))
    }
}

/// Background service: refreshes [`Live`], publishes this instance's upstream health for
/// auto mode, and prunes the rate limiters.
pub struct Refresher {
    pub store: Store,
    pub live: Arc<Live>,
    pub limits: Arc<Limits>,
    pub window: Arc<UpstreamWindow>,
    pub metrics: Arc<Metrics>,
    pub instance: String,
    pub every: Duration,
    pub window_s: u64,
}

#[async_trait]
impl BackgroundService for Refresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_publish = Instant::now();
        let mut last_prune = Instant::now();
        let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
        let mut redis_ok = true;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            match self.store.load_all().await {
                Ok(all) => {
                    if !redis_ok {
                        tracing::info!("redis reachable again; live config refreshed");
                    }
                    redis_ok = true;
                    self.live.replace(all);
                }
                Err(e) => {
                    self.metrics.redis_errors.inc();
                    if redis_ok {
                        tracing::warn!(error = %e, "live config refresh failed; keeping the last known config");
                    }
                    redis_ok = false;
                }
            }
            if last_publish.elapsed() >= Duration::from_secs(1) {
                last_publish = Instant::now();
                let summary = self.window.summary(self.window_s).encode();
                if let Err(e) = self
                    .store
                    .put_upstream_stats(&self.instance, &summary)
                    .await
                    && redis_ok
                {
                    tracing::debug!(error = %e, "publishing upstream stats failed");
                }
            }
            // Pruning walks every rate-limit key (hundreds of thousands during a surge): on a
            // blocking thread, so the proxy's workers keep serving, and never two at once. On
            // the async worker it stalled the waiting room every 30 s in the surge benchmark.
            if last_prune.elapsed() >= Duration::from_secs(30)
                && pruning.as_ref().is_none_or(|h| h.is_finished())
            {
                last_prune = Instant::now();
                let limits = self.limits.clone();
                pruning = Some(tokio::task::spawn_blocking(move || limits.prune()));
            }
        }
    }
}
