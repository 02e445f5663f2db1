//! Redis access for the waiting room: key layout and the Lua scripts that make every
//! check-and-write atomic.
//!
//! Keys (after `redis.key_prefix`): `fg:{event}:cfg` (hash: live config, seed commitment,
//! auto rate), `fg:{event}:q` (sorted set: waiting fans by score), `fg:{event}:places` (hash:
//! account → place record; one per account, so repeat joins get the same place),
//! `fg:{event}:adm` (sorted set: admitted, unclaimed, by claim deadline), `fg:{event}:active`
//! (sorted set: claimed admissions, by token expiry), `fg:{event}:bucket` (admission token
//! bucket), `fg:{event}:lease` (admission lease), `fg:{event}:sold_out`, `fg:{event}:revoked`,
//! `fg:{event}:admissions` (stream: audit log of admissions). The event is a hash tag, so an
//! event's keys share one Redis Cluster slot and every script below touches one slot only.
//! Global keys: `fg:events` (set of configured events), `fg:upstream` (per-instance upstream
//! health, for auto mode).
//!
//! Time always comes from Redis `TIME` inside the scripts, never from the gateway's clock.
//! Every call is bounded by the configured response timeout, so a stalled Redis turns into a
//! quick `503`, never a hung request.

use crate::event_config::EventConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use secrecy::ExposeSecret;
use shared::config::RedisSettings;
use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer in time")]
    Timeout,
    #[error("unexpected reply from redis: {0}")]
    Protocol(&'static str),
}

/// One lazily connected, auto-reconnecting Redis connection plus the key layout.
///
/// The connection is created on first use *inside* the calling service's runtime (pingora
/// services each own a runtime; a connection made elsewhere would be driven by a foreign
/// runtime).
pub struct Store {
    client: redis::Client,
    conn: OnceLock<ConnectionManager>,
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

/// Outcome of a join.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    UnknownEvent,
    Closed,
    SoldOut,
    /// A new place (`new = true`) or the existing one (repeat join); `ahead` is the number
    /// of fans in front when waiting in the queue.
    Placed {
        place: Place,
        new: bool,
        admitted: bool,
        ahead: Option<u64>,
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
    fn parse(s: &str) -> Option<Place> {
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
}

impl EventSnapshot {
    /// The admit rate in force: the measured one in auto mode, the configured one otherwise.
    pub fn effective_rate(&self) -> u64 {
        match (&self.config, self.auto_rate) {
            (Some(c), Some(r)) if c.auto.is_some() => r,
            (Some(c), _) => c.admit_per_minute,
            (None, _) => 0,
        }
    }
}

pub const JOIN_LUA: &str = r#"
local t = redis.call('TIME')
local sec = tonumber(t[1])
local usec = tonumber(t[2])
local now_ms = sec * 1000 + math.floor(usec / 1000)
local now_str = string.format('%d', now_ms)
local cfg = redis.call('HMGET', KEYS[1], 'mode', 'sale_start_ms', 'revealed')
local mode = cfg[1]
if not mode then return {'unknown'} end
local place = redis.call('HGET', KEYS[3], ARGV[1])
if place then
  if redis.call('ZSCORE', KEYS[4], ARGV[1]) or redis.call('ZSCORE', KEYS[6], ARGV[1]) then
    return {'existing_admitted', place, now_str}
  end
  return {'existing', place, now_str, redis.call('ZRANK', KEYS[2], ARGV[1]) or -1}
end
if mode == 'closed' then return {'closed'} end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'sold_out'} end
local score
local kind
if now_ms < tonumber(cfg[2]) and not cfg[3] then
  score = ARGV[2]
  kind = 'draw'
else
  score = string.format('%d%03d.%03d', sec, math.floor(usec / 1000), usec % 1000)
  kind = 'fifo'
end
place = ARGV[3] .. '|' .. score .. '|' .. now_str .. '|' .. kind
if mode == 'passthrough' then place = place .. '|' .. now_str end
redis.call('HSET', KEYS[3], ARGV[1], place)
if mode == 'passthrough' then
  redis.call('ZADD', KEYS[6], now_ms + tonumber(ARGV[4]), ARGV[1])
  return {'admitted', place, now_str}
end
redis.call('ZADD', KEYS[2], 'NX', score, ARGV[1])
return {'joined', place, now_str, redis.call('ZRANK', KEYS[2], ARGV[1])}
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

const TICK_LUA: &str = r#"
local holder = redis.call('GET', KEYS[7])
if not holder then
  redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[2])
elseif holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[7], ARGV[2])
else
  return {'follower'}
end
local c = redis.call('HMGET', KEYS[1], 'mode', 'admit_per_minute', 'max_active', 'claim_deadline_ms', 'auto_rate')
if not c[1] then return {'unknown'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = '(' .. string.format('%d', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', cutoff, 'LIMIT', 0, 1000)
for _, m in ipairs(gone) do
  redis.call('ZREM', KEYS[3], m)
  redis.call('HDEL', KEYS[5], m)
end
local done = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', cutoff, 'LIMIT', 0, 1000)
for _, m in ipairs(done) do
  redis.call('ZREM', KEYS[4], m)
  redis.call('HDEL', KEYS[5], m)
end
local mode = c[1]
local rate = tonumber(c[2])
if c[5] and ARGV[3] ~= '' then
  rate = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'auto_rate', ARGV[3])
elseif c[5] then
  rate = tonumber(c[5])
end
local qlen = redis.call('ZCARD', KEYS[2])
local n = 0
if mode == 'passthrough' then
  n = math.min(qlen, tonumber(ARGV[5]))
  redis.call('DEL', KEYS[6])
elseif mode == 'queue' and redis.call('EXISTS', KEYS[8]) == 0 then
  local b = redis.call('HMGET', KEYS[6], 'tokens', 'ts')
  local tokens = tonumber(b[1]) or 0
  local ts = tonumber(b[2]) or now
  local burst = math.max(1, rate * tonumber(ARGV[4]) / 60000)
  if now > ts then tokens = tokens + (now - ts) * rate / 60000 end
  if tokens > burst then tokens = burst end
  n = math.floor(tokens)
  local maxa = tonumber(c[3])
  if maxa > 0 then
    local used = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
    n = math.max(0, math.min(n, maxa - used))
  end
  n = math.min(n, qlen)
  redis.call('HSET', KEYS[6], 'tokens', tokens - n, 'ts', now)
else
  -- paused, closed or sold out: time does not accumulate admission budget
  redis.call('HSET', KEYS[6], 'ts', now)
end
local admitted = 0
if n > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], n)
  local deadline = now + tonumber(c[4])
  for i = 1, #popped, 2 do
    redis.call('ZADD', KEYS[3], deadline, popped[i])
    redis.call('XADD', KEYS[9], 'MAXLEN', '~', 1000000, '*', 'a', popped[i], 'by', ARGV[1])
    admitted = admitted + 1
  end
end
local active = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
return {'leader', admitted, #gone, #done, qlen - admitted, active, math.floor(rate)}
"#;

const PUT_CONFIG_LUA: &str = r#"
redis.call('HSET', KEYS[1], 'json', ARGV[1], 'mode', ARGV[2], 'sale_start_ms', ARGV[3],
  'admit_per_minute', ARGV[4], 'max_active', ARGV[5], 'claim_deadline_ms', ARGV[6],
  'token_ttl_s', ARGV[7])
redis.call('HSETNX', KEYS[1], 'seed', ARGV[8])
redis.call('HSETNX', KEYS[1], 'seed_hash', ARGV[9])
if ARGV[10] ~= '' then
  local cur = tonumber(redis.call('HGET', KEYS[1], 'auto_rate')) or tonumber(ARGV[4])
  cur = math.max(tonumber(ARGV[10]), math.min(tonumber(ARGV[11]), cur))
  redis.call('HSET', KEYS[1], 'auto_rate', string.format('%d', cur))
else
  redis.call('HDEL', KEYS[1], 'auto_rate')
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
"#;

const REVOKE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
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
  redis.call('ZREM', KEYS[3], who)
  redis.call('ZREM', KEYS[4], who)
  redis.call('ZREM', KEYS[5], who)
  redis.call('HDEL', KEYS[6], who)
end
return now_s
"#;

const DRAW_LUA: &str = r#"
local c = redis.call('HMGET', KEYS[1], 'seed', 'seed_hash', 'sale_start_ms')
if not c[2] then return {'unknown'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(c[3]) then
  redis.call('HSET', KEYS[1], 'revealed', '1')
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

struct Scripts {
    join: Script,
    status: Script,
    tick: Script,
    put_config: Script,
    revoke: Script,
    draw: Script,
    stats_put: Script,
    stats_get: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    join: Script::new(JOIN_LUA),
    status: Script::new(STATUS_LUA),
    tick: Script::new(TICK_LUA),
    put_config: Script::new(PUT_CONFIG_LUA),
    revoke: Script::new(REVOKE_LUA),
    draw: Script::new(DRAW_LUA),
    stats_put: Script::new(STATS_PUT_LUA),
    stats_get: Script::new(STATS_GET_LUA),
});

/// Positional access to a script's array reply.
struct Reply(Vec<Value>);

impl Reply {
    fn from(v: Value) -> Result<Reply, StoreError> {
        match v {
            Value::Array(items) => Ok(Reply(items)),
            _ => Err(StoreError::Protocol("expected an array reply")),
        }
    }

    fn str(&self, i: usize) -> Option<&str> {
        match self.0.get(i)? {
            Value::BulkString(b) => std::str::from_utf8(b).ok(),
            Value::SimpleString(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self, i: usize) -> Option<i64> {
        match self.0.get(i)? {
            Value::Int(n) => Some(*n),
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// A `ZRANK` result (`-1` or nil when not ranked).
    fn rank(&self, i: usize) -> Option<u64> {
        self.int(i).and_then(|n| u64::try_from(n).ok())
    }

    fn tag(&self) -> &str {
        self.str(0).unwrap_or("")
    }

    fn place(&self, i: usize) -> Result<Place, StoreError> {
        self.str(i)
            .and_then(Place::parse)
            .ok_or(StoreError::Protocol("bad place record"))
    }
}

impl Store {
    pub fn new(settings: &RedisSettings) -> anyhow::Result<Self> {
        use anyhow::Context;
        let client =
            redis::Client::open(settings.url.expose_secret()).context("invalid redis url")?;
        Ok(Self {
            client,
            conn: OnceLock::new(),
            prefix: settings.key_prefix.clone(),
            timeout: Duration::from_millis(settings.response_timeout_ms.max(1)),
        })
    }

    fn conn(&self) -> Result<ConnectionManager, StoreError> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let c = ConnectionManager::new_lazy_with_config(self.client.clone(), cfg)?;
        // Two tasks may race here; the loser's (unconnected) manager is simply dropped.
        Ok(self.conn.get_or_init(|| c).clone())
    }

    /// Runs `f` with a connection, bounded by the response timeout.
    async fn with<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>>,
    {
        let conn = self.conn()?;
        // The connection manager has its own timeouts; this outer bound also covers
        // waiting for a reconnect, so a caller never waits more than ~2× the timeout.
        match tokio::time::timeout(self.timeout * 2, f(conn)).await {
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

    fn events_key(&self) -> String {
        shared::revocation::events_key(&self.prefix)
    }

    fn upstream_key(&self) -> String {
        format!("{}fg:upstream", self.prefix)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.with(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .map(|_| ())
    }

    /// Joins `account` to `event` (once: a repeat join returns the existing place).
    pub async fn join(
        &self,
        event: &str,
        account: &str,
        presale_score: i64,
        session: &str,
        passthrough_ttl_s: u64,
    ) -> Result<JoinOutcome, StoreError> {
        let mut inv = SCRIPTS.join.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "q"))
            .key(self.key(event, "places"))
            .key(self.key(event, "adm"))
            .key(self.key(event, "sold_out"))
            .key(self.key(event, "active"))
            .arg(account)
            .arg(presale_score)
            .arg(session)
            .arg(passthrough_ttl_s.saturating_mul(1000));
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        Ok(match r.tag() {
            "unknown" => JoinOutcome::UnknownEvent,
            "closed" => JoinOutcome::Closed,
            "sold_out" => JoinOutcome::SoldOut,
            "existing" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: false,
                admitted: false,
                ahead: r.rank(3),
            },
            "existing_admitted" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: false,
                admitted: true,
                ahead: None,
            },
            "joined" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: true,
                admitted: false,
                ahead: r.rank(3),
            },
            "admitted" => JoinOutcome::Placed {
                place: r.place(1)?,
                new: true,
                admitted: true,
                ahead: None,
            },
            _ => return Err(StoreError::Protocol("unknown join reply")),
        })
    }

    /// Where `account` stands; claims a pending admission (the claim extends it to the token
    /// lifetime `ttl_s`).
    pub async fn status(
        &self,
        event: &str,
        account: &str,
        ttl_s: u64,
    ) -> Result<StatusOutcome, StoreError> {
        let mut inv = SCRIPTS.status.prepare_invoke();
        inv.key(self.key(event, "places"))
            .key(self.key(event, "q"))
            .key(self.key(event, "adm"))
            .key(self.key(event, "active"))
            .arg(account)
            .arg(ttl_s);
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

    /// One admission tick for `event` (a no-op unless this instance holds the lease).
    pub async fn tick(
        &self,
        event: &str,
        instance: &str,
        lease_ttl_ms: u64,
        auto_rate: Option<u64>,
        tick_ms: u64,
        passthrough_batch: u64,
    ) -> Result<TickOutcome, StoreError> {
        let mut inv = SCRIPTS.tick.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "q"))
            .key(self.key(event, "adm"))
            .key(self.key(event, "active"))
            .key(self.key(event, "places"))
            .key(self.key(event, "bucket"))
            .key(self.key(event, "lease"))
            .key(self.key(event, "sold_out"))
            .key(self.key(event, "admissions"))
            .arg(instance)
            .arg(lease_ttl_ms)
            .arg(auto_rate.map(|r| r.to_string()).unwrap_or_default())
            .arg(tick_ms)
            .arg(passthrough_batch);
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let n = |i| r.int(i).and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        Ok(match r.tag() {
            "follower" => TickOutcome::Follower,
            "unknown" => TickOutcome::UnknownEvent,
            "leader" => TickOutcome::Leader {
                admitted: n(1),
                expired_unclaimed: n(2),
                expired_active: n(3),
                queue_len: n(4),
                active: n(5),
                rate: n(6),
            },
            _ => return Err(StoreError::Protocol("unknown tick reply")),
        })
    }

    /// Stores a validated config (absolute). The draw seed is set only the first time, so
    /// the published commitment never changes. Returns the new config version.
    pub async fn put_config(
        &self,
        event: &str,
        config: &EventConfig,
        seed_hex: &str,
        seed_hash: &str,
    ) -> Result<i64, StoreError> {
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
        let version: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
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
        Ok(version)
    }

    /// Sets or clears the sold-out flag (booking may also `SET` the key itself).
    pub async fn set_sold_out(&self, event: &str, sold_out: bool) -> Result<(), StoreError> {
        let key = self.key(event, "sold_out");
        self.with(|mut c| async move {
            if sold_out {
                redis::cmd("SET")
                    .arg(key)
                    .arg("1")
                    .query_async::<()>(&mut c)
                    .await
            } else {
                redis::cmd("DEL").arg(key).query_async::<()>(&mut c).await
            }
        })
        .await
    }

    /// Revokes an account's (field `a:<account>`) or a session's (`s:<session>`) admission.
    /// Returns the revocation time (unix s), or `None` for an unknown event.
    pub async fn revoke(
        &self,
        event: &str,
        field: &str,
        account: Option<&str>,
        session: Option<&str>,
        keep_s: u64,
    ) -> Result<Option<i64>, StoreError> {
        let mut inv = SCRIPTS.revoke.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "revoked"))
            .key(self.key(event, "q"))
            .key(self.key(event, "adm"))
            .key(self.key(event, "active"))
            .key(self.key(event, "places"))
            .arg(field)
            .arg(account.unwrap_or(""))
            .arg(keep_s.max(60))
            .arg(session.unwrap_or(""));
        let at: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok((at >= 0).then_some(at))
    }

    /// Returns an admitted fan's slot to the `max_active` budget (after a paid order).
    pub async fn release_active(&self, event: &str, account: &str) -> Result<(), StoreError> {
        let key = self.key(event, "active");
        let account = account.to_owned();
        self.with(|mut c| async move {
            redis::cmd("ZREM")
                .arg(key)
                .arg(account)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// Keeps an admitted fan's `max_active` slot until `until_ms` (a refreshed token's
    /// expiry): only ever later, and only while the fan still holds the slot (`XX`), so a
    /// late extension cannot bring back a slot that was released, revoked or lapsed.
    pub async fn extend_active(
        &self,
        event: &str,
        account: &str,
        until_ms: i64,
    ) -> Result<(), StoreError> {
        let key = self.key(event, "active");
        let account = account.to_owned();
        self.with(|mut c| async move {
            redis::cmd("ZADD")
                .arg(key)
                .arg("XX")
                .arg("GT")
                .arg(until_ms)
                .arg(account)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
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

    /// Reads one event's snapshot (`None`: no config).
    pub async fn load_event(&self, event: &str) -> Result<Option<EventSnapshot>, StoreError> {
        let mut all = self.load_events(&[event.to_owned()]).await?;
        Ok(all.pop().and_then(|(_, s)| s.config.is_some().then_some(s)))
    }

    /// Reads every configured event's snapshot in one pipelined round trip (plus one for
    /// the index).
    pub async fn load_all(&self) -> Result<Vec<(String, EventSnapshot)>, StoreError> {
        let key = self.events_key();
        let mut events: Vec<String> = self
            .with(|mut c| async move { redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await })
            .await?;
        events.sort();
        self.load_events(&events).await
    }

    async fn load_events(
        &self,
        events: &[String],
    ) -> Result<Vec<(String, EventSnapshot)>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for e in events {
            pipe.cmd("HGETALL").arg(self.key(e, "cfg"));
            pipe.cmd("EXISTS").arg(self.key(e, "sold_out"));
            pipe.cmd("HGETALL").arg(self.key(e, "revoked"));
        }
        type Row = (HashMap<String, String>, bool, HashMap<String, i64>);
        let rows: Vec<Row> = self
            .with(|mut c| async move {
                let flat: Vec<Value> = pipe.query_async(&mut c).await?;
                let mut rows = Vec::with_capacity(flat.len() / 3);
                let mut it = flat.into_iter();
                while let (Some(a), Some(b), Some(d)) = (it.next(), it.next(), it.next()) {
                    rows.push((
                        redis::from_redis_value(a)?,
                        redis::from_redis_value(b)?,
                        redis::from_redis_value(d)?,
                    ));
                }
                Ok(rows)
            })
            .await?;
        Ok(events
            .iter()
            .cloned()
            .zip(rows)
            .map(|(e, (cfg, sold_out, revoked))| (e, snapshot(cfg, sold_out, revoked)))
            .collect())
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

fn snapshot(
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
