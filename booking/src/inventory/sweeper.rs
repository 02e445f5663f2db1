//! Expired-hold sweeper.
//!
//! Guarantees: every `active` hold past `expires_at` (database clock) is ended exactly once,
//! by whoever flips its status first (this sweeper on any instance, the hold statement that
//! reclaims its seats, or the fan's own next hold); its seats, GA units and usage go back in
//! the same transaction. Batches are claimed with `FOR UPDATE SKIP LOCKED`, so any number of
//! sweepers run side by side without waiting on or double-processing each other.
//!
//! Only `active` holds are swept: an `ordered` hold belongs to its order, and the order-expiry
//! job ends it (`holds::release_hold_tx(.., &[HoldStatus::Ordered], HoldStatus::Expired)`).
//!
//! Correctness never depends on the sweeper: a seat whose hold has expired is already
//! available to the hold statement. Sweeping keeps the table tidy and returns GA units and
//! usage, which nothing else reclaims.

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::repo::{EndedHold, release_resources};
use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use prometheus::IntCounterVec;
use sqlx::PgPool;
use std::time::Duration;

/// The sweeper as a [`Job`]: every `sweeper_interval_ms` (at least 100 ms), sweep until no
/// expired active hold is left.
pub struct HoldSweeper {
    pool: PgPool,
    batch: i64,
    every: Duration,
    /// `holds_expired_total`, by kind.
    expired: IntCounterVec,
}

impl HoldSweeper {
    pub fn new(state: &InventoryState) -> Self {
        Self {
            pool: state.pool.clone(),
            batch: state.settings.sweeper_batch.max(1),
            every: Duration::from_millis(state.settings.sweeper_interval_ms.max(100)),
            expired: state.metrics.holds_expired.clone(),
        }
    }

    /// Sweeps until no expired active hold is left (or only ones other sweepers hold);
    /// returns how many holds it expired.
    pub async fn sweep_all(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        loop {
            let ended = sweep_batch(&self.pool, self.batch).await?;
            for h in &ended {
                self.expired.with_label_values(&[h.kind.as_str()]).inc();
            }
            total += ended.len() as u64;
            if (ended.len() as i64) < self.batch {
                return Ok(total);
            }
        }
    }
}

#[async_trait]
impl Job for HoldSweeper {
    fn name(&self) -> &'static str {
        "hold-sweeper"
    }

    fn period(&self) -> Duration {
        self.every
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        self.sweep_all().await.map(drop)
    }
}

/// Sweeps until no expired active hold is left, with the state's batch size and metrics.
pub async fn sweep_all(state: &InventoryState) -> anyhow::Result<u64> {
    HoldSweeper::new(state).sweep_all().await
}

/// Sweeps ONE batch of at most `batch` holds; returns how many it expired.
pub async fn sweep_once(pool: &PgPool, batch: i64) -> anyhow::Result<u64> {
    Ok(sweep_batch(pool, batch).await?.len() as u64)
}

/// Expires up to `$1` active holds whose time is up, oldest first. `now()` (the transaction's
/// start: this is its first statement) rather than `clock_timestamp()`, which is volatile and
/// so cannot bound an index scan: each sweep would read every live hold's entry of
/// `holds_sweep` to find the expired ones. `kind IN (...)` is always true; it names the
/// predicate of `holds_sweep`, which only this statement may use (migration 0014).
/// The sub-select is an `ARRAY(...)` InitPlan, run once whatever the plan (docs/decisions.md,
/// "Claims lock their batch once").
pub const SWEEP_SQL: &str = "UPDATE holds h SET status = 'expired'
      WHERE h.id = ANY (ARRAY(
            SELECT id FROM holds
             WHERE status = 'active' AND kind IN ('seats', 'ga') AND expires_at <= now()
             ORDER BY expires_at, id
             LIMIT $1
             FOR UPDATE SKIP LOCKED))
     RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity";

async fn sweep_batch(pool: &PgPool, batch: i64) -> anyhow::Result<Vec<EndedHold>> {
    crate::platform::db::retry(1, || async {
        let mut tx = pool.begin().await.during("begin a sweep batch")?;
        let ended: Vec<EndedHold> = sqlx::query_as(SWEEP_SQL)
            .bind(batch)
            .fetch_all(&mut *tx)
            .await
            .during("expire a batch of expired active holds")?;
        if !ended.is_empty() {
            release_resources(&mut tx, &ended)
                .await
                .during("release what the expired holds held")?;
        }
        tx.commit().await.during("commit a sweep batch")?;
        Ok::<_, InventoryError>(ended)
    })
    .await
    .context("failed to sweep expired holds")
}
