//! The admission tick (`admission.rs` paces it): one script takes or renews the event's lease,
//! expires lapsed admissions, refills the token bucket and admits the next batch in score
//! order; a split queue's leader then pops the batch from its sub-queues (`shards.rs`).

use super::scripts::Reply;
use super::{OtherShards, Store, StoreError, TickOutcome, shards};
use redis::Value;
use shared::redis_conn::LuaScript as Script;
use std::sync::LazyLock;

/// Lua shared by the tick of a whole queue and of a split queue's sub-queue.
macro_rules! admit_lua {
    () => {
        r#"
-- Lapsed admissions leave with their places: unclaimed past the claim deadline (adm) and
-- claimed past the token's expiry (active), at most 1,000 of each per tick.
local function expire(adm, active, places, now)
  local cutoff = '(' .. string.format('%d', now)
  local gone = redis.call('ZRANGEBYSCORE', adm, '-inf', cutoff, 'LIMIT', 0, 1000)
  for _, m in ipairs(gone) do
    redis.call('ZREM', adm, m)
    redis.call('HDEL', places, m)
  end
  local done = redis.call('ZRANGEBYSCORE', active, '-inf', cutoff, 'LIMIT', 0, 1000)
  for _, m in ipairs(done) do
    redis.call('ZREM', active, m)
    redis.call('HDEL', places, m)
  end
  return #gone, #done
end
-- Admits `popped` (member, score, ... in score order, already out of the queue): a claim
-- deadline, the audit log, and the queue progress for status polls answered from gateway
-- memory (how many left by admission, the highest score admitted: a waiting fan at or below
-- it asks Redis; revoked places the cursor has passed become a plain count).
local function admit(popped, adm, log, prog, qgone, deadline, by)
  local admitted = 0
  for i = 1, #popped, 2 do
    redis.call('ZADD', adm, deadline, popped[i])
    redis.call('XADD', log, 'MAXLEN', '~', 1000000, '*', 'a', popped[i], 'by', by)
    admitted = admitted + 1
  end
  if admitted > 0 then
    local cursor = popped[#popped]
    redis.call('HINCRBY', prog, 'popped', admitted)
    redis.call('HSET', prog, 'cursor', cursor)
    local passed = redis.call('ZREMRANGEBYSCORE', qgone, '-inf', cursor)
    if passed > 0 then redis.call('HINCRBY', prog, 'gone_passed', passed) end
  end
  return admitted
end
"#
    };
}
pub(super) use admit_lua;

const TICK_LUA: &str = concat!(
    admit_lua!(),
    r#"
local holder = redis.call('GET', KEYS[7])
local took_over = false
if not holder then
  redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[2])
  took_over = true
elseif holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[7], ARGV[2])
else
  return {'follower'}
end
local c = redis.call('HMGET', KEYS[1], 'mode', 'admit_per_minute', 'max_active', 'claim_deadline_ms', 'auto_rate', 'sale_start_ms', 'sn_arrivals', 'sn_state', 'revealed', 'access', 'stamp', 'reg_closes_ms', 'sn_slots')
-- A split queue (ARGV[6]): this script keeps the lease and the bucket and decides how many
-- to admit; the gateway then pops them from the sub-queues in score order (shards.rs).
-- ARGV[7], [8]: the other sub-queues' admitted and waiting counts as of their last tick.
local split = ARGV[6] == '1'
local others_used = split and (tonumber(ARGV[7]) or 0) or 0
if not c[1] then return {'unknown'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ngone, ndone = expire(KEYS[3], KEYS[4], KEYS[5], now)
local mode = c[1]
local rate = tonumber(c[2])
if c[5] and ARGV[3] ~= '' then
  rate = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'auto_rate', ARGV[3])
elseif c[5] then
  rate = tonumber(c[5])
end
local qlen = redis.call('ZCARD', KEYS[2]) + (split and (tonumber(ARGV[8]) or 0) or 0)
local n = 0
if mode == 'passthrough' then
  n = math.min(qlen, tonumber(ARGV[5]))
  redis.call('DEL', KEYS[6])
elseif (mode == 'queue' or mode == 'safety_net') and now >= (tonumber(c[6]) or 0) and redis.call('EXISTS', KEYS[8]) == 0 then
  local b = redis.call('HMGET', KEYS[6], 'tokens', 'ts')
  local tokens = tonumber(b[1]) or 0
  local ts = tonumber(b[2]) or now
  -- At most one batch a tick (a tick's refill, rounded up), so a late tick never catches up;
  -- and a bucket one fan larger than a tick's refill, so it carries the fraction of a fan a
  -- tick leaves instead of losing it to the cap (capped at the refill, 900/min with 100 ms
  -- ticks admitted 600/min, and every tick that came a little early lost its fraction).
  local refill = rate * tonumber(ARGV[4]) / 60000
  local batch = math.max(1, math.ceil(refill))
  if now > ts then tokens = tokens + (now - ts) * rate / 60000 end
  local cap = refill + 1
  if took_over then
    -- A leader that takes the lease over (the previous one crashed: its lease had to lapse
    -- first) admits what was due since the last tick, up to the lease TTL plus one tick, so
    -- a leader crash does not lower the admit rate over the run.
    cap = math.max(cap, rate * math.min(now - ts, tonumber(ARGV[2]) + tonumber(ARGV[4])) / 60000)
    batch = math.floor(cap)
  end
  if tokens > cap then tokens = cap end
  n = math.min(math.floor(tokens), batch)
  local maxa = tonumber(c[3])
  if maxa > 0 then
    -- A split safety net also counts the slots granted to the home's joins (shards.rs;
    -- `others_used` has the other sub-queues' grants).
    local granted = (split and mode == 'safety_net' and (tonumber(c[13]) or 0)) or 0
    local used = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4]) + others_used + granted
    n = math.max(0, math.min(n, maxa - used))
  end
  n = math.min(n, qlen)
  redis.call('HSET', KEYS[6], 'tokens', tokens - n, 'ts', now)
else
  -- paused, closed, sold out or before the sale start (the draw decides the pre-sale order,
  -- so nobody leaves the queue before it): time does not accumulate admission budget
  redis.call('HSET', KEYS[6], 'ts', now)
end
local admitted = 0
if split then
  -- The fencing number the sub-queues check: a stalled former leader's pops are refused by
  -- every sub-queue the new leader has ticked since. In the progress hash, which nothing
  -- deletes (passthrough deletes the bucket).
  local seq = redis.call('HINCRBY', KEYS[10], 'tick_seq', 1)
  return {'leader', 0, ngone, ndone, qlen, redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4]) + others_used,
    math.floor(rate), '', n, seq, c[4], mode, c[6] or '0', c[3] or '0', c[9] or '', c[10] or 'open',
    c[11] or '0', redis.call('EXISTS', KEYS[8]), c[12] or '', c[7] or '0'}
end
if n > 0 then
  admitted = admit(redis.call('ZPOPMIN', KEYS[2], n), KEYS[3], KEYS[9], KEYS[10], KEYS[11],
    now + tonumber(c[4]), ARGV[1])
end
local active = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
-- The safety net passes joins again once the backlog is gone and both thresholds hold.
local sn = ''
if mode == 'safety_net' then
  local b = math.floor(now / 10000)
  local arrivals = 0
  for i = 0, 5 do arrivals = arrivals + (tonumber(redis.call('HGET', KEYS[10], 'arr:' .. (b - i))) or 0) end
  local maxa = tonumber(c[3])
  local calm = qlen - admitted == 0 and arrivals <= (tonumber(c[7]) or 0) and (maxa == 0 or active < maxa)
  sn = calm and 'pass' or 'queueing'
  if c[8] ~= sn then redis.call('HSET', KEYS[1], 'sn_state', sn) end
end
return {'leader', admitted, ngone, ndone, qlen - admitted, active, math.floor(rate), sn}
"#
);

static TICK: LazyLock<Script> = LazyLock::new(|| Script::new(TICK_LUA));

impl Store {
    /// One admission tick for `event` (a no-op unless this instance holds the lease).
    /// `shards`/`others`: a split queue and its other sub-queues' counts from the last tick.
    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    pub async fn tick(
        &self,
        event: &str,
        shards: u32,
        others: Option<OtherShards>,
        instance: &str,
        lease_ttl_ms: u64,
        auto_rate: Option<u64>,
        tick_ms: u64,
        passthrough_batch: u64,
    ) -> Result<TickOutcome, StoreError> {
        // A leader that has not ticked the other sub-queues yet (it just took the lease)
        // counts them first, so `max_active` holds from its first tick.
        let others = match others {
            Some(o) => o,
            None if shards > 1 => self.other_counts(event, shards).await?,
            None => OtherShards::default(),
        };
        let mut inv = TICK.prepare_invoke();
        self.shard_keys(
            &mut inv,
            event,
            0,
            &[
                "cfg",
                "q",
                "adm",
                "active",
                "places",
                "bucket",
                "lease",
                "sold_out",
                "admissions",
                "prog",
                "qgone",
            ],
        );
        inv.arg(instance)
            .arg(lease_ttl_ms)
            .arg(auto_rate.map(|r| r.to_string()).unwrap_or_default())
            .arg(tick_ms)
            .arg(passthrough_batch)
            .arg(if shards > 1 { "1" } else { "" })
            .arg(others.used)
            .arg(others.waiting);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let n = |i| r.int(i).and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        let outcome = match r.tag() {
            "follower" => TickOutcome::Follower,
            "unknown" => TickOutcome::UnknownEvent,
            "leader" => TickOutcome::Leader {
                admitted: n(1),
                expired_unclaimed: n(2),
                expired_active: n(3),
                queue_len: n(4),
                active: n(5),
                rate: n(6),
                safety_net_queueing: match r.str(7) {
                    Some("queueing") => Some(true),
                    Some("pass") => Some(false),
                    _ => None,
                },
                others: OtherShards::default(),
            },
            _ => return Err(StoreError::Protocol("unknown tick reply")),
        };
        if shards <= 1 || !matches!(outcome, TickOutcome::Leader { .. }) {
            return Ok(outcome);
        }
        let home = shards::HomeTick {
            admit: n(8),
            seq: r.int(9).map(|s| s.to_string()).unwrap_or_default(),
            claim_deadline_ms: r.str(10).unwrap_or("0").to_owned(),
            copy: shards::ConfigCopy::from_reply(&r, 11),
            sn_arrivals: n(19),
        };
        let (mut outcome, new_others) = self
            .tick_shards(event, shards, instance, &home, outcome)
            .await?;
        if let TickOutcome::Leader { others, .. } = &mut outcome {
            *others = new_others;
        }
        Ok(outcome)
    }
}
