//! Hot auctions: the bid decision runs in ONE Redis Lua script.
//!
//! The script reads the auction's state hash, takes the time from Redis `TIME`, applies the
//! same rules as the cold statement (open, not ended, minimum next bid, seller excluded,
//! anti-sniping with the extension cap), and, in the same atomic step, updates the state,
//! records the request's result for idempotent replay and `XADD`s the accepted bid to the
//! auction's stream. So an acknowledged bid always has its durable record (subject to the AOF
//! fsync policy, docs/operations.md "Auctions and Redis durability").
//!
//! The consumer ([`consume_auction`], run by a job) reads the stream through a consumer
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

use super::bids::{
    AcceptedBid, BidOutcome, auction_closed, bid_too_low, key_reused, seller_cannot_bid,
};
use super::{AuctionRow, SNIPING_WINDOW_S, min_next_bid, rfc3339};
use crate::app::state::AppState;
use crate::platform::error::{ApiError, ApiResult};
use anyhow::Context;
use chrono::{DateTime, TimeZone, Utc};
use redis::Script;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use shared::error::codes;
use std::sync::LazyLock;

pub const GROUP: &str = "booking";

/// The Redis keys of one hot auction.
pub struct HotKeys {
    pub state: String,
    pub reqs: String,
    pub stream: String,
}

pub fn keys(state: &AppState, id: &str) -> HotKeys {
    HotKeys {
        state: state.key(&format!("auction:{{{id}}}:state")),
        reqs: state.key(&format!("auction:{{{id}}}:reqs")),
        stream: state.key(&format!("auction:{{{id}}}:bids")),
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

/// What Postgres has recorded for a hot auction: the floor its Redis state must not be
/// below (the consumer only records what Redis accepted, so Redis can only be behind it after
/// losing writes).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Recorded {
    pub current_price: i64,
    pub leader_id: Option<String>,
    pub bid_count: i64,
    pub extensions: i32,
}

impl Recorded {
    /// Keeps the newer of two records (prices, counts and extensions only grow; at
    /// equal prices the leader recorded first stays).
    pub fn merge(&mut self, other: Recorded) {
        if other.leader_id.is_some()
            && (self.leader_id.is_none() || other.current_price > self.current_price)
        {
            self.current_price = other.current_price;
            self.leader_id = other.leader_id;
        }
        self.bid_count = self.bid_count.max(other.bid_count);
        self.extensions = self.extensions.max(other.extensions);
    }
}

const RECORDED_COLUMNS: &str = "current_price, leader_id, bid_count, extensions";

/// Postgres's record of a hot auction, from this process's copy when it is fresh enough
/// (`recorded_refresh_ms`), else read once and remembered: at most one read per auction per
/// refresh period per process, never one per bid.
async fn recorded(state: &AppState, id: &str) -> ApiResult<Recorded> {
    let max_age = std::time::Duration::from_millis(state.config.auctions.recorded_refresh_ms);
    if let Some(r) = state.auctions.recorded(id, max_age) {
        return Ok(r);
    }
    let row: Option<Recorded> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RECORDED_COLUMNS} FROM auctions WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(&state.pool)
    .await?;
    let row = row.ok_or_else(super::unknown_auction)?;
    state.auctions.remember_recorded(id, row.clone());
    Ok(row)
}

fn ms_to_time(ms: i64) -> anyhow::Result<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .with_context(|| format!("bad timestamp {ms} ms"))
}

/// Sets up the Redis state of a hot auction from its Postgres row, unless it exists already.
pub async fn init_from_row(state: &AppState, row: &AuctionRow) -> ApiResult<()> {
    let k = keys(state, &row.id);
    let mut conn = state.redis().await?;
    let _: i64 = INIT
        .key(&k.state)
        .key(&k.stream)
        .arg(&row.status)
        .arg(row.current_price)
        .arg(row.min_increment)
        .arg(row.end_time.timestamp_millis())
        .arg(&row.seller_id)
        .arg(row.max_extensions)
        .arg(row.leader_id.as_deref().unwrap_or(""))
        .arg(row.extensions)
        .arg(row.bid_count)
        .invoke_async(&mut conn)
        .await?;
    Ok(())
}

fn parse_rec(id: &str, bidder: &str, rec: &str) -> ApiResult<AcceptedBid> {
    let parts: Vec<&str> = rec.split('|').collect();
    let parsed = (|| -> anyhow::Result<AcceptedBid> {
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
    })();
    parsed.map_err(ApiError::Unexpected)
}

/// Places a bid on a hot auction (one script call; a second only if Redis lost the state).
pub async fn place(
    state: &AppState,
    id: &str,
    bidder: &str,
    request_id: &str,
    amount: i64,
) -> ApiResult<BidOutcome> {
    let k = keys(state, id);
    let floor = recorded(state, id).await?;
    let mut conn = state.redis().await?;
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
            .await?;
        let field = |i: usize| reply.get(i).map(String::as_str).unwrap_or("");
        match field(0) {
            "OK" => return Ok(BidOutcome::Accepted(parse_rec(id, bidder, field(1))?)),
            "DUP" => {
                let bid = parse_rec(id, bidder, field(1))?;
                if bid.amount != amount {
                    return Err(key_reused());
                }
                return Ok(BidOutcome::Replayed(bid));
            }
            "SELLER" => return Err(seller_cannot_bid()),
            "LOW" | "CLOSED" => {
                let price: i64 = field(1).parse().unwrap_or(0);
                let leader_id = Some(field(2)).filter(|l| !l.is_empty());
                let leader = state.auctions.handles.leader(id, leader_id, bidder);
                if field(0) == "CLOSED" {
                    let end = field(3)
                        .parse::<i64>()
                        .ok()
                        .and_then(|ms| ms_to_time(ms).ok())
                        .map(|t| rfc3339(&t))
                        .unwrap_or_default();
                    return Err(auction_closed(price, leader, &end));
                }
                let inc: i64 = field(4).parse().unwrap_or(0);
                let min_next = min_next_bid(price, inc, leader_id.is_some());
                return Err(bid_too_low(price, min_next, leader));
            }
            "MISSING" => {
                // Redis has no state for this auction (created while Redis was down, or Redis
                // lost it): initialise from Postgres (create-if-absent) and decide again.
                let row = super::load(state, id)
                    .await?
                    .ok_or_else(super::unknown_auction)?;
                if row.status != "OPEN" {
                    return Err(auction_closed(
                        row.current_price,
                        state
                            .auctions
                            .handles
                            .leader(id, row.leader_id.as_deref(), bidder),
                        &rfc3339(&row.end_time),
                    ));
                }
                init_from_row(state, &row).await?;
            }
            other => {
                return Err(ApiError::unexpected(anyhow::anyhow!(
                    "unexpected bid script reply {other:?}"
                )));
            }
        }
    }
    Err(ApiError::conflict(
        codes::CONFLICT,
        "auction state is being restored; retry with the same Idempotency-Key",
    ))
}

/// Overlays the live Redis state on a Postgres row (which trails it by the consumer lag).
pub async fn overlay(state: &AppState, row: &mut AuctionRow) -> ApiResult<()> {
    let k = keys(state, &row.id);
    let mut conn = state.redis().await?;
    let v: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&k.state)
        .arg(&["status", "price", "leader", "end", "ext", "bids"])
        .query_async(&mut conn)
        .await?;
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
pub async fn freeze(state: &AppState, id: &str) -> anyhow::Result<Option<Frozen>> {
    let k = keys(state, id);
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("redis unavailable: {e}"))?;
    let v: Vec<String> = FREEZE
        .key(&k.state)
        .invoke_async(&mut conn)
        .await
        .context("freeze script failed")?;
    if v.first().map(String::as_str) == Some("MISSING") {
        return Ok(None);
    }
    let f = |i: usize| v.get(i).map(String::as_str).unwrap_or("");
    Ok(Some(Frozen {
        closed: f(0) == "CLOSED",
        price: f(1).parse().context("price")?,
        leader: Some(f(2).to_owned()).filter(|l| !l.is_empty()),
        end_time: ms_to_time(f(3).parse().context("end")?)?,
        extensions: f(4).parse().context("ext")?,
        bids: f(5).parse().context("bids")?,
    }))
}

/// Lets a closed auction's Redis keys expire after the retention period (replays of its
/// bids keep working until then).
pub async fn expire_closed(state: &AppState, id: &str) -> anyhow::Result<()> {
    let k = keys(state, id);
    let ttl = state.config.auctions.hot_retention_s.max(60);
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("redis unavailable: {e}"))?;
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
        .context("expire failed")?;
    Ok(())
}

/// One accepted bid as read from the stream.
#[derive(Debug, Clone)]
pub struct StreamBid {
    pub entry_id: String,
    pub bid_id: String,
    pub bidder: String,
    pub request_id: String,
    pub amount: i64,
    pub placed_at: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub extensions: i32,
    pub extended: bool,
    pub bids: i64,
}

fn parse_entry(e: &StreamId) -> anyhow::Result<StreamBid> {
    let s = |k: &str| -> anyhow::Result<String> {
        e.get::<String>(k)
            .with_context(|| format!("stream entry {} lacks {k}", e.id))
    };
    Ok(StreamBid {
        entry_id: e.id.clone(),
        bid_id: s("bid_id")?,
        bidder: s("bidder")?,
        request_id: s("request_id")?,
        amount: s("amount")?.parse().context("amount")?,
        placed_at: ms_to_time(s("placed_ms")?.parse().context("placed_ms")?)?,
        end_time: ms_to_time(s("end_ms")?.parse().context("end_ms")?)?,
        extensions: s("ext")?.parse().context("ext")?,
        extended: s("extended")? == "1",
        bids: s("bids")?.parse().context("bids")?,
    })
}

/// Reads the next batch for `consumer`: its own pending entries first (a restart with the same
/// name), then entries another consumer left unacknowledged for too long, then new ones.
pub async fn read_batch(
    state: &AppState,
    id: &str,
    consumer: &str,
    count: usize,
) -> anyhow::Result<Vec<StreamBid>> {
    let idle = state.config.auctions.consumer_claim_idle_ms;
    read_batch_claiming(state, id, consumer, count, idle).await
}

/// [`read_batch`], taking over entries other consumers have held for `claim_idle_ms` or more.
async fn read_batch_claiming(
    state: &AppState,
    id: &str,
    consumer: &str,
    count: usize,
    claim_idle_ms: u64,
) -> anyhow::Result<Vec<StreamBid>> {
    let k = keys(state, id);
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("redis unavailable: {e}"))?;
    let read = |start: &'static str| {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&k.stream)
            .arg(start);
        cmd
    };
    let entries = |reply: Option<StreamReadReply>| -> Vec<StreamId> {
        reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default()
    };
    let mut ids = entries(
        read("0")
            .query_async(&mut conn)
            .await
            .context("XREADGROUP pending")?,
    );
    if ids.is_empty() {
        let claimed: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&k.stream)
            .arg(GROUP)
            .arg(consumer)
            .arg(claim_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await
            .context("XAUTOCLAIM")?;
        ids = claimed.claimed;
    }
    if ids.is_empty() {
        ids = entries(
            read(">")
                .query_async(&mut conn)
                .await
                .context("XREADGROUP new")?,
        );
    }
    ids.iter().map(parse_entry).collect()
}

/// Writes a batch of one auction's accepted bids to Postgres, in one statement: the bid rows
/// (idempotent) and the auction row moved forward, never backward.
pub async fn write_batch(state: &AppState, id: &str, batch: &[StreamBid]) -> anyhow::Result<u64> {
    let Some(top) = batch.iter().max_by_key(|b| b.amount) else {
        return Ok(0);
    };
    let res: Option<Recorded> = sqlx::query_as(
        r#"
WITH b AS (
    SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[],
                         $7::timestamptz[], $8::bool[])
             AS b(id, bidder_id, request_id, amount, placed_at, end_time, extended)
), ins AS (
    INSERT INTO bids (id, auction_id, bidder_id, request_id, amount, placed_at, end_time,
                      extended, path)
    SELECT b.id, $1, b.bidder_id, b.request_id, b.amount, b.placed_at, b.end_time, b.extended,
           'hot'
      FROM b
    ON CONFLICT (auction_id, request_id) DO NOTHING
    RETURNING 1
)
-- A data-modifying CTE runs exactly once whether or not it is referenced.
UPDATE auctions a
   SET current_price = CASE WHEN $9 > a.current_price OR a.leader_id IS NULL THEN $9
                            ELSE a.current_price END,
       leader_id     = CASE WHEN $9 > a.current_price OR a.leader_id IS NULL THEN $10
                            ELSE a.leader_id END,
       end_time      = GREATEST(a.end_time, $11),
       extensions    = GREATEST(a.extensions, $12),
       bid_count     = GREATEST(a.bid_count, $13),
       last_bid_at   = GREATEST(a.last_bid_at, $14)
 WHERE a.id = $1
RETURNING a.current_price, a.leader_id, a.bid_count, a.extensions
"#,
    )
    .bind(id)
    .bind(batch.iter().map(|b| b.bid_id.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.bidder.clone()).collect::<Vec<_>>())
    .bind(
        batch
            .iter()
            .map(|b| b.request_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(batch.iter().map(|b| b.amount).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.placed_at).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.end_time).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.extended).collect::<Vec<_>>())
    .bind(top.amount)
    .bind(&top.bidder)
    .bind(
        batch
            .iter()
            .map(|b| b.end_time)
            .max()
            .unwrap_or(top.end_time),
    )
    .bind(batch.iter().map(|b| b.extensions).max().unwrap_or(0))
    .bind(batch.iter().map(|b| b.bids).max().unwrap_or(0))
    .bind(
        batch
            .iter()
            .map(|b| b.placed_at)
            .max()
            .unwrap_or(top.placed_at),
    )
    .fetch_optional(&state.pool)
    .await
    .context("failed to record hot bids")?;
    // This process now knows Postgres's record without reading it again.
    Ok(match res {
        Some(rec) => {
            state.auctions.remember_recorded(id, rec);
            1
        }
        None => 0,
    })
}

/// Acknowledges entries after their Postgres write committed.
pub async fn ack(state: &AppState, id: &str, batch: &[StreamBid]) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let k = keys(state, id);
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("redis unavailable: {e}"))?;
    let mut cmd = redis::cmd("XACK");
    cmd.arg(&k.stream).arg(GROUP);
    for b in batch {
        cmd.arg(&b.entry_id);
    }
    let _: i64 = cmd.query_async(&mut conn).await.context("XACK")?;
    Ok(())
}

/// Drains one auction's stream into Postgres (read → write → ack, batch by batch). Returns
/// the number of entries processed.
pub async fn consume_auction(state: &AppState, id: &str, consumer: &str) -> anyhow::Result<usize> {
    let count = state.config.auctions.consumer_batch.max(1);
    let mut total = 0;
    loop {
        let batch = read_batch(state, id, consumer, count).await?;
        if batch.is_empty() {
            return Ok(total);
        }
        write_batch(state, id, &batch).await?;
        ack(state, id, &batch).await?;
        total += batch.len();
    }
}

/// Records EVERY entry of a frozen auction's stream (no bid can be added any more): entries
/// other consumers read but never acknowledged are claimed at once, whoever holds them (a
/// consumer that died mid-batch, or a live one that is slow: both write idempotently), and
/// the drain is complete only when the group has nothing pending. `Ok(false)`: entries are
/// still pending (taken by a concurrent claimer); the caller must not close yet.
pub async fn drain_frozen(state: &AppState, id: &str, consumer: &str) -> anyhow::Result<bool> {
    let count = state.config.auctions.consumer_batch.max(1);
    loop {
        let batch = read_batch_claiming(state, id, consumer, count, 0).await?;
        if batch.is_empty() {
            break;
        }
        write_batch(state, id, &batch).await?;
        ack(state, id, &batch).await?;
    }
    Ok(pending(state, id).await? == 0)
}

/// Entries delivered to some consumer of the group and not yet acknowledged.
pub async fn pending(state: &AppState, id: &str) -> anyhow::Result<i64> {
    let k = keys(state, id);
    let mut conn = state
        .redis()
        .await
        .map_err(|e| anyhow::anyhow!("redis unavailable: {e}"))?;
    let reply: redis::Value = redis::cmd("XPENDING")
        .arg(&k.stream)
        .arg(GROUP)
        .query_async(&mut conn)
        .await
        .context("XPENDING")?;
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => Ok(*n),
            other => anyhow::bail!("unexpected XPENDING reply {other:?}"),
        },
        other => anyhow::bail!("unexpected XPENDING reply {other:?}"),
    }
}

/// One consumer pass over every open hot auction. Closed ones need none: the closer drains
/// an auction's stream after freezing it (no bid can arrive after that) and before it records
/// the close.
pub async fn consume_all(state: &AppState) -> anyhow::Result<usize> {
    #[derive(sqlx::FromRow)]
    struct Open {
        id: String,
        #[sqlx(flatten)]
        recorded: Recorded,
    }
    // The same read refreshes this instance's copy of what Postgres recorded (the bid floor),
    // so on an instance running jobs it is never more than one tick old.
    let open: Vec<Open> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, {RECORDED_COLUMNS} FROM auctions WHERE hot AND status = 'OPEN' ORDER BY id"
    )))
    .fetch_all(&state.pool)
    .await
    .context("failed to list hot auctions")?;
    let consumer = state.auctions.consumer_name.clone();
    let mut total = 0;
    for Open { id, recorded } in open {
        state.auctions.remember_recorded(&id, recorded);
        match consume_auction(state, &id, &consumer).await {
            Ok(n) => total += n,
            Err(e) => tracing::warn!(auction = %id, error = ?e, "hot bid consumer failed"),
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::Recorded;

    fn rec(price: i64, leader: Option<&str>, bids: i64, ext: i32) -> Recorded {
        Recorded {
            current_price: price,
            leader_id: leader.map(str::to_owned),
            bid_count: bids,
            extensions: ext,
        }
    }

    #[test]
    fn a_stale_record_never_lowers_a_newer_one() {
        let mut cur = rec(2000, Some("bob"), 5, 1);
        cur.merge(rec(1500, Some("alice"), 3, 0));
        assert_eq!(cur, rec(2000, Some("bob"), 5, 1));
        // A tie keeps the leader recorded first.
        cur.merge(rec(2000, Some("carol"), 6, 1));
        assert_eq!(cur, rec(2000, Some("bob"), 6, 1));
        cur.merge(rec(2100, Some("dave"), 7, 2));
        assert_eq!(cur, rec(2100, Some("dave"), 7, 2));
        // No leader yet: the start price is no floor over a recorded leader.
        let mut open = rec(1000, None, 0, 0);
        open.merge(rec(1000, Some("erin"), 1, 0));
        assert_eq!(open, rec(1000, Some("erin"), 1, 0));
        open.merge(rec(1000, None, 0, 0));
        assert_eq!(open, rec(1000, Some("erin"), 1, 0));
    }
}
