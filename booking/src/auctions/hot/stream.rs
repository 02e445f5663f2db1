//! The hot-bid consumer: each hot auction's stream, read through the consumer group
//! [`super::GROUP`], is written to Postgres idempotently and only then acknowledged. A
//! consumer that dies mid-batch leaves its entries pending: the same consumer name re-reads
//! them, another consumer claims them after `consumer_claim_idle_ms`, and the closer claims
//! them at once when the auction is frozen ([`drain_frozen`]).

use super::{GROUP, keys, ms_to_time};
use crate::auctions::AuctionsState;
use crate::auctions::error::{AuctionError, RedisContext};
use crate::auctions::model::StreamBid;
use crate::auctions::repo;
use anyhow::Context;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

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
    state: &AuctionsState,
    id: &str,
    consumer: &str,
    count: usize,
) -> Result<Vec<StreamBid>, AuctionError> {
    let idle = state.settings.consumer_claim_idle_ms;
    read_batch_claiming(state, id, consumer, count, idle).await
}

/// [`read_batch`], taking over entries other consumers have held for `claim_idle_ms` or more.
async fn read_batch_claiming(
    state: &AuctionsState,
    id: &str,
    consumer: &str,
    count: usize,
    claim_idle_ms: u64,
) -> Result<Vec<StreamBid>, AuctionError> {
    let k = keys(&state.redis, id);
    let mut conn = state.redis.conn().await?;
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
            .redis_op("read pending hot bids (XREADGROUP)")?,
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
            .redis_op("claim idle hot bids (XAUTOCLAIM)")?;
        ids = claimed.claimed;
    }
    if ids.is_empty() {
        ids = entries(
            read(">")
                .query_async(&mut conn)
                .await
                .redis_op("read new hot bids (XREADGROUP)")?,
        );
    }
    Ok(ids.iter().map(parse_entry).collect::<anyhow::Result<_>>()?)
}

/// Writes a batch of one auction's accepted bids to Postgres ([`repo::record_hot_bids`]) and
/// remembers the resulting record as this process's bid floor. Returns 1 when the auction
/// row was moved, 0 for an empty batch or an unknown auction.
pub async fn write_batch(
    state: &AuctionsState,
    id: &str,
    batch: &[StreamBid],
) -> Result<u64, AuctionError> {
    Ok(match repo::record_hot_bids(&state.pool, id, batch).await? {
        Some(rec) => {
            // This process now knows Postgres's record without reading it again.
            state.runtime.remember_recorded(id, rec);
            1
        }
        None => 0,
    })
}

/// Acknowledges entries after their Postgres write committed.
pub async fn ack(state: &AuctionsState, id: &str, batch: &[StreamBid]) -> Result<(), AuctionError> {
    if batch.is_empty() {
        return Ok(());
    }
    let k = keys(&state.redis, id);
    let mut conn = state.redis.conn().await?;
    let mut cmd = redis::cmd("XACK");
    cmd.arg(&k.stream).arg(GROUP);
    for b in batch {
        cmd.arg(&b.entry_id);
    }
    let _: i64 = cmd
        .query_async(&mut conn)
        .await
        .redis_op("acknowledge hot bids (XACK)")?;
    Ok(())
}

/// Drains one auction's stream into Postgres (read → write → ack, batch by batch). Returns
/// the number of entries processed.
pub async fn consume_auction(
    state: &AuctionsState,
    id: &str,
    consumer: &str,
) -> Result<usize, AuctionError> {
    let count = state.settings.consumer_batch.max(1);
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
pub async fn drain_frozen(
    state: &AuctionsState,
    id: &str,
    consumer: &str,
) -> Result<bool, AuctionError> {
    let count = state.settings.consumer_batch.max(1);
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
pub async fn pending(state: &AuctionsState, id: &str) -> Result<i64, AuctionError> {
    let k = keys(&state.redis, id);
    let mut conn = state.redis.conn().await?;
    let reply: redis::Value = redis::cmd("XPENDING")
        .arg(&k.stream)
        .arg(GROUP)
        .query_async(&mut conn)
        .await
        .redis_op("count pending hot bids (XPENDING)")?;
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => Ok(*n),
            other => Err(anyhow::anyhow!("unexpected XPENDING reply {other:?}").into()),
        },
        other => Err(anyhow::anyhow!("unexpected XPENDING reply {other:?}").into()),
    }
}

/// One consumer pass over every open hot auction. Closed ones need none: the closer drains
/// an auction's stream after freezing it (no bid can arrive after that) and before it records
/// the close.
pub async fn consume_all(state: &AuctionsState) -> Result<usize, AuctionError> {
    // The same read refreshes this instance's copy of what Postgres recorded (the bid floor),
    // so on an instance running jobs it is never more than one tick old.
    let open = repo::open_hot(&state.pool).await?;
    let mut total = 0;
    for (id, recorded) in open {
        state.runtime.remember_recorded(&id, recorded);
        match consume_auction(state, &id, &state.consumer_name).await {
            Ok(n) => total += n,
            Err(e) => tracing::warn!(auction = %id, error = ?e, "hot bid consumer failed"),
        }
    }
    Ok(total)
}
