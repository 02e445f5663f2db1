//! Prometheus metrics for booking, served at `GET /metrics`.
//!
//! One struct holds every metric so handlers reach them through `state.metrics` without
//! global registries. Add new metrics here and register them in `new`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_latency: HistogramVec,
    /// Holds placed, by kind (`seats`/`ga`).
    pub holds: IntCounterVec,
    /// Client-facing refusals (409/422/...), by machine code.
    pub refusals: IntCounterVec,
    /// Holds released by the sweeper.
    pub holds_expired: IntCounterVec,
    /// Unpublished outbox rows (sampled by the relay).
    pub outbox_lag: IntGauge,
    /// Bids accepted, by path (`cold`/`hot`).
    pub bids: IntCounterVec,
    /// Payments, webhooks, outbox relay and ticket delivery.
    pub payments: crate::payments::PaymentMetrics,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("floodgate_booking".into()), None)?;
        let http_requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route and status"),
            &["method", "route", "status"],
        )?;
        let http_latency = HistogramVec::new(
            HistogramOpts::new("http_request_duration_seconds", "Request latency by route")
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
            &["route"],
        )?;
        let holds = IntCounterVec::new(Opts::new("holds_total", "Holds placed"), &["kind"])?;
        let refusals = IntCounterVec::new(
            Opts::new("refusals_total", "Client errors by code"),
            &["code"],
        )?;
        let holds_expired = IntCounterVec::new(
            Opts::new("holds_expired_total", "Holds released on expiry"),
            &["kind"],
        )?;
        let outbox_lag = IntGauge::new("outbox_lag", "Unpublished outbox rows")?;
        let bids = IntCounterVec::new(Opts::new("bids_total", "Accepted bids"), &["path"])?;
        registry.register(Box::new(http_requests.clone()))?;
        registry.register(Box::new(http_latency.clone()))?;
        registry.register(Box::new(holds.clone()))?;
        registry.register(Box::new(refusals.clone()))?;
        registry.register(Box::new(holds_expired.clone()))?;
        registry.register(Box::new(outbox_lag.clone()))?;
        registry.register(Box::new(bids.clone()))?;
        let payments = crate::payments::PaymentMetrics::register(&registry)?;
        Ok(Self {
            registry,
            http_requests,
            http_latency,
            holds,
            refusals,
            holds_expired,
            outbox_lag,
            bids,
            payments,
        })
    }

    /// Text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if encoder.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
