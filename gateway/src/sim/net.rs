//! The safety net's join decision (`mode: "safety_net"`), as `JOIN_LUA` makes it for a queue
//! of one sub-queue: each arrival after the sale start is counted in 10-second buckets, and it
//! goes straight through while the last minute's arrivals (itself included) stay within the
//! threshold, nobody is queued and fewer than `max_active` fans hold an admission; otherwise
//! it queues, and the tick admits the backlog at the admit rate as in queue mode.

use std::collections::VecDeque;

/// Buckets per minute (the script sums the current bucket and the five before it).
const BUCKETS: i64 = 6;
const BUCKET_MS: i64 = 10_000;

#[derive(Debug, Clone)]
pub struct SafetyNet {
    arrivals_per_minute: u64,
    max_active: u64,
    /// (bucket, arrivals), oldest first, the last minute only.
    buckets: VecDeque<(i64, u64)>,
}

impl SafetyNet {
    pub fn new(arrivals_per_minute: u64, max_active: u64) -> SafetyNet {
        SafetyNet {
            arrivals_per_minute,
            max_active,
            buckets: VecDeque::with_capacity(BUCKETS as usize + 1),
        }
    }

    /// Counts an arrival at `at_ms` and says whether it passes, with `queued` fans waiting
    /// and `holding` admitted (`|adm| + |active|`).
    pub fn arrive(&mut self, at_ms: i64, queued: u64, holding: u64) -> bool {
        let b = at_ms.div_euclid(BUCKET_MS);
        match self.buckets.back_mut() {
            Some((last, n)) if *last == b => *n += 1,
            _ => self.buckets.push_back((b, 1)),
        }
        while self.buckets.front().is_some_and(|(f, _)| *f <= b - BUCKETS) {
            self.buckets.pop_front();
        }
        let arrivals: u64 = self.buckets.iter().map(|(_, n)| n).sum();
        arrivals <= self.arrivals_per_minute
            && queued == 0
            && (self.max_active == 0 || holding < self.max_active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_minute_of_arrivals_decides_with_the_backlog_and_the_cap() {
        let mut net = SafetyNet::new(3, 0);
        assert!(net.arrive(0, 0, 0));
        assert!(net.arrive(5_000, 0, 0));
        assert!(net.arrive(19_999, 0, 0));
        // The fourth within the minute's buckets is one too many.
        assert!(!net.arrive(20_000, 0, 0));
        // 60 s on, the first bucket (0–10 s) has left the window: 3 in 10–70 s again.
        assert!(net.arrive(60_000, 0, 0));
        // A backlog or a full cap queues whatever the arrivals.
        assert!(!net.arrive(200_000, 1, 0));
        let mut capped = SafetyNet::new(1000, 2);
        assert!(capped.arrive(0, 0, 1));
        assert!(!capped.arrive(1, 0, 2));
    }
}
