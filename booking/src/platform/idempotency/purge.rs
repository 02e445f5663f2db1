//! The retention of idempotency keys: the purge job and its statement.

use super::{Idempotency, IdempotencySettings};
use sqlx::PgPool;

/// The retention job: deletes keys older than `[idempotency] retention_h`.
pub struct PurgeKeys(pub Idempotency);

#[async_trait::async_trait]
impl crate::platform::jobs::Job for PurgeKeys {
    fn name(&self) -> &'static str {
        "idempotency-purge"
    }

    fn period(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0.settings.purge_interval_ms.max(1000))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        purge_expired(&self.0.pool, &self.0.settings)
            .await
            .map(|_| ())
    }
}

/// Deletes up to `$2` keys older than `$1` hours: the locking sub-select as an `ARRAY(...)`
/// InitPlan, run once whatever the plan (docs/decisions.md, "Claims lock their batch once").
/// By `ctid` (the key has two columns): the rows are locked, so none can move before the
/// delete.
pub const PURGE_BATCH: &str = "DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
                 SELECT ctid FROM idempotency_keys
                  WHERE created_at < clock_timestamp() - make_interval(hours => $1)
                  LIMIT $2
                  FOR UPDATE SKIP LOCKED))";

/// Deletes keys older than the retention, in `FOR UPDATE SKIP LOCKED` batches (safe on many
/// instances). Returns the number deleted.
pub async fn purge_expired(pool: &PgPool, settings: &IdempotencySettings) -> anyhow::Result<u64> {
    use anyhow::Context;
    let hours = i32::try_from(settings.retention_h.max(24)).unwrap_or(24);
    let batch = settings.purge_batch.max(1);
    let mut total = 0;
    loop {
        let n = sqlx::query(PURGE_BATCH)
            .bind(hours)
            .bind(batch)
            .execute(pool)
            .await
            .context("failed to purge idempotency keys")?
            .rows_affected();
        total += n;
        if n < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(total);
        }
    }
}
