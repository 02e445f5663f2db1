//! The Lua scripts behind every check-and-write of the waiting room. Each touches one event's
//! keys only (one Redis Cluster slot) and reads time from Redis `TIME`.

use super::{Place, StoreError};
use redis::Value;
use shared::redis_conn::LuaScript as Script;
use std::sync::LazyLock;

pub const JOIN_LUA: &str = r#"
-- Fans ever queued ahead of a waiting place: its rank plus everyone admitted (admission pops
-- in score order, so all of them scored lower) plus those revoked from below it. For a FIFO
-- place this never changes, so the receipt carries it and any gateway can compute the rank
-- later as before - admitted - revoked below, with no Redis call.
local function before(rank, score)
  local p = redis.call('HMGET', KEYS[7], 'popped', 'gone_passed')
  return rank + (tonumber(p[1]) or 0) + (tonumber(p[2]) or 0) + redis.call('ZCOUNT', KEYS[9], '-inf', '(' .. score)
end
local t = redis.call('TIME')
local sec = tonumber(t[1])
local usec = tonumber(t[2])
local now_ms = sec * 1000 + math.floor(usec / 1000)
local now_str = string.format('%d', now_ms)
local cfg = redis.call('HMGET', KEYS[1], 'mode', 'sale_start_ms', 'revealed', 'sn_arrivals', 'max_active', 'sn_state', 'access',
  'sn_arr_cap', 'sn_slots', 'sn_others_waiting', 'sn_stamp', 'stamp')
local mode = cfg[1]
if not mode then return {'unknown'} end
local place = redis.call('HGET', KEYS[3], ARGV[1])
if place then
  if redis.call('ZSCORE', KEYS[4], ARGV[1]) or redis.call('ZSCORE', KEYS[6], ARGV[1]) then
    return {'existing_admitted', place, now_str}
  end
  local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
  if not rank then return {'existing', place, now_str, -1, -1} end
  return {'existing', place, now_str, rank, before(rank, redis.call('ZSCORE', KEYS[2], ARGV[1]))}
end
if mode == 'closed' then return {'closed'} end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'sold_out'} end
-- Registered rooms (registration.rs): decided here, in the same script as the place, so a join
-- racing an upload of the list is refused or queued, never half.
local registered = cfg[7] == 'registered'
if registered and redis.call('SISMEMBER', KEYS[11], ARGV[1]) == 0 then
  return {'not_registered', now_str}
end
local score
local kind
local joined = now_str
local session = ARGV[3]
local restored = 0
-- A place receipt shown with the join (ARGV[5..8]: score, session, joined_ms, kind) restores a
-- place this Redis lost (a crash under appendfsync everysec loses the last second of joins).
-- Never a place that admission has passed (admitted, then claimed or lapsed), one revoked
-- while waiting, or an account ops revoked: those join at the back like anyone.
if ARGV[8] == 'draw' or ARGV[8] == 'fifo' then
  local cursor = tonumber(redis.call('HGET', KEYS[7], 'cursor') or '')
  if mode ~= 'passthrough' and (not cursor or tonumber(ARGV[5]) > cursor)
      and not redis.call('ZSCORE', KEYS[9], ARGV[1])
      and redis.call('HEXISTS', KEYS[10], 'a:' .. ARGV[1]) == 0 then
    score = ARGV[5]
    kind = ARGV[8]
    session = ARGV[6]
    joined = ARGV[7]
    restored = 1
  end
end
if restored == 1 then
  if registered then redis.call('SADD', KEYS[12], ARGV[1]) end
else
  -- A registered fan's first join is drawn whenever it happens (registration was the
  -- arrival); the drawn set makes it once, so a lapsed or revoked fan joins at the back.
  -- Anyone else is drawn only before the sale start (and the seed's reveal).
  local drawn
  if registered then
    drawn = redis.call('SADD', KEYS[12], ARGV[1]) == 1
  else
    drawn = now_ms < tonumber(cfg[2]) and not cfg[3]
  end
  if drawn then
    score = ARGV[2]
    kind = 'draw'
  else
    score = string.format('%d%03d.%03d', sec, math.floor(usec / 1000), usec % 1000)
    kind = 'fifo'
  end
end
-- The safety net (after the sale start): count the arrival (10-second buckets in the progress
-- hash), then let it straight through unless the last minute's arrivals, the admitted fans
-- (max_active) or a backlog say queue. Decided here, atomically, for every instance at once;
-- a fan is either passed or queued, never both.
local pass = false
if mode == 'safety_net' and kind == 'fifo' and restored == 0 then
  local b = math.floor(sec / 10)
  if redis.call('HINCRBY', KEYS[7], 'arr:' .. b, 1) == 1 then
    for i = 6, 17 do redis.call('HDEL', KEYS[7], 'arr:' .. (b - i)) end
  end
  local arrivals = 0
  for i = 0, 5 do arrivals = arrivals + (tonumber(redis.call('HGET', KEYS[7], 'arr:' .. (b - i))) or 0) end
  local maxa = tonumber(cfg[5]) or 0
  if ARGV[9] == '1' then
    -- A split queue: this sub-queue's budgets from the leader's last tick (shards.rs): its
    -- cap on the minute's arrivals, the max_active slots granted to it (a pass spends one),
    -- and whether another sub-queue has a backlog. Budgets of an older config (`sn_stamp`)
    -- or none yet queue.
    pass = cfg[11] ~= false and cfg[11] == cfg[12] and tonumber(cfg[10]) == 0
      and arrivals <= (tonumber(cfg[8]) or -1) and redis.call('ZCARD', KEYS[2]) == 0
      and (maxa == 0 or (tonumber(cfg[9]) or 0) >= 1)
    if pass and maxa > 0 then redis.call('HINCRBY', KEYS[1], 'sn_slots', -1) end
  else
    pass = arrivals <= (tonumber(cfg[4]) or 0) and redis.call('ZCARD', KEYS[2]) == 0
      and (maxa == 0 or redis.call('ZCARD', KEYS[4]) + redis.call('ZCARD', KEYS[6]) < maxa)
    local state = pass and 'pass' or 'queueing'
    if cfg[6] ~= state then redis.call('HSET', KEYS[1], 'sn_state', state) end
  end
end
place = session .. '|' .. score .. '|' .. joined .. '|' .. kind
if mode == 'passthrough' or pass then place = place .. '|' .. now_str end
redis.call('HSET', KEYS[3], ARGV[1], place)
if mode == 'passthrough' or pass then
  redis.call('ZADD', KEYS[6], now_ms + tonumber(ARGV[4]), ARGV[1])
  if pass then redis.call('HINCRBY', KEYS[7], 'sn_passed', 1) end
  return {'admitted', place, now_str}
end
redis.call('ZADD', KEYS[2], 'NX', score, ARGV[1])
if kind == 'draw' then
  -- The pre-sale score histogram (top 14 bits of score + 2^52): what every gateway needs to
  -- place a draw fan without asking Redis (progress.rs).
  redis.call('BITFIELD', KEYS[8], 'INCRBY', 'u32', '#' .. math.floor((tonumber(score) + 4503599627370496) / 274877906944), 1)
  redis.call('HINCRBY', KEYS[7], 'draws', 1)
else
  redis.call('HINCRBY', KEYS[7], 'fifos', 1)
  -- A split queue (ARGV[9], queue_shards > 1): arrival times in 1 ms buckets from this
  -- sub-queue's first FIFO place, so every gateway can count this sub-queue's places below
  -- any score and rank a fan of another sub-queue without asking Redis (progress.rs).
  if ARGV[9] == '1' then
    local f0 = tonumber(redis.call('HGET', KEYS[7], 'f0'))
    if not f0 then
      f0 = math.floor(tonumber(score))
      redis.call('HSET', KEYS[7], 'f0', string.format('%d', f0))
    end
    local b = math.max(0, math.min(4194303, math.floor(tonumber(score) - f0)))
    redis.call('BITFIELD', KEYS[13], 'INCRBY', 'u32', '#' .. b, 1)
  end
end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
return {'joined', place, now_str, rank, before(rank, score), restored}
"#;

pub const STATUS_LUA: &str = r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local place = redis.call('HGET', KEYS[1], ARGV[1])
if not place then return {'none'} end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if rank then return {'waiting', place, rank, redis.call('ZCARD', KEYS[2]), now_ms} end
local dl = redis.call('ZSCORE', KEYS[3], ARGV[1])
if dl and tonumber(dl) > now_ms then
  local exp = now_ms + tonumber(ARGV[2]) * 1000
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], exp, ARGV[1])
  -- The claim is the admission: its time goes on the place, for every later token.
  place = place .. '|' .. string.format('%d', now_ms)
  redis.call('HSET', KEYS[1], ARGV[1], place)
  return {'admitted', place, exp, 0, now_ms}
end
local act = redis.call('ZSCORE', KEYS[4], ARGV[1])
if act and tonumber(act) > now_ms then return {'admitted', place, tonumber(act), 0, now_ms} end
-- Missed the claim deadline (or the admission ended): release the place now rather than at
-- the next tick, so joining again at once queues the fan at the back.
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
return {'expired'}
"#;

// KEYS[2..4] and ARGV[12..]: the audit log (ARGV[12] actor, [24..26] role, operator id, note)
// and the schedule (`changes.rs`, which lays them out).
const PUT_CONFIG_LUA: &str = concat!(
    super::changes::pending_lua!(),
    r#"
local before = redis.call('HGET', KEYS[1], 'json') or ''
-- A scheduled change applies only onto the config it was merged with, and only while it is
-- still pending and unedited: exactly once, whichever instance gets there first.
if ARGV[14] ~= '' and (redis.call('HGET', KEYS[1], 'version') or '0') ~= ARGV[14] then return {'stale'} end
if ARGV[15] ~= '' and (redis.call('HGET', KEYS[4], ARGV[15]) ~= ARGV[16]
    or not redis.call('ZSCORE', KEYS[3], ARGV[15])) then return {'gone'} end
-- queue_shards (ARGV[23]) is fixed when the room is created: fans already placed live in the
-- sub-queue their account hashes to under that count.
local qs = redis.call('HGET', KEYS[1], 'queue_shards')
if not qs and redis.call('EXISTS', KEYS[1]) == 1 then qs = '1' end
if qs and qs ~= ARGV[23] then return {'shards', qs} end
redis.call('HSET', KEYS[1], 'queue_shards', ARGV[23])
-- What the sub-queues copy (mode, times, sold out) changed: they copy it on the next tick.
redis.call('HINCRBY', KEYS[1], 'stamp', 1)
redis.call('HSET', KEYS[1], 'json', ARGV[1], 'mode', ARGV[2], 'sale_start_ms', ARGV[3],
  'admit_per_minute', ARGV[4], 'max_active', ARGV[5], 'claim_deadline_ms', ARGV[6],
  'token_ttl_s', ARGV[7])
redis.call('HSET', KEYS[1], 'access', ARGV[21], 'reg_closes_ms', ARGV[22])
redis.call('HSETNX', KEYS[1], 'seed', ARGV[8])
redis.call('HSETNX', KEYS[1], 'seed_hash', ARGV[9])
if ARGV[10] ~= '' then
  local cur = tonumber(redis.call('HGET', KEYS[1], 'auto_rate')) or tonumber(ARGV[4])
  cur = math.max(tonumber(ARGV[10]), math.min(tonumber(ARGV[11]), cur))
  redis.call('HSET', KEYS[1], 'auto_rate', string.format('%d', cur))
else
  redis.call('HDEL', KEYS[1], 'auto_rate')
end
if ARGV[18] ~= '' then
  redis.call('HSET', KEYS[1], 'sn_arrivals', ARGV[18])
else
  redis.call('HDEL', KEYS[1], 'sn_arrivals', 'sn_state')
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
local sched_before = redis.call('HGET', KEYS[1], 'pending') or '[]'
if ARGV[15] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[15])
  redis.call('HSET', KEYS[4], ARGV[15], ARGV[17])
end
if ARGV[20] == '1' then
  -- The PUT named the whole pending list: the old one goes (the audit entry keeps it).
  for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do redis.call('HDEL', KEYS[4], id) end
  redis.call('DEL', KEYS[3])
  for i = 27, #ARGV, 3 do
    redis.call('ZADD', KEYS[3], ARGV[i + 1], ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
  end
end
local sched_after = render_pending()
local entry = {'at', now_ms(), 'actor', ARGV[12], 'role', ARGV[24], 'operator_id', ARGV[25],
  'note', ARGV[26], 'action', ARGV[13], 'before', before, 'after', ARGV[1], 'version', version}
if ARGV[15] ~= '' then
  entry[#entry + 1] = 'change'
  entry[#entry + 1] = ARGV[15]
end
if sched_after ~= sched_before then
  entry[#entry + 1] = 'schedule_before'
  entry[#entry + 1] = sched_before
  entry[#entry + 1] = 'schedule_after'
  entry[#entry + 1] = sched_after
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[19], '*', unpack(entry))
return {'ok', version}
"#
);

const REVOKE_LUA: &str = r#"
-- ARGV[7] '1': another sub-queue of a split queue (no config check, no audit entry: the
-- home's run did both).
local sub = ARGV[7] == '1'
if not sub and redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local now_s = tonumber(redis.call('TIME')[1])
redis.call('HSET', KEYS[2], ARGV[1], now_s)
redis.call('EXPIRE', KEYS[2], ARGV[3])
local who = ARGV[2]
if who == '' and ARGV[4] ~= '' then
  -- A session revoke names no account: find the admitted fan holding that session (work
  -- bounded by the admitted sets, which max_active keeps small; revokes are rare).
  local prefix = ARGV[4] .. '|'
  for _, set in ipairs({KEYS[4], KEYS[5]}) do
    for _, m in ipairs(redis.call('ZRANGE', set, 0, -1)) do
      local p = redis.call('HGET', KEYS[6], m)
      if p and string.sub(p, 1, #prefix) == prefix then who = m break end
    end
    if who ~= '' then break end
  end
end
if who ~= '' then
  -- Free the slot at once: the admission budget (max_active) must not wait for the token
  -- to expire.
  local waiting = redis.call('ZSCORE', KEYS[3], who)
  if waiting then redis.call('ZADD', KEYS[7], waiting, who) end
  redis.call('ZREM', KEYS[3], who)
  redis.call('ZREM', KEYS[4], who)
  redis.call('ZREM', KEYS[5], who)
  redis.call('HDEL', KEYS[6], who)
end
-- The config audit log (KEYS[8]; ARGV[5] actor, ARGV[6] its length cap, ARGV[8..10] the
-- actor's role, operator id and note).
if sub then return now_s end
redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[6], '*', 'at', now_s * 1000, 'actor', ARGV[5],
  'role', ARGV[8], 'operator_id', ARGV[9], 'note', ARGV[10],
  'action', 'revoke', 'before', '', 'after', ARGV[1])
return now_s
"#;

const DRAW_LUA: &str = r#"
local c = redis.call('HMGET', KEYS[1], 'seed', 'seed_hash', 'sale_start_ms')
if not c[2] then return {'unknown'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(c[3]) then
  if redis.call('HSETNX', KEYS[1], 'revealed', '1') == 1 then redis.call('HINCRBY', KEYS[1], 'stamp', 1) end
  return {'revealed', c[2], c[3], c[1]}
end
return {'committed', c[2], c[3]}
"#;

const STATS_PUT_LUA: &str = r#"
local now = tonumber(redis.call('TIME')[1])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
return now
"#;

const STATS_GET_LUA: &str = r#"
local now = tonumber(redis.call('TIME')[1])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local ts = tonumber(string.match(all[i + 1], '^(%d+)'))
  if ts and now - ts <= tonumber(ARGV[1]) then
    out[#out + 1] = all[i + 1]
  elseif ts and now - ts > 3600 then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
"#;

/// A budget shared by every gateway instance (GCRA: one key holding the theoretical arrival
/// time, ms). ARGV: period ms, budget per period, cells this instance already spent locally
/// (its share, charged whatever the verdict, never past a full budget). Returns 0 when the
/// request may pass, else the milliseconds until it could.
const GCRA_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local period = tonumber(ARGV[1])
local interval = period / tonumber(ARGV[2])
local v = redis.call('GET', KEYS[1])
local tat = math.max(v and tonumber(v) or now, now)
tat = math.min(tat + tonumber(ARGV[3]) * interval, now + period)
local wait = 0
if tat + interval - now > period then
  wait = math.ceil(tat + interval - now - period)
else
  tat = tat + interval
end
redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1)
return wait
"#;

pub(super) struct Scripts {
    pub(super) join: Script,
    pub(super) status: Script,
    pub(super) put_config: Script,
    pub(super) revoke: Script,
    pub(super) draw: Script,
    pub(super) stats_put: Script,
    pub(super) stats_get: Script,
    pub(super) gcra: Script,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    join: Script::new(JOIN_LUA),
    status: Script::new(STATUS_LUA),
    put_config: Script::new(PUT_CONFIG_LUA),
    revoke: Script::new(REVOKE_LUA),
    draw: Script::new(DRAW_LUA),
    stats_put: Script::new(STATS_PUT_LUA),
    stats_get: Script::new(STATS_GET_LUA),
    gcra: Script::new(GCRA_LUA),
});

/// Positional access to a script's array reply.
pub(super) struct Reply(Vec<Value>);

impl Reply {
    pub(super) fn from(v: Value) -> Result<Reply, StoreError> {
        match v {
            Value::Array(items) => Ok(Reply(items)),
            _ => Err(StoreError::Protocol("expected an array reply")),
        }
    }

    pub(super) fn str(&self, i: usize) -> Option<&str> {
        match self.0.get(i)? {
            Value::BulkString(b) => std::str::from_utf8(b).ok(),
            Value::SimpleString(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn int(&self, i: usize) -> Option<i64> {
        match self.0.get(i)? {
            Value::Int(n) => Some(*n),
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// A `ZRANK` result (`-1` or nil when not ranked).
    pub(super) fn rank(&self, i: usize) -> Option<u64> {
        self.int(i).and_then(|n| u64::try_from(n).ok())
    }

    pub(super) fn tag(&self) -> &str {
        self.str(0).unwrap_or("")
    }

    pub(super) fn place(&self, i: usize) -> Result<Place, StoreError> {
        self.str(i)
            .and_then(Place::parse)
            .ok_or(StoreError::Protocol("bad place record"))
    }
}
