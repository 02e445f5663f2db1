//! The gateway's in-memory view of every event's live config, sold-out flag and
//! revocations, and of the operator credentials booking publishes, refreshed from Redis
//! every `refresh_ms` (so a change reaches every instance within a second) by [`Refresher`],
//! a pingora background service.
//!
//! When Redis is down the last known view stays in force: admitted fans keep working and
//! revocations already seen keep being enforced. The operator list is the exception after
//! `admin::operators::MAX_STALE`: past that, operator credentials are refused `503` rather
//! than checked against a list that may predate a revocation.

use crate::auto::UpstreamWindow;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::progress::{DrawHistogram, Progress};
use crate::slots::Freed;
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
    /// Fans whose `max_active` slot was freed (`slots.rs`).
    pub freed: Freed,
    /// The operator credentials the admin listener accepts (`admin/operators.rs`).
    pub operators: crate::admin::operators::Operators,
}

impl Live {
    pub fn get(&self, event: &str) -> Option<Arc<EventSnapshot>> {
        self.events
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(event)
            .cloned()
    }

    /// The event's `queue_shards` (1 when unknown: an event's count never changes, and an
    /// unknown event has no split queue to find).
    pub fn queue_shards(&self, event: &str) -> u32 {
        self.get(event).map_or(1, |s| s.queue_shards())
    }

    pub fn event_ids(&self) -> Vec<String> {
        self.events
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    pub fn upsert(&self, event: &str, mut snap: EventSnapshot) {
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = events.get(event) {
            carry_progress(&mut snap, &old.progress);
        }
        events.insert(event.to_owned(), Arc::new(snap));
    }

    /// Installs a refresh. Events whose progress was not read this time keep the last one,
    /// and a progress read without its draw histogram keeps the last histogram.
    fn replace(&self, all: Vec<(String, EventSnapshot)>) {
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        let map = all
            .into_iter()
            .filter(|(_, s)| s.config.is_some())
            .map(|(e, mut s)| {
                if let Some(old) = events.get(&e) {
                    carry_progress(&mut s, &old.progress);
                }
                (e, Arc::new(s))
            })
            .collect();
        *events = map;
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

/// How long a freed mark of `event` can matter (ms): a token lasts at most `max_session_s`
/// from its admission (or its first lifetime, if longer), plus a minute of clock slack.
/// `None`: an event no longer configured.
pub fn freed_keep_ms(live: &Live, event: &str) -> Option<i64> {
    let snap = live.get(event)?;
    let c = snap.config.as_ref()?;
    let s = c.max_session_s.max(c.token_ttl_s).saturating_add(60);
    Some(
        i64::try_from(s)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000),
    )
}

fn carry_progress(snap: &mut EventSnapshot, old: &Arc<Progress>) {
    if !snap.progress.known {
        snap.progress = old.clone();
    } else if !snap.progress.parts.is_empty() {
        if snap.progress.hist.is_none()
            && let Some(p) = Arc::get_mut(&mut snap.progress)
        {
            p.carry_part_histograms(old);
        }
    } else if snap.progress.hist.is_none()
        && let (Some(p), Some(h)) = (Arc::get_mut(&mut snap.progress), &old.hist)
    {
        p.hist = Some(h.clone());
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

/// An instance counts as live (for shared rate limits) while its health summary is this fresh.
const MEMBER_MAX_AGE_S: u64 = 3;

/// How often the refresher reads queue progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// How often the refresher forgets freed marks no token can use any more.
const FREED_PRUNE_EVERY: Duration = Duration::from_secs(10);

impl Refresher {
    /// Re-reads booking's published operator list (`admin/operators.rs` decides what to keep).
    async fn refresh_operators(&self) {
        use crate::admin::operators::Installed;
        match self.store.load_operators().await {
            Ok(raw) => {
                let done = self.live.operators.install(raw.as_deref(), Instant::now());
                if done == Installed::Malformed {
                    self.metrics.operators_malformed.inc();
                }
            }
            // Counted; the list in force ages towards its staleness limit. The live config's
            // own read logs Redis going away and coming back.
            Err(_) => self.metrics.redis_errors.inc(),
        }
    }

    /// Reads the freed marks written since the last read of each event (`slots.rs`).
    async fn refresh_freed(&self) -> Result<(), crate::store::StoreError> {
        let from: Vec<(String, i64)> = self
            .live
            .event_ids()
            .into_iter()
            .map(|e| {
                let ms = self.live.freed.read_from(&e);
                (e, ms)
            })
            .collect();
        let read = self.store.load_freed(&from).await?;
        for ((event, _), marks) in from.into_iter().zip(read) {
            self.live.freed.merge(&event, marks);
        }
        Ok(())
    }

    /// Adds the draw histogram to each fresh progress: re-read only for events whose draw
    /// count moved since the last read (so once the sale starts, never again). A split queue:
    /// each sub-queue's draw and FIFO histograms, re-read only where its counts moved.
    async fn attach_histograms(&self, all: &mut [(String, EventSnapshot)]) {
        let mut stale: Vec<HistRead> = Vec::new();
        for (i, (event, snap)) in all.iter_mut().enumerate() {
            if !snap.progress.known {
                continue;
            }
            let old = self.live.get(event);
            if snap.progress.parts.is_empty() {
                let draws = snap.progress.draws;
                let have = old.and_then(|s| s.progress.hist.as_ref().map(|h| h.draws));
                if draws > 0 && have != Some(draws) {
                    stale.push(HistRead::whole(i));
                }
                continue;
            }
            if let (Some(p), Some(o)) = (Arc::get_mut(&mut snap.progress), &old) {
                p.carry_part_histograms(&o.progress);
            }
            for (j, part) in snap.progress.parts.iter().enumerate() {
                let part_read = |fifo, from| HistRead {
                    event: i,
                    part: Some(u32::try_from(j).unwrap_or(0)),
                    fifo,
                    from,
                };
                if part.draws > 0 && part.draw_hist.as_ref().map(|h| h.draws) != Some(part.draws) {
                    stale.push(part_read(false, 0));
                }
                if part.fifos > 0 && part.fifo_hist.as_ref().map(|h| h.fifos) != Some(part.fifos) {
                    stale.push(part_read(true, part.fifo_reread_from()));
                }
            }
        }
        if stale.is_empty() {
            return;
        }
        let keys = stale
            .iter()
            .map(|r| {
                let event = &all[r.event].0;
                let key = match r.part {
                    None => self.store.key(event, "hist"),
                    Some(k) => {
                        self.store
                            .shard_key(event, k, if r.fifo { "fhist" } else { "hist" })
                    }
                };
                (key, r.from)
            })
            .collect();
        let strings = match self.store.load_tails(keys).await {
            Ok(s) => s,
            Err(e) => {
                self.metrics.redis_errors.inc();
                tracing::debug!(error = %e, "reading queue histograms failed");
                return;
            }
        };
        for (r, bytes) in stale.into_iter().zip(strings) {
            let Some(p) = Arc::get_mut(&mut all[r.event].1.progress) else {
                continue;
            };
            match r.part {
                None => p.hist = Some(Arc::new(DrawHistogram::from_bitfield(p.draws, &bytes))),
                Some(k) => {
                    if let Some(part) = p.parts.get_mut(k as usize) {
                        part.attach(r.fifo, r.from, &bytes);
                        p.hist = None;
                    }
                }
            }
        }
        for (_, snap) in all.iter_mut() {
            if let Some(p) = Arc::get_mut(&mut snap.progress)
                && !p.parts.is_empty()
                && p.hist.is_none()
            {
                p.combine_draw_histograms();
            }
        }
    }
}

/// A histogram string the refresher (re-)reads: the event's index, its sub-queue (`None`: a
/// whole queue's draw histogram), whether it is the FIFO one, and from which byte.
struct HistRead {
    event: usize,
    part: Option<u32>,
    fifo: bool,
    from: usize,
}

impl HistRead {
    fn whole(event: usize) -> HistRead {
        HistRead {
            event,
            part: None,
            fifo: false,
            from: 0,
        }
    }
}

#[async_trait]
impl BackgroundService for Refresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_publish = Instant::now();
        let mut last_prune = Instant::now();
        let mut last_freed_prune = Instant::now();
        let mut last_progress = Instant::now() - PROGRESS_EVERY;
        let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
        let mut redis_ok = true;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            // Queue progress (status polls answered from memory) at most once a second.
            let with_progress = last_progress.elapsed() >= PROGRESS_EVERY;
            if with_progress {
                last_progress = Instant::now();
            }
            // The operator list is read alongside, so a slow or failing Redis costs one wait
            // per tick, not two, and the refresh keeps its cadence.
            let ((), loaded) =
                tokio::join!(self.refresh_operators(), self.store.load_all(with_progress));
            match loaded {
                Ok(mut all) => {
                    if with_progress {
                        self.attach_histograms(&mut all).await;
                    }
                    if !redis_ok {
                        tracing::info!("redis reachable again; live config refreshed");
                    }
                    redis_ok = true;
                    self.live.replace(all);
                    if let Err(e) = self.refresh_freed().await {
                        self.metrics.redis_errors.inc();
                        tracing::debug!(error = %e, "reading freed admission slots failed");
                    }
                    if last_freed_prune.elapsed() >= FREED_PRUNE_EVERY {
                        last_freed_prune = Instant::now();
                        let now_ms = chrono::Utc::now().timestamp_millis();
                        let live = &self.live;
                        live.freed.prune(now_ms, |e| freed_keep_ms(live, e));
                    }
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
                // Instances that published within 3 s share the rate-limit budgets. Without
                // Redis the last count stays (the shared budgets are unreachable anyway).
                if let Ok(live) = self.store.upstream_stats(MEMBER_MAX_AGE_S).await {
                    let n = u32::try_from(live.len()).unwrap_or(u32::MAX).max(1);
                    self.limits.set_members(n);
                    self.metrics.members.set(i64::from(n));
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
