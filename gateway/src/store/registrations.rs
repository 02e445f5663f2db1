//! The registration list of a registered room: `fg:{event}:reg`, a set of account ids.
//!
//! Guarantees: a fan's registration is one script (room registered-only, closing time checked
//! against Redis `TIME`, `SADD`), so it is refused or stored, never half; an ops upload writes
//! only ids it has already validated, in pipelined `SADD`/`SREM` batches that are each atomic
//! and commute (concurrent uploads end as their union); a replacement is built in a staging key
//! of the same slot and swapped in with one `RENAME`, so a join sees the old list or the new
//! one, never a mix.

use super::scripts::Reply;
use super::{Store, StoreError};
use redis::Value;
use shared::redis_conn::LuaScript as Script;
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
    /// A fan registers for a registered room (idempotent).
    pub async fn register(
        &self,
        event: &str,
        account: &str,
    ) -> Result<RegisterOutcome, StoreError> {
        let mut inv = REGISTER.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "reg"))
            .arg(account);
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

    /// Whether the event has a config at all (uploads for a mistyped event are refused).
    pub async fn event_exists(&self, event: &str) -> Result<bool, StoreError> {
        let key = self.key(event, "cfg");
        self.with(|mut c| async move {
            redis::cmd("EXISTS")
                .arg(key)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|n| n == 1)
    }

    /// Applies an upload of already validated account ids. Returns how many members changed
    /// (added or removed) and the list's size afterwards.
    pub async fn change_registrations<'a, I>(
        &self,
        event: &str,
        change: ListChange,
        accounts: I,
    ) -> Result<(u64, u64), StoreError>
    where
        I: Iterator<Item = &'a [u8]>,
    {
        let list = self.key(event, "reg");
        let target = match change {
            ListChange::Replace => {
                self.key(event, &format!("reg:staging:{}", shared::ids::new_id()))
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
        let size = if change == ListChange::Replace {
            let mut inv = SWAP.prepare_invoke();
            inv.key(&target).key(&list);
            self.with(|mut c| async move { inv.invoke_async::<u64>(&mut c).await })
                .await?
        } else {
            self.registration_count(event).await?
        };
        Ok((changed, size))
    }

    /// How many accounts are on the list.
    pub async fn registration_count(&self, event: &str) -> Result<u64, StoreError> {
        let key = self.key(event, "reg");
        self.with(|mut c| async move { redis::cmd("SCARD").arg(key).query_async(&mut c).await })
            .await
    }

    /// Whether `account` is on the list.
    pub async fn is_registered(&self, event: &str, account: &str) -> Result<bool, StoreError> {
        let key = self.key(event, "reg");
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
