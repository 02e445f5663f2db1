//! The registration list of a registered room: `fg:{event}:reg`, a set of account ids. In a
//! split queue (`queue_shards` > 1) each account's registration lives beside its place, in its
//! sub-queue's `fg:{event:k}:reg` ([`shard_of`]): the join script, on that sub-queue, reads
//! only its own fan's membership, so the list splits by account like everything else per fan.
//!
//! Guarantees: a fan's registration is one script (room registered-only, closing time checked
//! against Redis `TIME`, `SADD`), so it is refused or stored, never half; an ops upload writes
//! only ids it has already validated, in pipelined `SADD`/`SREM` batches that are each atomic
//! and commute (concurrent uploads end as their union); a replacement is built in a staging key
//! of the same slot and swapped in with one `RENAME`, so a join sees the old list or the new
//! one, never a mix. In a split queue each sub-queue's part is swapped on its own, so that holds
//! per account (a fan's join reads one sub-queue), while two fans of different sub-queues may
//! see the old and the new list for the moment between the swaps.

use super::scripts::Reply;
use super::shards::shard_of_bytes;
use super::{Store, StoreError, shard_of};
use redis::Value;
use shared::redis_conn::{LuaScript as Script, query_per_slot};
use std::sync::LazyLock;

/// Members per `SADD`/`SREM`: a few thousand keeps each command well under a millisecond of
/// Redis time (joins are not held up) while the round trips stay few.
pub const BATCH: usize = 4000;
/// Commands per pipelined round trip.
const PIPELINE: usize = 8;
/// A staging key outlives a crashed replacement by at most this long.
const STAGING_TTL_S: u64 = 3600;

const REGISTER_LUA: &str = r#"
local c = redis.call('HMGET', KEYS[1], 'mode', 'access', 'reg_closes_ms')
if not c[1] then return {'unknown'} end
if c[2] ~= 'registered' then return {'not_required'} end
local closes = c[3] or ''
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return {'registered', closes} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= (tonumber(closes) or 0) then return {'closed', closes} end
redis.call('SADD', KEYS[2], ARGV[1])
return {'registered', closes}
"#;

/// Swaps a staged list in (`RENAME` keeps it one step); an empty replacement empties the list.
const SWAP_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('PERSIST', KEYS[2])
else
  redis.call('DEL', KEYS[2])
end
return redis.call('SCARD', KEYS[2])
"#;

static REGISTER: LazyLock<Script> = LazyLock::new(|| Script::new(REGISTER_LUA));
static SWAP: LazyLock<Script> = LazyLock::new(|| Script::new(SWAP_LUA));

/// Outcome of a fan's registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterOutcome {
    UnknownEvent,
    /// The room is open to everyone.
    NotRequired,
    /// Past the closing time (and not registered before).
    Closed {
        closes_ms: Option<i64>,
    },
    /// Registered (now or before).
    Registered {
        closes_ms: Option<i64>,
    },
}

/// How an upload changes the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListChange {
    /// Union with the current list.
    Add,
    /// Take these accounts off.
    Remove,
    /// The list becomes exactly these accounts.
    Replace,
}

impl ListChange {
    pub fn parse(s: &str) -> Option<ListChange> {
        match s {
            "add" => Some(ListChange::Add),
            "remove" => Some(ListChange::Remove),
            "replace" => Some(ListChange::Replace),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ListChange::Add => "add",
            ListChange::Remove => "remove",
            ListChange::Replace => "replace",
        }
    }
}

impl Store {
    /// A fan registers for a registered room (idempotent). In a split queue the script runs
    /// on the fan's sub-queue and reads its copy of the config (access, closing time).
    pub async fn register(
        &self,
        event: &str,
        shards: u32,
        account: &str,
    ) -> Result<RegisterOutcome, StoreError> {
        let k = shard_of(account, shards);
        let mut outcome = self.register_once(event, k, account).await?;
        if outcome == RegisterOutcome::UnknownEvent && k > 0 {
            // A room created a moment ago may not have its copy here yet (as for joins).
            self.copy_config(event).await?;
            outcome = self.register_once(event, k, account).await?;
        }
        Ok(outcome)
    }

    async fn register_once(
        &self,
        event: &str,
        k: u32,
        account: &str,
    ) -> Result<RegisterOutcome, StoreError> {
        let mut inv = REGISTER.prepare_invoke();
        self.shard_keys(&mut inv, event, k, &["cfg", "reg"]);
        inv.arg(account);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let closes_ms = r.int(1);
        Ok(match r.tag() {
            "unknown" => RegisterOutcome::UnknownEvent,
            "not_required" => RegisterOutcome::NotRequired,
            "closed" => RegisterOutcome::Closed { closes_ms },
            "registered" => RegisterOutcome::Registered { closes_ms },
            _ => return Err(StoreError::Protocol("unknown register reply")),
        })
    }

    /// The event's sub-queue count, or `None` when it has no config (uploads for a mistyped
    /// event are refused). Read from the home, not a snapshot: ops may upload through an
    /// instance that has not refreshed a room created a moment ago.
    pub async fn event_shards(&self, event: &str) -> Result<Option<u32>, StoreError> {
        let cfg = self.key(event, "cfg");
        let (mode, shards): (Option<String>, Option<u32>) = self
            .with(|mut c| async move {
                redis::cmd("HMGET")
                    .arg(cfg)
                    .arg("mode")
                    .arg("queue_shards")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(mode.map(|_| shards.unwrap_or(1).max(1)))
    }

    /// Applies an upload of already validated account ids to an event of `shards`
    /// sub-queues. Returns how many members changed (added or removed) and the list's size
    /// afterwards.
    pub async fn change_registrations<'a, I>(
        &self,
        event: &str,
        shards: u32,
        change: ListChange,
        accounts: I,
    ) -> Result<(u64, u64), StoreError>
    where
        I: Iterator<Item = &'a [u8]>,
    {
        if shards <= 1 {
            let changed = self.change_part(event, 0, change, accounts).await?;
            let size = match changed.1 {
                Some(size) => size,
                None => self.registration_count(event, 1).await?,
            };
            return Ok((changed.0, size));
        }
        let mut parts: Vec<Vec<&[u8]>> = vec![Vec::new(); shards as usize];
        for a in accounts {
            parts[shard_of_bytes(a, shards) as usize].push(a);
        }
        let (mut changed, mut size, mut counted) = (0, 0, true);
        // Every part, even an empty one: a replacement empties the sub-queues it has no
        // account for.
        for (k, part) in (0u32..).zip(parts) {
            let (c, s) = self.change_part(event, k, change, part.into_iter()).await?;
            changed += c;
            match s {
                Some(s) => size += s,
                None => counted = false,
            }
        }
        if !counted {
            size = self.registration_count(event, shards).await?;
        }
        Ok((changed, size))
    }

    /// One sub-queue's part of an upload: the members changed, and the part's size when a
    /// replacement swapped it in.
    async fn change_part<'a, I>(
        &self,
        event: &str,
        k: u32,
        change: ListChange,
        accounts: I,
    ) -> Result<(u64, Option<u64>), StoreError>
    where
        I: Iterator<Item = &'a [u8]>,
    {
        let list = self.shard_key(event, k, "reg");
        let target = match change {
            ListChange::Replace => {
                self.shard_key(event, k, &format!("reg:staging:{}", shared::ids::new_id()))
            }
            ListChange::Add | ListChange::Remove => list.clone(),
        };
        let cmd = if change == ListChange::Remove {
            "SREM"
        } else {
            "SADD"
        };
        let mut changed = 0u64;
        let mut accounts = accounts.peekable();
        while accounts.peek().is_some() {
            let mut pipe = redis::pipe();
            for _ in 0..PIPELINE {
                if accounts.peek().is_none() {
                    break;
                }
                let c = pipe.cmd(cmd).arg(&target);
                for a in accounts.by_ref().take(BATCH) {
                    c.arg(a);
                }
            }
            if change == ListChange::Replace {
                pipe.cmd("EXPIRE").arg(&target).arg(STAGING_TTL_S).ignore();
            }
            let counts: Vec<u64> = self
                .with(|mut c| async move { pipe.query_async(&mut c).await })
                .await?;
            changed += counts.iter().sum::<u64>();
        }
        if change != ListChange::Replace {
            return Ok((changed, None));
        }
        let mut inv = SWAP.prepare_invoke();
        inv.key(&target).key(&list);
        let size = self
            .with(|mut c| async move { inv.invoke_async::<u64>(&mut c).await })
            .await?;
        Ok((changed, Some(size)))
    }

    /// How many accounts are on the list (over every sub-queue, one round trip per slot).
    pub async fn registration_count(&self, event: &str, shards: u32) -> Result<u64, StoreError> {
        let pipes: Vec<redis::Pipeline> = (0..shards.max(1))
            .map(|k| {
                let mut p = redis::pipe();
                p.cmd("SCARD").arg(self.shard_key(event, k, "reg"));
                p
            })
            .collect();
        self.with(|mut c| async move {
            let v = query_per_slot(&mut c, &pipes).await?;
            v.into_iter()
                .map(|x| redis::from_redis_value::<u64>(x).map_err(Into::into))
                .sum()
        })
        .await
    }

    /// Whether `account` is on the list.
    pub async fn is_registered(
        &self,
        event: &str,
        shards: u32,
        account: &str,
    ) -> Result<bool, StoreError> {
        let key = self.shard_key(event, shard_of(account, shards), "reg");
        let account = account.to_owned();
        self.with(|mut c| async move {
            redis::cmd("SISMEMBER")
                .arg(key)
                .arg(account)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|n| n == 1)
    }
}
