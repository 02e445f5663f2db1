//! Per-account and per-IP request limits (governor's GCRA, keyed), for joins, status polls
//! and admitted API calls. Over a limit the caller gets `429` with `Retry-After`.
//!
//! Accounts are keyed by a 64-bit hash rather than the string, so checking a limit on the
//! proxy's hot path allocates nothing; a collision could only make two accounts share a
//! budget, never bypass one.
//!
//! IPv6 clients are keyed by their /64 ([`ip_key`]): one subscriber line or host usually gets
//! a whole /64, so keying by the full address would hand one client 2^64 budgets.

use crate::config::RateLimits;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

/// Which budget a request spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Join,
    Status,
    Api,
}

impl Scope {
    pub fn label(self) -> &'static str {
        match self {
            Scope::Join => "join",
            Scope::Status => "status",
            Scope::Api => "api",
        }
    }
}

struct Pair {
    account: Option<DefaultKeyedRateLimiter<u64>>,
    ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

pub struct Limits {
    join: Pair,
    status: Pair,
    api: Pair,
    hasher: std::collections::hash_map::RandomState,
    clock: DefaultClock,
}

fn per_minute(n: u32) -> Option<DefaultKeyedRateLimiter<u64>> {
    NonZeroU32::new(n).map(|n| RateLimiter::keyed(Quota::per_minute(n)))
}

fn per_minute_ip(n: u32) -> Option<DefaultKeyedRateLimiter<IpAddr>> {
    NonZeroU32::new(n).map(|n| RateLimiter::keyed(Quota::per_minute(n)))
}

impl Limits {
    pub fn new(l: &RateLimits) -> Self {
        Self {
            join: Pair {
                account: per_minute(l.join_per_account_per_min),
                ip: per_minute_ip(l.join_per_ip_per_min),
            },
            status: Pair {
                account: per_minute(l.status_per_account_per_min),
                ip: per_minute_ip(l.status_per_ip_per_min),
            },
            api: Pair {
                account: NonZeroU32::new(l.api_per_account_per_s)
                    .map(|n| RateLimiter::keyed(Quota::per_second(n))),
                ip: NonZeroU32::new(l.api_per_ip_per_s)
                    .map(|n| RateLimiter::keyed(Quota::per_second(n))),
            },
            hasher: Default::default(),
            clock: DefaultClock::default(),
        }
    }

    fn pair(&self, scope: Scope) -> &Pair {
        match scope {
            Scope::Join => &self.join,
            Scope::Status => &self.status,
            Scope::Api => &self.api,
        }
    }

    fn account_key(&self, account: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(account.as_bytes());
        h.finish()
    }

    /// The client IP's budget. `Err(retry_after)` when over the limit.
    pub fn check_ip(&self, scope: Scope, ip: Option<IpAddr>) -> Result<(), Duration> {
        match (&self.pair(scope).ip, ip) {
            (Some(l), Some(ip)) => l
                .check_key(&ip_key(ip))
                .map_err(|n| n.wait_time_from(self.clock.now())),
            _ => Ok(()),
        }
    }

    /// The account's budget. `Err(retry_after)` when over the limit.
    pub fn check_account(&self, scope: Scope, account: &str) -> Result<(), Duration> {
        match &self.pair(scope).account {
            Some(l) => l
                .check_key(&self.account_key(account))
                .map_err(|n| n.wait_time_from(self.clock.now())),
            None => Ok(()),
        }
    }

    /// Forgets keys whose budget is full again, bounding memory (called periodically, off
    /// the async workers: with hundreds of thousands of fans it walks that many keys).
    pub fn prune(&self) {
        for p in [&self.join, &self.status, &self.api] {
            if let Some(l) = &p.account {
                prune_one(l);
            }
            if let Some(l) = &p.ip {
                prune_one(l);
            }
        }
    }
}

/// Drops the keys at full budget; rehashes to a smaller table only once most keys are gone
/// (after a surge). Rehashing holds a shard's lock for the whole shard, so doing it on every
/// pass while a surge keeps the map full made every request touching that shard wait.
fn prune_one<K: Hash + Eq + Clone>(l: &DefaultKeyedRateLimiter<K>) {
    let before = l.len();
    l.retain_recent();
    if l.len().saturating_mul(4) < before {
        l.shrink_to_fit();
    }
}

/// The budget an address spends: an IPv4 address (IPv4-mapped IPv6 included) is its own
/// key; an IPv6 address is keyed by its /64 prefix.
pub fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// `Retry-After` seconds for a wait (at least 1).
pub fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_limit_applies_per_account() {
        let l = Limits::new(&RateLimits {
            join_per_account_per_min: 2,
            ..RateLimits::default()
        });
        assert!(l.check_account(Scope::Join, "a").is_ok());
        assert!(l.check_account(Scope::Join, "a").is_ok());
        let wait = l.check_account(Scope::Join, "a").unwrap_err();
        assert!(retry_after_secs(wait) >= 1);
        assert!(l.check_account(Scope::Join, "b").is_ok());
        // A disabled limit never refuses.
        let off = Limits::new(&RateLimits {
            api_per_account_per_s: 0,
            ..RateLimits::default()
        });
        for _ in 0..1000 {
            assert!(off.check_account(Scope::Api, "a").is_ok());
        }
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("test address");
        assert_eq!(ip_key(ip("2001:db8:1:2::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            ip_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            ip_key(ip("2001:db8:1:2::1"))
        );
        assert_ne!(ip_key(ip("2001:db8:1:3::1")), ip_key(ip("2001:db8:1:2::1")));
        assert_eq!(ip_key(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(ip_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_ne!(ip_key(ip("192.0.2.7")), ip_key(ip("192.0.2.8")));

        let l = Limits::new(&RateLimits {
            join_per_ip_per_min: 2,
            ..RateLimits::default()
        });
        assert!(l.check_ip(Scope::Join, Some(ip("2001:db8:1:2::1"))).is_ok());
        assert!(l.check_ip(Scope::Join, Some(ip("2001:db8:1:2::2"))).is_ok());
        assert!(
            l.check_ip(Scope::Join, Some(ip("2001:db8:1:2::3")))
                .is_err(),
            "a third address of the same /64 shares the budget"
        );
        assert!(l.check_ip(Scope::Join, Some(ip("2001:db8:1:3::1"))).is_ok());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
    }
}
