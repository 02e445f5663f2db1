//! When a waiting fan polls: the gateway's own cadence (`queue::poll_after_ms` over
//! `queue::expected_wait_ms`, capped by `queue::poll_cap_ms`), and its steady-state total.
//!
//! The simulation schedules every fan's next poll at the interval they were told
//! ([`super::waiting`]). [`PollModel::steady_per_second`] is the closed form the gateway's
//! docs quote: a queue of `L` fans that has stood still for a cap interval polls
//! `Σ_r 1000 / interval(r)` times a second, summed over rank buckets (each rank below 16,
//! then 8 buckets per doubling, the interval taken at the bucket's middle: ~150 evaluations
//! for two million fans). It is an upper bound while the queue grows — a fan's first poll
//! comes a whole interval after their join — and the tests use it to check the per-fan
//! schedule once the queue is steady.

use crate::queue::{expected_wait_ms, poll_after_ms, poll_cap_ms};

/// What the gateway tells a waiting fan about when to poll.
#[derive(Debug, Clone, Copy)]
pub struct PollModel {
    pub rate_per_min: u64,
    pub cap_ms: u64,
    /// False while admission is stopped (paused): the gateway then sizes intervals by
    /// position instead of the expected wait.
    pub moving: bool,
}

/// `(first rank, ranks)` buckets covering `0..len`.
fn buckets(len: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut lo = 0u64;
    std::iter::from_fn(move || {
        if lo >= len {
            return None;
        }
        let hi = if lo < 16 {
            lo + 1
        } else {
            ((lo as f64 * 2f64.powf(0.125)).ceil() as u64).max(lo + 1)
        }
        .min(len);
        let b = (lo, hi - lo);
        lo = hi;
        Some(b)
    })
}

impl PollModel {
    pub fn new(rate_per_min: u64, claim_deadline_s: u64, moving: bool) -> PollModel {
        PollModel {
            rate_per_min,
            cap_ms: poll_cap_ms(claim_deadline_s),
            moving,
        }
    }

    /// The interval told to a fan with `ahead` in front, `until_start_ms` before the sale
    /// start; `jitter` in [-1, 1] as the gateway draws it.
    pub fn interval_ms(&self, ahead: u64, until_start_ms: u64, jitter: f64) -> u64 {
        let wait = if self.moving {
            expected_wait_ms(ahead, self.rate_per_min, until_start_ms)
        } else {
            None
        };
        poll_after_ms(ahead, wait, self.cap_ms, jitter).max(1)
    }

    /// Polls per second of a queue of `waiting` fans once every fan polls at the interval
    /// of their rank (jitter at its expected value 0).
    pub fn steady_per_second(&self, waiting: u64, until_start_ms: u64) -> f64 {
        buckets(waiting)
            .map(|(lo, n)| {
                n as f64 * 1000.0 / self.interval_ms(lo + n / 2, until_start_ms, 0.0) as f64
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_rank_once() {
        for len in [0, 1, 15, 16, 17, 1000, 2_000_000] {
            let b: Vec<_> = buckets(len).collect();
            assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), len);
            assert!(b.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(b.len() < 200, "{len}: {} buckets", b.len());
        }
    }

    #[test]
    fn bucket_sum_matches_the_per_fan_sum() {
        // 600/min, deadline 120 s: polls every second near the front, every 48 s far back.
        let m = PollModel::new(600, 120, true);
        for len in [10, 500, 20_000, 300_000] {
            let exact: f64 = (0..len)
                .map(|r| 1000.0 / m.interval_ms(r, 0, 0.0) as f64)
                .sum();
            let fast = m.steady_per_second(len, 0);
            assert!(
                (fast / exact - 1.0).abs() < 0.01,
                "{len}: {fast} vs {exact}"
            );
        }
        // Nearly everyone at the cap: ~300,000 / 48 s, plus the front.
        let p = m.steady_per_second(300_000, 0);
        assert!((6_000.0..9_000.0).contains(&p), "{p}");
    }
}
