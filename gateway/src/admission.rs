//! The admission ticker (a pingora background service, one per instance).
//!
//! Every `tick_ms` it runs the tick script for each configured event. The script first takes
//! or renews the event's lease (`SET NX PX`, compare-and-renew), so exactly one instance
//! admits per event; if that instance dies its lease lapses after `lease_ttl_ms` and the next
//! tick of another instance takes over. In the same atomic step the script expires unclaimed
//! admissions (their capacity returns to the `max_active` budget) and pops at most one batch
//! from a token bucket refilled at `admit_per_minute` (`ZPOPMIN`), never above `max_active`.
//! Popped fans are recorded with a claim deadline, so nobody is admitted twice or lost across
//! a failover: a fan is either in the queue or in the admitted set, moved atomically.
//!
//! In auto mode the leader also recomputes the rate every [`AUTO_ADJUST_EVERY`] from every
//! instance's upstream measurements (see [`crate::auto`]).

use crate::auto::{AutoTarget, Summary, next_rate};
use crate::live::Live;
use crate::metrics::Metrics;
use crate::store::{Store, TickOutcome};
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const AUTO_ADJUST_EVERY: Duration = Duration::from_secs(2);

pub struct Ticker {
    pub store: Store,
    pub live: Arc<Live>,
    pub metrics: Arc<Metrics>,
    pub instance: String,
    pub tick: Duration,
    pub lease_ttl_ms: u64,
    pub passthrough_batch: u64,
    pub window_s: u64,
}

#[derive(Default)]
struct EventTickState {
    queue_len: u64,
    leader: bool,
}

impl Ticker {
    async fn measured(&self) -> Option<Summary> {
        match self.store.upstream_stats(self.window_s.max(2)).await {
            Ok(rows) => Some(Summary::combine(
                rows.iter().filter_map(|r| Summary::decode_published(r)),
            )),
            Err(e) => {
                tracing::debug!(error = %e, "reading upstream stats failed");
                None
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Ticker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state: HashMap<String, EventTickState> = HashMap::new();
        let mut last_adjust = Instant::now();
        let mut failing = false;
        let tick_ms = u64::try_from(self.tick.as_millis()).unwrap_or(1000);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let events = self.live.event_ids();
            let adjust = last_adjust.elapsed() >= AUTO_ADJUST_EVERY;
            let mut measured = None;
            if adjust {
                last_adjust = Instant::now();
            }
            for event in events {
                let Some(snap) = self.live.get(&event) else {
                    continue;
                };
                let Some(cfg) = &snap.config else { continue };
                let st = state.entry(event.clone()).or_default();
                let mut auto_rate = None;
                if let (Some(a), true, true) = (&cfg.auto, adjust, st.leader) {
                    if measured.is_none() {
                        measured = self.measured().await;
                    }
                    if let Some(m) = &measured {
                        let target = AutoTarget {
                            floor: u64::try_from(a.floor).unwrap_or(1),
                            ceiling: u64::try_from(a.ceiling).unwrap_or(1),
                            target_p99_ms: u64::try_from(a.target_p99_ms).unwrap_or(800),
                            max_error_ratio: a.max_error_ratio,
                        };
                        let current = snap.auto_rate.unwrap_or(cfg.admit_per_minute);
                        let next = next_rate(current, &target, m, st.queue_len > 0);
                        if next != current {
                            tracing::info!(event = %event, from = current, to = next,
                                p99_ms = m.p99_ms, errors = m.errors, requests = m.requests,
                                "auto mode adjusts the admit rate");
                        }
                        auto_rate = Some(next);
                    }
                }
                match self
                    .store
                    .tick(
                        &event,
                        &self.instance,
                        self.lease_ttl_ms,
                        auto_rate,
                        tick_ms,
                        self.passthrough_batch,
                    )
                    .await
                {
                    Ok(TickOutcome::Leader {
                        admitted,
                        expired_unclaimed,
                        queue_len,
                        active,
                        rate,
                        ..
                    }) => {
                        if !st.leader {
                            tracing::info!(event = %event, instance = %self.instance, "took the admission lease");
                        }
                        st.leader = true;
                        st.queue_len = queue_len;
                        let m = &self.metrics;
                        let l = [event.as_str()];
                        m.admitted.with_label_values(&l).inc_by(admitted);
                        m.expired_unclaimed
                            .with_label_values(&l)
                            .inc_by(expired_unclaimed);
                        m.queue_length
                            .with_label_values(&l)
                            .set(i64::try_from(queue_len).unwrap_or(i64::MAX));
                        m.active_admitted
                            .with_label_values(&l)
                            .set(i64::try_from(active).unwrap_or(i64::MAX));
                        m.admit_rate
                            .with_label_values(&l)
                            .set(i64::try_from(rate).unwrap_or(i64::MAX));
                        m.is_leader.with_label_values(&l).set(1);
                        failing = false;
                    }
                    Ok(TickOutcome::Follower) | Ok(TickOutcome::UnknownEvent) => {
                        if st.leader {
                            tracing::warn!(event = %event, "lost the admission lease");
                        }
                        st.leader = false;
                        self.metrics
                            .is_leader
                            .with_label_values(&[event.as_str()])
                            .set(0);
                        failing = false;
                    }
                    Err(e) => {
                        self.metrics.redis_errors.inc();
                        if !failing {
                            tracing::warn!(error = %e, "admission tick failed; retrying every tick");
                        }
                        failing = true;
                        st.leader = false;
                        break;
                    }
                }
            }
        }
    }
}
