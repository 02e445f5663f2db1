//! The auction closer: `OPEN -> CLOSED` exactly once per auction, with its `auction.closed`
//! outbox event (winner, price) written by the same statement.
//!
//! Safe on any number of instances and rerunnable: due rows are claimed with
//! `FOR UPDATE SKIP LOCKED` (a row another closer or an in-flight bid holds is skipped and
//! looked at next tick) and the transition is `WHERE status = 'OPEN'`. The closer is not what
//! stops bids: the bid statement's `end_time > clock_timestamp()` (or the Lua script's `TIME`
//! check) already refuses every bid after the end; the closer only closes the books.
//!
//! Hot auctions are first frozen in Redis (one script: `CLOSED` iff Redis time has passed the
//! Redis end, which may have been extended beyond what Postgres knows), then their stream is
//! drained into Postgres (every entry, including those another consumer read and never
//! acknowledged), and only then is the result recorded with the outbox event: the higher of
//! Redis's frozen state and Postgres's record, so a Redis that lost writes cannot lower it.

use super::error::{AuctionError, StatementContext};
use super::{AuctionsState, hot};
use chrono::{DateTime, Utc};

/// One closed auction, for the live "closed" message.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Closed {
    pub id: String,
    pub leader_id: Option<String>,
    pub current_price: i64,
    pub end_time: DateTime<Utc>,
    pub bid_count: i64,
}

const CLOSE_COLD: &str = r#"
WITH due AS (
    SELECT id FROM auctions
     WHERE status = 'OPEN' AND NOT hot AND end_time <= clock_timestamp()
     ORDER BY end_time
     LIMIT $1
     FOR UPDATE SKIP LOCKED
), closed AS (
    UPDATE auctions a
       SET status = 'CLOSED', closed_at = clock_timestamp()
      FROM due
     WHERE a.id = due.id AND a.status = 'OPEN'
    RETURNING a.id, a.seller_id, a.title, a.leader_id, a.current_price, a.end_time, a.bid_count
), ev AS (
    INSERT INTO outbox (event_id, topic, aggregate_id, payload)
    SELECT 'auction.closed:' || c.id, 'auction.closed', c.id,
           jsonb_build_object('auction_id', c.id, 'title', c.title, 'seller', c.seller_id,
                              'winner', c.leader_id, 'sold', c.leader_id IS NOT NULL,
                              'price', c.current_price, 'bids', c.bid_count,
                              'end_time', c.end_time)
      FROM closed c
)
SELECT id, leader_id, current_price, end_time, bid_count FROM closed
"#;

/// Closes one hot auction with the higher of the result frozen in Redis and what Postgres
/// recorded (Redis may have lost writes the consumer had already recorded; a tie keeps the
/// leader Postgres recorded first). With no Redis state, Postgres's record stands.
const CLOSE_HOT: &str = r#"
WITH due AS (
    SELECT id FROM auctions
     WHERE id = $1 AND hot AND status = 'OPEN'
       -- Frozen in Redis ($2 set): Redis time and the Redis end decided. Otherwise (Redis
       -- lost the auction) Postgres's own end must have passed.
       AND ($2::bigint IS NOT NULL OR end_time <= clock_timestamp())
     FOR UPDATE SKIP LOCKED
), closed AS (
    UPDATE auctions a
       SET status        = 'CLOSED',
           closed_at     = clock_timestamp(),
           current_price = CASE WHEN $3::text IS NOT NULL
                                     AND ($2 > a.current_price OR a.leader_id IS NULL)
                                THEN $2 ELSE a.current_price END,
           leader_id     = CASE WHEN $3::text IS NOT NULL
                                     AND ($2 > a.current_price OR a.leader_id IS NULL)
                                THEN $3 ELSE a.leader_id END,
           end_time      = GREATEST(a.end_time, COALESCE($4, a.end_time)),
           extensions    = GREATEST(a.extensions, COALESCE($5, 0)),
           bid_count     = GREATEST(a.bid_count, COALESCE($6, 0))
      FROM due
     WHERE a.id = due.id
    RETURNING a.id, a.seller_id, a.title, a.leader_id, a.current_price, a.end_time, a.bid_count
), ev AS (
    INSERT INTO outbox (event_id, topic, aggregate_id, payload)
    SELECT 'auction.closed:' || c.id, 'auction.closed', c.id,
           jsonb_build_object('auction_id', c.id, 'title', c.title, 'seller', c.seller_id,
                              'winner', c.leader_id, 'sold', c.leader_id IS NOT NULL,
                              'price', c.current_price, 'bids', c.bid_count,
                              'end_time', c.end_time)
      FROM closed c
)
SELECT id, leader_id, current_price, end_time, bid_count FROM closed
"#;

/// One closer pass: cold auctions in batches until none is due, then due hot auctions.
/// Returns the auctions this pass closed. Publishes "closed" after the commits.
pub async fn close_due(state: &AuctionsState) -> Result<Vec<Closed>, AuctionError> {
    let batch = state.settings.closer_batch.max(1);
    let mut all = Vec::new();
    loop {
        let closed: Vec<Closed> = sqlx::query_as(CLOSE_COLD)
            .bind(batch)
            .fetch_all(&state.pool)
            .await
            .stmt("close due cold auctions")?;
        let n = closed.len();
        for c in &closed {
            super::live::publish_closed(state, c);
        }
        all.extend(closed);
        if (n as i64) < batch {
            break;
        }
    }
    let hot_due: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM auctions
          WHERE status = 'OPEN' AND hot AND end_time <= clock_timestamp()
          ORDER BY end_time LIMIT $1",
    )
    .bind(batch)
    .fetch_all(&state.pool)
    .await
    .stmt("list due hot auctions")?;
    for id in hot_due {
        match close_hot(state, &id).await {
            Ok(Some(c)) => {
                super::live::publish_closed(state, &c);
                all.push(c);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(auction = %id, error = ?e, "closing hot auction failed"),
        }
    }
    Ok(all)
}

/// Freeze in Redis, drain the stream, record the result. `None`: not ended in Redis yet
/// (extended), or another closer got it.
async fn close_hot(state: &AuctionsState, id: &str) -> Result<Option<Closed>, AuctionError> {
    let frozen = hot::freeze(state, id).await?;
    if let Some(f) = &frozen {
        if !f.closed {
            return Ok(None);
        }
        // Every bid the script accepted is in the stream; record them all (whichever consumer
        // read them) before the result.
        if !hot::drain_frozen(state, id, &state.consumer_name).await? {
            tracing::info!(auction = %id, "hot auction still has unrecorded bids; closing later");
            return Ok(None);
        }
    } else {
        tracing::warn!(auction = %id, "hot auction has no Redis state; closing with Postgres's record");
    }
    let closed: Option<Closed> = sqlx::query_as(CLOSE_HOT)
        .bind(id)
        .bind(frozen.as_ref().map(|f| f.price))
        .bind(frozen.as_ref().and_then(|f| f.leader.clone()))
        .bind(frozen.as_ref().map(|f| f.end_time))
        .bind(frozen.as_ref().map(|f| f.extensions))
        .bind(frozen.as_ref().map(|f| f.bids))
        .fetch_optional(&state.pool)
        .await
        .stmt("record a hot auction's close")?;
    if closed.is_some()
        && let Err(e) = hot::expire_closed(state, id).await
    {
        tracing::warn!(auction = %id, error = ?e, "could not set expiry on closed hot auction keys");
    }
    Ok(closed)
}
