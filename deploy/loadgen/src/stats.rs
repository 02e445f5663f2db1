//! Shared latency/outcome statistics for scenarios: an HDR histogram (microseconds) plus
//! counts per outcome label. One `Recorder` per task (no locks on the hot path), merged at
//! the end into a `Summary` that prints and serialises the same way for every scenario.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Latencies (µs) and outcome counts of one kind of request.
pub struct Recorder {
    hist: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            // 1 µs .. 10 min at 3 significant digits (constant bounds: cannot fail).
            hist: Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"),
            outcomes: BTreeMap::new(),
        }
    }

    /// Records one request: its latency and an outcome label (`201`, `409 SEAT_TAKEN`, ...).
    pub fn record(&mut self, latency: Duration, outcome: &str) {
        let us = (latency.as_micros() as u64).clamp(1, 600_000_000);
        let _ = self.hist.record(us);
        *self.outcomes.entry(outcome.to_owned()).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Recorder) {
        let _ = self.hist.add(&other.hist);
        for (k, v) in &other.outcomes {
            *self.outcomes.entry(k.clone()).or_default() += v;
        }
    }

    pub fn count(&self, outcome: &str) -> u64 {
        self.outcomes.get(outcome).copied().unwrap_or(0)
    }

    pub fn summary(&self, elapsed: Duration) -> Summary {
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        let total = self.hist.len();
        let secs = elapsed.as_secs_f64().max(1e-9);
        Summary {
            requests: total,
            per_s: total as f64 / secs,
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p99_ms: q(0.99),
            max_ms: self.hist.max() as f64 / 1000.0,
            outcomes: self.outcomes.clone(),
        }
    }
}

/// What a scenario reports per request kind.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub outcomes: BTreeMap<String, u64>,
}

impl Summary {
    pub fn print(&self, name: &str) {
        println!(
            "{name:>10}: {:>8} req  {:>9.1}/s  p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.1} ms",
            self.requests, self.per_s, self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms
        );
        for (k, v) in &self.outcomes {
            println!("{:>12} {k}: {v}", "");
        }
    }
}

/// An outcome label from an HTTP status and an optional error body (`409 SEAT_TAKEN`).
pub fn outcome(status: u16, body: &[u8]) -> String {
    if status < 400 {
        return status.to_string();
    }
    let code = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_owned));
    match code {
        Some(c) => format!("{status} {c}"),
        None => status.to_string(),
    }
}
