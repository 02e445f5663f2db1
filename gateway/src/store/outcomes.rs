//! What the store's calls answer: join, status and tick outcomes, a fan's place record, the
//! draw commitment and the per-event snapshot the gateway caches.

use crate::event_config::EventConfig;
use crate::progress::Progress;
use std::collections::HashMap;
use std::sync::Arc;

/// Outcome of a join.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    UnknownEvent,
    Closed,
    SoldOut,
    /// A registered-only room and the account is not on its list (`now_ms`: Redis time).
    NotRegistered {
        now_ms: i64,
    },
    /// A new place (`new = true`) or the existing one (repeat join); `ahead` is the number
    /// of fans in front when waiting in the queue, `before` the number ever queued in front
    /// (those admitted or revoked since included), which stays fixed for a FIFO place.
    Placed {
        place: Place,
        new: bool,
        admitted: bool,
        ahead: Option<u64>,
        before: Option<u64>,
        /// The place came back from the fan's receipt (this Redis had lost it).
        restored: bool,
    },
}

/// A fan's place record, as stored in `fg:{event}:places`.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub session: String,
    /// Queue score (string, exactly as stored: pre-sale draws are negative integers, later
    /// arrivals are Redis `TIME` in ms with a microsecond fraction).
    pub score: String,
    pub joined_ms: i64,
    /// `draw` (arrived before the sale start) or `fifo`.
    pub kind: String,
    /// When the admission was claimed (passthrough: the join), unix ms; absent until then.
    /// Every token of the admission carries it (`adm`), so the session bound counts from it.
    pub admitted_ms: Option<i64>,
}

impl Place {
    pub(super) fn parse(s: &str) -> Option<Place> {
        let mut it = s.split('|');
        let session = it.next()?.to_owned();
        let score = it.next()?.to_owned();
        let joined_ms = it.next()?.parse().ok()?;
        let kind = it.next()?.to_owned();
        let admitted_ms = it.next().and_then(|v| v.parse().ok());
        Some(Place {
            session,
            score,
            joined_ms,
            kind,
            admitted_ms,
        })
    }
}

/// Outcome of a status poll.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusOutcome {
    NotJoined,
    Waiting {
        place: Place,
        /// 0-based rank in the queue.
        rank: u64,
        queue_len: u64,
    },
    /// Admitted and claimed: mint a token valid until `expires_ms`.
    Admitted {
        place: Place,
        now_ms: i64,
        expires_ms: i64,
    },
    /// Admitted but the claim deadline (or the token lifetime) passed: the place is gone.
    Expired,
}

/// What one admission tick did.
#[derive(Debug, Clone, PartialEq)]
pub enum TickOutcome {
    Follower,
    UnknownEvent,
    Leader {
        admitted: u64,
        expired_unclaimed: u64,
        expired_active: u64,
        queue_len: u64,
        active: u64,
        rate: u64,
        /// Safety-net mode: `Some(true)` while queueing, `Some(false)` while passing.
        safety_net_queueing: Option<bool>,
        /// A split queue: the sub-queues other than the home, for the next tick.
        others: super::OtherShards,
    },
}

/// Draw commitment for an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    pub seed_hash: String,
    pub sale_start_ms: i64,
    /// Present once Redis time has passed the sale start.
    pub seed: Option<String>,
}

/// Everything the gateway caches about one event, read from Redis by the refresher.
#[derive(Debug, Clone, Default)]
pub struct EventSnapshot {
    pub config: Option<EventConfig>,
    pub seed: Vec<u8>,
    pub seed_hash: String,
    pub auto_rate: Option<u64>,
    pub version: i64,
    pub sold_out: bool,
    /// Revoked account → revocation time (unix s): tokens issued at or before it are refused.
    pub revoked_accounts: HashMap<String, i64>,
    pub revoked_sessions: HashMap<String, i64>,
    /// Queue progress for status polls answered from memory (`progress.rs`).
    pub progress: Arc<Progress>,
    /// Scheduled changes still pending, by time (`schedule.rs`).
    pub pending: Vec<crate::schedule::Change>,
    /// Safety-net mode: `pass` or `queueing`, as the join and tick scripts last decided.
    pub safety_net_state: Option<String>,
}

impl EventSnapshot {
    /// The sub-queues the event's queue is split over (1: not split).
    pub fn queue_shards(&self) -> u32 {
        self.config.as_ref().map_or(1, |c| c.queue_shards.max(1))
    }

    /// The admit rate in force: the measured one in auto mode, the configured one otherwise.
    pub fn effective_rate(&self) -> u64 {
        match (&self.config, self.auto_rate) {
            (Some(c), Some(r)) if c.auto.is_some() => r,
            (Some(c), _) => c.admit_per_minute,
            (None, _) => 0,
        }
    }
}

/// An event's snapshot from its config hash, sold-out flag and revocation hash.
pub(super) fn snapshot(
    mut cfg: HashMap<String, String>,
    sold_out: bool,
    revoked: HashMap<String, i64>,
) -> EventSnapshot {
    let config = cfg
        .get("json")
        .and_then(|j| serde_json::from_str::<EventConfig>(j).ok());
    let seed = cfg
        .get("seed")
        .and_then(|s| hex::decode(s).ok())
        .unwrap_or_default();
    let mut revoked_accounts = HashMap::new();
    let mut revoked_sessions = HashMap::new();
    for (k, at) in revoked {
        if let Some(a) = k.strip_prefix("a:") {
            revoked_accounts.insert(a.to_owned(), at);
        } else if let Some(s) = k.strip_prefix("s:") {
            revoked_sessions.insert(s.to_owned(), at);
        }
    }
    EventSnapshot {
        config,
        seed,
        seed_hash: cfg.remove("seed_hash").unwrap_or_default(),
        auto_rate: cfg.get("auto_rate").and_then(|r| r.parse().ok()),
        version: cfg.get("version").and_then(|v| v.parse().ok()).unwrap_or(0),
        sold_out,
        revoked_accounts,
        revoked_sessions,
        progress: Arc::default(),
        pending: crate::schedule::parse_pending(cfg.get("pending")),
        safety_net_state: cfg.remove("sn_state"),
    }
}
