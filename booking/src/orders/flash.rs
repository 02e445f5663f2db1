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
//!   Postgres `available` (summed over the SKU's stock rows; on the hot flag, after expiry
//!   returns stock, on a job, and via `POST /admin/products/{sku}/flash/reconcile`).
//!   Reconciling while orders are in flight
//!   can only raise the count above the truth (those orders' releases add back); Postgres
//!   then refuses the surplus and the next reconcile corrects it.
//!
//! Keys carry the SKU in a hash tag so one SKU's gate keys share a Redis Cluster slot.

use crate::orders::repo::{During, OrderError};
use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use anyhow::Context;
use redis::Script;
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use std::sync::LazyLock;
use std::time::Duration;

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
-- ARGV[3..]: admissions whose order Postgres showed committed in the same snapshot as
-- ARGV[1]: their units are already gone from available, so they are settled here (what
-- SETTLE does after the commit) rather than subtracted a second time.
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v and v ~= 'done' then redis.call('HSET', KEYS[2], ARGV[i], 'done') end
end
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

async fn conn(redis: &Redis) -> Result<ConnectionManager, OrderError> {
    redis.conn().await.map_err(OrderError::RedisUnavailable)
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

impl Gate {
    /// The `outcome` label of `flash_gate_total`.
    pub fn label(self) -> &'static str {
        match self {
            Gate::Admitted => "admitted",
            Gate::Retry => "retry",
            Gate::Ungated => "ungated",
            Gate::Refused { .. } => "refused",
        }
    }

    /// The script's `{outcome, remaining}` answer; anything unexpected passes to Postgres.
    fn from_script(outcome: i64, remaining: i64) -> Self {
        match outcome {
            ADMITTED => Gate::Admitted,
            RETRY => Gate::Retry,
            REFUSED => Gate::Refused { remaining },
            UNGATED => Gate::Ungated,
            other => {
                tracing::warn!(other, "unexpected flash gate answer; passing to Postgres");
                Gate::Ungated
            }
        }
    }
}

/// Tries to take `quantity` units of `sku` for the request identified by `admission`; the
/// admission is remembered for `admission_ttl_s` (as long as the request's idempotency key).
pub async fn acquire(
    redis: &Redis,
    sku: &str,
    quantity: i64,
    admission: &str,
    admission_ttl_s: u64,
) -> Gate {
    let result: Result<(i64, i64), OrderError> = async {
        let mut conn = conn(redis).await?;
        ACQUIRE
            .key(counter_key(redis, sku))
            .key(admissions_key(redis, sku))
            .arg(quantity)
            .arg(admission)
            .arg(admission_ttl_s)
            .invoke_async(&mut conn)
            .await
            .during("run the flash gate's acquire script")
    }
    .await;
    match result {
        Ok((outcome, remaining)) => Gate::from_script(outcome, remaining),
        Err(e) => {
            // Redis is a filter: without it Postgres still decides correctly, only slower.
            tracing::warn!(error = ?e, "flash gate unavailable; passing to Postgres");
            Gate::Ungated
        }
    }
}

/// Gives back the slot `admission` took on `sku` (at most once). Best effort: a lost release
/// only makes the gate stricter until the next reconcile.
pub async fn release(redis: &Redis, sku: &str, admission: &str) {
    on_admission(redis, &RELEASE, sku, admission, "release").await;
}

/// Marks the slot `admission` took on `sku` as sold (its order committed), so reconcile no
/// longer counts it in flight. Best effort: a lost settle only holds those units back from
/// the gate until the in-flight window passes.
pub async fn settle(redis: &Redis, sku: &str, admission: &str) {
    on_admission(redis, &SETTLE, sku, admission, "settle").await;
}

/// Runs a per-admission script (`KEYS` counter and admissions hash, `ARGV[1]` the admission);
/// failures are logged, not returned: both callers are best effort.
async fn on_admission(redis: &Redis, script: &Script, sku: &str, admission: &str, what: &str) {
    let res: Result<i64, OrderError> = async {
        let mut conn = conn(redis).await?;
        script
            .key(counter_key(redis, sku))
            .key(admissions_key(redis, sku))
            .arg(admission)
            .invoke_async(&mut conn)
            .await
            .during("run a flash gate admission script")
    }
    .await;
    if let Err(e) = res {
        tracing::warn!(error = ?e, sku, "failed to {what} flash gate slot");
    }
}

/// Sets the gate of `sku` from Postgres `available` and the admissions whose order was seen
/// committed in the same snapshot (see RECONCILE); returns the new count.
async fn set_gate(
    conn: &mut ConnectionManager,
    redis: &Redis,
    sku: &str,
    available: i64,
    committed: &[String],
) -> Result<i64, OrderError> {
    let mut call = RECONCILE.key(counter_key(redis, sku));
    call.key(admissions_key(redis, sku))
        .arg(available)
        .arg(IN_FLIGHT_MS);
    for c in committed {
        call.arg(c);
    }
    call.invoke_async(conn)
        .await
        .during("run the flash gate's reconcile script")
}

/// The admissions of `sku` whose order has not been settled: `(account, key)` each.
async fn unsettled(
    conn: &mut ConnectionManager,
    redis: &Redis,
    sku: &str,
) -> Result<(Vec<String>, Vec<String>), OrderError> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(admissions_key(redis, sku))
        .query_async(conn)
        .await
        .during("read the flash gate's admissions")?;
    Ok(all
        .into_iter()
        .filter(|(_, v)| v != "done")
        .filter_map(|(id, _)| {
            let (account, key) = id.split_once('\u{1f}')?;
            Some((account.to_owned(), key.to_owned()))
        })
        .unzip())
}

/// Resets the gate of `sku` to Postgres `available` minus the units of admitted orders still
/// in flight when the product is hot, removes it otherwise. Returns the new count (None: not
/// gated).
///
/// An order that has committed but whose request has not yet settled its admission (the
/// moment between the commit and `settle`) is already out of `available`; counting it in
/// flight as well set the gate one order too low, and a fan was answered `SOLD_OUT` while a
/// unit was left (`flash::reconcile_racing_a_rush_…`, about one run in three). So the
/// unsettled admissions are read first, and the stock and which of them have a committed order
/// are read in ONE Postgres snapshot; those are settled by the script, not subtracted.
pub async fn reconcile(pool: &PgPool, redis: &Redis, sku: &str) -> Result<Option<i64>, OrderError> {
    let mut conn = conn(redis).await?;
    let (accounts, keys) = unsettled(&mut conn, redis, sku).await?;
    let row: Option<(bool, Option<i64>, Vec<String>)> = sqlx::query_as(
        "SELECT p.hot,
                (SELECT sum(i.available)::bigint FROM inventory i WHERE i.sku = p.sku),
                ARRAY(SELECT o.account_id || chr(31) || o.idempotency_key
                        FROM unnest($2::text[], $3::text[]) AS a (account, key)
                        JOIN orders o ON o.account_id = a.account AND o.idempotency_key = a.key)
           FROM products p WHERE p.sku = $1",
    )
    .bind(sku)
    .bind(&accounts)
    .bind(&keys)
    .fetch_optional(pool)
    .await
    .during("read the product's hot flag, stock and committed admissions")?;
    match row {
        Some((true, Some(available), committed)) => Ok(Some(
            set_gate(&mut conn, redis, sku, available, &committed).await?,
        )),
        _ => {
            redis::cmd("DEL")
                .arg(counter_key(redis, sku))
                .query_async::<()>(&mut conn)
                .await
                .during("delete the flash gate")?;
            Ok(None)
        }
    }
}

/// Removes the gate of `sku` (hot flag cleared).
pub async fn remove(redis: &Redis, sku: &str) -> Result<(), OrderError> {
    let mut conn = conn(redis).await?;
    redis::cmd("DEL")
        .arg(counter_key(redis, sku))
        .query_async::<()>(&mut conn)
        .await
        .during("delete the flash gate")
}

/// Reconciles every hot SKU ([`reconcile`] each). Returns how many gates were set.
pub async fn reconcile_all(pool: &PgPool, redis: &Redis) -> anyhow::Result<usize> {
    let skus: Vec<String> = sqlx::query_scalar(
        "SELECT p.sku FROM products p WHERE p.hot
            AND EXISTS (SELECT 1 FROM inventory i WHERE i.sku = p.sku)
          ORDER BY p.sku",
    )
    .fetch_all(pool)
    .await
    .context("failed to read hot products")?;
    let mut set = 0;
    for sku in &skus {
        if reconcile(pool, redis, sku)
            .await
            .with_context(|| format!("failed to set the flash gate of {sku}"))?
            .is_some()
        {
            set += 1;
        }
    }
    Ok(set)
}

/// The gate's current count (tests and ops).
pub async fn current(redis: &Redis, sku: &str) -> Result<Option<i64>, OrderError> {
    let mut conn = conn(redis).await?;
    redis::cmd("GET")
        .arg(counter_key(redis, sku))
        .query_async(&mut conn)
        .await
        .during("read the flash gate")
}

/// The periodic reconcile of every hot SKU's gate (idempotent `SET`s: safe on many
/// instances). Holds only the clients it uses.
pub struct ReconcileGates {
    pub pool: PgPool,
    pub redis: Redis,
    pub period: Duration,
}

#[async_trait::async_trait]
impl Job for ReconcileGates {
    fn name(&self) -> &'static str {
        "flash-reconcile"
    }

    fn period(&self) -> Duration {
        self.period
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        reconcile_all(&self.pool, &self.redis).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_answers_map_to_gate_outcomes() {
        assert_eq!(Gate::from_script(ADMITTED, 4), Gate::Admitted);
        assert_eq!(Gate::from_script(RETRY, 4), Gate::Retry);
        assert_eq!(Gate::from_script(UNGATED, 0), Gate::Ungated);
        assert_eq!(
            Gate::from_script(REFUSED, 2),
            Gate::Refused { remaining: 2 }
        );
        // An answer this code does not know must never refuse a buyer: Postgres decides.
        assert_eq!(Gate::from_script(42, 0), Gate::Ungated);
    }

    #[test]
    fn gate_outcomes_have_their_metric_labels() {
        let labels: Vec<_> = [
            Gate::Admitted,
            Gate::Retry,
            Gate::Ungated,
            Gate::Refused { remaining: 0 },
        ]
        .iter()
        .map(|g| g.label())
        .collect();
        assert_eq!(labels, ["admitted", "retry", "ungated", "refused"]);
    }
}
