//! The ticket-delivery consumer: reads `order.paid` events from their Redis Stream in a
//! consumer group and records each delivery exactly once.
//!
//! Guarantees:
//! - Exactly-once effect on at-least-once delivery: the delivery row is keyed by the outbox
//!   `event_id` (`INSERT ... ON CONFLICT DO NOTHING`), so an event published twice (relay
//!   died before marking it) or handed over twice (consumer died before `XACK`) is recorded
//!   once.
//! - A message is acknowledged (`XACK`) only after its row committed. A consumer that dies
//!   in between leaves the message pending; any consumer reclaims messages idle longer than
//!   `delivery_reclaim_idle_ms` (`XAUTOCLAIM`) and processes them again.
//! - A message that cannot be understood is moved to `<stream>:dead` and acknowledged, so it
//!   cannot block the group forever.
//! - An event the stream lost after the relay marked it published (a Redis rollback — AOF
//!   `everysec`, a failover, a restore — or a trim) is recovered from Postgres: the catch-up
//!   job ([`catch_up_once`]) finds `order.paid` events of still-paid orders that have no
//!   delivery row `delivery_catch_up_grace_s` after their publication and hands them back
//!   to the relay, which publishes them again under the same `event_id`; the delivery row's
//!   key makes that exactly once even when the original entry was only slow.

use crate::app::state::AppState;
use crate::outbox::stream_key;
use anyhow::Context;
use redis::aio::ConnectionManager;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use serde::Deserialize;
use std::sync::OnceLock;

/// The consumer group of ticket delivery.
pub const GROUP: &str = "ticket-delivery";
/// The topic it consumes.
pub const TOPIC: &str = "order.paid";

/// This process's consumer name (host-pid-random), stable for the life of the process.
pub fn consumer_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "booking".into());
        format!(
            "{host}-{}-{}",
            std::process::id(),
            &shared::ids::new_id()[24..]
        )
    })
}

#[derive(Debug, Deserialize)]
struct PaidPayload {
    order_id: String,
    account_id: String,
    #[serde(default)]
    tickets: serde_json::Value,
}

/// What happened to one stream entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// First time: a delivery row was written.
    Delivered,
    /// Already delivered earlier (duplicate publish or redelivery).
    Duplicate,
    /// Unreadable: moved to the dead-letter stream.
    DeadLettered,
}

/// Ensures the group exists (from the start of the stream, so events published before the
/// first consumer started are delivered too).
async fn create_group(conn: &mut ConnectionManager, key: &str) -> anyhow::Result<()> {
    let r: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(key)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e).context("XGROUP CREATE failed"),
    }
}

async fn read_new(
    conn: &mut ConnectionManager,
    key: &str,
    consumer: &str,
    count: usize,
) -> redis::RedisResult<Vec<StreamId>> {
    let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(key)
        .arg(">")
        .query_async(conn)
        .await?;
    Ok(reply
        .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
        .unwrap_or_default())
}

/// Takes over messages another consumer received but did not acknowledge within
/// `min_idle_ms`.
pub async fn reclaim(
    state: &AppState,
    consumer: &str,
    min_idle_ms: u64,
    count: usize,
) -> anyhow::Result<Vec<StreamId>> {
    let key = stream_key(state, TOPIC);
    let mut conn = state.redis().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
        .arg(&key)
        .arg(GROUP)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg("0-0")
        .arg("COUNT")
        .arg(count)
        .query_async(&mut conn)
        .await
        .context("XAUTOCLAIM failed")?;
    Ok(reply.claimed)
}

/// Reads up to `count` new messages for `consumer` without processing them (what a consumer
/// that crashes right after reading leaves behind). Creates the group if needed.
pub async fn read_batch(
    state: &AppState,
    consumer: &str,
    count: usize,
) -> anyhow::Result<Vec<StreamId>> {
    let key = stream_key(state, TOPIC);
    let mut conn = state.redis().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    match read_new(&mut conn, &key, consumer, count).await {
        Ok(v) => Ok(v),
        Err(e) if e.code() == Some("NOGROUP") => {
            create_group(&mut conn, &key).await?;
            read_new(&mut conn, &key, consumer, count)
                .await
                .context("XREADGROUP failed")
        }
        Err(e) => Err(e).context("XREADGROUP failed"),
    }
}

/// Records one entry (once per event id), then acknowledges it.
pub async fn handle(state: &AppState, consumer: &str, entry: &StreamId) -> anyhow::Result<Handled> {
    let key = stream_key(state, TOPIC);
    let event_id: Option<String> = entry.get("event_id");
    let payload: Option<PaidPayload> = entry
        .get::<String>("payload")
        .and_then(|p| serde_json::from_str(&p).ok());
    let outcome = match (event_id, payload) {
        (Some(event_id), Some(p)) => {
            let inserted = sqlx::query(
                "INSERT INTO deliveries (event_id, order_id, account_id, tickets, stream_entry, consumer)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (event_id) DO NOTHING",
            )
            .bind(&event_id)
            .bind(&p.order_id)
            .bind(&p.account_id)
            .bind(&p.tickets)
            .bind(&entry.id)
            .bind(consumer)
            .execute(&state.pool)
            .await
            .context("failed to record a ticket delivery")?
            .rows_affected();
            if inserted == 1 {
                tracing::info!(order_id = %p.order_id, event_id = %event_id, "tickets delivered");
                Handled::Delivered
            } else {
                Handled::Duplicate
            }
        }
        _ => {
            let mut conn = state.redis().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut cmd = redis::cmd("XADD");
            cmd.arg(format!("{key}:dead"))
                .arg("*")
                .arg("stream_entry")
                .arg(&entry.id);
            for (field, value) in &entry.map {
                if let Ok(v) = redis::from_redis_value_ref::<String>(value) {
                    cmd.arg(field).arg(v);
                }
            }
            let _: String = cmd
                .query_async(&mut conn)
                .await
                .context("failed to dead-letter a malformed message")?;
            tracing::warn!(stream_entry = %entry.id, "malformed order.paid message dead-lettered");
            Handled::DeadLettered
        }
    };
    // Only now, after the row committed, is the message acknowledged.
    let mut conn = state.redis().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let _: i64 = redis::cmd("XACK")
        .arg(&key)
        .arg(GROUP)
        .arg(&entry.id)
        .query_async(&mut conn)
        .await
        .context("XACK failed")?;
    let label = match outcome {
        Handled::Delivered => "delivered",
        Handled::Duplicate => "duplicate",
        Handled::DeadLettered => "dead_lettered",
    };
    state
        .metrics
        .payments
        .deliveries
        .with_label_values(&[label])
        .inc();
    Ok(outcome)
}

/// One consumer pass: reclaim abandoned messages, read new ones, handle each. Returns the
/// number of entries handled. The periodic job.
pub async fn consume_once(state: &AppState, consumer: &str) -> anyhow::Result<usize> {
    let settings = &state.config.outbox;
    let count = settings.delivery_batch.max(1);
    let mut entries = read_batch(state, consumer, count).await?;
    entries.extend(reclaim(state, consumer, settings.delivery_reclaim_idle_ms, count).await?);
    for entry in &entries {
        handle(state, consumer, entry).await?;
    }
    Ok(entries.len())
}

/// Delivery catch-up: `order.paid` outbox rows of orders that are still `PAID`, published
/// more than `delivery_catch_up_grace_s` ago (and within `delivery_catch_up_window_s`) and
/// never delivered, are marked unpublished again — one statement, `FOR UPDATE SKIP LOCKED`,
/// so any number of instances can run it — and the relay publishes them again with their
/// own `event_id`. Returns how many were handed back. A republished row gets a new
/// `published_at`, so a consumer that is merely slow sees it again only after another grace.
pub async fn catch_up_once(state: &AppState) -> anyhow::Result<u64> {
    let settings = &state.config.outbox;
    let ids: Vec<i64> = sqlx::query_scalar(
        "UPDATE outbox o SET published_at = NULL, claimed_until = NULL
          WHERE o.id IN (
                SELECT x.id FROM outbox x JOIN orders ord ON ord.id = x.aggregate_id
                 WHERE x.topic = 'order.paid'
                   AND x.published_at <= clock_timestamp() - make_interval(secs => $1)
                   AND x.published_at > clock_timestamp() - make_interval(secs => $2)
                   AND ord.status = 'PAID'
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = x.event_id)
                 ORDER BY x.id
                 LIMIT $3
                 FOR UPDATE OF x SKIP LOCKED)
         RETURNING o.id",
    )
    .bind(settings.delivery_catch_up_grace_s as f64)
    .bind(settings.delivery_catch_up_window_s.max(1) as f64)
    .bind(settings.relay_batch.max(1))
    .fetch_all(&state.pool)
    .await
    .context("delivery catch-up failed")?;
    let n = ids.len() as u64;
    if n > 0 {
        tracing::warn!(
            events = n,
            "order.paid events published but never delivered (stream entries lost?): republishing"
        );
        state.metrics.payments.delivery_catch_up.inc_by(n);
    }
    Ok(n)
}
