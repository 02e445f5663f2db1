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
//! Each topic has its own stream, `<prefix>stream:<topic>`, entries carrying `event_id`,
//! `topic`, `aggregate_id`, `payload` (JSON) and `outbox_id`. Streams are trimmed
//! approximately to `stream_maxlen`.

pub mod delivery;

/// Everything the outbox domain's handlers and jobs use; the app layer builds it and handlers take
/// it with `State<OutboxState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct OutboxState {
    pub pool: sqlx::PgPool,
    pub redis: crate::platform::redis::Redis,
    pub auth: crate::platform::auth::Auth,
}

impl axum::extract::FromRef<OutboxState> for crate::platform::auth::Auth {
    fn from_ref(state: &OutboxState) -> Self {
        state.auth.clone()
    }
}

use crate::app::state::AppState;
use anyhow::Context;
use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

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

/// A claimed outbox row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: String,
    pub topic: String,
    pub aggregate_id: String,
    pub payload: serde_json::Value,
}

/// The stream an event of `topic` goes to.
pub fn stream_key(state: &AppState, topic: &str) -> String {
    state.key(&format!("stream:{topic}"))
}

/// Claims up to `batch` unpublished rows whose lease is free (one committed statement).
pub async fn claim_batch(pool: &PgPool, batch: i64, lease_s: u64) -> sqlx::Result<Vec<OutboxRow>> {
    let mut rows: Vec<OutboxRow> = sqlx::query_as(
        "UPDATE outbox o
            SET claimed_until = clock_timestamp() + make_interval(secs => $2),
                publish_attempts = o.publish_attempts + 1
          WHERE o.id IN (
                SELECT id FROM outbox
                 WHERE published_at IS NULL
                   AND (claimed_until IS NULL OR claimed_until < clock_timestamp())
                 ORDER BY id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
         RETURNING o.id, o.event_id, o.topic, o.aggregate_id, o.payload",
    )
    .bind(batch.max(1))
    .bind(lease_s as f64)
    .fetch_all(pool)
    .await?;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// `XADD`s every row (one pipeline). Returns the stream entry ids, in row order.
pub async fn publish(state: &AppState, rows: &[OutboxRow]) -> anyhow::Result<Vec<String>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = state.redis().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let maxlen = state.config.outbox.stream_maxlen.max(1);
    let mut pipe = redis::pipe();
    for r in rows {
        pipe.cmd("XADD")
            .arg(stream_key(state, &r.topic))
            .arg("MAXLEN")
            .arg("~")
            .arg(maxlen)
            .arg("*")
            .arg("event_id")
            .arg(&r.event_id)
            .arg("topic")
            .arg(&r.topic)
            .arg("aggregate_id")
            .arg(&r.aggregate_id)
            .arg("payload")
            .arg(r.payload.to_string())
            .arg("outbox_id")
            .arg(r.id);
    }
    pipe.query_async::<Vec<String>>(&mut conn)
        .await
        .context("XADD to the outbox streams failed")
}

/// Marks rows published (after Redis acknowledged them).
pub async fn mark_published(pool: &PgPool, ids: &[i64]) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "UPDATE outbox SET published_at = clock_timestamp(), claimed_until = NULL
          WHERE id = ANY($1) AND published_at IS NULL",
    )
    .bind(ids)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Gives claimed rows back at once after a failed publish (instead of waiting for the lease).
async fn unclaim(pool: &PgPool, ids: &[i64]) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1) AND published_at IS NULL",
    )
    .bind(ids)
    .execute(pool)
    .await?
    .rows_affected())
}

/// One relay batch: claim, publish, mark. Returns the number of rows published.
pub async fn relay_once(state: &AppState) -> anyhow::Result<usize> {
    let settings = &state.config.outbox;
    let rows = claim_batch(&state.pool, settings.relay_batch, settings.lease_s)
        .await
        .context("failed to claim outbox rows")?;
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    if let Err(e) = publish(state, &rows).await {
        if let Err(u) = unclaim(&state.pool, &ids).await {
            tracing::warn!(error = ?u, "failed to unclaim outbox rows; their lease will expire");
        }
        return Err(e);
    }
    mark_published(&state.pool, &ids)
        .await
        .context("failed to mark outbox rows published")?;
    state
        .metrics
        .payments
        .outbox_published
        .inc_by(rows.len() as u64);
    Ok(rows.len())
}

/// Relays until a batch comes back short, then samples the lag gauges. The periodic job.
pub async fn relay_all(state: &AppState) -> anyhow::Result<usize> {
    let batch = state.config.outbox.relay_batch.max(1) as usize;
    let mut total = 0;
    loop {
        let n = relay_once(state).await?;
        total += n;
        if n < batch {
            break;
        }
    }
    sample_lag(state).await?;
    Ok(total)
}

/// Sets `outbox_lag` (unpublished rows) and `outbox_oldest_unpublished_seconds`.
pub async fn sample_lag(state: &AppState) -> anyhow::Result<()> {
    let (count, age): (i64, f64) = sqlx::query_as(
        "SELECT count(*),
                COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0)::float8
           FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(&state.pool)
    .await
    .context("failed to measure outbox lag")?;
    state.metrics.outbox_lag.set(count);
    state.metrics.payments.outbox_oldest_s.set(age);
    Ok(())
}
