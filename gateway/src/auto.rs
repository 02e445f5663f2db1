//! Auto mode: measure the booking upstream and let the admit rate follow its real capacity.
//!
//! Every instance records each proxied response in [`UpstreamWindow`] (per-second slots of
//! counters and a coarse latency histogram; recording is a few relaxed atomic adds). Once a
//! second each instance publishes a [`Summary`] of the sliding window to Redis; the
//! admission leader combines all instances' summaries and applies [`next_rate`], an AIMD
//! rule: multiplicative decrease when p99 latency or the 5xx/429 share is over target,
//! additive increase while fans are waiting and the upstream is healthy, always within the
//! event's `[floor, ceiling]`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const SLOTS: u64 = 64;
/// Upper bounds (ms) of the latency buckets; the last one catches everything.
const BUCKETS_MS: [u64; 16] = [
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    300,
    500,
    800,
    1000,
    2000,
    5000,
    10_000,
    u64::MAX,
];

#[derive(Default)]
struct Slot {
    second: AtomicU64,
    count: AtomicU64,
    errors: AtomicU64,
    lat: [AtomicU64; BUCKETS_MS.len()],
}

/// Sliding window of upstream outcomes (last 64 seconds kept).
pub struct UpstreamWindow {
    start: Instant,
    slots: Vec<Slot>,
}

impl Default for UpstreamWindow {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

/// A window's totals.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    pub requests: u64,
    pub errors: u64,
    pub p99_ms: u64,
}

impl Summary {
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.requests, self.errors, self.p99_ms)
    }

    /// Parses `"<published_at> <requests> <errors> <p99_ms>"` as stored in Redis.
    pub fn decode_published(s: &str) -> Option<Summary> {
        let mut it = s.split(' ').skip(1).map(|x| x.parse::<u64>().ok());
        Some(Summary {
            requests: it.next()??,
            errors: it.next()??,
            p99_ms: it.next()??,
        })
    }

    /// Combines instances: counts add up, p99 is the worst instance's (conservative).
    pub fn combine(all: impl IntoIterator<Item = Summary>) -> Summary {
        all.into_iter().fold(Summary::default(), |a, b| Summary {
            requests: a.requests + b.requests,
            errors: a.errors + b.errors,
            p99_ms: a.p99_ms.max(b.p99_ms),
        })
    }
}

impl UpstreamWindow {
    fn now_s(&self) -> u64 {
        // +1 so that second 0 is distinguishable from an empty slot.
        self.start.elapsed().as_secs() + 1
    }

    /// Records one upstream outcome. `status` 0 means no response (connect/read failure).
    pub fn record(&self, latency: Duration, status: u16) {
        let sec = self.now_s();
        let Some(slot) = self.slots.get((sec % SLOTS) as usize) else {
            return;
        };
        let seen = slot.second.load(Relaxed);
        if seen != sec
            && slot
                .second
                .compare_exchange(seen, sec, Relaxed, Relaxed)
                .is_ok()
        {
            // First writer of a new second clears the slot. A concurrent add during the
            // reset can be lost; that is noise in a statistic, never a correctness issue.
            slot.count.store(0, Relaxed);
            slot.errors.store(0, Relaxed);
            for b in &slot.lat {
                b.store(0, Relaxed);
            }
        }
        slot.count.fetch_add(1, Relaxed);
        if status == 0 || status == 429 || status >= 500 {
            slot.errors.fetch_add(1, Relaxed);
        }
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        let i = BUCKETS_MS
            .iter()
            .position(|&b| ms <= b)
            .unwrap_or(BUCKETS_MS.len() - 1);
        if let Some(b) = slot.lat.get(i) {
            b.fetch_add(1, Relaxed);
        }
    }

    /// Totals over the last `window_s` seconds (including the current one).
    pub fn summary(&self, window_s: u64) -> Summary {
        let now = self.now_s();
        let mut s = Summary::default();
        let mut lat = [0u64; BUCKETS_MS.len()];
        for slot in &self.slots {
            let sec = slot.second.load(Relaxed);
            if sec == 0 || now.saturating_sub(sec) >= window_s.max(1) {
                continue;
            }
            s.requests += slot.count.load(Relaxed);
            s.errors += slot.errors.load(Relaxed);
            for (acc, b) in lat.iter_mut().zip(&slot.lat) {
                *acc += b.load(Relaxed);
            }
        }
        let total: u64 = lat.iter().sum();
        if total > 0 {
            // Smallest bucket bound covering 99 % of samples.
            let need = total - total / 100;
            let mut seen = 0;
            for (i, n) in lat.iter().enumerate() {
                seen += n;
                if seen >= need {
                    s.p99_ms = BUCKETS_MS[i].min(60_000);
                    break;
                }
            }
        }
        s
    }
}

/// Targets of one event's auto mode.
#[derive(Debug, Clone, Copy)]
pub struct AutoTarget {
    pub floor: u64,
    pub ceiling: u64,
    pub target_p99_ms: u64,
    pub max_error_ratio: f64,
}

/// Fewer samples than this say nothing about the upstream: hold the rate.
pub const MIN_SAMPLES: u64 = 20;

/// AIMD step: the next admit rate (per minute) from the current one and the measured window.
pub fn next_rate(current: u64, t: &AutoTarget, measured: &Summary, fans_waiting: bool) -> u64 {
    let current = current.clamp(t.floor, t.ceiling);
    if measured.requests < MIN_SAMPLES {
        return current;
    }
    let error_ratio = measured.errors as f64 / measured.requests as f64;
    if measured.p99_ms > t.target_p99_ms || error_ratio > t.max_error_ratio {
        // Multiplicative decrease: back off fast when booking struggles.
        return ((current as f64 * 0.7) as u64).clamp(t.floor, t.ceiling);
    }
    if fans_waiting {
        // Additive increase: probe for capacity in steps of 5 % of the ceiling.
        return current
            .saturating_add((t.ceiling / 20).max(1))
            .clamp(t.floor, t.ceiling);
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: AutoTarget = AutoTarget {
        floor: 100,
        ceiling: 1000,
        target_p99_ms: 500,
        max_error_ratio: 0.05,
    };

    fn s(requests: u64, errors: u64, p99_ms: u64) -> Summary {
        Summary {
            requests,
            errors,
            p99_ms,
        }
    }

    #[test]
    fn aimd_moves_within_bounds() {
        assert_eq!(next_rate(500, &T, &s(100, 0, 50), true), 550);
        assert_eq!(next_rate(990, &T, &s(100, 0, 50), true), 1000);
        assert_eq!(next_rate(500, &T, &s(100, 0, 50), false), 500);
        assert_eq!(next_rate(500, &T, &s(100, 0, 900), true), 350);
        assert_eq!(next_rate(500, &T, &s(100, 10, 50), true), 350);
        assert_eq!(next_rate(120, &T, &s(100, 50, 50), true), 100);
        // Too few samples: hold.
        assert_eq!(next_rate(500, &T, &s(5, 5, 9000), true), 500);
        // Out-of-bounds current values are clamped first.
        assert_eq!(next_rate(5000, &T, &s(0, 0, 0), true), 1000);
    }

    #[test]
    fn window_summarises_latency_and_errors() {
        let w = UpstreamWindow::default();
        for _ in 0..98 {
            w.record(Duration::from_millis(3), 200);
        }
        w.record(Duration::from_millis(700), 503);
        w.record(Duration::from_millis(700), 0);
        let sum = w.summary(10);
        assert_eq!(sum.requests, 100);
        assert_eq!(sum.errors, 2);
        assert_eq!(sum.p99_ms, 800);
        let enc = format!("1700000000 {}", sum.encode());
        assert_eq!(Summary::decode_published(&enc), Some(sum));
        let both = Summary::combine([sum, s(10, 1, 20)]);
        assert_eq!(both, s(110, 3, 800));
    }
}
