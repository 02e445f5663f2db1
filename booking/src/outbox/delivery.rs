//! The ticket-delivery consumer: reads `order.paid` events from their Redis Stream in a
//! consumer group and records each delivery exactly once.
//!
//! Guarantees:
//! - Exactly-once effect on at-least-once delivery: the delivery row is keyed by the outbox
//!   `event_id` (`INSERT ... ON CONFLICT DO NOTHING`), so an event published twice (relay
//!   died before marking it) or handed over twice (consumer died before `XACK`) is recorded
//!   once.
//! - The ticket e-mail (a `mail_deliveries` row keyed by the same event id) is queued in the
//!   delivery row's transaction, so it exists iff the delivery does (`tickets::mail`).
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

use crate::outbox::{OutboxState, stream_key};
use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use serde::Deserialize;
use std::sync::OnceLock;
use std::time::Duration;

/// The ticket-delivery consumer job (Redis and Postgres), as [`consumer_name`].
pub struct Deliver(pub OutboxState);

#[async_trait]
impl Job for Deliver {
    fn name(&self) -> &'static str {
        "ticket-delivery"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.delivery_poll_ms.max(10))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        consume_once(&self.0, consumer_name()).await?;
        Ok(())
    }
}

/// The delivery catch-up job ([`catch_up_once`]).
pub struct CatchUp(pub OutboxState);

#[async_trait]
impl Job for CatchUp {
    fn name(&self) -> &'static str {
        "ticket-delivery-catch-up"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.delivery_catch_up_interval_ms.max(10))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        catch_up_once(&self.0).await?;
        Ok(())
    }
}

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

#[derive(Debug, PartialEq, Eq, Deserialize)]
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

impl Handled {
    /// The `result` label of `ticket_deliveries_total`.
    pub fn label(self) -> &'static str {
        match self {
            Handled::Delivered => "delivered",
            Handled::Duplicate => "duplicate",
            Handled::DeadLettered => "dead_lettered",
        }
    }
}

/// The event id and payload of an `order.paid` entry, or `None` when it cannot be
/// understood (it is dead-lettered then).
fn read_entry(entry: &StreamId) -> Option<(String, PaidPayload)> {
    let event_id: String = entry.get("event_id")?;
    let payload = entry
        .get::<String>("payload")
        .and_then(|p| serde_json::from_str(&p).ok())?;
    Some((event_id, payload))
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
    state: &OutboxState,
    consumer: &str,
    min_idle_ms: u64,
    count: usize,
) -> anyhow::Result<Vec<StreamId>> {
    let key = stream_key(&state.redis, TOPIC);
    let mut conn = state
        .redis
        .conn()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
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
    state: &OutboxState,
    consumer: &str,
    count: usize,
) -> anyhow::Result<Vec<StreamId>> {
    let key = stream_key(&state.redis, TOPIC);
    let mut conn = state
        .redis
        .conn()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
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

/// Queues the ticket e-mail of a first delivery (`$1` event id, `$2` order id) when the order
/// has an address (`tickets::mail` sends it).
pub const MAIL_ROW: &str = "INSERT INTO mail_deliveries (kind, key, order_id)
     SELECT 'tickets', $1, c.order_id FROM order_contacts c
      WHERE c.order_id = $2 AND c.email IS NOT NULL
     ON CONFLICT (kind, key) DO NOTHING";

/// Records one entry (once per event id) and, in the same transaction, queues its ticket
/// e-mail, then acknowledges it.
pub async fn handle(
    state: &OutboxState,
    consumer: &str,
    entry: &StreamId,
) -> anyhow::Result<Handled> {
    let key = stream_key(&state.redis, TOPIC);
    let outcome = match read_entry(entry) {
        Some((event_id, p)) => {
            let mut tx = state
                .pool
                .begin()
                .await
                .context("failed to begin a ticket delivery")?;
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
            .execute(&mut *tx)
            .await
            .context("failed to record a ticket delivery")?
            .rows_affected();
            if inserted == 1 {
                // The e-mail, with the delivery or not at all: keyed by the same event id, so
                // a redelivered event can never queue a second message. Only orders that
                // have an address get one; the address itself stays in `order_contacts`.
                sqlx::query(MAIL_ROW)
                    .bind(&event_id)
                    .bind(&p.order_id)
                    .execute(&mut *tx)
                    .await
                    .context("failed to queue the ticket e-mail")?;
            }
            tx.commit()
                .await
                .context("failed to commit a ticket delivery")?;
            if inserted == 1 {
                tracing::info!(order_id = %p.order_id, event_id = %event_id, "tickets delivered");
                Handled::Delivered
            } else {
                Handled::Duplicate
            }
        }
        None => {
            let mut conn = state
                .redis
                .conn()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
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
    let mut conn = state
        .redis
        .conn()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _: i64 = redis::cmd("XACK")
        .arg(&key)
        .arg(GROUP)
        .arg(&entry.id)
        .query_async(&mut conn)
        .await
        .context("XACK failed")?;
    state
        .metrics
        .deliveries
        .with_label_values(&[outcome.label()])
        .inc();
    Ok(outcome)
}

/// One consumer pass: reclaim abandoned messages, read new ones, handle each. Returns the
/// number of entries handled. The periodic job.
pub async fn consume_once(state: &OutboxState, consumer: &str) -> anyhow::Result<usize> {
    let settings = &state.settings;
    let count = settings.delivery_batch.max(1);
    let mut entries = read_batch(state, consumer, count).await?;
    entries.extend(reclaim(state, consumer, settings.delivery_reclaim_idle_ms, count).await?);
    for entry in &entries {
        handle(state, consumer, entry).await?;
    }
    Ok(entries.len())
}

/// Hands back up to `$3` published, undelivered `order.paid` rows of `PAID` orders published
/// between `$2` and `$1` seconds ago ([`catch_up_once`]): the locking sub-select as an `ARRAY(...)` InitPlan, run once whatever the plan
/// (docs/decisions.md, "Claims lock their batch once").
pub const CATCH_UP: &str = "UPDATE outbox o SET published_at = NULL, claimed_until = NULL
          WHERE o.id = ANY (ARRAY(
                SELECT x.id FROM outbox x JOIN orders ord ON ord.id = x.aggregate_id
                 WHERE x.topic = 'order.paid'
                   AND x.published_at <= clock_timestamp() - make_interval(secs => $1)
                   AND x.published_at > clock_timestamp() - make_interval(secs => $2)
                   AND ord.status = 'PAID'
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = x.event_id)
                 ORDER BY x.id
                 LIMIT $3
                 FOR UPDATE OF x SKIP LOCKED))
         RETURNING o.id";

/// Delivery catch-up: `order.paid` outbox rows of orders that are still `PAID`, published
/// more than `delivery_catch_up_grace_s` ago (and within `delivery_catch_up_window_s`) and
/// never delivered, are marked unpublished again — one statement, `FOR UPDATE SKIP LOCKED`,
/// so any number of instances can run it — and the relay publishes them again with their
/// own `event_id`. Returns how many were handed back. A republished row gets a new
/// `published_at`, so a consumer that is merely slow sees it again only after another grace.
pub async fn catch_up_once(state: &OutboxState) -> anyhow::Result<u64> {
    let settings = &state.settings;
    // Planned on each run (an unnamed statement): a plan cached while `orders` was empty (a
    // first boot) would scan `orders` for every outbox row for as long as the connection
    // lives (`jobs::claims_take_their_batch_once_whatever_plan_was_cached`).
    let ids: Vec<i64> = sqlx::query_scalar(CATCH_UP)
        .persistent(false)
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
        state.metrics.delivery_catch_up.inc_by(n);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn entry(fields: &[(&str, &str)]) -> StreamId {
        StreamId {
            id: "1-0".into(),
            map: fields
                .iter()
                .map(|(k, v)| {
                    (
                        (*k).to_owned(),
                        redis::Value::BulkString(v.as_bytes().to_vec()),
                    )
                })
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn an_order_paid_entry_is_read_by_event_id_and_payload() {
        let e = entry(&[
            ("event_id", "evt_1"),
            ("topic", TOPIC),
            (
                "payload",
                r#"{"order_id":"ord_1","account_id":"alice","tickets":[{"id":"t1"}],"extra":1}"#,
            ),
        ]);
        let (event_id, p) = read_entry(&e).expect("readable");
        assert_eq!(event_id, "evt_1");
        assert_eq!(
            (p.order_id.as_str(), p.account_id.as_str()),
            ("ord_1", "alice")
        );
        assert_eq!(p.tickets, serde_json::json!([{"id": "t1"}]));
        // Tickets are optional (orders without seats).
        let e = entry(&[
            ("event_id", "evt_2"),
            ("payload", r#"{"order_id":"o","account_id":"a"}"#),
        ]);
        assert_eq!(
            read_entry(&e).expect("readable").1.tickets,
            serde_json::Value::Null
        );
    }

    #[test]
    fn unreadable_entries_are_dead_lettered() {
        for fields in [
            vec![("payload", r#"{"order_id":"o","account_id":"a"}"#)],
            vec![("event_id", "evt_1")],
            vec![("event_id", "evt_1"), ("payload", "not json")],
            vec![("event_id", "evt_1"), ("payload", r#"{"order_id":"o"}"#)],
        ] {
            assert!(read_entry(&entry(&fields)).is_none(), "{fields:?}");
        }
    }

    #[test]
    fn delivery_results_keep_their_metric_labels() {
        assert_eq!(
            [
                Handled::Delivered,
                Handled::Duplicate,
                Handled::DeadLettered
            ]
            .map(Handled::label),
            ["delivered", "duplicate", "dead_lettered"]
        );
    }

    #[test]
    fn the_consumer_name_is_stable_and_names_this_process() {
        let name = consumer_name();
        assert_eq!(name, consumer_name());
        assert!(
            name.contains(&format!("-{}-", std::process::id())),
            "{name}"
        );
    }
}
