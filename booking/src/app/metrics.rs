//! Prometheus metrics for booking, served at `GET /metrics`.
//!
//! One struct holds every metric so handlers reach them through `state.metrics` without
//! global registries. Add new metrics here and register them in `new`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};
use shared::error::codes;

/// The refusal codes exported (at 0) from startup.
const SALE_REFUSALS: [&str; 10] = [
    codes::SEAT_TAKEN,
    codes::SOLD_OUT,
    codes::NO_SEATS_TOGETHER,
    codes::ORPHAN_SEAT,
    codes::LIMIT_EXCEEDED,
    codes::INSUFFICIENT_STOCK,
    codes::HOLD_EXPIRED,
    codes::CARD_DECLINED,
    codes::BID_TOO_LOW,
    codes::AUCTION_CLOSED,
];

pub struct Metrics {
    pub registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_latency: HistogramVec,
    /// Client-facing refusals (409/422/...), by machine code. Shared by every domain that
    /// refuses (each gets a handle in its metrics).
    pub refusals: IntCounterVec,
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
        let refusals = IntCounterVec::new(
            Opts::new("refusals_total", "Client errors by code"),
            &["code"],
        )?;
        registry.register(Box::new(http_requests.clone()))?;
        registry.register(Box::new(http_latency.clone()))?;
        registry.register(Box::new(refusals.clone()))?;
        // Zero from the start for the refusals a sale is watched by, so the dashboard's
        // "409s by error code" shows 0 (not "no data") until the first one, and `rate()`
        // sees the first refusal as an increase.
        for code in SALE_REFUSALS {
            refusals.with_label_values(&[code]);
        }
        Ok(Self {
            registry,
            http_requests,
            http_latency,
            refusals,
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
