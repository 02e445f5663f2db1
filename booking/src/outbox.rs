//! The outbox relay: moves `outbox` rows to Redis Streams, at least once.
//!
//! Guarantees:
//! - A row is written in the same transaction as the change it announces ([`write_tx`]), so
//!   an event exists iff its change committed.
//! - Relays claim rows in one statement (`FOR UPDATE SKIP LOCKED` inside an `UPDATE` that
//!   sets a short lease, `claimed_until`), commit, then `XADD` — no transaction is open while
//!   Redis is called — and mark the rows published only after Redis acknowledged every
//!   `XADD`. Any number of relays can run at once: a claimed row is invisible to the others
//!   until its lease runs out.
//! - A relay that dies between `XADD` and the mark leaves the lease to expire; the row is
//!   published again. Delivery is therefore at least once, and consumers dedupe by the
//!   `event_id` field (see [`crate::outbox::delivery`]).
//!
//! The relay ([`relay`]) and the ticket-delivery consumer ([`delivery`]) are jobs of this
//! domain; it depends on no other domain (payments and orders call [`write_tx`]).
//!
//! Each topic has its own stream, `<prefix>stream:<topic>`, entries carrying `event_id`,
//! `topic`, `aggregate_id`, `payload` (JSON) and `outbox_id`. Streams are trimmed
//! approximately to `stream_maxlen`.

pub mod delivery;
pub mod relay;

use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use serde::Deserialize;
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;

pub use relay::{
    OutboxRow, claim_batch, mark_published, publish, relay_all, relay_once, sample_lag,
};

/// Everything the outbox's jobs use: Postgres (the rows), Redis (the streams), the
/// `[outbox]` settings and the metrics. The app layer builds it. Cheap to clone.
#[derive(Clone)]
pub struct OutboxState {
    pub pool: PgPool,
    pub redis: Redis,
    pub settings: Arc<OutboxSettings>,
    pub metrics: OutboxMetrics,
}

/// The outbox's background jobs: the relay, the ticket-delivery consumer and its catch-up
/// from Postgres. Each is safe on any number of instances.
pub fn jobs(state: &OutboxState) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(relay::Relay(state.clone())),
        Arc::new(delivery::Deliver(state.clone())),
        Arc::new(delivery::CatchUp(state.clone())),
    ]
}

/// `[outbox]` settings (relay and ticket-delivery consumer).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxSettings {
    /// How often the relay looks for unpublished rows.
    pub relay_interval_ms: u64,
    /// Rows per relay batch (one claim statement, one Redis pipeline).
    pub relay_batch: i64,
    /// How long a claimed row stays invisible to other relays. Longer than a Redis call can
    /// take; a dead relay's rows are republished after it.
    pub lease_s: u64,
    /// Approximate cap on each stream's length (`XADD MAXLEN ~`).
    pub stream_maxlen: u64,
    /// Ticket-delivery consumer: poll interval, batch size, and how long a message may sit
    /// unacknowledged with a (presumed dead) consumer before another one reclaims it.
    pub delivery_poll_ms: u64,
    pub delivery_batch: usize,
    pub delivery_reclaim_idle_ms: u64,
    /// Delivery catch-up (see [`crate::outbox::delivery::catch_up_once`]): how often it runs, how
    /// long after its publication an `order.paid` event may still be undelivered before it
    /// is published again, and how far back it looks.
    pub delivery_catch_up_interval_ms: u64,
    pub delivery_catch_up_grace_s: u64,
    pub delivery_catch_up_window_s: u64,
}

impl Default for OutboxSettings {
    fn default() -> Self {
        Self {
            relay_interval_ms: 200,
            relay_batch: 500,
            lease_s: 30,
            stream_maxlen: 1_000_000,
            delivery_poll_ms: 200,
            delivery_batch: 100,
            delivery_reclaim_idle_ms: 30_000,
            delivery_catch_up_interval_ms: 60_000,
            delivery_catch_up_grace_s: 300,
            delivery_catch_up_window_s: 7 * 86_400,
        }
    }
}

/// Outbox relay and ticket-delivery metrics, registered on the app's registry.
#[derive(Clone)]
pub struct OutboxMetrics {
    /// Outbox rows published to streams.
    pub published: prometheus::IntCounter,
    /// Unpublished outbox rows (sampled by the relay).
    pub lag: prometheus::IntGauge,
    /// Age of the oldest unpublished outbox row.
    pub oldest_s: prometheus::Gauge,
    /// Ticket-delivery consumer results (`delivered`, `duplicate`, `dead_lettered`).
    pub deliveries: prometheus::IntCounterVec,
    /// Paid orders whose lost ticket-delivery event was published again from Postgres.
    pub delivery_catch_up: prometheus::IntCounter,
}

impl OutboxMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Opts};
        let m = Self {
            published: IntCounter::new(
                "outbox_published_total",
                "Outbox rows published to Redis Streams",
            )?,
            lag: IntGauge::new("outbox_lag", "Unpublished outbox rows")?,
            oldest_s: Gauge::new(
                "outbox_oldest_unpublished_seconds",
                "Age of the oldest unpublished outbox row",
            )?,
            deliveries: IntCounterVec::new(
                Opts::new(
                    "ticket_deliveries_total",
                    "Ticket-delivery consumer results",
                ),
                &["result"],
            )?,
            delivery_catch_up: IntCounter::new(
                "ticket_delivery_catch_up_total",
                "Paid orders whose ticket-delivery event was published again from Postgres",
            )?,
        };
        registry.register(Box::new(m.published.clone()))?;
        registry.register(Box::new(m.lag.clone()))?;
        registry.register(Box::new(m.oldest_s.clone()))?;
        registry.register(Box::new(m.deliveries.clone()))?;
        registry.register(Box::new(m.delivery_catch_up.clone()))?;
        Ok(m)
    }
}

/// Writes one event inside the caller's transaction.
pub async fn write_tx(
    conn: &mut PgConnection,
    topic: &str,
    aggregate_id: &str,
    payload: &serde_json::Value,
) -> sqlx::Result<String> {
    let event_id = shared::ids::new_id();
    sqlx::query(
        "INSERT INTO outbox (event_id, topic, aggregate_id, payload) VALUES ($1, $2, $3, $4)",
    )
    .bind(&event_id)
    .bind(topic)
    .bind(aggregate_id)
    .bind(payload)
    .execute(conn)
    .await?;
    Ok(event_id)
}

/// The stream an event of `topic` goes to (`<prefix>stream:<topic>`).
pub fn stream_key(redis: &Redis, topic: &str) -> String {
    redis.key(&format!("stream:{topic}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(prefix: &str) -> Redis {
        Redis::new(&shared::config::RedisSettings {
            key_prefix: prefix.into(),
            ..Default::default()
        })
        .expect("a valid redis url")
    }

    #[test]
    fn each_topic_has_its_own_prefixed_stream() {
        assert_eq!(
            stream_key(&redis("fg:"), "order.paid"),
            "fg:stream:order.paid"
        );
        assert_eq!(stream_key(&redis(""), "order.paid"), "stream:order.paid");
        assert_ne!(
            stream_key(&redis("fg:"), "order.paid"),
            stream_key(&redis("fg:"), "order.refunded")
        );
    }

    /// The `[outbox]` section as booking's config holds it.
    #[derive(Deserialize)]
    struct Root {
        #[serde(default)]
        outbox: OutboxSettings,
    }

    #[test]
    fn outbox_settings_load_from_the_environment_and_refuse_unknown_keys() {
        let env = vec![("FLOODGATE_OUTBOX__RELAY_BATCH".to_owned(), "50".to_owned())];
        let c: Root = shared::config::load(None, env).expect("valid [outbox]");
        assert_eq!(c.outbox.relay_batch, 50);
        assert_eq!(c.outbox.lease_s, 30);
        let bad = vec![("FLOODGATE_OUTBOX__RELAY_BATCHES".to_owned(), "5".to_owned())];
        assert!(shared::config::load::<Root>(None, bad).is_err());
    }
}
