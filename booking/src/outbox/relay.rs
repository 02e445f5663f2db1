//! The relay job: claim a batch of unpublished rows (one committed statement, a lease), `XADD`
//! them (one pipeline, no transaction open), mark them published. See [`crate::outbox`] for
//! the guarantees.

use crate::outbox::{OutboxState, stream_key};
use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use sqlx::PgPool;
use std::time::Duration;

/// The relay job (pool and Redis, settings, metrics).
pub struct Relay(pub OutboxState);

#[async_trait]
impl Job for Relay {
    fn name(&self) -> &'static str {
        "outbox-relay"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.relay_interval_ms.max(10))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        relay_all(&self.0).await?;
        Ok(())
    }
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

/// Claims up to `$1` unpublished rows whose lease is free, leasing them for `$2` seconds:
/// the locking sub-select as an `ARRAY(...)` InitPlan, run once whatever the plan
/// (docs/decisions.md, "Claims lock their batch once").
pub const CLAIM_BATCH: &str = "UPDATE outbox o
            SET claimed_until = clock_timestamp() + make_interval(secs => $2),
                publish_attempts = o.publish_attempts + 1
          WHERE o.id = ANY (ARRAY(
                SELECT id FROM outbox
                 WHERE published_at IS NULL
                   AND (claimed_until IS NULL OR claimed_until < clock_timestamp())
                 ORDER BY id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED))
         RETURNING o.id, o.event_id, o.topic, o.aggregate_id, o.payload";

/// Claims up to `batch` unpublished rows whose lease is free (one committed statement).
pub async fn claim_batch(pool: &PgPool, batch: i64, lease_s: u64) -> sqlx::Result<Vec<OutboxRow>> {
    let mut rows: Vec<OutboxRow> = sqlx::query_as(CLAIM_BATCH)
        .bind(batch.max(1))
        .bind(lease_s as f64)
        .fetch_all(pool)
        .await?;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// `XADD`s every row (one pipeline). Returns the stream entry ids, in row order.
pub async fn publish(state: &OutboxState, rows: &[OutboxRow]) -> anyhow::Result<Vec<String>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = state
        .redis
        .conn()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let maxlen = state.settings.stream_maxlen.max(1);
    let mut pipe = redis::pipe();
    for r in rows {
        pipe.cmd("XADD")
            .arg(stream_key(&state.redis, &r.topic))
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
pub async fn relay_once(state: &OutboxState) -> anyhow::Result<usize> {
    let settings = &state.settings;
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
    state.metrics.published.inc_by(rows.len() as u64);
    Ok(rows.len())
}

/// True while a relay pass should take another batch: the last one came back full.
fn batch_was_full(published: usize, batch: i64) -> bool {
    published >= batch.max(1) as usize
}

/// Relays until a batch comes back short, then samples the lag gauges. The periodic job.
pub async fn relay_all(state: &OutboxState) -> anyhow::Result<usize> {
    let mut total = 0;
    loop {
        let n = relay_once(state).await?;
        total += n;
        if !batch_was_full(n, state.settings.relay_batch) {
            break;
        }
    }
    sample_lag(state).await?;
    Ok(total)
}

/// Sets `outbox_lag` (unpublished rows) and `outbox_oldest_unpublished_seconds`.
pub async fn sample_lag(state: &OutboxState) -> anyhow::Result<()> {
    let (count, age): (i64, f64) = sqlx::query_as(
        "SELECT count(*),
                COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0)::float8
           FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(&state.pool)
    .await
    .context("failed to measure outbox lag")?;
    state.metrics.lag.set(count);
    state.metrics.oldest_s.set(age);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::batch_was_full;

    #[test]
    fn a_pass_goes_on_only_after_a_full_batch() {
        assert!(batch_was_full(500, 500));
        assert!(!batch_was_full(499, 500));
        assert!(!batch_was_full(0, 500));
        // A batch setting below one claims one row at a time.
        assert!(batch_was_full(1, 0));
        assert!(!batch_was_full(0, -3));
    }
}
