//! A split queue (`queue_shards` > 1): one event's queue over several sub-queues, each its own
//! hash tag (`fg:{event:k}:…`), so one event's joins spread over several Redis Cluster masters.
//!
//! What is per fan lives in the sub-queue the account hashes to ([`shard_of`]): the place, the
//! waiting set, the admitted and active sets, the revoked-while-waiting places, the progress
//! counters and score histograms, the admissions log. Sub-queue 0 is the event's home and
//! keeps what is per event: the config, the lease, the token bucket, the audit log, the
//! schedule, booking's revocation list. The other sub-queues keep a copy of what a join or a
//! registration needs from the config (mode, sale start, reveal, cap, access, registration's
//! closing time, sold out), written by every leader
//! tick and after every config or sold-out write; the home's `stamp` orders the copies.
//!
//! A tick of a split queue, by the leader only:
//! 1. the home's tick script takes the lease, refills the bucket and decides how many to admit
//!    (`n`), counting the other sub-queues' waiting and admitted fans as of the last tick; it
//!    returns a fencing number (`seq`) and the config to copy;
//! 2. the gateway reads the first `n` of every sub-queue and merges them by score;
//! 3. each sub-queue's script pops its share, up to the merge's highest score for it, after
//!    checking that no later leader has ticked it (`seq`), copies the config and expires
//!    lapsed admissions.
//! 4. with mode `safety_net`, the leader hands each sub-queue its budgets for the joins until
//!    the next tick ([`budgets`]): a cap on its minute's arrivals, `max_active` slots granted
//!    from those no one holds, and whether another sub-queue has a backlog.
//!
//! Admission is therefore in score order across sub-queues as of step 2. A fan who joins a
//! sub-queue between steps 2 and 3 with a lower score than the cut waits for the next tick;
//! that happens only to FIFO joins on a master whose clock trails another's (fairness is
//! exact up to the masters' clock offset) and to places restored from receipts. A crash
//! between steps 1 and 3 loses at most that tick's batch from the rate (never admits twice:
//! each pop is one script on the fan's own sub-queue).

use super::scripts::Reply;
use super::{Store, StoreError, TickOutcome};
use redis::Value;
use shared::redis_conn::{LuaScript as Script, query_per_slot};
use std::sync::LazyLock;

mod budgets;

/// The sub-queue holding `account`'s place among `shards` (FNV-1a: stable across processes
/// and releases, which a split queue needs for as long as fans wait).
pub fn shard_of(account: &str, shards: u32) -> u32 {
    shard_of_bytes(account.as_bytes(), shards)
}

/// [`shard_of`] of an account id as bytes (an upload's lines).
pub fn shard_of_bytes(account: &[u8], shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in account {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u32::try_from(h % u64::from(shards)).unwrap_or(0)
}

/// Waiting and admitted fans of the sub-queues other than the home, as of a leader's tick
/// (the next tick's home script counts them against `max_active` and the queue length).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtherShards {
    pub used: u64,
    pub waiting: u64,
}

/// One sub-queue's tick: fencing, the config copy, expiry, and the pops the merge gave it.
/// KEYS: cfg, q, adm, active, places, admissions, prog, qgone, sold_out.
/// ARGV: seq ('' = copy only), pops, highest score to pop, claim deadline ms, instance,
/// copy ('1'), stamp, mode, sale_start_ms, max_active, revealed, access, sold out, shards,
/// registration's closing time.
const SHARD_TICK_LUA: &str = concat!(
    super::ticks::admit_lua!(),
    r#"
if ARGV[1] ~= '' then
  local last = tonumber(redis.call('HGET', KEYS[7], 'seq') or '0')
  if tonumber(ARGV[1]) < last then return {'stale'} end
  redis.call('HSET', KEYS[7], 'seq', ARGV[1])
end
if ARGV[6] == '1' and tonumber(ARGV[7]) > (tonumber(redis.call('HGET', KEYS[1], 'stamp')) or -1) then
  redis.call('HSET', KEYS[1], 'mode', ARGV[8], 'sale_start_ms', ARGV[9], 'max_active', ARGV[10],
    'access', ARGV[12], 'queue_shards', ARGV[14], 'stamp', ARGV[7])
  if ARGV[15] ~= '' then redis.call('HSET', KEYS[1], 'reg_closes_ms', ARGV[15]) else redis.call('HDEL', KEYS[1], 'reg_closes_ms') end
  if ARGV[11] == '1' then redis.call('HSET', KEYS[1], 'revealed', '1') else redis.call('HDEL', KEYS[1], 'revealed') end
  if ARGV[13] == '1' then redis.call('SET', KEYS[9], '1') else redis.call('DEL', KEYS[9]) end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ngone, ndone = expire(KEYS[3], KEYS[4], KEYS[5], now)
local admitted = 0
if tonumber(ARGV[2]) > 0 then
  -- Up to the merge's cut only: a place revoked since the merge read is not replaced by one
  -- that scores above the cut.
  local head = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
  for i = 1, #head, 2 do redis.call('ZREM', KEYS[2], head[i]) end
  admitted = admit(head, KEYS[3], KEYS[6], KEYS[7], KEYS[8], now + tonumber(ARGV[4]), ARGV[5])
end
-- The last minute's safety-net arrivals (the join's 10-second buckets), for the budgets.
local b = math.floor(now / 10000)
local arrivals = 0
for i = 0, 5 do arrivals = arrivals + (tonumber(redis.call('HGET', KEYS[7], 'arr:' .. (b - i))) or 0) end
-- Admitted fans and the safety-net slots granted here and not yet spent, read together: a
-- pass moves one from the second to the first, so their sum only grows by admissions.
return {'ok', admitted, ngone, ndone, redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4]), arrivals,
  tonumber(redis.call('HGET', KEYS[1], 'sn_slots')) or 0}
"#
);

static SHARD_TICK: LazyLock<Script> = LazyLock::new(|| Script::new(SHARD_TICK_LUA));

/// What the home's tick hands to the sub-queues: how many to admit, the fencing number, the
/// claim deadline and the config copy.
#[derive(Debug, Clone, Default)]
pub(super) struct HomeTick {
    pub(super) admit: u64,
    pub(super) seq: String,
    pub(super) claim_deadline_ms: String,
    pub(super) copy: ConfigCopy,
    /// The safety net's arrivals threshold (per minute, the whole event).
    pub(super) sn_arrivals: u64,
}

/// The part of the home's config a join reads, as copied to the other sub-queues.
#[derive(Debug, Clone, Default)]
pub(super) struct ConfigCopy {
    pub(super) stamp: String,
    pub(super) mode: String,
    pub(super) sale_start_ms: String,
    pub(super) max_active: String,
    pub(super) revealed: bool,
    pub(super) access: String,
    pub(super) sold_out: bool,
    pub(super) reg_closes_ms: String,
}

impl ConfigCopy {
    /// From the home tick's reply (fields 12..) or the copy read ([`Store::config_copy`]).
    pub(super) fn from_reply(r: &Reply, at: usize) -> ConfigCopy {
        let s = |i: usize| r.str(at + i).unwrap_or("").to_owned();
        ConfigCopy {
            mode: s(0),
            sale_start_ms: s(1),
            max_active: s(2),
            revealed: r.str(at + 3).is_some_and(|v| v == "1"),
            access: s(4),
            stamp: s(5),
            sold_out: r.int(at + 6) == Some(1),
            reg_closes_ms: s(7),
        }
    }
}

/// One sub-queue's answer to its tick.
#[derive(Debug, Default, Clone, Copy)]
struct ShardTicked {
    admitted: u64,
    expired_unclaimed: u64,
    expired_active: u64,
    waiting: u64,
    used: u64,
    /// Safety-net arrivals in the last minute.
    arrivals: u64,
    /// Safety-net `max_active` slots granted to this sub-queue's joins, not yet spent.
    slots: u64,
}

impl Store {
    /// `fg:{event}:suffix` for sub-queue 0, `fg:{event:k}:suffix` for sub-queue `k`.
    pub fn shard_key(&self, event: &str, k: u32, suffix: &str) -> String {
        shared::revocation::shard_key(&self.prefix, event, k, suffix)
    }

    /// Copies the home's config to sub-queues 1.. now (joins there read it). A config or
    /// sold-out write calls this; every leader tick does it too, so a copy lost to a crash
    /// is at most one tick behind.
    pub async fn copy_config(&self, event: &str) -> Result<(), StoreError> {
        let (copy, shards) = self.config_copy(event).await?;
        if shards <= 1 {
            return Ok(());
        }
        let home = HomeTick {
            copy,
            ..HomeTick::default()
        };
        for k in 1..shards {
            self.shard_tick(event, k, shards, &home, 0, "", "").await?;
        }
        Ok(())
    }

    /// The home's config fields a join reads, and the sub-queue count, in one round trip.
    async fn config_copy(&self, event: &str) -> Result<(ConfigCopy, u32), StoreError> {
        let cfg = self.key(event, "cfg");
        let sold = self.key(event, "sold_out");
        let (fields, sold_out): (Vec<Option<String>>, i64) = self
            .with(|mut c| async move {
                redis::pipe()
                    .cmd("HMGET")
                    .arg(cfg)
                    .arg(&[
                        "mode",
                        "sale_start_ms",
                        "max_active",
                        "revealed",
                        "access",
                        "stamp",
                        "queue_shards",
                        "reg_closes_ms",
                    ])
                    .cmd("EXISTS")
                    .arg(sold)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let f = |i: usize| fields.get(i).cloned().flatten().unwrap_or_default();
        let copy = ConfigCopy {
            mode: f(0),
            sale_start_ms: f(1),
            max_active: f(2),
            revealed: f(3) == "1",
            access: f(4),
            stamp: f(5),
            sold_out: sold_out == 1,
            reg_closes_ms: f(7),
        };
        Ok((copy, f(6).parse().unwrap_or(1)))
    }

    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    async fn shard_tick(
        &self,
        event: &str,
        k: u32,
        shards: u32,
        home: &HomeTick,
        pops: u64,
        max_score: &str,
        instance: &str,
    ) -> Result<Option<ShardTicked>, StoreError> {
        let c = &home.copy;
        let mut inv = SHARD_TICK.prepare_invoke();
        self.shard_keys(
            &mut inv,
            event,
            k,
            &[
                "cfg",
                "q",
                "adm",
                "active",
                "places",
                "admissions",
                "prog",
                "qgone",
                "sold_out",
            ],
        );
        inv.arg(&home.seq)
            .arg(pops)
            .arg(if max_score.is_empty() {
                "-inf"
            } else {
                max_score
            })
            .arg(if home.claim_deadline_ms.is_empty() {
                "0"
            } else {
                home.claim_deadline_ms.as_str()
            })
            .arg(instance)
            .arg(if k > 0 && !c.stamp.is_empty() {
                "1"
            } else {
                ""
            })
            .arg(&c.stamp)
            .arg(&c.mode)
            .arg(&c.sale_start_ms)
            .arg(&c.max_active)
            .arg(if c.revealed { "1" } else { "" })
            .arg(&c.access)
            .arg(if c.sold_out { "1" } else { "" })
            .arg(shards)
            .arg(&c.reg_closes_ms);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let n = |i| r.int(i).and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        Ok(match r.tag() {
            "ok" => Some(ShardTicked {
                admitted: n(1),
                expired_unclaimed: n(2),
                expired_active: n(3),
                waiting: n(4),
                used: n(5),
                arrivals: n(6),
                slots: n(7),
            }),
            "stale" => None,
            _ => return Err(StoreError::Protocol("unknown sub-queue tick reply")),
        })
    }

    /// Waiting and admitted fans of sub-queues 1.. (read only), one round trip per slot.
    pub(super) async fn other_counts(
        &self,
        event: &str,
        shards: u32,
    ) -> Result<OtherShards, StoreError> {
        let pipes: Vec<redis::Pipeline> = (1..shards)
            .map(|k| {
                let mut p = redis::pipe();
                p.cmd("ZCARD").arg(self.shard_key(event, k, "q"));
                p.cmd("ZCARD").arg(self.shard_key(event, k, "adm"));
                p.cmd("ZCARD").arg(self.shard_key(event, k, "active"));
                p
            })
            .collect();
        let counts: Vec<u64> = self
            .with(|mut c| async move {
                let v = query_per_slot(&mut c, &pipes).await?;
                v.into_iter()
                    .map(|x| redis::from_redis_value::<u64>(x).map_err(Into::into))
                    .collect()
            })
            .await?;
        let mut o = OtherShards::default();
        for c in counts.chunks_exact(3) {
            o.waiting += c[0];
            o.used += c[1] + c[2];
        }
        Ok(o)
    }

    /// The first `n` waiting places of every sub-queue (member, score as Redis wrote it),
    /// one pipelined round trip per slot.
    async fn heads(
        &self,
        event: &str,
        shards: u32,
        n: u64,
    ) -> Result<Vec<Vec<(String, String)>>, StoreError> {
        let pipes: Vec<redis::Pipeline> = (0..shards)
            .map(|k| {
                let mut p = redis::pipe();
                p.cmd("ZRANGE")
                    .arg(self.shard_key(event, k, "q"))
                    .arg(0)
                    .arg(n.saturating_sub(1))
                    .arg("WITHSCORES");
                p
            })
            .collect();
        self.with(|mut c| async move {
            let v = query_per_slot(&mut c, &pipes).await?;
            v.into_iter()
                .map(|x| redis::from_redis_value::<Vec<(String, String)>>(x).map_err(Into::into))
                .collect()
        })
        .await
    }

    /// Steps 2 and 3 of a split queue's tick (module docs), after the home's tick decided.
    /// Returns the leader's outcome with every sub-queue's counts added.
    pub(super) async fn tick_shards(
        &self,
        event: &str,
        shards: u32,
        instance: &str,
        home: &HomeTick,
        mut outcome: TickOutcome,
    ) -> Result<(TickOutcome, OtherShards), StoreError> {
        let cuts = if home.admit > 0 {
            let heads = self.heads(event, shards, home.admit).await?;
            merge_heads(&heads, home.admit)
        } else {
            vec![(0, String::new()); shards as usize]
        };
        let mut others = OtherShards::default();
        let mut sum = ShardTicked::default();
        let mut each = Vec::with_capacity(shards as usize);
        for k in 0..shards {
            let (pops, cut) = &cuts[k as usize];
            let Some(t) = self
                .shard_tick(event, k, shards, home, *pops, cut, instance)
                .await?
            else {
                // A later leader has ticked this sub-queue: this instance lost the lease.
                return Ok((TickOutcome::Follower, others));
            };
            if k > 0 {
                others.used += t.used;
                others.waiting += t.waiting;
            }
            sum.admitted += t.admitted;
            sum.expired_unclaimed += t.expired_unclaimed;
            sum.expired_active += t.expired_active;
            sum.waiting += t.waiting;
            sum.used += t.used;
            each.push(t);
        }
        let queueing = if home.copy.mode == "safety_net" {
            let max_active = home.copy.max_active.parse().unwrap_or(0);
            let (b, calm) = budgets::budgets(&each, home.sn_arrivals, max_active);
            self.write_budgets(event, &b, &home.copy.stamp, calm)
                .await?;
            // The next home tick counts the other sub-queues' slots as taken.
            others.used = each
                .iter()
                .zip(&b)
                .skip(1)
                .map(|(t, b)| t.used + t.slots + b.grant.unwrap_or(0))
                .sum();
            Some(!calm)
        } else {
            None
        };
        if let TickOutcome::Leader {
            admitted,
            expired_unclaimed,
            expired_active,
            queue_len,
            active,
            safety_net_queueing,
            ..
        } = &mut outcome
        {
            *safety_net_queueing = queueing;
            *admitted = sum.admitted;
            *expired_unclaimed += sum.expired_unclaimed;
            *expired_active += sum.expired_active;
            *queue_len = sum.waiting;
            *active = sum.used;
        }
        Ok((outcome, others))
    }
}

/// The `n` lowest scores over every sub-queue's head: for each sub-queue, how many of them
/// are its own and the highest such score (as Redis wrote it). Ties go to the lower
/// sub-queue, then the member (any fixed order would do; the scores tie only by accident).
fn merge_heads(heads: &[Vec<(String, String)>], n: u64) -> Vec<(u64, String)> {
    let mut all: Vec<(f64, usize, &str, &str)> = heads
        .iter()
        .enumerate()
        .flat_map(|(k, h)| {
            h.iter().filter_map(move |(m, s)| {
                s.parse::<f64>()
                    .ok()
                    .map(|f| (f, k, m.as_str(), s.as_str()))
            })
        })
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)));
    let mut cuts = vec![(0u64, String::new()); heads.len()];
    for (_, k, _, s) in all
        .into_iter()
        .take(usize::try_from(n).unwrap_or(usize::MAX))
    {
        cuts[k].0 += 1;
        s.clone_into(&mut cuts[k].1);
    }
    cuts
}

#[cfg(test)]
mod tests;
