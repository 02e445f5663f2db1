//! Per-process auction state: the per-bidder bid rate limiter and caches of immutable auction
//! facts and of price floors. The caches only ever save work or refuse early: nothing is
//! accepted because of them.

use super::model::{Meta, Recorded};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Caches are bounded: past this many entries they are simply cleared (they only save work).
const CACHE_LIMIT: usize = 100_000;

pub struct AuctionRuntime {
    limiter: DefaultKeyedRateLimiter<String>,
    /// Auction id -> (hot, seller, event). None of them changes after creation.
    meta: Mutex<HashMap<String, Meta>>,
    /// Auction id -> a known lower bound of the minimum next bid. Prices only rise, so any
    /// value once observed stays a lower bound forever: a bid below it is certainly too low.
    /// Used to skip the contended row lock, never to accept.
    floors: Mutex<HashMap<String, i64>>,
    /// Hot auction id -> what Postgres had recorded when this process last looked, and when.
    /// Passed to the bid script as a floor, so a Redis that lost writes (rollback, failover)
    /// cannot accept a bid below a recorded one ([`Recorded`]).
    recorded: Mutex<HashMap<String, (Instant, Recorded)>>,
    limit: usize,
}

impl AuctionRuntime {
    /// `bids_per_second` sustained per bidder, bursts of `burst` (both at least 1).
    pub fn new(bids_per_second: u32, burst: u32) -> Self {
        Self::with_limit(bids_per_second, burst, CACHE_LIMIT)
    }

    fn with_limit(bids_per_second: u32, burst: u32, limit: usize) -> Self {
        let rate = NonZeroU32::new(bids_per_second.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            meta: Mutex::new(HashMap::new()),
            floors: Mutex::new(HashMap::new()),
            recorded: Mutex::new(HashMap::new()),
            limit,
        }
    }

    /// `Err(seconds)` (at least 1) when `bidder` is over the per-bidder bid rate.
    pub fn check_rate(&self, bidder: &str) -> Result<(), u64> {
        match self.limiter.check_key(&bidder.to_owned()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1))
            }
        }
    }

    /// Forgets idle rate-limit keys (called by the closer tick) so memory stays bounded.
    pub fn tidy(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    pub fn cached_meta(&self, id: &str) -> Option<Meta> {
        self.meta.lock().ok()?.get(id).cloned()
    }

    pub fn remember_meta(&self, id: &str, meta: Meta) {
        if let Ok(mut m) = self.meta.lock() {
            if m.len() >= self.limit {
                m.clear();
            }
            m.insert(id.to_owned(), meta);
        }
    }

    /// The known lower bound of the next acceptable bid, if any.
    pub fn floor(&self, id: &str) -> Option<i64> {
        self.floors.lock().ok()?.get(id).copied()
    }

    /// Records an observed minimum next bid (keeps the highest seen).
    pub fn raise_floor(&self, id: &str, min_next: i64) {
        if let Ok(mut f) = self.floors.lock() {
            if f.len() >= self.limit {
                f.clear();
            }
            let e = f.entry(id.to_owned()).or_insert(min_next);
            *e = (*e).max(min_next);
        }
    }

    /// This process's copy of what Postgres recorded for a hot auction, if younger than
    /// `max_age`.
    pub fn recorded(&self, id: &str, max_age: Duration) -> Option<Recorded> {
        let m = self.recorded.lock().ok()?;
        let (at, rec) = m.get(id)?;
        (at.elapsed() <= max_age).then(|| rec.clone())
    }

    /// Remembers what Postgres recorded (merged monotonically: a stale read can never lower
    /// a newer one) and restarts its age.
    pub fn remember_recorded(&self, id: &str, rec: Recorded) {
        if let Ok(mut m) = self.recorded.lock() {
            if m.len() >= self.limit {
                m.clear();
            }
            let now = Instant::now();
            match m.get_mut(id) {
                Some((at, cur)) => {
                    cur.merge(rec);
                    *at = now;
                }
                None => {
                    m.insert(id.to_owned(), (now, rec));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(price: i64, leader: &str) -> Recorded {
        Recorded {
            current_price: price,
            leader_id: Some(leader.to_owned()),
            bid_count: 1,
            extensions: 0,
        }
    }

    #[test]
    fn floors_only_rise() {
        let rt = AuctionRuntime::new(5, 5);
        assert_eq!(rt.floor("a"), None);
        rt.raise_floor("a", 1200);
        rt.raise_floor("a", 1100);
        assert_eq!(rt.floor("a"), Some(1200));
        rt.raise_floor("a", 1300);
        assert_eq!(rt.floor("a"), Some(1300));
        assert_eq!(rt.floor("b"), None);
    }

    #[test]
    fn a_remembered_record_merges_and_expires_by_age() {
        let rt = AuctionRuntime::new(5, 5);
        rt.remember_recorded("a", rec(2000, "bob"));
        rt.remember_recorded("a", rec(1500, "alice"));
        let long = Duration::from_secs(3600);
        assert_eq!(rt.recorded("a", long), Some(rec(2000, "bob")));
        assert_eq!(
            rt.recorded("a", Duration::ZERO),
            None,
            "older than no age at all"
        );
        assert_eq!(rt.recorded("b", long), None);
    }

    #[test]
    fn full_caches_are_cleared_rather_than_grown() {
        let rt = AuctionRuntime::with_limit(5, 5, 2);
        let meta = || Meta {
            hot: false,
            seller: "s".into(),
            event: Some("e".into()),
        };
        rt.remember_meta("a", meta());
        rt.remember_meta("b", meta());
        rt.remember_meta("c", meta());
        assert!(rt.cached_meta("a").is_none() && rt.cached_meta("c").is_some());
        rt.raise_floor("a", 1);
        rt.raise_floor("b", 1);
        rt.raise_floor("c", 1);
        assert_eq!((rt.floor("a"), rt.floor("c")), (None, Some(1)));
    }

    #[test]
    fn the_rate_limit_is_per_bidder_and_says_when_to_retry() {
        let rt = AuctionRuntime::new(1, 2);
        assert!(rt.check_rate("ann").is_ok());
        assert!(rt.check_rate("ann").is_ok());
        let wait = rt.check_rate("ann").expect_err("over the burst");
        assert!((1..=2).contains(&wait), "{wait}");
        assert!(
            rt.check_rate("bob").is_ok(),
            "another bidder has their own bucket"
        );
    }
}
