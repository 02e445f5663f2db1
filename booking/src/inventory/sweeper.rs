//! Expired-hold sweeper.
//!
//! Guarantees: every `active` hold past `expires_at` (database clock) is ended exactly once,
//! by whoever flips its status first (this sweeper on any instance, the hold statement that
//! reclaims its seats, or the fan's own next hold); its seats, GA units and usage go back in
//! the same transaction. Batches are claimed with `FOR UPDATE SKIP LOCKED`, so any number of
//! sweepers run side by side without waiting on or double-processing each other.
//!
//! Only `active` holds are swept: an `ordered` hold belongs to its order, and the order-expiry
//! job ends it (`holds::release_hold_tx(.., &["ordered"], "expired")`).
//!
//! Correctness never depends on the sweeper: a seat whose hold has expired is already
//! available to the hold statement. Sweeping keeps the table tidy and returns GA units and
//! usage, which nothing else reclaims.

use crate::app::state::AppState;
use crate::inventory::holds::{EndedHold, release_resources};
use anyhow::Context;
use sqlx::PgPool;

/// Sweeps until no expired active hold is left (or only ones other sweepers hold).
pub async fn sweep_all(state: &AppState) -> anyhow::Result<u64> {
    let batch = state.config.booking.sweeper_batch.max(1);
    let mut total = 0;
    loop {
        let ended = sweep_batch(&state.pool, batch).await?;
        for h in &ended {
            state
                .metrics
                .holds_expired
                .with_label_values(&[h.kind.as_str()])
                .inc();
        }
        total += ended.len() as u64;
        if (ended.len() as i64) < batch {
            return Ok(total);
        }
    }
}

/// Sweeps ONE batch of at most `batch` holds; returns how many it expired.
pub async fn sweep_once(pool: &PgPool, batch: i64) -> anyhow::Result<u64> {
    Ok(sweep_batch(pool, batch).await?.len() as u64)
}

async fn sweep_batch(pool: &PgPool, batch: i64) -> anyhow::Result<Vec<EndedHold>> {
    crate::platform::db::retry(1, || async {
        let mut tx = pool.begin().await?;
        let ended: Vec<EndedHold> = sqlx::query_as(
            "WITH expired AS (
                 SELECT id FROM holds
                 WHERE status = 'active' AND expires_at <= clock_timestamp()
                 ORDER BY expires_at, id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
             UPDATE holds h SET status = 'expired'
             FROM expired e
             WHERE h.id = e.id
             RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        if !ended.is_empty() {
            release_resources(&mut tx, &ended).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(ended)
    })
    .await
    .context("failed to sweep expired holds")
}

/// Expires one account's own expired active holds for an event (what the sweeper would do),
/// so a fan whose earlier hold ran out is not refused by the ticket limit until the next
/// sweep. Returns how many holds it ended.
///
/// Waits (plain `FOR UPDATE`, not `SKIP LOCKED`) when a sweeper is expiring the same hold at
/// that moment: skipping it would return before the sweeper's commit gave the usage back, and
/// the fan's retry would be refused `LIMIT_EXCEEDED` for nothing. Locks in the sweeper's order
/// (`expires_at, id`), so the two never deadlock; the set is one account's few holds.
pub(crate) async fn expire_account_holds(
    pool: &PgPool,
    event: &str,
    account: &str,
) -> sqlx::Result<u64> {
    crate::platform::db::retry(1, || async {
        let mut tx = pool.begin().await?;
        let ended: Vec<EndedHold> = sqlx::query_as(
            "UPDATE holds h SET status = 'expired'
             WHERE h.id IN (
                 SELECT id FROM holds
                 WHERE event_id = $1 AND account_id = $2 AND status = 'active'
                   AND expires_at <= clock_timestamp()
                 ORDER BY expires_at, id
                 FOR UPDATE)
             RETURNING h.id, h.event_id, h.account_id, h.kind, h.quantity",
        )
        .bind(event)
        .bind(account)
        .fetch_all(&mut *tx)
        .await?;
        if !ended.is_empty() {
            release_resources(&mut tx, &ended).await?;
        }
        tx.commit().await?;
        Ok(ended.len() as u64)
    })
    .await
}
