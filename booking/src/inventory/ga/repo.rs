//! The statements of a GA hold: ONE autocommit statement (units from one free shard, usage,
//! hold row and the tier's price, all or nothing; waiting for a shard, or taking units across
//! shards, only when that found none), and the read that explains a refusal.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::take::Attempt;
use crate::platform::kept::KeptPool;
use chrono::{DateTime, Utc};

type Result<T> = std::result::Result<T, InventoryError>;

pub(super) struct GaTaken {
    pub hold_id: String,
    pub expires_at: DateTime<Utc>,
    /// The tier's unit price (`None` only when the tier does not exist, i.e. never taken).
    pub price: Option<i64>,
    /// The account's checkout end with this hold (`platform::session_until`).
    pub live_until_ms: i64,
}

// How the hold statements lock shards, and why they cannot deadlock. A row lock that a
// `FOR UPDATE` (or an `UPDATE`) took stays until the transaction ends even when the row then
// fails its condition (it was changed meanwhile and has too few units left), so a statement
// that waited or skipped its way through several shards may hold locks on shards it did not
// use. The rule: a transaction waits for a shard only while it holds no other shard of the
// tier, or only lower ones (shard order, like the release, the expiry and the sale). So each
// way of taking units below is its own transaction, and only the first (which never waits) is
// used under normal load. Before this, the hold statement skipped through locked shards and
// then waited for one in its random order while keeping the skipped-through locks: two holds
// could each keep the shard the other waited for. Postgres found the cycle after
// `deadlock_timeout` (1 s), and after four such retries a fan got 503
// (`ga::ga_mixed_quantities_never_exceed_capacity`, CI; `ga_shards::no_deadlock_*`).

/// The second part of every GA hold statement, after the way's `got` (the shards to take
/// from, locked, and how many units from each): the usage upsert (only if `got` has the units,
/// the sale has started and the limit allows it), the hold row (only with the usage), the
/// units taken from the locked shards (only with the hold) and their allocation. So either
/// all of it is written or nothing is, and the statement needs no transaction around it.
/// Locks are taken shards → usage, the order of every release and expiry. `$1` event,
/// `$2` account, `$3` tier, `$4` quantity, `$5` hold id, `$6` the hold's random start shard.
///
/// `took` has no `available >= take` guard: `got`'s rows are locked by this statement and were
/// re-checked after the lock, and a shortfall must fail the whole statement
/// (`CHECK (available >= 0)`) rather than commit a hold with fewer units than its quantity.
///
/// `took` sets the count from `got.available`, the locked row's count, not from its own read
/// of the row: that read is the statement's snapshot, and when a return refilled the row after
/// the snapshot (1 unit then, 2 once locked) Postgres checks `CHECK (available >= 0)` against
/// the snapshot's row minus the take (-1) BEFORE it finds the newer version, and fails the
/// statement. Nothing can change the row between the lock and the update (the lock is this
/// statement's), so the locked count is the row's count.
/// (`ga_shards::a_hold_waiting_for_a_shard_a_return_refills_takes_what_it_finds`)
macro_rules! usage_hold_and_units {
    () => {
        "
usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, $2, $4 FROM events e
    WHERE e.id = $1 AND $4 <= e.max_tickets_per_account
      AND e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
      AND (SELECT sum(take) FROM got) = $4
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
    SELECT $5, e.id, $2, 'ga', $3, $4, clock_timestamp() + make_interval(secs => e.hold_ttl_s)
    FROM events e, usage
    WHERE e.id = $1
    RETURNING expires_at),
took AS (
    UPDATE ga_counters c SET available = g.available - g.take
    FROM got g, hold
    WHERE c.event_id = $1 AND c.tier = $3 AND c.shard = g.shard AND g.take > 0
    RETURNING c.shard, g.take),
item AS (
    INSERT INTO hold_ga_items (hold_id, shard, quantity)
    SELECT $5, shard, take FROM took
    RETURNING quantity)"
    };
}

/// The last part of every GA hold statement but its last column: the hold's expiry (`None`:
/// nothing written), the units taken, the tier's price; when nothing was taken, the tier's
/// units and the most on one shard, as the statement's snapshot saw them; whether the sale
/// has started (`None`: no such event) and whether the limit allows the quantity (snapshot
/// reads, to explain a refusal); whether `got` found the units; then the account's checkout
/// end (`platform::session_until`).
macro_rules! hold_outcome {
    () => {
        "
SELECT (SELECT expires_at FROM hold),
       (SELECT sum(quantity)::int FROM item),
       (SELECT price FROM ga_tiers WHERE event_id = $1 AND tier = $3),
       CASE WHEN NOT EXISTS (SELECT 1 FROM item) THEN
           (SELECT sum(available)::bigint FROM ga_counters WHERE event_id = $1 AND tier = $3)
       END,
       CASE WHEN NOT EXISTS (SELECT 1 FROM item) THEN
           (SELECT max(available) FROM ga_counters WHERE event_id = $1 AND tier = $3)
       END,
       (SELECT e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
          FROM events e WHERE e.id = $1),
       (SELECT COALESCE(a.tickets, 0) + $4 <= e.max_tickets_per_account
          FROM events e LEFT JOIN account_event_usage a
            ON a.event_id = e.id AND a.account_id = $2
         WHERE e.id = $1),
       COALESCE((SELECT sum(take) FROM got) = $4, false),
       "
    };
}

/// THE GA hold statement, the one that runs under normal load: one shard with enough units,
/// then the usage, the hold row, the units and their allocation, and the tier's price; every
/// part conditional on the one before, so one round trip decides, and nothing is written
/// unless everything is. `bench/sql/ga_hold.sql` runs this text.
///
/// The shard: the first with enough units from a random start that no other transaction has
/// locked (`SKIP LOCKED`: passed over, never waited for). A tier of ONE shard has nothing to
/// skip to, so there (and only there: the statement then locks no other shard) the second
/// branch waits for it (`UNION ALL` under `LIMIT 1` stops at the first row).
const HOLD_FROM_A_FREE_SHARD: &str = concat!(
    "
WITH got AS (
    SELECT shard, available, $4::int AS take FROM (
        SELECT shard, available FROM ga_counters
        WHERE event_id = $1 AND tier = $3 AND available >= $4
        ORDER BY (shard + 64 - $6) % 64
        LIMIT 1
        FOR UPDATE SKIP LOCKED) free
    UNION ALL
    SELECT shard, available, $4::int FROM (
        SELECT shard, available FROM ga_counters
        WHERE event_id = $1 AND tier = $3 AND available >= $4
          AND NOT EXISTS (SELECT 1 FROM ga_counters o
                          WHERE o.event_id = $1 AND o.tier = $3 AND o.shard <> 0)
        FOR UPDATE) only_shard
    LIMIT 1),",
    usage_hold_and_units!(),
    hold_outcome!(),
    crate::live_until_ms_sql!("$2", "$1", "(SELECT expires_at FROM hold)", "NULL")
);

/// Every shard with enough units was locked by another hold: wait for ONE of them (the first
/// from the random start, as the snapshot saw it). The lock names one row, so it waits for
/// one lock while holding no other shard; if that shard has too few units by the time it is
/// ours, nothing is taken (or written).
const HOLD_WAITING_FOR_ONE_SHARD: &str = concat!(
    "
WITH pick AS (
    SELECT shard FROM ga_counters
    WHERE event_id = $1 AND tier = $3 AND available >= $4
    ORDER BY (shard + 64 - $6) % 64
    LIMIT 1),
got AS (
    SELECT c.shard, c.available, $4::int AS take FROM ga_counters c, pick
    WHERE c.event_id = $1 AND c.tier = $3 AND c.shard = pick.shard AND c.available >= $4
    FOR UPDATE OF c),",
    usage_hold_and_units!(),
    hold_outcome!(),
    crate::live_until_ms_sql!("$2", "$1", "(SELECT expires_at FROM hold)", "NULL")
);

/// The last resort, and the definitive answer: the tier's shards that have units, locked in
/// shard order (waiting), the quantity split greedily in shard order, all or nothing. Runs
/// when no single shard has the whole quantity (the stock is spread thin) or the shard waited
/// for was drained meanwhile. The locked rows are their latest versions, so the plan is exact.
const HOLD_ACROSS_SHARDS_IN_ORDER: &str = concat!(
    "
WITH locked AS (
    SELECT shard, available FROM ga_counters
    WHERE event_id = $1 AND tier = $3 AND available > 0
    ORDER BY shard
    FOR UPDATE),
got AS (
    SELECT shard, available,
           LEAST(available::bigint,
                 GREATEST(0, $4 - (sum(available) OVER (ORDER BY shard) - available)))::int
               AS take
    FROM locked
    WHERE (SELECT sum(available) FROM locked) >= $4),",
    usage_hold_and_units!(),
    hold_outcome!(),
    crate::live_until_ms_sql!("$2", "$1", "(SELECT expires_at FROM hold)", "NULL")
);

/// The ways of taking units, in the order they are tried; each is one transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    FreeShard,
    WaitForOne,
    AcrossInOrder,
}

impl Way {
    fn statement(self) -> &'static str {
        match self {
            Way::FreeShard => HOLD_FROM_A_FREE_SHARD,
            Way::WaitForOne => HOLD_WAITING_FOR_ONE_SHARD,
            Way::AcrossInOrder => HOLD_ACROSS_SHARDS_IN_ORDER,
        }
    }

    /// What to try after this way took nothing, from what its snapshot saw (`left`: the
    /// tier's units, `most`: the most on one shard); `None` when the tier is sold out for
    /// this quantity.
    fn next(self, qty: i32, left: Option<i64>, most: Option<i32>) -> Option<Way> {
        let qty64 = i64::from(qty);
        if left.unwrap_or(0) < qty64 || self == Way::AcrossInOrder {
            return None;
        }
        match self {
            // A shard had enough but every such shard was locked: wait for one.
            Way::FreeShard if most.unwrap_or(0) >= qty => Some(Way::WaitForOne),
            // Spread thinner than the quantity, or the shard waited for was drained.
            _ => Some(Way::AcrossInOrder),
        }
    }
}

/// A GA hold: the ways of taking units in turn, each ONE autocommit statement that writes all
/// of a hold or nothing. Under normal load the first decides.
pub(super) async fn take_units_tx(
    pool: &KeptPool,
    event: &str,
    account: &str,
    tier: &str,
    qty: i32,
) -> Result<Attempt<GaTaken, ()>> {
    let start = rand::random_range(0..64i32);
    let mut way = Way::FreeShard;
    loop {
        let hold_id = shared::ids::new_id();
        type Row = (
            Option<DateTime<Utc>>,
            Option<i32>,
            Option<i64>,
            Option<i64>,
            Option<i32>,
            Option<bool>,
            Option<bool>,
            bool,
            i64,
        );
        let (expires_at, took, price, left, most, on_sale, limit_ok, found, live_until_ms): Row =
            sqlx::query_as(way.statement())
                .bind(event)
                .bind(account)
                .bind(tier)
                .bind(qty)
                .bind(&hold_id)
                .bind(start)
                .fetch_one(pool)
                .await
                .during("take the GA hold")?;
        if let Some(expires_at) = expires_at {
            if took != Some(qty) {
                // Cannot happen: the units come from rows this statement locked.
                tracing::error!(
                    hold_id,
                    ?took,
                    qty,
                    "a GA hold took other than its quantity"
                );
            }
            return Ok(Attempt::Done(GaTaken {
                hold_id,
                expires_at,
                price,
                live_until_ms,
            }));
        }
        // Nothing was written. Why, in the order the checks mean to the fan.
        match (on_sale, limit_ok) {
            // No such event: the limit read says so (`limit_refusal`).
            (None, _) | (_, Some(false) | None) => return Ok(Attempt::Limit),
            (Some(false), _) => return Ok(Attempt::NotOnSale),
            // The units were there but the usage row (locked after the snapshot) had moved
            // on: a concurrent hold of the same account took the room.
            _ if found => return Ok(Attempt::Limit),
            _ => {}
        }
        match way.next(qty, left, most) {
            Some(next) => way = next,
            None => return Ok(Attempt::Short(())),
        }
    }
}

/// The refusal when no units could be taken, from what is left (read after the rollback,
/// informational).
pub(super) async fn sold_out(pool: &KeptPool, event: &str, tier: &str, qty: i32) -> InventoryError {
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
