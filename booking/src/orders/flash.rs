//! The flash-sale gate: a Redis counter per hot SKU (`flash:stock:{sku}`) that admits at most
//! the remaining stock to the Postgres order path and answers the rest `409 SOLD_OUT`
//! without a database query.
//!
//! Guarantees:
//! - **The gate can only make us sell fewer, never more.** Postgres still decides every unit
//!   with its conditional `UPDATE`; the gate only filters. When the gate key is missing
//!   (never reconciled, Redis restarted or flushed) or Redis is unreachable, requests pass
//!   through to Postgres.
//! - Check-and-decrement is one Lua script (`DECRBY` only when `count >= quantity`).
//! - Each admission is recorded under the request's idempotency identity (account + key) in
//!   `flash:adm:{sku}`: a retry of an admitted request passes without taking a second slot (so
//!   a retry of a successful order is replayed, never answered "sold out"), and a release gives
//!   a slot back at most once.
//! - A failed order releases its slot (`INCRBY`); [`reconcile`] resets the counter from
//!   Postgres `available` (on the hot flag, after expiry returns stock, on a job, and via
//!   `POST /admin/products/{sku}/flash/reconcile`). Reconciling while orders are in flight
//!   can only raise the count above the truth (those orders' releases add back); Postgres
//!   then refuses the surplus and the next reconcile corrects it.
//!
//! Keys carry the SKU in a hash tag so one SKU's gate keys share a Redis Cluster slot.

use crate::app::state::AppState;
use crate::platform::error::ApiResult;
use crate::platform::redis::Redis;
use anyhow::Context;
use redis::Script;
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use std::sync::LazyLock;

/// Admission scripts return `{outcome, remaining}`.
const ADMITTED: i64 = 1;
const REFUSED: i64 = 0;
const RETRY: i64 = 2;
const UNGATED: i64 = 3;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] counter, KEYS[2] admissions hash; ARGV[1] quantity, ARGV[2] admission id,
-- ARGV[3] admissions ttl (s). An admission is stored as 'quantity:admitted_ms' while its order
-- is in flight and as 'done' once the order committed (see SETTLE, RECONCILE).
local s = redis.call('GET', KEYS[1])
if not s then return {3, 0} end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return {2, tonumber(s)} end
local n = tonumber(s)
local q = tonumber(ARGV[1])
if n >= q then
  local t = redis.call('TIME')
  redis.call('DECRBY', KEYS[1], q)
  redis.call('HSET', KEYS[2], ARGV[2], q .. ':' .. (t[1] * 1000 + math.floor(t[2] / 1000)))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
  return {1, n - q}
end
return {0, n}
",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] counter, KEYS[2] admissions hash; ARGV[1] admission id. A settled ('done')
-- admission has no units to give back.
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
local q = tonumber(string.match(v, '^(%d+)'))
if not q then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], q) end
return q
",
    )
});

static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] counter (unused), KEYS[2] admissions hash; ARGV[1] admission id: its order
-- committed, its units are sold.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], 'done')
  return 1
end
return 0
",
    )
});

/// How long an admission counts as in flight. An order transaction ends long before (request
/// timeout, pool wait); an older unsettled admission is a process that died mid-order, and
/// reconcile must stop holding its units back.
const IN_FLIGHT_MS: i64 = 60_000;

static RECONCILE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] counter, KEYS[2] admissions hash; ARGV[1] Postgres available, ARGV[2] in-flight
-- window (ms). Postgres' available still counts the units of admitted orders that have not
-- committed yet; the gate already gave those out, so they are subtracted. Setting the gate to
-- plain available let one extra buyer through per order in flight, each to wait on the hot
-- row only to be refused.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local in_flight = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 2, #all, 2 do
  local q, at = string.match(all[i], '^(%d+):(%d+)$')
  if q and now - tonumber(at) < tonumber(ARGV[2]) then in_flight = in_flight + tonumber(q) end
end
local n = tonumber(ARGV[1]) - in_flight
if n < 0 then n = 0 end
redis.call('SET', KEYS[1], n)
return n
",
    )
});

fn counter_key(redis: &Redis, sku: &str) -> String {
    redis.key(&format!("flash:stock:{{{sku}}}"))
}

fn admissions_key(redis: &Redis, sku: &str) -> String {
    redis.key(&format!("flash:adm:{{{sku}}}"))
}

/// What the gate said about one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// A slot was taken for this request; release it unless the order commits.
    Admitted,
    /// This request (same account + key) already holds a slot: pass, take nothing.
    Retry,
    /// The SKU has no gate (not hot, not reconciled yet) or Redis is down: Postgres decides.
    Ungated,
    /// Not enough left. `remaining` is the gate's count (0 means sold out).
    Refused { remaining: i64 },
}

/// Tries to take `quantity` units of `sku` for the request identified by `admission`.
pub async fn acquire(state: &AppState, sku: &str, quantity: i64, admission: &str) -> Gate {
    let ttl = i64::from(state.config.idempotency.retention_h.max(24)) * 3600;
    let result: Result<(i64, i64), _> = async {
        let mut conn = state.redis().await?;
        Ok::<_, crate::platform::error::ApiError>(
            ACQUIRE
                .key(counter_key(&state.redis, sku))
                .key(admissions_key(&state.redis, sku))
                .arg(quantity)
                .arg(admission)
                .arg(ttl)
                .invoke_async(&mut conn)
                .await?,
        )
    }
    .await;
    let gate = match result {
        Ok((ADMITTED, _)) => Gate::Admitted,
        Ok((RETRY, _)) => Gate::Retry,
        Ok((UNGATED, _)) => Gate::Ungated,
        Ok((REFUSED, remaining)) => Gate::Refused { remaining },
        Ok(other) => {
            tracing::warn!(?other, "unexpected flash gate answer; passing to Postgres");
            Gate::Ungated
        }
        Err(e) => {
            // Redis is a filter: without it Postgres still decides correctly, only slower.
            tracing::warn!(error = ?e, "flash gate unavailable; passing to Postgres");
            Gate::Ungated
        }
    };
    let label = match gate {
        Gate::Admitted => "admitted",
        Gate::Retry => "retry",
        Gate::Ungated => "ungated",
        Gate::Refused { .. } => "refused",
    };
    state
        .metrics
        .commerce
        .flash_gate
        .with_label_values(&[label])
        .inc();
    gate
}

/// Gives back the slot `admission` took on `sku` (at most once). Best effort: a lost release
/// only makes the gate stricter until the next reconcile.
pub async fn release(state: &AppState, sku: &str, admission: &str) {
    on_admission(state, &RELEASE, sku, admission, "release").await;
}

/// Marks the slot `admission` took on `sku` as sold (its order committed), so reconcile no
/// longer counts it in flight. Best effort: a lost settle only holds those units back from
/// the gate until the in-flight window passes.
pub async fn settle(state: &AppState, sku: &str, admission: &str) {
    on_admission(state, &SETTLE, sku, admission, "settle").await;
}

/// Runs a per-admission script (`KEYS` counter and admissions hash, `ARGV[1]` the admission);
/// failures are logged, not returned: both callers are best effort.
async fn on_admission(state: &AppState, script: &Script, sku: &str, admission: &str, what: &str) {
    let res: ApiResult<i64> = async {
        let mut conn = state.redis().await?;
        Ok(script
            .key(counter_key(&state.redis, sku))
            .key(admissions_key(&state.redis, sku))
            .arg(admission)
            .invoke_async(&mut conn)
            .await?)
    }
    .await;
    if let Err(e) = res {
        tracing::warn!(error = ?e, sku, "failed to {what} flash gate slot");
    }
}

/// Sets the gate of `sku` from Postgres `available` (see RECONCILE); returns the new count.
async fn set_gate(
    conn: &mut ConnectionManager,
    redis: &Redis,
    sku: &str,
    available: i64,
) -> redis::RedisResult<i64> {
    RECONCILE
        .key(counter_key(redis, sku))
        .key(admissions_key(redis, sku))
        .arg(available)
        .arg(IN_FLIGHT_MS)
        .invoke_async(conn)
        .await
}

/// Resets the gate of `sku` to Postgres `available` minus the units of admitted orders still
/// in flight when the product is hot, removes it otherwise. Returns the new count (None: not gated).
pub async fn reconcile(pool: &PgPool, redis: &Redis, sku: &str) -> ApiResult<Option<i64>> {
    let row: Option<(bool, i64)> = sqlx::query_as(
        "SELECT p.hot, i.available FROM products p JOIN inventory i USING (sku) WHERE p.sku = $1",
    )
    .bind(sku)
    .fetch_optional(pool)
    .await?;
    let mut conn = redis.conn().await?;
    match row {
        Some((true, available)) => Ok(Some(set_gate(&mut conn, redis, sku, available).await?)),
        _ => {
            redis::cmd("DEL")
                .arg(counter_key(redis, sku))
                .query_async::<()>(&mut conn)
                .await?;
            Ok(None)
        }
    }
}

/// Removes the gate of `sku` (hot flag cleared).
pub async fn remove(state: &AppState, sku: &str) -> ApiResult<()> {
    let mut conn = state.redis().await?;
    redis::cmd("DEL")
        .arg(counter_key(&state.redis, sku))
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// Reconciles every hot SKU (the periodic job). Returns how many gates were set.
pub async fn reconcile_all(state: &AppState) -> anyhow::Result<usize> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT p.sku, i.available FROM products p JOIN inventory i USING (sku)
          WHERE p.hot ORDER BY p.sku",
    )
    .fetch_all(&state.pool)
    .await
    .context("failed to read hot products")?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("redis unavailable for flash reconcile")?;
    for (sku, available) in &rows {
        set_gate(&mut conn, &state.redis, sku, *available)
            .await
            .with_context(|| format!("failed to set the flash gate of {sku}"))?;
    }
    Ok(rows.len())
}

/// The gate's current count (tests and ops).
pub async fn current(state: &AppState, sku: &str) -> ApiResult<Option<i64>> {
    let mut conn = state.redis().await?;
    Ok(redis::cmd("GET")
        .arg(counter_key(&state.redis, sku))
        .query_async(&mut conn)
        .await?)
}
