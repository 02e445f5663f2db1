//! Prometheus metrics of one gateway instance (its own registry, so several instances can
//! live in one test process). Hot-path counters are resolved once at start-up, so recording
//! is an atomic add, never a label lookup.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use shared::token::TokenError;

pub struct Metrics {
    registry: Registry,
    pub joins: IntCounter,
    pub status_polls: IntCounter,
    pub status_from_memory: IntCounter,
    pub members: IntGauge,
    pub in_flight: IntGauge,
    pub places_restored: IntCounter,
    pub admitted: IntCounterVec,
    pub expired_unclaimed: IntCounterVec,
    pub queue_length: IntGaugeVec,
    pub active_admitted: IntGaugeVec,
    pub admit_rate: IntGaugeVec,
    pub is_leader: IntGaugeVec,
    /// Safety-net rooms: 1 while new arrivals queue, 0 while they pass (leader's view).
    pub safety_net_queueing: IntGaugeVec,
    token_rejections: IntCounterVec,
    pub rate_limited: IntCounterVec,
    pub upstream_latency: Histogram,
    upstream_responses: IntCounterVec,
    /// `upstream_responses` children by class (none, 1xx … 5xx), resolved once.
    upstream_by_class: [IntCounter; 6],
    pub upstream_unavailable: IntCounter,
    pub redis_errors: IntCounter,
    pub proxied: IntCounter,
    pub session_refreshed: IntCounter,
    /// Checkout writes of fans whose `max_active` slot was freed, by outcome (`slots.rs`):
    /// `taken` (a slot again), `full` (`409 ROOM_FULL`), `failed_open` (Redis failed: forwarded).
    slot_retakes: [IntCounter; 3],
    /// Admin calls refused before their handler, by reason (`admin/auth.rs`). Named like
    /// booking's counter of the same refusals (no `fg_` prefix), so one query sums both
    /// admin listeners.
    admin_auth_failures: IntCounterVec,
    /// Reads of booking's operator list that were not a list (the last good one stayed).
    pub operators_malformed: IntCounter,
}

/// What became of a freed fan's checkout write (`fg_slot_retakes_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retake {
    Taken = 0,
    Full = 1,
    FailedOpen = 2,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        let gauge_vec =
            |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["event"]);
        let upstream_responses = IntCounterVec::new(
            Opts::new("fg_upstream_responses_total", "Upstream responses by class"),
            &["class"],
        )?;
        let m = Metrics {
            joins: counter("fg_joins_total", "Queue joins (new places and repeats)")?,
            status_polls: counter("fg_status_polls_total", "Queue status polls")?,
            places_restored: counter(
                "fg_places_restored_total",
                "Queue places given back from fans' receipts after Redis lost them",
            )?,
            in_flight: IntGauge::new(
                "fg_requests_in_flight",
                "Requests this instance is handling now (waiting-room, proxied, static)",
            )?,
            members: IntGauge::new(
                "fg_gateway_members",
                "Live gateway instances sharing the rate-limit budgets",
            )?,
            status_from_memory: counter(
                "fg_status_polls_from_memory_total",
                "Queue status polls answered from the gateway's queue progress, without Redis",
            )?,
            admitted: IntCounterVec::new(
                Opts::new(
                    "fg_admitted_total",
                    "Fans admitted by this instance's ticker",
                ),
                &["event"],
            )?,
            expired_unclaimed: IntCounterVec::new(
                Opts::new(
                    "fg_admissions_expired_total",
                    "Admissions not claimed before their deadline",
                ),
                &["event"],
            )?,
            queue_length: gauge_vec("fg_queue_length", "Fans waiting")?,
            active_admitted: gauge_vec(
                "fg_active_admitted",
                "Admitted fans holding a place in the active budget",
            )?,
            admit_rate: gauge_vec("fg_admit_rate_per_minute", "Admit rate in force")?,
            is_leader: gauge_vec(
                "fg_admission_leader",
                "1 when this instance holds the lease",
            )?,
            safety_net_queueing: gauge_vec(
                "fg_safety_net_queueing",
                "1 while a safety-net room queues new arrivals, 0 while it lets them through",
            )?,
            token_rejections: IntCounterVec::new(
                Opts::new(
                    "fg_token_rejections_total",
                    "Admission tokens refused, by reason",
                ),
                &["reason"],
            )?,
            rate_limited: IntCounterVec::new(
                Opts::new(
                    "fg_rate_limited_total",
                    "Requests refused with 429, by scope",
                ),
                &["scope"],
            )?,
            upstream_latency: Histogram::with_opts(
                HistogramOpts::new(
                    "fg_upstream_latency_seconds",
                    "Time from sending a request upstream to its response header",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ]),
            )?,
            upstream_responses: upstream_responses.clone(),
            upstream_by_class: ["none", "1xx", "2xx", "3xx", "4xx", "5xx"]
                .map(|c| upstream_responses.with_label_values(&[c])),
            upstream_unavailable: counter(
                "fg_upstream_unavailable_total",
                "Requests answered 503 because no upstream was reachable",
            )?,
            redis_errors: counter("fg_redis_errors_total", "Failed Redis calls")?,
            proxied: counter("fg_proxied_total", "Requests forwarded to booking")?,
            session_refreshed: counter(
                "fg_admission_refreshed_total",
                "Admission tokens re-minted because the fan's checkout lasts longer",
            )?,
            slot_retakes: {
                let v = IntCounterVec::new(
                    Opts::new(
                        "fg_slot_retakes_total",
                        "Checkout writes of fans whose max_active slot was freed: slot taken \
                         again, refused (room full), or forwarded with Redis failing",
                    ),
                    &["outcome"],
                )?;
                registry.register(Box::new(v.clone()))?;
                ["taken", "full", "failed_open"].map(|o| v.with_label_values(&[o]))
            },
            admin_auth_failures: {
                let v = IntCounterVec::new(
                    Opts::new(
                        "admin_auth_failures_total",
                        "Admin listener calls refused before their handler, by reason \
                         (missing, malformed, unknown, expired, wrong_type, unavailable, \
                         rate_limited, role)",
                    ),
                    &["reason"],
                )?;
                registry.register(Box::new(v.clone()))?;
                v
            },
            operators_malformed: counter(
                "fg_operators_list_malformed_total",
                "Reads of the published operator list that did not parse (the last good list \
                 stayed in force)",
            )?,
            registry,
        };
        m.registry.register(Box::new(m.joins.clone()))?;
        m.registry.register(Box::new(m.status_polls.clone()))?;
        m.registry
            .register(Box::new(m.status_from_memory.clone()))?;
        m.registry.register(Box::new(m.members.clone()))?;
        m.registry.register(Box::new(m.in_flight.clone()))?;
        m.registry.register(Box::new(m.places_restored.clone()))?;
        m.registry.register(Box::new(m.admitted.clone()))?;
        m.registry.register(Box::new(m.expired_unclaimed.clone()))?;
        m.registry.register(Box::new(m.queue_length.clone()))?;
        m.registry.register(Box::new(m.active_admitted.clone()))?;
        m.registry.register(Box::new(m.admit_rate.clone()))?;
        m.registry.register(Box::new(m.is_leader.clone()))?;
        m.registry
            .register(Box::new(m.safety_net_queueing.clone()))?;
        m.registry.register(Box::new(m.token_rejections.clone()))?;
        m.registry.register(Box::new(m.rate_limited.clone()))?;
        m.registry.register(Box::new(m.upstream_latency.clone()))?;
        m.registry
            .register(Box::new(m.upstream_responses.clone()))?;
        m.registry
            .register(Box::new(m.upstream_unavailable.clone()))?;
        m.registry.register(Box::new(m.redis_errors.clone()))?;
        m.registry.register(Box::new(m.proxied.clone()))?;
        m.registry.register(Box::new(m.session_refreshed.clone()))?;
        m.registry
            .register(Box::new(m.operators_malformed.clone()))?;
        Ok(m)
    }

    /// Counts one upstream response by status class (0 = no response).
    pub fn upstream_response(&self, status: u16) {
        let i = match status {
            100..=599 => usize::from(status / 100),
            _ => 0,
        };
        if let Some(c) = self.upstream_by_class.get(i) {
            c.inc();
        }
    }

    pub fn slot_retake(&self, outcome: Retake) {
        self.slot_retakes[outcome as usize].inc();
    }

    /// Counts one admin call refused before its handler (`admin/auth.rs` names the reasons).
    pub fn admin_auth_failed(&self, reason: &str) {
        self.admin_auth_failures.with_label_values(&[reason]).inc();
    }

    pub fn token_rejected(&self, e: &TokenError) {
        self.token_rejections.with_label_values(&[e.reason()]).inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }
}
