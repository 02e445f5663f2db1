//! The cart's storage: the Redis hash per account and event (the line limit applied in one
//! Lua script). Prices come from the catalogue cache ([`catalog`]).

use crate::orders::products::catalog;
use crate::orders::repo::{During, OrderError};
use crate::platform::redis::Redis;
use redis::Script;
use redis::aio::ConnectionManager;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// Cart lifetime, refreshed on write.
pub const CART_TTL_S: i64 = 30 * 24 * 3600;

static SET_LINE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] cart; ARGV[1] sku, ARGV[2] quantity (0 removes), ARGV[3] max lines, ARGV[4] ttl
local q = tonumber(ARGV[2])
if q == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
     and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
    return -1
  end
  redis.call('HSET', KEYS[1], ARGV[1], q)
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4])) end
return redis.call('HLEN', KEYS[1])
",
    )
});

/// Removes the ordered lines, each only if its quantity is still what was ordered (a line
/// changed on another device after checkout is kept), and sets the order's completed marker:
/// both keys carry the account's hash tag, so one script (one round trip) does both.
static CLEAR_ORDERED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] cart, KEYS[2] completed marker; ARGV[1] marker TTL (s), then sku1, qty1, sku2, qty2, ...
redis.call('SET', KEYS[2], 1, 'EX', tonumber(ARGV[1]))
local removed = 0
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
",
    )
});

/// The cart of `account` in `event` (hash tag on the account, so one fan's carts share a
/// slot; event ids are slugs, so the key is unambiguous).
pub fn cart_key(redis: &Redis, account: &str, event: &str) -> String {
    redis.key(&format!("cart:{{{account}}}:{event}"))
}

/// The lines of `account`'s cart in `event`, in SKU order. Fields that are not a positive
/// quantity (never written by this module) are ignored.
pub async fn lines(
    redis: &Redis,
    account: &str,
    event: &str,
) -> Result<BTreeMap<String, i64>, OrderError> {
    let mut conn = conn(redis).await?;
    let raw: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(cart_key(redis, account, event))
        .query_async(&mut conn)
        .await
        .during("read the cart")?;
    Ok(positive(raw))
}

/// The cart's lines and the catalogue's version ([`catalog`]), in one round trip (a
/// pipeline, not a script: the two keys may live in different cluster slots).
pub async fn lines_and_version(
    redis: &Redis,
    account: &str,
    event: &str,
) -> Result<(BTreeMap<String, i64>, Option<String>), OrderError> {
    let mut conn = conn(redis).await?;
    let (raw, version): (Vec<(String, String)>, Option<String>) = redis::pipe()
        .cmd("HGETALL")
        .arg(cart_key(redis, account, event))
        .cmd("GET")
        .arg(catalog::version_key(redis))
        .query_async(&mut conn)
        .await
        .during("read the cart")?;
    Ok((positive(raw), version))
}

fn positive(raw: Vec<(String, String)>) -> BTreeMap<String, i64> {
    raw.into_iter()
        .filter_map(|(sku, q)| q.parse::<i64>().ok().filter(|q| *q > 0).map(|q| (sku, q)))
        .collect()
}

/// Best-effort, after an order committed: removes its lines from the cart and sets its
/// completed marker (`marker`, the full key, which must carry the account's hash tag as the
/// cart's key does), in one round trip. A failure leaves the lines, and a retry of the key
/// that meets a sold-out gate is refused rather than replayed (its stored answer stays).
pub async fn clear_ordered(
    redis: &Redis,
    account: &str,
    event: &str,
    ordered: &BTreeMap<String, i64>,
    marker: &str,
    marker_ttl_s: u64,
) {
    let res: Result<i64, OrderError> = async {
        let mut conn = conn(redis).await?;
        let mut inv = CLEAR_ORDERED.key(cart_key(redis, account, event));
        inv.key(marker).arg(marker_ttl_s);
        for (sku, q) in ordered {
            inv.arg(sku).arg(q.to_string());
        }
        inv.invoke_async(&mut conn)
            .await
            .during("clear the ordered cart lines and set the completed marker")
    }
    .await;
    if let Err(e) = res {
        tracing::warn!(error = ?e, "failed to clear the cart after an order; lines stay");
    }
}

async fn conn(redis: &Redis) -> Result<ConnectionManager, OrderError> {
    redis.conn().await.map_err(OrderError::RedisUnavailable)
}

/// Sets the quantity of `sku` in the cart (0 removes the line) and refreshes the cart's TTL.
/// Returns the number of lines after the change, `None` when a new line would exceed
/// `max_lines` (nothing written).
pub async fn set_quantity(
    redis: &Redis,
    account: &str,
    event: &str,
    sku: &str,
    quantity: i64,
    max_lines: u32,
) -> Result<Option<i64>, OrderError> {
    let mut conn = conn(redis).await?;
    let lines: i64 = SET_LINE
        .key(cart_key(redis, account, event))
        .arg(sku)
        .arg(quantity)
        .arg(max_lines)
        .arg(CART_TTL_S)
        .invoke_async(&mut conn)
        .await
        .during("set a cart line")?;
    Ok((lines >= 0).then_some(lines))
}

/// Removes the line of `sku` (a line that is not there is fine: idempotent).
pub async fn remove(
    redis: &Redis,
    account: &str,
    event: &str,
    sku: &str,
) -> Result<(), OrderError> {
    let mut conn = conn(redis).await?;
    redis::cmd("HDEL")
        .arg(cart_key(redis, account, event))
        .arg(sku)
        .query_async::<()>(&mut conn)
        .await
        .during("remove a cart line")
}
