//! How often a waiting fan polls and what they are told while waiting: the poll cadence
//! (`poll_after_ms`, also used by the launch simulator) and the waiting answer's fields.

use crate::event_config::{EventConfig, Mode};
use crate::store::EventSnapshot;

/// Shortest and longest interval between a fan's polls.
pub const MIN_POLL_MS: u64 = 1000;
pub const MAX_POLL_MS: u64 = 60_000;

/// The longest poll interval for an event: at most a minute, and short enough that a fan
/// admitted right after a poll (say ops just raised the rate) polls again well inside the
/// claim deadline, jitter included (0.4 × deadline × 1.2 < deadline).
pub fn poll_cap_ms(claim_deadline_s: u64) -> u64 {
    (claim_deadline_s.saturating_mul(400)).clamp(MIN_POLL_MS, MAX_POLL_MS)
}

/// How long a fan should wait before the next poll: a quarter of the expected wait (so the
/// fan checks in a few times as the queue moves and every second near the front), between
/// [`MIN_POLL_MS`] and `cap_ms`; while the queue does not move (paused, rate 0) it grows with
/// the position instead. ±20 % jitter keeps fans who joined together from polling together.
/// `wait_ms` is the expected wait (time to the sale start plus the queue ahead at the admit
/// rate), `None` when the queue is not moving; `jitter` is uniform in `[-1, 1]`.
///
/// Why a quarter of the wait: the poll rate of the whole queue is then about
/// `4 × admit rate × ln(queue / admit rate)` plus `fans beyond the cap / cap`, so two million
/// waiting browsers cost tens of thousands of polls a second instead of millions.
pub fn poll_after_ms(ahead: u64, wait_ms: Option<u64>, cap_ms: u64, jitter: f64) -> u64 {
    let cap = cap_ms.max(MIN_POLL_MS) as f64;
    let base = match wait_ms {
        Some(w) => w as f64 / 4.0,
        None => MIN_POLL_MS as f64 + (ahead as f64).sqrt() * 100.0,
    };
    let base = base.clamp(MIN_POLL_MS as f64, cap);
    (base * (1.0 + 0.2 * jitter.clamp(-1.0, 1.0))) as u64
}

/// Expected wait in ms for a fan with `ahead` fans in front: until the sale starts, then
/// `ahead` admissions at `rate_per_min` (`None` when the queue is not moving).
pub fn expected_wait_ms(ahead: u64, rate_per_min: u64, until_start_ms: u64) -> Option<u64> {
    (rate_per_min > 0)
        .then(|| until_start_ms.saturating_add(ahead.saturating_mul(60_000) / rate_per_min))
}

/// What a waiting fan is told: the queue's state, the expected wait and when to poll next.
pub(super) struct Waiting {
    pub(super) state: &'static str,
    pub(super) rate: u64,
    pub(super) eta_s: Option<u64>,
    pub(super) poll_ms: u64,
}

impl Waiting {
    pub(super) fn of(snap: &EventSnapshot, cfg: &EventConfig, ahead: u64) -> Self {
        let rate = snap.effective_rate();
        let state = if snap.sold_out {
            "sold_out"
        } else {
            match cfg.mode {
                Mode::Paused => "paused",
                Mode::Closed => "closed",
                Mode::Queue | Mode::Passthrough | Mode::SafetyNet => "waiting",
            }
        };
        let until_start_ms =
            u64::try_from((cfg.sale_start - chrono::Utc::now()).num_milliseconds()).unwrap_or(0);
        let wait_ms = if state == "waiting" {
            expected_wait_ms(ahead, rate, until_start_ms)
        } else {
            None
        };
        Self {
            state,
            rate,
            eta_s: wait_ms.map(|w| w.div_ceil(1000)),
            poll_ms: poll_after_ms(ahead, wait_ms, poll_cap_ms(cfg.claim_deadline_s), jitter()),
        }
    }
}

fn jitter() -> f64 {
    rand::random::<f64>() * 2.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_interval_follows_the_expected_wait_and_is_capped() {
        let cap = poll_cap_ms(120);
        assert_eq!(cap, 48_000);
        let mut last = 0;
        for ahead in [0, 10, 100, 1_000, 10_000, 100_000, 2_000_000] {
            let p = poll_after_ms(ahead, expected_wait_ms(ahead, 600, 0), cap, 0.0);
            assert!(p >= last, "{ahead}: {p} < {last}");
            assert!((MIN_POLL_MS..=cap).contains(&p));
            last = p;
        }
        // Near the front: every second. 400 ahead at 600/min = 40 s wait → 10 s.
        assert_eq!(
            poll_after_ms(0, expected_wait_ms(0, 600, 0), cap, 0.0),
            1000
        );
        assert_eq!(
            poll_after_ms(400, expected_wait_ms(400, 600, 0), cap, 0.0),
            10_000
        );
        assert_eq!(poll_after_ms(10_000_000, Some(u64::MAX), cap, 0.0), cap);
        // The time to the sale start counts: the queue does not move before it.
        assert_eq!(expected_wait_ms(0, 600, 20_000), Some(20_000));
        assert_eq!(
            poll_after_ms(0, expected_wait_ms(0, 600, 20_000), cap, 0.0),
            5_000
        );
        // Jitter spreads polls by ±20 %, and even then a fan polls inside its claim deadline.
        assert_eq!(poll_after_ms(10_000_000, Some(u64::MAX), cap, 1.0), 57_600);
        assert_eq!(poll_after_ms(10_000_000, Some(u64::MAX), cap, -1.0), 38_400);
        for deadline_s in [10, 60, 120, 3600] {
            let worst = poll_after_ms(u64::MAX, Some(u64::MAX), poll_cap_ms(deadline_s), 1.0);
            assert!(worst < deadline_s * 1000, "{deadline_s}: {worst}");
        }
        // Not moving (paused, rate 0): grows with position.
        assert!(poll_after_ms(10_000, None, cap, 0.0) > poll_after_ms(10, None, cap, 0.0));
        assert_eq!(expected_wait_ms(5, 0, 0), None);
    }

    #[test]
    fn expected_wait() {
        assert_eq!(expected_wait_ms(0, 600, 0), Some(0));
        assert_eq!(expected_wait_ms(600, 600, 0), Some(60_000));
        assert_eq!(expected_wait_ms(1, 600, 0), Some(100));
        assert_eq!(expected_wait_ms(u64::MAX, 1, u64::MAX), Some(u64::MAX));
    }
}
