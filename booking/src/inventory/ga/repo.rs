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
/// has started), one shard with enough units (random start, `SKIP LOCKED`: a shard another
/// transaction is decrementing is passed over, never waited for) decremented and recorded,
/// and the tier's price. Every part is conditional on the one before, so one round trip
/// decides; the caller rolls back when a part is missing. `bench/sql/ga_*.sql` run this text.
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
    SELECT shard FROM ga_counters
    WHERE event_id = $1 AND tier = $3 AND available >= $4
    ORDER BY (shard + 64 - $6) % 64
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
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

/// Takes what one shard with units left can give (at most `$3`), in the same order as the
/// hold statement, and records it. `$5` is the hold's random start.
macro_rules! take_some {
    ($lock:literal) => {
        concat!(
            "WITH pick AS (
                 SELECT shard, available FROM ga_counters
                 WHERE event_id = $1 AND tier = $2 AND available > 0
                 ORDER BY (shard + 64 - $5) % 64
                 LIMIT 1
                 ",
            $lock,
            "),
             took AS (
                 UPDATE ga_counters c SET available = c.available - LEAST(p.available, $3)
                 FROM pick p
                 WHERE c.event_id = $1 AND c.tier = $2 AND c.shard = p.shard
                 RETURNING c.shard, LEAST(p.available, $3) AS qty),
             item AS (
                 INSERT INTO hold_ga_items (hold_id, shard, quantity)
                 SELECT $4, shard, qty FROM took
                 ON CONFLICT (hold_id, shard)
                     DO UPDATE SET quantity = hold_ga_items.quantity + EXCLUDED.quantity)
             SELECT qty FROM took"
        )
    };
}
/// Never waits: a locked shard is skipped.
const TAKE_SOME_FREE: &str = take_some!("FOR UPDATE SKIP LOCKED");
/// Waits for ONE shard (the first with units left from the random start).
const TAKE_SOME_WAITING: &str = take_some!("FOR UPDATE");

/// The last resort of a multi-unit hold: the tier's shards that have units, locked in shard
/// order (waiting), the quantity split greedily in shard order, all or nothing.
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
    let (usage_ok, expires_at, shard, price): (bool, Option<DateTime<Utc>>, Option<i32>, Option<i64>) =
        sqlx::query_as(HOLD_FROM_ONE_SHARD)
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
    if shard.is_none() && !take_piecewise(&mut *tx, &t.hold_id, event, tier, qty, start).await? {
        tx.rollback().await.during("roll back a refused hold")?;
        return Ok(Attempt::Short(t));
    }
    tx.commit().await.during("commit the hold")?;
    Ok(Attempt::Done(t))
}

/// The rare path: no free shard had the whole quantity (the stock is spread thin, or every
/// shard with enough is busy). `false` when the tier has fewer than `qty` units left (the
/// caller rolls back).
///
/// - One unit: wait for ONE shard with units (the first from the random start). The hold
///   holds no other shard lock while it waits.
/// - More: one free shard at a time (`SKIP LOCKED`, each statement one row), inside a
///   savepoint. If the free shards do not add up, the savepoint gives back what they gave and
///   the shards with units are locked in shard order. Only waits in shard order (this, and
///   the release, which locks a hold's shards in shard order) while holding shard locks, so
///   two holds never wait for each other's shards in a cycle.
async fn take_piecewise(
    tx: &mut PgConnection,
    hold_id: &str,
    event: &str,
    tier: &str,
    qty: i32,
    start: i32,
) -> Result<bool> {
    if qty == 1 {
        return Ok(take_some(tx, TAKE_SOME_WAITING, hold_id, event, tier, 1, start)
            .await?
            .is_some());
    }
    let mut sp = Acquire::begin(&mut *tx)
        .await
        .during("begin taking GA units piecewise")?;
    let mut left = qty;
    while left > 0 {
        match take_some(&mut sp, TAKE_SOME_FREE, hold_id, event, tier, left, start).await? {
            Some(n) => left -= n,
            None => break,
        }
    }
    if left == 0 {
        sp.commit().await.during("keep the GA units taken piecewise")?;
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

/// One `take_some!` statement: the units it took from one shard, `None` when it found none.
async fn take_some(
    conn: &mut PgConnection,
    sql: &'static str,
    hold_id: &str,
    event: &str,
    tier: &str,
    left: i32,
    start: i32,
) -> Result<Option<i32>> {
    sqlx::query_scalar(sql)
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
