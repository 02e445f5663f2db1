//! Redis access for the waiting room: key layout and the Lua scripts that make every
//! check-and-write atomic.
//!
//! Keys (after `redis.key_prefix`): `fg:{event}:cfg` (hash: live config, seed commitment,
//! auto rate), `fg:{event}:q` (sorted set: waiting fans by score), `fg:{event}:places` (hash:
//! account → place record; one per account, so repeat joins get the same place),
//! `fg:{event}:adm` (sorted set: admitted, unclaimed, by claim deadline), `fg:{event}:active`
//! (sorted set: claimed admissions, by token expiry), `fg:{event}:bucket` (admission token
//! bucket), `fg:{event}:lease` (admission lease), `fg:{event}:sold_out`, `fg:{event}:revoked`,
//! `fg:{event}:admissions` (stream: audit log of admissions), `fg:{event}:reg` (set: accounts
//! allowed into a registered room), `fg:{event}:drawn` (set: registered accounts whose draw
//! place has been given), `fg:{event}:cfglog` (stream: the config audit log),
//! `fg:{event}:sched` / `fg:{event}:schedq` (scheduled changes: records, pending by time; see
//! `changes.rs`). The event is a hash tag, so an
//! event's keys share one Redis Cluster slot and every script below touches one slot only.
//! A split queue (`queue_shards` > 1) keeps each fan's keys under `fg:{event:k}:…` instead,
//! `k` from the account (`shards.rs`), so one event's joins spread over several slots.
//! Global keys: `fg:events` (set of configured events), `fg:upstream` (per-instance upstream
//! health, for auto mode), `fg:operators` (booking's published operator credentials, read
//! only: `admin/operators.rs`).
//!
//! Time always comes from Redis `TIME` inside the scripts, never from the gateway's clock.
//! Every call is bounded by the configured response timeout, so a stalled Redis turns into a
//! quick `503`, never a hung request.

use crate::draw::ReceiptClaims;
use crate::event_config::EventConfig;
use redis::Value;
use shared::config::RedisSettings;
use shared::redis_conn::{Conn, Connector, Invocation};
use std::time::Duration;

mod changes;
mod fans;
mod outcomes;
mod registrations;
mod scripts;
mod shards;
mod snapshots;
mod ticks;

pub use changes::{
    AUDIT_MAX_LEN, AuditEntry, ChangeWrite, ConfigWrite, DueChange, Who, WriteOutcome,
};

pub use outcomes::{Draw, EventSnapshot, JoinOutcome, Place, StatusOutcome, TickOutcome};
pub use registrations::{ListChange, RegisterOutcome};
pub use scripts::{JOIN_LUA, STATUS_LUA};
use scripts::{Reply, SCRIPTS};
pub use shards::{OtherShards, shard_of};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer in time")]
    Timeout,
    #[error("unexpected reply from redis: {0}")]
    Protocol(&'static str),
}

/// The waiting room's Redis (one server or a cluster, connected on first use inside the
/// calling service's runtime, reconnecting by itself) plus the key layout.
pub struct Store {
    redis: Connector,
    prefix: String,
    timeout: Duration,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Connects to the waiting room's Redis (`[redis] queue_url`, else `url`; `mode`).
    pub fn new(settings: &RedisSettings) -> anyhow::Result<Self> {
        let settings = settings.queue();
        Ok(Self {
            redis: Connector::new(&settings)?,
            prefix: settings.key_prefix.clone(),
            timeout: Duration::from_millis(settings.response_timeout_ms.max(1)),
        })
    }

    /// Runs `f` with a connection, bounded by the response timeout.
    async fn with<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>>,
    {
        // The connection has its own timeouts; this outer bound also covers connecting (a
        // cluster reads its slot map) and waiting for a reconnect, so a caller never waits
        // more than ~2× the timeout.
        let call = async {
            let conn = self.redis.conn().await?;
            f(conn).await
        };
        match tokio::time::timeout(self.timeout * 2, call).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `fg:{event}:suffix` with the deployment prefix.
    pub fn key(&self, event: &str, suffix: &str) -> String {
        // Booking reads the revocations through the same layout.
        shared::revocation::event_key(&self.prefix, event, suffix)
    }

    /// Appends the keys `suffixes` of `event`'s sub-queue `k` to a script call, in order.
    fn shard_keys(&self, inv: &mut Invocation<'_>, event: &str, k: u32, suffixes: &[&str]) {
        for suffix in suffixes {
            inv.key(self.shard_key(event, k, suffix));
        }
    }

    fn events_key(&self) -> String {
        shared::revocation::events_key(&self.prefix)
    }

    fn upstream_key(&self) -> String {
        format!("{}fg:upstream", self.prefix)
    }

    /// Booking's published operator list (`shared::credentials::Published` as JSON), as
    /// stored; `None` when nothing was published.
    pub async fn load_operators(&self) -> Result<Option<String>, StoreError> {
        let key = shared::credentials::operators_key(&self.prefix);
        self.with(|mut c| async move { redis::cmd("GET").arg(key).query_async(&mut c).await })
            .await
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.with(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .map(|_| ())
    }

    /// Joins `account` to `event` (once: a repeat join returns the existing place).
    /// `restore`: the place from the fan's receipt, given back if this Redis lost it (see
    /// `JOIN_LUA` for when it is refused).
    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    pub async fn join(
        &self,
        event: &str,
        shards: u32,
        account: &str,
        presale_score: i64,
        session: &str,
        passthrough_ttl_s: u64,
        restore: Option<&ReceiptClaims>,
    ) -> Result<JoinOutcome, StoreError> {
        let k = shard_of(account, shards);
        let outcome = self
            .join_once(
                event,
                shards,
                k,
                account,
                presale_score,
                session,
                passthrough_ttl_s,
                restore,
            )
            .await?;
        if !matches!(outcome, JoinOutcome::UnknownEvent) || k == 0 {
            return Ok(outcome);
        }
        // A sub-queue without its config copy yet (a room created a moment ago, its copy
        // lost): copy it now and join again.
        self.copy_config(event).await?;
        self.join_once(
            event,
            shards,
            k,
            account,
            presale_score,
            session,
            passthrough_ttl_s,
            restore,
        )
        .await
    }

    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    async fn join_once(
        &self,
        event: &str,
        shards: u32,
        k: u32,
        account: &str,
        presale_score: i64,
        session: &str,
        passthrough_ttl_s: u64,
        restore: Option<&ReceiptClaims>,
    ) -> Result<JoinOutcome, StoreError> {
        let mut inv = SCRIPTS.join.prepare_invoke();
        self.shard_keys(
            &mut inv,
            event,
            k,
            &[
                "cfg", "q", "places", "adm", "sold_out", "active", "prog", "hist", "qgone",
                "revoked", "reg", "drawn", "fhist",
            ],
        );
        inv.arg(account)
            .arg(presale_score)
            .arg(session)
            .arg(passthrough_ttl_s.saturating_mul(1000));
        match restore {
            Some(r) => inv.arg(&r.score).arg(&r.sid).arg(r.joined_ms).arg(&r.kind),
            None => inv.arg("").arg("").arg("").arg(""),
        };
        inv.arg(if shards > 1 { "1" } else { "" });
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        Ok(match r.tag() {
            "unknown" => JoinOutcome::UnknownEvent,
            "not_registered" => JoinOutcome::NotRegistered {
                now_ms: r.int(1).unwrap_or(0),
            },
            "closed" => JoinOutcome::Closed,
            "sold_out" => JoinOutcome::SoldOut,
            "existing" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: false,
                admitted: false,
                ahead: r.rank(3),
                before: r.rank(4),
                restored: false,
            },
            "existing_admitted" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: false,
                admitted: true,
                ahead: None,
                before: None,
                restored: false,
            },
            "joined" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: true,
                admitted: false,
                ahead: r.rank(3),
                before: r.rank(4),
                restored: r.int(5) == Some(1),
            },
            "admitted" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: true,
                admitted: true,
                ahead: None,
                before: None,
                restored: false,
            },
            _ => return Err(StoreError::Protocol("unknown join reply")),
        })
    }

    /// Where `account` stands; claims a pending admission (the claim extends it to the token
    /// lifetime `ttl_s`).
    /// In a split queue the rank and length are the fan's own sub-queue's.
    pub async fn status(
        &self,
        event: &str,
        shards: u32,
        account: &str,
        ttl_s: u64,
    ) -> Result<StatusOutcome, StoreError> {
        let k = shard_of(account, shards);
        let mut inv = SCRIPTS.status.prepare_invoke();
        self.shard_keys(&mut inv, event, k, &["places", "q", "adm", "active"]);
        inv.arg(account).arg(ttl_s);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        Ok(match r.tag() {
            "none" => StatusOutcome::NotJoined,
            "expired" => StatusOutcome::Expired,
            "waiting" => StatusOutcome::Waiting {
                place: r.place(1)?,
                rank: r.int(2).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
                queue_len: r.int(3).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
            },
            "admitted" => StatusOutcome::Admitted {
                place: r.place(1)?,
                expires_ms: r.int(2).ok_or(StoreError::Protocol("bad expiry"))?,
                now_ms: r.int(4).ok_or(StoreError::Protocol("bad time"))?,
            },
            _ => return Err(StoreError::Protocol("unknown status reply")),
        })
    }

    /// Stores a validated config (absolute) and its audit entry, in one script. The draw seed
    /// is set only the first time, so the published commitment never changes.
    pub async fn put_config(
        &self,
        event: &str,
        config: &EventConfig,
        seed_hex: &str,
        seed_hash: &str,
        write: &ConfigWrite<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let json = serde_json::to_string(config)
            .map_err(|_| StoreError::Protocol("config not serialisable"))?;
        let (floor, ceiling) = match &config.auto {
            Some(a) => (a.floor.to_string(), a.ceiling.to_string()),
            None => (String::new(), String::new()),
        };
        let mut inv = SCRIPTS.put_config.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .arg(json)
            .arg(config.mode.as_str())
            .arg(config.sale_start_ms())
            .arg(config.admit_per_minute)
            .arg(config.max_active)
            .arg(config.claim_deadline_s.saturating_mul(1000))
            .arg(config.token_ttl_s)
            .arg(seed_hex)
            .arg(seed_hash)
            .arg(floor)
            .arg(ceiling);
        self.config_write_args(&mut inv, event, config, write);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let version = match r.tag() {
            "ok" => r.int(1).ok_or(StoreError::Protocol("bad config version"))?,
            "stale" => return Ok(WriteOutcome::Stale),
            "gone" => return Ok(WriteOutcome::Gone),
            "shards" => {
                let n = r.int(1).and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
                return Ok(WriteOutcome::ShardsFixed(n));
            }
            _ => return Err(StoreError::Protocol("unknown config-write reply")),
        };
        // The index is a separate (cross-slot) key; writing it after the config means the
        // refresher never sees an indexed event without a config.
        let events = self.events_key();
        let ev = event.to_owned();
        self.with(|mut c| async move {
            redis::cmd("SADD")
                .arg(events)
                .arg(ev)
                .query_async::<i64>(&mut c)
                .await
        })
        .await?;
        if config.queue_shards > 1 {
            self.copy_config(event).await?;
        }
        Ok(WriteOutcome::Written(version))
    }

    /// The draw commitment; reveals the seed once Redis time is past the sale start.
    pub async fn draw(&self, event: &str) -> Result<Option<Draw>, StoreError> {
        let mut inv = SCRIPTS.draw.prepare_invoke();
        inv.key(self.key(event, "cfg"));
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        Ok(match r.tag() {
            "unknown" => None,
            tag => Some(Draw {
                seed_hash: r.str(1).unwrap_or("").to_owned(),
                sale_start_ms: r.int(2).unwrap_or(0),
                seed: (tag == "revealed").then(|| r.str(3).unwrap_or("").to_owned()),
            }),
        })
    }

    /// Spends one request of a budget shared by every instance (`limits.rs`): `Ok(None)` when
    /// it may pass, `Ok(Some(wait))` when over. `prepaid`: cells this instance let through on
    /// its local share before asking.
    pub async fn spend_shared(
        &self,
        key: &str,
        period_ms: u64,
        budget: u32,
        prepaid: u32,
    ) -> Result<Option<Duration>, StoreError> {
        let mut inv = SCRIPTS.gcra.prepare_invoke();
        inv.key(format!("{}fg:rl:{key}", self.prefix))
            .arg(period_ms)
            .arg(budget)
            .arg(prepaid);
        let wait_ms: u64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok((wait_ms > 0).then(|| Duration::from_millis(wait_ms)))
    }

    /// Publishes this instance's upstream health summary (auto mode reads every instance's).
    pub async fn put_upstream_stats(
        &self,
        instance: &str,
        summary: &str,
    ) -> Result<(), StoreError> {
        let mut inv = SCRIPTS.stats_put.prepare_invoke();
        inv.key(self.upstream_key()).arg(instance).arg(summary);
        self.with(|mut c| async move { inv.invoke_async::<i64>(&mut c).await })
            .await
            .map(|_| ())
    }

    /// Every instance's summary published within the last `max_age_s` seconds.
    pub async fn upstream_stats(&self, max_age_s: u64) -> Result<Vec<String>, StoreError> {
        let mut inv = SCRIPTS.stats_get.prepare_invoke();
        inv.key(self.upstream_key()).arg(max_age_s);
        self.with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_round_trip() {
        let p = Place::parse("sess|-4503599627370000|1732961234567|draw").unwrap();
        assert_eq!(p.session, "sess");
        assert_eq!(p.score, "-4503599627370000");
        assert_eq!(p.joined_ms, 1_732_961_234_567);
        assert_eq!(p.kind, "draw");
        assert_eq!(p.admitted_ms, None);
        let p = Place::parse("sess|1732961234567.123|1732961234567|fifo|1732961299000").unwrap();
        assert_eq!(p.admitted_ms, Some(1_732_961_299_000));
        assert!(Place::parse("garbage").is_none());
    }
}
