//! The statements of a GA hold: the hold transaction (usage, hold row, units from one shard
//! and the tier's price in ONE statement; units piecewise across shards only when no single
//! free shard has enough), and the read that explains a refusal.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::take::{Attempt, begin_hold_tx};
use chrono::{DateTime, Utc};
use sqlx::{Acquire, PgConnection, PgPool};

type Result<T> = std::result::Result<T, InventoryError>;

pub(super) struct GaTaken {
    pub hold_id: String,
    pub expires_at: DateTime<Utc>,
    /// The tier's unit price (`None` only when the tier does not exist, i.e. never taken).
    pub price: Option<i64>,
}

/// THE GA hold statement: the usage upsert, the hold row (only if the usage passed and the sale
/// has started), one shard with enough units decremented and recorded, and the tier's price.
/// Every part is conditional on the one before, so one round trip decides; the caller rolls
/// back when a part is missing. `bench/sql/ga_hold.sql` runs this text.
///
/// The shard: the first with enough units from a random start that no other transaction has
/// locked (`SKIP LOCKED`: passed over, never waited for). Only when every such shard is
/// locked at that instant (one shard under load, always) does the second branch run
/// (`UNION ALL` under `LIMIT 1` stops at the first row) and wait for ONE shard, the first
/// from the random start, holding no other shard lock meanwhile.
const HOLD_FROM_ONE_SHARD: &str = "
WITH usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, $2, $4 FROM events e
    WHERE e.id = $1 AND $4 <= e.max_tickets_per_account
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
    SELECT $5, e.id, $2, 'ga', $3, $4, clock_timestamp() + make_interval(secs => e.hold_ttl_s)
    FROM events e, usage
    WHERE e.id = $1 AND e.sale_start <= clock_timestamp()
    RETURNING expires_at),
pick AS (
    SELECT shard FROM (
        SELECT shard FROM ga_counters
        WHERE event_id = $1 AND tier = $3 AND available >= $4
        ORDER BY (shard + 64 - $6) % 64
        LIMIT 1
        FOR UPDATE SKIP LOCKED) free
    UNION ALL
    SELECT shard FROM (
        SELECT shard FROM ga_counters
        WHERE event_id = $1 AND tier = $3 AND available >= $4
        ORDER BY (shard + 64 - $6) % 64
        LIMIT 1
        FOR UPDATE) busy
    LIMIT 1),
took AS (
    UPDATE ga_counters c SET available = c.available - $4
    FROM pick, hold
    WHERE c.event_id = $1 AND c.tier = $3 AND c.shard = pick.shard
    RETURNING c.shard),
item AS (
    INSERT INTO hold_ga_items (hold_id, shard, quantity)
    SELECT $5, shard, $4 FROM took
    RETURNING shard)
SELECT EXISTS (SELECT 1 FROM usage),
       (SELECT expires_at FROM hold),
       (SELECT shard FROM item),
       (SELECT price FROM ga_tiers WHERE event_id = $1 AND tier = $3)";

/// Takes what one free shard (`SKIP LOCKED`) with units left can give, at most `$3`, in the
/// order of the hold statement (`$5`: the hold's random start), and records it.
const TAKE_SOME_FREE: &str = "
WITH pick AS (
    SELECT shard, available FROM ga_counters
    WHERE event_id = $1 AND tier = $2 AND available > 0
    ORDER BY (shard + 64 - $5) % 64
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
took AS (
    UPDATE ga_counters c SET available = c.available - LEAST(p.available, $3)
    FROM pick p
    WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = p.shard
    RETURNING c.shard, LEAST(p.available, $3) AS qty),
item AS (
    INSERT INTO hold_ga_items (hold_id, shard, quantity)
    SELECT $4, shard, qty FROM took)
SELECT qty FROM took";

/// The last resort of a multi-unit hold: the tier's shards that have units, locked in shard
/// order (waiting), the quantity split greedily in shard order, all or nothing.
/// `c.available >= p.take` guards against a plan made from a stale `available`: seen in
/// `ga_shards::ga_units_are_conserved_while_holds_of_mixed_sizes_race_releases` as a
/// `CHECK (available >= 0)` violation (a 500) when piecewise takes raced releases. A shard the
/// guard skips makes the sum short, and the caller rolls the hold back (`SOLD_OUT`).
const TAKE_ACROSS_IN_ORDER: &str = "
WITH locked AS (
    SELECT shard, available FROM ga_counters
    WHERE event_id = $1 AND tier = $2 AND available > 0
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
      AND c.available >= p.take
    RETURNING c.shard, p.take)
INSERT INTO hold_ga_items (hold_id, shard, quantity)
SELECT $4, shard, take FROM took
RETURNING quantity";

/// One GA hold transaction: the hold statement, and when no single free shard had the whole
/// quantity, the units piece by piece. Three round trips in the common case: begin, the
/// statement, commit.
pub(super) async fn take_units_tx(
    pool: &PgPool,
    async_commit: bool,
    event: &str,
    account: &str,
    tier: &str,
    qty: i32,
) -> Result<Attempt<GaTaken>> {
    let hold_id = shared::ids::new_id();
    let start = rand::random_range(0..64i32);
    let mut tx = begin_hold_tx(pool, async_commit).await?;
    // (usage passed, the hold's expiry: None before the sale, the shard, the tier's price)
    type Row = (bool, Option<DateTime<Utc>>, Option<i32>, Option<i64>);
    let (usage_ok, expires_at, shard, price): Row = sqlx::query_as(HOLD_FROM_ONE_SHARD)
        .bind(event)
        .bind(account)
        .bind(tier)
        .bind(qty)
        .bind(&hold_id)
        .bind(start)
        .fetch_one(&mut *tx)
        .await
        .during("take the GA hold")?;
    if !usage_ok {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Limit);
    }
    let Some(expires_at) = expires_at else {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::NotOnSale);
    };
    let t = GaTaken {
        hold_id,
        expires_at,
        price,
    };
    // No shard had the whole quantity: one unit is then sold out; more may be spread thin.
    if shard.is_none()
        && (qty == 1 || !take_piecewise(&mut tx, &t.hold_id, event, tier, qty, start).await?)
    {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Short(t));
    }
    tx.commit().await.during("commit the hold")?;
    Ok(Attempt::Done(t))
}

/// The rare path of a multi-unit hold: no shard had the whole quantity, so the stock is
/// spread thin (or was taken meanwhile). `false` when the tier has fewer than `qty` units left
/// (the caller rolls back).
///
/// What free shards give, one shard per statement (`SKIP LOCKED`), inside a savepoint. If that
/// does not add up (shards with units are busy), the savepoint gives it back and the shards
/// that have units are locked in shard order, all or nothing. A hold waits for shard locks only
/// while holding none (the hold statement) or in shard order (this, and the release), so shard
/// waits never form a cycle.
async fn take_piecewise(
    tx: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
    start: i32,
) -> Result<bool> {
    let mut sp = Acquire::begin(&mut *tx)
        .await
        .during("begin taking GA units piecewise")?;
    let mut left = qty;
    while left > 0 {
        match take_some_free(&mut sp, hold_id, event, tier, left, start).await? {
            Some(n) => left -= n,
            None => break,
        }
    }
    if left == 0 {
        sp.commit()
            .await
            .during("keep the GA units taken piecewise")?;
        return Ok(true);
    }
    sp.rollback()
        .await
        .during("give back GA units taken piecewise")?;
    let parts: Vec<i32> = sqlx::query_scalar(TAKE_ACROSS_IN_ORDER)
        .bind(event)
        .bind(tier)
        .bind(qty)
        .bind(hold_id)
        .fetch_all(&mut *tx)
        .await
        .during("take GA units across shards in order")?;
    Ok(parts.iter().map(|&q| i64::from(q)).sum::<i64>() == i64::from(qty))
}

/// [`TAKE_SOME_FREE`]: the units it took from one shard, `None` when it found none.
async fn take_some_free(
    conn: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    left: i32,
    start: i32,
) -> Result<Option<i32>> {
    sqlx::query_scalar(TAKE_SOME_FREE)
        .bind(event)
        .bind(tier)
        .bind(left)
        .bind(hold_id)
        .bind(start)
        .fetch_optional(conn)
        .await
        .during("take GA units from one shard")
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
