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
//!
//! One tick is [`Ticker::tick_once`]; the background service only paces it. Tests step
//! admission with `tick_once` (passing the clock for the auto-adjust period) instead of
//! waiting for the timer.

use crate::auto::{AutoTarget, Summary, next_rate};
use crate::event_config::AutoBounds;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::store::{OtherShards, Store, StoreError, TickOutcome};
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

/// What a ticker carries from one tick to the next.
#[derive(Debug)]
pub struct TickerState {
    events: HashMap<String, EventTickState>,
    last_adjust: Instant,
    /// The last tick failed on Redis (the warning is logged once per outage).
    failing: bool,
}

#[derive(Debug, Default)]
struct EventTickState {
    queue_len: u64,
    leader: bool,
    /// A split queue's other sub-queues, as this instance's last tick as leader found them
    /// (`None`: read them before admitting).
    others: Option<OtherShards>,
}

impl TickerState {
    /// A ticker started at `now`: its first auto adjustment is due [`AUTO_ADJUST_EVERY`] later.
    pub fn new(now: Instant) -> TickerState {
        TickerState {
            events: HashMap::new(),
            last_adjust: now,
            failing: false,
        }
    }

    /// Whether this instance led `event` on its last tick.
    pub fn is_leader(&self, event: &str) -> bool {
        self.events.get(event).is_some_and(|s| s.leader)
    }

    /// True (and restarts the period) when an auto adjustment is due at `now`.
    fn adjust_due(&mut self, now: Instant) -> bool {
        let due = now.saturating_duration_since(self.last_adjust) >= AUTO_ADJUST_EVERY;
        if due {
            self.last_adjust = now;
        }
        due
    }
}

/// What one [`Ticker::tick_once`] did.
#[derive(Debug, Default)]
pub struct TickReport {
    /// The auto-adjust period came due on this tick.
    pub adjust_due: bool,
    /// Each event ticked, with the tick script's outcome.
    pub outcomes: Vec<(String, TickOutcome)>,
    /// Events whose auto-mode rate was recomputed on this tick, with the new rate.
    pub auto_rates: Vec<(String, u64)>,
    /// The Redis error that cut this tick short (the remaining events wait for the next one).
    pub error: Option<StoreError>,
}

impl TickReport {
    /// The outcome for `event`, if it was ticked.
    pub fn outcome(&self, event: &str) -> Option<&TickOutcome> {
        self.outcomes
            .iter()
            .find(|(e, _)| e == event)
            .map(|(_, o)| o)
    }
}

fn auto_target(a: &AutoBounds) -> AutoTarget {
    AutoTarget {
        floor: u64::try_from(a.floor).unwrap_or(1),
        ceiling: u64::try_from(a.ceiling).unwrap_or(1),
        target_p99_ms: u64::try_from(a.target_p99_ms).unwrap_or(800),
        max_error_ratio: a.max_error_ratio,
    }
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

    /// One admission tick over every configured event; `now` decides whether the auto-mode
    /// rate is due for recomputation. Records the outcome in the metrics and logs lease
    /// changes; a Redis error ends the tick (counted once in `redis_errors`).
    pub async fn tick_once(&self, state: &mut TickerState, now: Instant) -> TickReport {
        let tick_ms = u64::try_from(self.tick.as_millis()).unwrap_or(1000);
        let mut report = TickReport {
            adjust_due: state.adjust_due(now),
            ..TickReport::default()
        };
        let mut measured = None;
        for event in self.live.event_ids() {
            let Some(snap) = self.live.get(&event) else {
                continue;
            };
            let Some(cfg) = &snap.config else { continue };
            let st = state.events.entry(event.clone()).or_default();
            let mut auto_rate = None;
            // Only a leader that has already ticked adjusts: it knows the queue length.
            if let (Some(a), true, true) = (&cfg.auto, report.adjust_due, st.leader) {
                if measured.is_none() {
                    measured = self.measured().await;
                }
                if let Some(m) = &measured {
                    let current = snap.auto_rate.unwrap_or(cfg.admit_per_minute);
                    let next = next_rate(current, &auto_target(a), m, st.queue_len > 0);
                    if next != current {
                        tracing::info!(event = %event, from = current, to = next,
                            p99_ms = m.p99_ms, errors = m.errors, requests = m.requests,
                            "auto mode adjusts the admit rate");
                    }
                    auto_rate = Some(next);
                    report.auto_rates.push((event.clone(), next));
                }
            }
            let outcome = self
                .store
                .tick(
                    &event,
                    cfg.queue_shards,
                    st.others,
                    &self.instance,
                    self.lease_ttl_ms,
                    auto_rate,
                    tick_ms,
                    self.passthrough_batch,
                )
                .await;
            match outcome {
                Ok(o) => {
                    self.record(&event, st, &o);
                    state.failing = false;
                    report.outcomes.push((event, o));
                }
                Err(e) => {
                    self.metrics.redis_errors.inc();
                    if !state.failing {
                        tracing::warn!(error = %e, "admission tick failed; retrying every tick");
                    }
                    state.failing = true;
                    st.leader = false;
                    report.error = Some(e);
                    break;
                }
            }
        }
        report
    }

    /// Lease bookkeeping, logs and metrics for one event's successful tick.
    fn record(&self, event: &str, st: &mut EventTickState, outcome: &TickOutcome) {
        let l = [event];
        match *outcome {
            TickOutcome::Leader {
                admitted,
                expired_unclaimed,
                queue_len,
                active,
                rate,
                safety_net_queueing,
                others,
                ..
            } => {
                st.others = Some(others);
                if !st.leader {
                    tracing::info!(event = %event, instance = %self.instance, "took the admission lease");
                }
                st.leader = true;
                st.queue_len = queue_len;
                let m = &self.metrics;
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
                if let Some(q) = safety_net_queueing {
                    m.safety_net_queueing
                        .with_label_values(&l)
                        .set(i64::from(q));
                }
            }
            TickOutcome::Follower | TickOutcome::UnknownEvent => {
                if st.leader {
                    tracing::warn!(event = %event, "lost the admission lease");
                }
                st.leader = false;
                st.others = None;
                self.metrics.is_leader.with_label_values(&l).set(0);
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Ticker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state = TickerState::new(Instant::now());
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            self.tick_once(&mut state, Instant::now()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_adjust_comes_due_once_per_period() {
        let t0 = Instant::now();
        let mut s = TickerState::new(t0);
        assert!(!s.adjust_due(t0));
        assert!(!s.adjust_due(t0 + AUTO_ADJUST_EVERY - Duration::from_millis(1)));
        assert!(s.adjust_due(t0 + AUTO_ADJUST_EVERY));
        // The period restarts at the adjusting tick, not at the previous due time.
        let t1 = t0 + AUTO_ADJUST_EVERY;
        assert!(!s.adjust_due(t1 + Duration::from_millis(100)));
        assert!(s.adjust_due(t1 + AUTO_ADJUST_EVERY + Duration::from_secs(5)));
        // A clock that appears to go backwards never triggers an adjustment.
        assert!(!s.adjust_due(t0));
    }

    #[test]
    fn auto_bounds_become_targets() {
        let a = AutoBounds {
            floor: 60,
            ceiling: 6000,
            target_p99_ms: 500,
            max_error_ratio: 0.1,
        };
        let t = auto_target(&a);
        assert_eq!((t.floor, t.ceiling, t.target_p99_ms), (60, 6000, 500));
        assert!((t.max_error_ratio - 0.1).abs() < f64::EPSILON);
    }

    #[test]
    fn a_fresh_state_leads_nothing() {
        let s = TickerState::new(Instant::now());
        assert!(!s.is_leader("any"));
    }
}
