//! The statements of a GA hold: the hold transaction (usage, hold row, units from the
//! tier's shards), the tier's price, and the read that explains a refusal.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::take::{Attempt, begin_hold_tx, insert_hold, reserve_usage};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

type Result<T> = std::result::Result<T, InventoryError>;

pub(super) struct GaTaken {
    pub hold_id: String,
    pub expires_at: DateTime<Utc>,
}

/// One GA hold transaction: usage, hold row, then the units (fast path, then slow path).
pub(super) async fn take_units_tx(
    pool: &PgPool,
    async_commit: bool,
    event: &str,
    account: &str,
    tier: &str,
    qty: i32,
) -> Result<Attempt<GaTaken>> {
    let hold_id = shared::ids::new_id();
    let mut tx = begin_hold_tx(pool, async_commit).await?;
    if !reserve_usage(&mut tx, event, account, qty).await? {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Limit);
    }
    let Some(expires_at) = insert_hold(&mut tx, &hold_id, event, account, Some(tier), qty).await?
    else {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::NotOnSale);
    };
    let taken = if take_from_one_shard(&mut tx, &hold_id, event, tier, qty).await? {
        true
    } else {
        take_across_shards(&mut tx, &hold_id, event, tier, qty).await?
    };
    let t = GaTaken {
        hold_id,
        expires_at,
    };
    if !taken {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Short(t));
    }
    tx.commit().await.during("commit the hold")?;
    Ok(Attempt::Done(t))
}

/// Fast path: one free shard with enough units, starting from a random shard.
async fn take_from_one_shard(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
) -> Result<bool> {
    let start = rand::random_range(0..64i32);
    let shard: Option<i32> = sqlx::query_scalar(
        "WITH pick AS (
             SELECT shard FROM ga_counters
             WHERE event_id = $1 AND tier = $2 AND available >= $3
             ORDER BY (shard + 64 - $4) % 64
             LIMIT 1
             FOR UPDATE SKIP LOCKED),
         took AS (
             UPDATE ga_counters c SET available = c.available - $3
             FROM pick
             WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = pick.shard
             RETURNING c.shard)
         INSERT INTO hold_ga_items (hold_id, shard, quantity)
         SELECT $5, shard, $3 FROM took
         RETURNING shard",
    )
    .bind(event)
    .bind(tier)
    .bind(qty)
    .bind(start)
    .bind(hold_id)
    .fetch_optional(conn)
    .await
    .during("take the units from one shard")?;
    Ok(shard.is_some())
}

/// Slow path: lock every shard of the tier in shard order and take `qty` across them
/// (greedily, lowest shard first), all or nothing.
async fn take_across_shards(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
) -> Result<bool> {
    let parts: Vec<i32> = sqlx::query_scalar(
        "WITH locked AS (
             SELECT shard, available FROM ga_counters
             WHERE event_id = $1 AND tier = $2
             ORDER BY shard
             FOR UPDATE),
         plan AS (
             SELECT shard,
                    LEAST(available::bigint,
                          GREATEST(0, $3 - (sum(available) OVER (ORDER BY shard) - available)))::int
                        AS take
             FROM locked
             WHERE (SELECT sum(available) FROM locked) >= $3),
         took AS (
             UPDATE ga_counters c SET available = c.available - p.take
             FROM plan p
             WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = p.shard AND p.take > 0
             RETURNING c.shard, p.take)
         INSERT INTO hold_ga_items (hold_id, shard, quantity)
         SELECT $4, shard, take FROM took
         RETURNING quantity",
    )
    .bind(event)
    .bind(tier)
    .bind(qty)
    .bind(hold_id)
    .fetch_all(conn)
    .await
    .during("take the units across the tier's shards")?;
    Ok(parts.iter().map(|&q| i64::from(q)).sum::<i64>() == i64::from(qty))
}

/// The unit price of a GA tier.
pub(super) async fn tier_price(pool: &PgPool, event: &str, tier: &str) -> Result<i64> {
    sqlx::query_scalar("SELECT price FROM ga_tiers WHERE event_id = $1 AND tier = $2")
        .bind(event)
        .bind(tier)
        .fetch_one(pool)
        .await
        .during("read the GA tier's price")
}

/// The refusal when no units could be taken, from what is left (read after the rollback,
/// informational).
pub(super) async fn sold_out(pool: &PgPool, event: &str, tier: &str, qty: i32) -> InventoryError {
    let left: Result<Option<i64>> = sqlx::query_scalar(
        "SELECT sum(available)::bigint FROM ga_counters WHERE event_id = $1 AND tier = $2",
    )
    .bind(event)
    .bind(tier)
    .fetch_one(pool)
    .await
    .during("read the units left in the GA tier");
    match left {
        Err(e) => e,
        Ok(left) => shortfall(left, tier, qty),
    }
}

/// `left`: the tier's units summed over its shards, `None` when it has no shards (no such
/// tier). Some but too few left is SOLD_OUT with the number; none left is plain SOLD_OUT.
fn shortfall(left: Option<i64>, tier: &str, qty: i32) -> InventoryError {
    match left {
        None => InventoryError::UnknownTier {
            tier: tier.to_owned(),
        },
        Some(n) if n > 0 && n < i64::from(qty) => InventoryError::SoldOut { available: Some(n) },
        Some(_) => InventoryError::SoldOut { available: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_without_shards_does_not_exist() {
        assert!(matches!(
            shortfall(None, "floor", 2),
            InventoryError::UnknownTier { tier } if tier == "floor"
        ));
    }

    #[test]
    fn too_few_units_left_says_how_many() {
        assert!(matches!(
            shortfall(Some(3), "floor", 4),
            InventoryError::SoldOut { available: Some(3) }
        ));
        assert!(matches!(
            shortfall(Some(0), "floor", 4),
            InventoryError::SoldOut { available: None }
        ));
        // Enough left but every shard busy or spread too thin is still a plain SOLD_OUT.
        assert!(matches!(
            shortfall(Some(9), "floor", 4),
            InventoryError::SoldOut { available: None }
        ));
    }
}
