//! Per-account and per-IP request limits (governor's GCRA, keyed), for joins, status polls,
//! admitted API calls and the payment provider's webhooks. Over a limit the caller gets `429`
//! with `Retry-After`. Each scope has budgets of its own: a webhook never spends a fan's
//! per-IP budget, nor a fan's request the webhooks'.
//!
//! Accounts are keyed by a 64-bit hash rather than the string, so checking a limit on the
//! proxy's hot path allocates nothing; a collision could only make two accounts share a
//! budget, never bypass one.
//!
//! IPv6 clients are keyed by their /64 ([`ip_key`]): one subscriber line or host usually gets
//! a whole /64, so keying by the full address would hand one client 2^64 budgets.

use crate::config::RateLimits;
use crate::store::Store;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Which budget a request spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Join,
    Status,
    Api,
    /// `POST /webhooks/payments` (per IP only: the provider has no account).
    Webhook,
}

impl Scope {
    pub fn label(self) -> &'static str {
        match self {
            Scope::Join => "join",
            Scope::Status => "status",
            Scope::Api => "api",
            Scope::Webhook => "webhook",
        }
    }
}

/// One budget: a local limiter holding the whole budget, of which each request spends one
/// cell per live instance (so an instance lets through its share, budget ÷ instances).
struct Budget<K: Hash + Eq + Clone> {
    local: DefaultKeyedRateLimiter<K>,
    per_period: NonZeroU32,
    period: Duration,
}

impl<K: Hash + Eq + Clone> Budget<K> {
    fn new(per_period: u32, period: Duration) -> Option<Self> {
        let n = NonZeroU32::new(per_period)?;
        let quota = Quota::with_period(period / n.get())?.allow_burst(n);
        Some(Self {
            local: RateLimiter::keyed(quota),
            per_period: n,
            period,
        })
    }
}

struct Pair {
    account: Option<Budget<u64>>,
    ip: Option<Budget<IpAddr>>,
}

/// What the local check decided.
#[derive(Debug)]
pub enum Verdict {
    Pass,
    /// Over the limit: retry after this long.
    Over(Duration),
    /// Over this instance's share while other instances are live: the shared budget in Redis
    /// decides ([`Limits::settle`]).
    Shared(SharedSpend),
}

/// A request to spend from a budget shared by every instance.
#[derive(Debug)]
pub struct SharedSpend {
    key: String,
    period: Duration,
    budget: u32,
    /// This instance's share, spent locally before its first shared spend of a period.
    prepaid: u32,
}

/// A key that went over its local share: when its current period of shared spending began,
/// and until when Redis said no (answered locally meanwhile, so a flood costs Redis one call
/// per refusal, not one per request).
struct Episode {
    started: Instant,
    blocked_until: Option<Instant>,
}

/// Per-account and per-IP limits that hold across gateway instances.
///
/// Each instance lets a key through on its share (budget ÷ live instances, counted by the
/// refresher from the instances publishing their health) with no Redis call. Past its share
/// (a fan whose keep-alive connection sticks to one instance, or one over budget) it asks the
/// shared GCRA budget in Redis, charging the share it already let through the first time in a
/// period. So a fan on one instance gets the whole budget, a client spread evenly over every
/// instance gets the budget (plus one request per instance), and the worst case (a client
/// just under its share on all instances but one) is under twice the budget rather than
/// instances × budget. docs/decisions.md, "Limits across instances".
pub struct Limits {
    join: Pair,
    status: Pair,
    api: Pair,
    webhook: Pair,
    hasher: std::collections::hash_map::RandomState,
    clock: DefaultClock,
    members: AtomicU32,
    episodes: Mutex<HashMap<String, Episode>>,
}

const MINUTE: Duration = Duration::from_secs(60);
const SECOND: Duration = Duration::from_secs(1);

impl Limits {
    pub fn new(l: &RateLimits) -> Self {
        let pair = |account, ip, period| Pair {
            account: Budget::new(account, period),
            ip: Budget::new(ip, period),
        };
        Self {
            join: pair(l.join_per_account_per_min, l.join_per_ip_per_min, MINUTE),
            status: pair(
                l.status_per_account_per_min,
                l.status_per_ip_per_min,
                MINUTE,
            ),
            api: pair(l.api_per_account_per_s, l.api_per_ip_per_s, SECOND),
            webhook: pair(0, l.webhooks_per_ip_per_min, MINUTE),
            hasher: Default::default(),
            clock: DefaultClock::default(),
            members: AtomicU32::new(1),
            episodes: Mutex::new(HashMap::new()),
        }
    }

    /// Live gateway instances sharing the budgets (this one included).
    pub fn set_members(&self, n: u32) {
        self.members.store(n.max(1), Relaxed);
    }

    pub fn members(&self) -> u32 {
        self.members.load(Relaxed)
    }

    fn pair(&self, scope: Scope) -> &Pair {
        match scope {
            Scope::Join => &self.join,
            Scope::Status => &self.status,
            Scope::Api => &self.api,
            Scope::Webhook => &self.webhook,
        }
    }

    fn account_key(&self, account: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(account.as_bytes());
        h.finish()
    }

    /// The client IP's budget.
    pub fn check_ip(&self, scope: Scope, ip: Option<IpAddr>) -> Verdict {
        match (&self.pair(scope).ip, ip) {
            (Some(b), Some(ip)) => {
                let k = ip_key(ip);
                self.check(b, &k, || format!("{}:i:{k}", scope.label()))
            }
            _ => Verdict::Pass,
        }
    }

    /// The account's budget.
    pub fn check_account(&self, scope: Scope, account: &str) -> Verdict {
        match &self.pair(scope).account {
            Some(b) => self.check(b, &self.account_key(account), || {
                format!("{}:a:{account}", scope.label())
            }),
            None => Verdict::Pass,
        }
    }

    fn check<K: Hash + Eq + Clone>(
        &self,
        b: &Budget<K>,
        key: &K,
        shared_key: impl FnOnce() -> String,
    ) -> Verdict {
        let members = self.members();
        let cost = members.min(b.per_period.get());
        let local = match NonZeroU32::new(cost) {
            Some(c) => b.local.check_key_n(key, c),
            None => Ok(Ok(())),
        };
        let wait = match local {
            Ok(Ok(())) => return Verdict::Pass,
            Ok(Err(not_until)) => not_until.wait_time_from(self.clock.now()),
            Err(_) => b.period,
        };
        if members <= 1 {
            return Verdict::Over(wait);
        }
        let key = shared_key();
        let now = Instant::now();
        let mut episodes = self.episodes.lock().unwrap_or_else(|p| p.into_inner());
        let prepaid = match episodes.get_mut(&key) {
            Some(e) if now.duration_since(e.started) < b.period => {
                if let Some(until) = e.blocked_until.filter(|u| *u > now) {
                    return Verdict::Over(until - now);
                }
                0
            }
            Some(e) => {
                *e = Episode {
                    started: now,
                    blocked_until: None,
                };
                b.per_period.get() / members
            }
            None => {
                episodes.insert(
                    key.clone(),
                    Episode {
                        started: now,
                        blocked_until: None,
                    },
                );
                b.per_period.get() / members
            }
        };
        Verdict::Shared(SharedSpend {
            key,
            period: b.period,
            budget: b.per_period.get(),
            prepaid,
        })
    }

    /// Decides a [`Verdict`]: `Err(retry_after)` when over the limit. Only a shared spend
    /// calls Redis; if Redis cannot answer, the request passes (a limit protects capacity, and
    /// the local share has already been spent; refusing fans because Redis hiccupped would
    /// turn an outage of the limiter into an outage of the sale).
    pub async fn settle(&self, store: &Store, v: Verdict) -> Result<(), Duration> {
        let s = match v {
            Verdict::Pass => return Ok(()),
            Verdict::Over(w) => return Err(w),
            Verdict::Shared(s) => s,
        };
        let period_ms = u64::try_from(s.period.as_millis()).unwrap_or(u64::MAX);
        match store
            .spend_shared(&s.key, period_ms, s.budget, s.prepaid)
            .await
        {
            Ok(None) => Ok(()),
            Ok(Some(wait)) => {
                let mut episodes = self.episodes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(e) = episodes.get_mut(&s.key) {
                    e.blocked_until = Some(Instant::now() + wait);
                }
                Err(wait)
            }
            Err(e) => {
                tracing::debug!(error = %e, "shared rate limit unavailable; letting the request through");
                Ok(())
            }
        }
    }

    /// Forgets keys whose budget is full again, bounding memory (called periodically, off
    /// the async workers: with hundreds of thousands of fans it walks that many keys).
    pub fn prune(&self) {
        for p in [&self.join, &self.status, &self.api, &self.webhook] {
            if let Some(b) = &p.account {
                prune_one(&b.local);
            }
            if let Some(b) = &p.ip {
                prune_one(&b.local);
            }
        }
        let now = Instant::now();
        self.episodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, e| now.duration_since(e.started) < MINUTE);
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
        assert!(matches!(l.check_account(Scope::Join, "a"), Verdict::Pass));
        assert!(matches!(l.check_account(Scope::Join, "a"), Verdict::Pass));
        let Verdict::Over(wait) = l.check_account(Scope::Join, "a") else {
            panic!("a third join in a minute must be over a budget of two");
        };
        assert!(retry_after_secs(wait) >= 1);
        assert!(matches!(l.check_account(Scope::Join, "b"), Verdict::Pass));
        // A disabled limit never refuses.
        let off = Limits::new(&RateLimits {
            api_per_account_per_s: 0,
            ..RateLimits::default()
        });
        for _ in 0..1000 {
            assert!(matches!(off.check_account(Scope::Api, "a"), Verdict::Pass));
        }
    }

    #[test]
    fn webhooks_and_fans_spend_budgets_of_their_own() {
        let l = Limits::new(&RateLimits {
            api_per_ip_per_s: 2,
            webhooks_per_ip_per_min: 3,
            ..RateLimits::default()
        });
        let ip = Some("192.0.2.7".parse::<IpAddr>().expect("test address"));
        let pass = |s| matches!(l.check_ip(s, ip), Verdict::Pass);
        for _ in 0..3 {
            assert!(pass(Scope::Webhook));
        }
        assert!(
            !pass(Scope::Webhook),
            "a fourth webhook is over a budget of 3"
        );
        // The webhooks spent nothing of the fans' budget on the same address, and the other
        // way round.
        assert!(pass(Scope::Api) && pass(Scope::Api));
        assert!(!pass(Scope::Api));
        assert_eq!(Scope::Webhook.label(), "webhook");
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
        let pass = |a: &str| matches!(l.check_ip(Scope::Join, Some(ip(a))), Verdict::Pass);
        assert!(pass("2001:db8:1:2::1"));
        assert!(pass("2001:db8:1:2::2"));
        assert!(
            !pass("2001:db8:1:2::3"),
            "a third address of the same /64 shares the budget"
        );
        assert!(pass("2001:db8:1:3::1"));
    }

    #[test]
    fn with_other_instances_live_a_key_spends_its_share_locally_then_asks_redis() {
        let l = Limits::new(&RateLimits {
            status_per_account_per_min: 12,
            ..RateLimits::default()
        });
        l.set_members(3);
        for _ in 0..4 {
            assert!(matches!(l.check_account(Scope::Status, "a"), Verdict::Pass));
        }
        // Past the share (12 / 3): the shared budget decides, charged the share once.
        let Verdict::Shared(s) = l.check_account(Scope::Status, "a") else {
            panic!("the fifth poll must go to the shared budget");
        };
        assert_eq!((s.key.as_str(), s.budget, s.prepaid), ("status:a:a", 12, 4));
        assert_eq!(s.period, MINUTE);
        let Verdict::Shared(s) = l.check_account(Scope::Status, "a") else {
            panic!("still over the share");
        };
        assert_eq!(s.prepaid, 0, "the share is charged once per period");
        // Alone again: the local budget is the whole budget.
        l.set_members(1);
        assert!(matches!(l.check_account(Scope::Status, "b"), Verdict::Pass));
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
    }
}
