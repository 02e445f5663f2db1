//! Hot auctions: the bid decision runs in ONE Redis Lua script.
//!
//! The script reads the auction's state hash, takes the time from Redis `TIME`, applies the
//! same rules as the cold statement (open, not ended, minimum next bid, seller excluded,
//! anti-sniping with the extension cap), and, in the same atomic step, updates the state,
//! records the request's result for idempotent replay and `XADD`s the accepted bid to the
//! auction's stream. So an acknowledged bid always has its durable record (subject to the AOF
//! fsync policy, docs/operations.md "Auctions and Redis durability").
//!
//! The consumer ([`stream`]: [`consume_auction`], run by a job) reads the stream through a consumer
//! group, writes the bids to Postgres idempotently (`UNIQUE (auction_id, request_id)`,
//! `ON CONFLICT DO NOTHING`), moves the auction row forward monotonically, and only then
//! acknowledges. A consumer that dies mid-batch leaves its entries pending; they are
//! re-read by the same consumer name or claimed by another after `consumer_claim_idle_ms`,
//! and once the auction is frozen the closer claims them at once ([`drain_frozen`]): an
//! auction is closed only when every entry of its stream is recorded.
//!
//! Postgres's record is also the floor of the hot path: the script gets it with each bid
//! (from a per-process copy that the consumer's writes and ticks refresh, re-read by a bid
//! when older than `recorded_refresh_ms`: never a read per bid) and raises a Redis
//! state that is behind it before deciding, so a Redis that lost writes never accepts a bid
//! below a recorded one; the closer keeps the higher of the two results.
//!
//! Every key of one auction shares a hash tag (`auction:{id}`), so the script touches one
//! Redis Cluster slot.

mod stream;

pub use stream::{
    ack, consume_all, consume_auction, drain_frozen, pending, read_batch, write_batch,
};

use super::bids::{AcceptedBid, BidOutcome};
use super::error::{AuctionError, RedisContext};
use super::model::{AuctionRow, AuctionStatus, Recorded, SNIPING_WINDOW_S, min_next_bid, rfc3339};
use super::{AuctionsState, repo};
use crate::platform::redis::Redis;
use anyhow::Context;
use chrono::{DateTime, TimeZone, Utc};
use redis::Script;
use std::sync::LazyLock;

pub const GROUP: &str = "booking";

/// The Redis keys of one hot auction.
pub struct HotKeys {
    pub state: String,
    pub reqs: String,
    pub stream: String,
}

pub fn keys(redis: &Redis, id: &str) -> HotKeys {
    HotKeys {
        state: redis.key(&format!("auction:{{{id}}}:state")),
        reqs: redis.key(&format!("auction:{{{id}}}:reqs")),
        stream: redis.key(&format!("auction:{{{id}}}:bids")),
    }
}

/// KEYS: state, reqs, stream. ARGV: bidder, amount, request_id, bid_id, window_ms, then what
/// Postgres has recorded: price, leader ('' for none), bids, ext.
/// Returns {'OK', rec} | {'DUP', rec} | {'LOW'|'CLOSED', price, leader, end_ms} |
/// {'SELLER'} | {'MISSING'} (LOW also carries the increment); rec =
/// bid_id|amount|placed_ms|end_ms|extended.
///
/// Postgres's record is a floor: if Redis is behind it (it lost writes the consumer had
/// already recorded: an `everysec` crash, a failover, a restore), the state is raised to it
/// before deciding, so no bid below a recorded one is ever accepted. (The end is not taken from
/// it: a lost extension can only end the auction earlier in Redis, where the closer then keeps
/// Postgres's later end, and a cached end must never reopen an auction Redis has ended.)
static PLACE_BID: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local prev = redis.call('HGET', KEYS[2], ARGV[3])
if prev then return {'DUP', prev} end
local s = redis.call('HMGET', KEYS[1], 'status', 'price', 'inc', 'end', 'leader', 'seller',
                     'ext', 'maxext', 'bids')
if not s[1] then return {'MISSING'} end
if s[6] == ARGV[1] then return {'SELLER'} end
local behind = false
if ARGV[7] ~= '' and (not s[5] or tonumber(ARGV[6]) > tonumber(s[2])) then
  s[2] = ARGV[6]
  s[5] = ARGV[7]
  behind = true
end
if tonumber(ARGV[8]) > tonumber(s[9]) then s[9] = ARGV[8]; behind = true end
if tonumber(ARGV[9]) > tonumber(s[7]) then s[7] = ARGV[9]; behind = true end
if behind then
  redis.call('HSET', KEYS[1], 'price', s[2], 'ext', s[7], 'bids', s[9])
  if s[5] then redis.call('HSET', KEYS[1], 'leader', s[5]) end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local endt = tonumber(s[4])
local leader = s[5] or ''
if s[1] ~= 'OPEN' or now >= endt then return {'CLOSED', s[2], leader, s[4]} end
local need = tonumber(s[2])
if s[5] then need = need + tonumber(s[3]) end
if tonumber(ARGV[2]) < need then return {'LOW', s[2], leader, s[4], s[3]} end
local window = tonumber(ARGV[5])
local ext = tonumber(s[7])
local extended = '0'
if endt - now < window and ext < tonumber(s[8]) then
  endt = now + window
  ext = ext + 1
  extended = '1'
end
local ends = string.format('%.0f', endt)
local nows = string.format('%.0f', now)
local exts = string.format('%.0f', ext)
local bids = string.format('%.0f', tonumber(s[9]) + 1)
redis.call('HSET', KEYS[1], 'price', ARGV[2], 'leader', ARGV[1], 'end', ends, 'ext', exts,
           'bids', bids)
local rec = ARGV[4] .. '|' .. ARGV[2] .. '|' .. nows .. '|' .. ends .. '|' .. extended
redis.call('HSET', KEYS[2], ARGV[3], rec)
redis.call('XADD', KEYS[3], '*', 'bid_id', ARGV[4], 'bidder', ARGV[1], 'amount', ARGV[2],
           'request_id', ARGV[3], 'placed_ms', nows, 'end_ms', ends, 'ext', exts,
           'extended', extended, 'bids', bids)
return {'OK', rec}
"#,
    )
});

/// Create-if-absent. KEYS: state, stream. ARGV: status, price, inc, end_ms, seller, maxext,
/// leader ('' for none), ext, bids. Also creates the consumer group (from the stream start).
static INIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'price', ARGV[2], 'inc', ARGV[3], 'end', ARGV[4],
           'seller', ARGV[5], 'maxext', ARGV[6], 'ext', ARGV[8], 'bids', ARGV[9])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'leader', ARGV[7]) end
local ok = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[2], 'booking', '0', 'MKSTREAM')
return 1
"#,
    )
});

/// KEYS: state. Closes the auction in Redis if its end (Redis `TIME`) has passed; idempotent.
/// Returns {status, price, leader, end_ms, ext, bids} or {'MISSING'}.
static FREEZE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local s = redis.call('HMGET', KEYS[1], 'status', 'price', 'leader', 'end', 'ext', 'bids')
if not s[1] then return {'MISSING'} end
local status = s[1]
if status == 'OPEN' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now >= tonumber(s[4]) then
    redis.call('HSET', KEYS[1], 'status', 'CLOSED')
    status = 'CLOSED'
  end
end
return {status, s[2], s[3] or '', s[4], s[5], s[6]}
"#,
    )
});

/// Postgres's record of a hot auction, from this process's copy when it is fresh enough
/// (`recorded_refresh_ms`), else read once and remembered: at most one read per auction per
/// refresh period per process, never one per bid.
async fn recorded(state: &AuctionsState, id: &str) -> Result<Recorded, AuctionError> {
    let max_age = std::time::Duration::from_millis(state.settings.recorded_refresh_ms);
    if let Some(r) = state.runtime.recorded(id, max_age) {
        return Ok(r);
    }
    let row = repo::load_recorded(&state.pool, id)
        .await?
        .ok_or(AuctionError::NotFound)?;
    state.runtime.remember_recorded(id, row.clone());
    Ok(row)
}

fn ms_to_time(ms: i64) -> anyhow::Result<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .with_context(|| format!("bad timestamp {ms} ms"))
}

/// Sets up the Redis state of a hot auction from its Postgres row, unless it exists already.
pub async fn init_from_row(state: &AuctionsState, row: &AuctionRow) -> Result<(), AuctionError> {
    let k = keys(&state.redis, &row.id);
    let mut conn = state.redis.conn().await?;
    let _: i64 = INIT
        .key(&k.state)
        .key(&k.stream)
        .arg(row.status.as_str())
        .arg(row.current_price)
        .arg(row.min_increment)
        .arg(row.end_time.timestamp_millis())
        .arg(&row.seller_id)
        .arg(row.max_extensions)
        .arg(row.leader_id.as_deref().unwrap_or(""))
        .arg(row.extensions)
        .arg(row.bid_count)
        .invoke_async(&mut conn)
        .await
        .redis_op("run the hot auction init script")?;
    Ok(())
}

/// A bid record (`bid_id|amount|placed_ms|end_ms|extended`) as the accepted bid it stands for.
fn parse_rec(id: &str, bidder: &str, rec: &str) -> anyhow::Result<AcceptedBid> {
    let parts: Vec<&str> = rec.split('|').collect();
    let [bid_id, amount, placed, end, extended] = parts.as_slice() else {
        anyhow::bail!("malformed bid record");
    };
    Ok(AcceptedBid {
        bid_id: (*bid_id).to_owned(),
        auction_id: id.to_owned(),
        bidder: bidder.to_owned(),
        amount: amount.parse().context("amount")?,
        placed_at: ms_to_time(placed.parse().context("placed")?)?,
        end_time: ms_to_time(end.parse().context("end")?)?,
        extended: *extended == "1",
    })
}

/// Places a bid on a hot auction (one script call; a second only if Redis lost the state).
pub async fn place(
    state: &AuctionsState,
    id: &str,
    bidder: &str,
    request_id: &str,
    amount: i64,
) -> Result<BidOutcome, AuctionError> {
    let k = keys(&state.redis, id);
    let floor = recorded(state, id).await?;
    let mut conn = state.redis.conn().await?;
    for _ in 0..2 {
        let bid_id = shared::ids::new_id();
        let reply: Vec<String> = PLACE_BID
            .key(&k.state)
            .key(&k.reqs)
            .key(&k.stream)
            .arg(bidder)
            .arg(amount)
            .arg(request_id)
            .arg(&bid_id)
            .arg(SNIPING_WINDOW_S * 1000)
            .arg(floor.current_price)
            .arg(floor.leader_id.as_deref().unwrap_or(""))
            .arg(floor.bid_count)
            .arg(floor.extensions)
            .invoke_async(&mut conn)
            .await
            .redis_op("run the bid script")?;
        let field = |i: usize| reply.get(i).map(String::as_str).unwrap_or("");
        match field(0) {
            "OK" => return Ok(BidOutcome::Accepted(parse_rec(id, bidder, field(1))?)),
            "DUP" => {
                let bid = parse_rec(id, bidder, field(1))?;
                if bid.amount != amount {
                    return Err(AuctionError::KeyReused);
                }
                return Ok(BidOutcome::Replayed(bid));
            }
            "SELLER" => return Err(AuctionError::SellerCannotBid),
            "LOW" | "CLOSED" => {
                let current_price: i64 = field(1).parse().unwrap_or(0);
                let leader_id = Some(field(2)).filter(|l| !l.is_empty());
                let leader = state.handles.leader(id, leader_id, bidder);
                if field(0) == "CLOSED" {
                    let end_time = field(3)
                        .parse::<i64>()
                        .ok()
                        .and_then(|ms| ms_to_time(ms).ok())
                        .map(|t| rfc3339(&t))
                        .unwrap_or_default();
                    return Err(AuctionError::Closed {
                        current_price,
                        leader,
                        end_time,
                    });
                }
                let inc: i64 = field(4).parse().unwrap_or(0);
                return Err(AuctionError::TooLow {
                    current_price,
                    min_next: min_next_bid(current_price, inc, leader_id.is_some()),
                    leader,
                });
            }
            "MISSING" => {
                // Redis has no state for this auction (created while Redis was down, or Redis
                // lost it): initialise from Postgres (create-if-absent) and decide again.
                let row = repo::load(&state.pool, id)
                    .await?
                    .ok_or(AuctionError::NotFound)?;
                if row.status != AuctionStatus::Open {
                    return Err(AuctionError::Closed {
                        current_price: row.current_price,
                        leader: row.leader_for(&state.handles, bidder),
                        end_time: rfc3339(&row.end_time),
                    });
                }
                init_from_row(state, &row).await?;
            }
            other => {
                return Err(AuctionError::Unexpected(anyhow::anyhow!(
                    "unexpected bid script reply {other:?}"
                )));
            }
        }
    }
    Err(AuctionError::Retry(
        "auction state is being restored; retry with the same Idempotency-Key",
    ))
}

/// Overlays the live Redis state on a Postgres row (which trails it by the consumer lag).
pub async fn overlay(state: &AuctionsState, row: &mut AuctionRow) -> Result<(), AuctionError> {
    let k = keys(&state.redis, &row.id);
    let mut conn = state.redis.conn().await?;
    let v: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&k.state)
        .arg(&["status", "price", "leader", "end", "ext", "bids"])
        .query_async(&mut conn)
        .await
        .redis_op("read the hot auction state")?;
    let get = |i: usize| v.get(i).cloned().flatten();
    if get(0).is_none() {
        return Ok(());
    }
    // Postgres's record wins ties and never goes backwards (Redis may have lost writes).
    if let Some(p) = get(1).and_then(|p| p.parse::<i64>().ok())
        && let Some(leader) = get(2)
        && (p > row.current_price || row.leader_id.is_none())
    {
        row.current_price = p;
        row.leader_id = Some(leader);
    }
    if let Some(t) = get(3)
        .and_then(|e| e.parse::<i64>().ok())
        .and_then(|ms| ms_to_time(ms).ok())
    {
        row.end_time = row.end_time.max(t);
    }
    if let Some(x) = get(4).and_then(|x| x.parse::<i32>().ok()) {
        row.extensions = row.extensions.max(x);
    }
    if let Some(b) = get(5).and_then(|b| b.parse::<i64>().ok()) {
        row.bid_count = row.bid_count.max(b);
    }
    Ok(())
}

/// The frozen (or still open) Redis state of a hot auction.
#[derive(Debug, Clone)]
pub struct Frozen {
    pub closed: bool,
    pub price: i64,
    pub leader: Option<String>,
    pub end_time: DateTime<Utc>,
    pub extensions: i32,
    pub bids: i64,
}

/// Closes the auction in Redis if it has ended by Redis time. `None`: no Redis state.
pub async fn freeze(state: &AuctionsState, id: &str) -> Result<Option<Frozen>, AuctionError> {
    let k = keys(&state.redis, id);
    let mut conn = state.redis.conn().await?;
    let v: Vec<String> = FREEZE
        .key(&k.state)
        .invoke_async(&mut conn)
        .await
        .redis_op("run the freeze script")?;
    if v.first().map(String::as_str) == Some("MISSING") {
        return Ok(None);
    }
    let f = |i: usize| v.get(i).map(String::as_str).unwrap_or("");
    let parsed = (|| -> anyhow::Result<Frozen> {
        Ok(Frozen {
            closed: f(0) == "CLOSED",
            price: f(1).parse().context("price")?,
            leader: Some(f(2).to_owned()).filter(|l| !l.is_empty()),
            end_time: ms_to_time(f(3).parse().context("end")?)?,
            extensions: f(4).parse().context("ext")?,
            bids: f(5).parse().context("bids")?,
        })
    })();
    Ok(Some(parsed.context("malformed freeze script reply")?))
}

/// Lets a closed auction's Redis keys expire after the retention period (replays of its
/// bids keep working until then).
pub async fn expire_closed(state: &AuctionsState, id: &str) -> Result<(), AuctionError> {
    let k = keys(&state.redis, id);
    let ttl = state.settings.hot_retention_s.max(60);
    let mut conn = state.redis.conn().await?;
    let _: () = redis::pipe()
        .cmd("EXPIRE")
        .arg(&k.state)
        .arg(ttl)
        .ignore()
        .cmd("EXPIRE")
        .arg(&k.reqs)
        .arg(ttl)
        .ignore()
        .cmd("EXPIRE")
        .arg(&k.stream)
        .arg(ttl)
        .ignore()
        .query_async(&mut conn)
        .await
        .redis_op("expire a closed hot auction's keys")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bid_record_parses_back_into_the_accepted_bid() {
        let bid = parse_rec("auc", "ann", "b1|1500|1900000000123|1900000120123|1").expect("parses");
        assert_eq!(bid.bid_id, "b1");
        assert_eq!(bid.amount, 1500);
        assert_eq!(bid.placed_at.timestamp_millis(), 1_900_000_000_123);
        assert_eq!(bid.end_time.timestamp_millis(), 1_900_000_120_123);
        assert!(bid.extended);
        assert!(
            !parse_rec("auc", "ann", "b1|1500|1|2|0")
                .expect("parses")
                .extended
        );
        assert!(
            parse_rec("auc", "ann", "b1|1500|1|2").is_err(),
            "a field is missing"
        );
        assert!(
            parse_rec("auc", "ann", "b1|lots|1|2|0").is_err(),
            "not a number"
        );
    }

    #[test]
    fn every_key_of_an_auction_shares_one_cluster_slot() {
        let redis = Redis::new(&shared::config::RedisSettings {
            key_prefix: "fg:".into(),
            ..Default::default()
        })
        .expect("a client needs no connection");
        let k = keys(&redis, "a1");
        for key in [&k.state, &k.reqs, &k.stream] {
            assert!(key.starts_with("fg:auction:{a1}:"), "{key}");
        }
    }
}
