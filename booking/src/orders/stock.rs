//! A SKU's stock split over shard rows (`inventory (sku, shard)`, issue 16): the statements
//! that take, move and read it. One row would serialise every order of a hot SKU behind its
//! row lock and commit flush; with `stock_shards` rows, orders on different rows commit in
//! parallel.
//!
//! Guarantees:
//! - Every row keeps `CHECK (available >= 0)`, and every statement moves units between
//!   columns or rows of the same SKU, so the SKU's total (available + reserved + sold +
//!   held_back, summed over its rows) never changes except by an admin's stock update.
//! - An order line takes its units from one row in one statement (rows in random order,
//!   locked rows skipped); only when no row alone can serve it does it lock all the SKU's
//!   rows (in shard order) and take from their sum, so it is refused only when the sum is
//!   short. What it took is recorded per row in `order_stock`, and payment, expiry,
//!   cancellation and refund move exactly those units on exactly those rows.
//! - A row that an order empties is refilled from the fullest other row (half of it, rows
//!   busy elsewhere skipped); the slow path spreads whatever is left evenly. Units are only
//!   ever moved, never created or dropped.

use crate::orders::model::Shortage;
use crate::orders::repo::{During, OrderError};
use crate::platform::kept::Lease;
use sqlx::PgConnection;
use std::collections::BTreeMap;

/// Most rows one SKU's stock may be split over (the `products.stock_shards` CHECK).
pub const MAX_STOCK_SHARDS: i32 = 64;

/// How an order transaction takes each line's units; a way that cannot serve every line makes
/// the caller roll back and run the order again with [`StockWay::next`].
///
/// Why not all in one transaction: a row lock taken by `FOR UPDATE` stays until the
/// transaction ends even when the row then fails its condition, so a statement that skipped or
/// waited its way through several rows may keep rows it did not use. Waiting for a row while
/// keeping others out of (sku, shard) order is how two orders deadlock (each a second of
/// `deadlock_timeout`; the first version of this split did exactly that and, with 400
/// concurrent buyers, orders queued for over 20 s). So a transaction waits for a stock row
/// only while it holds rows of lower SKUs alone, or (the last way) in (sku, shard) order, as
/// payment, expiry, cancellation, refunds and the admin's reshaping lock them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StockWay {
    /// Each line from one row with enough units that no one else has locked (`SKIP LOCKED`);
    /// never waits, except for the only row of a one-row SKU.
    FreeRow,
    /// Each line waits for ONE row with enough units (every such row was busy).
    WaitForOne,
    /// Each line from the sum of its SKU's rows, all locked in shard order: the definitive
    /// answer (a shortage here is real).
    AcrossInOrder,
}

impl StockWay {
    pub fn next(self) -> StockWay {
        match self {
            StockWay::FreeRow => StockWay::WaitForOne,
            StockWay::WaitForOne | StockWay::AcrossInOrder => StockWay::AcrossInOrder,
        }
    }
}

/// Reserves every line (SKU → quantity) of order `order_id` inside the caller's transaction:
/// `available -= q, reserved += q` on the shard rows it takes from, recorded in
/// `order_stock`. Lines go in SKU order (so carts sharing SKUs lock in one order). Errors,
/// with earlier lines already reserved (the caller must roll back): [`OrderError::StockBusy`]
/// when this way could not serve a line (run the order again with `way.next()`), and
/// [`OrderError::Shortage`] from [`StockWay::AcrossInOrder`].
pub async fn reserve_stock_tx(
    conn: &mut PgConnection,
    order_id: &str,
    lines: &BTreeMap<String, i64>,
    way: StockWay,
) -> Result<(), OrderError> {
    for (sku, &q) in lines {
        reserve_line(conn, order_id, sku, q, way).await?;
    }
    Ok(())
}

async fn reserve_line(
    conn: &mut PgConnection,
    order_id: &str,
    sku: &str,
    q: i64,
    way: StockWay,
) -> Result<(), OrderError> {
    let available = if way == StockWay::AcrossInOrder {
        if take_from_sum(conn, order_id, sku, q).await? {
            return Ok(());
        }
        // Still holding every row's lock: the sum is exact.
        sqlx::query_scalar("SELECT sum(available)::bigint FROM inventory WHERE sku = $1")
            .bind(sku)
            .fetch_one(&mut *conn)
            .await
            .during("read the remaining stock after a shortage")?
    } else {
        match take_from_one(conn, order_id, sku, q, way).await? {
            (Some(taken), _) => return refill_if_dry(conn, sku, taken).await,
            // Enough units over the rows, just none free (or not on one row): next way.
            (None, Some(sum)) if sum >= q => return Err(OrderError::StockBusy),
            // Short as the statement saw it: sold out now beats two more transactions.
            (None, sum) => sum,
        }
    };
    Err(match available {
        Some(a) => OrderError::Shortage {
            sku: sku.to_owned(),
            requested: q,
            shortage: Shortage::of(a),
        },
        None => OrderError::UnknownSku(sku.to_owned()),
    })
}

/// A row the order took from and what it has left.
struct Taken {
    shard: i32,
    left: i64,
}

/// Takes `q` units from one row that has them, rows in random order. [`StockWay::FreeRow`]
/// skips rows locked by others (and waits only for the only row of a one-row SKU: nothing
/// else of this SKU can be held then); [`StockWay::WaitForOne`] picks one row with enough from
/// the statement's snapshot and waits for that row alone, taking nothing if it has too few
/// units once locked. Returns what it took, or `None` and the SKU's units summed over its rows
/// as the statement saw them (`None` for a SKU without rows).
async fn take_from_one(
    conn: &mut PgConnection,
    order_id: &str,
    sku: &str,
    q: i64,
    way: StockWay,
) -> Result<(Option<Taken>, Option<i64>), OrderError> {
    // `took` counts from `pick.available`, the locked row's count: Postgres checks
    // `CHECK (available >= 0)` on the snapshot's row minus `$2` before it finds a newer
    // version, which a return may have refilled after the snapshot (`ga::repo`'s `took`).
    const FREE: &str = "WITH pick AS (
             SELECT shard, available FROM (
                 SELECT shard, available FROM inventory
                  WHERE sku = $1 AND available >= $2
                  ORDER BY random() LIMIT 1
                  FOR UPDATE SKIP LOCKED) free
             UNION ALL
             SELECT shard, available FROM (
                 SELECT shard, available FROM inventory
                  WHERE sku = $1 AND available >= $2
                    AND NOT EXISTS (SELECT 1 FROM inventory o WHERE o.sku = $1 AND o.shard <> 0)
                  FOR UPDATE) only_row
             LIMIT 1),
         took AS (
             UPDATE inventory i SET available = pick.available - $2, reserved = i.reserved + $2
               FROM pick WHERE i.sku = $1 AND i.shard = pick.shard
             RETURNING i.shard, i.available),
         ins AS (
             INSERT INTO order_stock (order_id, sku, shard, quantity)
             SELECT $3, $1, shard, $2 FROM took
             RETURNING shard)
         SELECT (SELECT shard FROM ins), (SELECT available FROM took),
                CASE WHEN NOT EXISTS (SELECT 1 FROM took)
                     THEN (SELECT sum(available)::bigint FROM inventory WHERE sku = $1) END";
    const WAIT_FOR_ONE: &str = "WITH pick AS (
             SELECT shard FROM inventory
              WHERE sku = $1 AND available >= $2
              ORDER BY random() LIMIT 1),
         took AS (
             UPDATE inventory i SET available = i.available - $2, reserved = i.reserved + $2
               FROM pick WHERE i.sku = $1 AND i.shard = pick.shard AND i.available >= $2
             RETURNING i.shard, i.available),
         ins AS (
             INSERT INTO order_stock (order_id, sku, shard, quantity)
             SELECT $3, $1, shard, $2 FROM took
             RETURNING shard)
         SELECT (SELECT shard FROM ins), (SELECT available FROM took),
                CASE WHEN NOT EXISTS (SELECT 1 FROM took)
                     THEN (SELECT sum(available)::bigint FROM inventory WHERE sku = $1) END";
    let sql = if way == StockWay::FreeRow {
        FREE
    } else {
        WAIT_FOR_ONE
    };
    let (shard, left, sum): (Option<i32>, Option<i64>, Option<i64>) = sqlx::query_as(sql)
        .bind(sku)
        .bind(q)
        .bind(order_id)
        .fetch_one(&mut *conn)
        .await
        .during("reserve a cart line's stock from one shard")?;
    let taken = shard.zip(left).map(|(shard, left)| Taken { shard, left });
    Ok((taken, sum))
}

/// The row an order just emptied (still locked by this transaction) gets half of the fullest
/// other row's units, skipping rows locked elsewhere and rows above the product's shard
/// count (retired rows are not refilled). Nothing to do while the row has units left. The
/// donor's new count comes from its locked count, not the snapshot's (see `FREE`).
async fn refill_if_dry(conn: &mut PgConnection, sku: &str, t: Taken) -> Result<(), OrderError> {
    if t.left > 0 {
        return Ok(());
    }
    sqlx::query(
        "WITH donor AS (
             SELECT shard, available FROM inventory
              WHERE sku = $1 AND shard <> $2 AND available >= 2
                AND $2 < (SELECT stock_shards FROM products WHERE sku = $1)
              ORDER BY available DESC LIMIT 1
              FOR UPDATE SKIP LOCKED),
         gave AS (
             UPDATE inventory i SET available = d.available - d.available / 2
               FROM donor d WHERE i.sku = $1 AND i.shard = d.shard
             RETURNING d.available / 2 AS moved)
         UPDATE inventory i SET available = i.available + g.moved
           FROM gave g WHERE i.sku = $1 AND i.shard = $2",
    )
    .bind(sku)
    .bind(t.shard)
    .execute(&mut *conn)
    .await
    .during("refill an emptied stock shard from the fullest")?;
    Ok(())
}

/// After a one-statement order emptied row `shard` of `sku` (its own transaction, committed):
/// the row gets half of the fullest other row's units, as [`refill_if_dry`] does inside the
/// order's transaction. It waits for no lock: the emptied row is skipped when someone else has
/// it locked (an order refilling it, an admin reshaping), and so are busy donors. Units only
/// move between two rows of one SKU, in one statement.
pub async fn refill_emptied(
    conn: &mut PgConnection,
    sku: &str,
    shard: i32,
) -> Result<(), OrderError> {
    sqlx::query(
        "WITH dry AS (
             SELECT shard FROM inventory
              WHERE sku = $1 AND shard = $2 AND available = 0
                AND $2 < (SELECT stock_shards FROM products WHERE sku = $1)
              FOR UPDATE SKIP LOCKED),
         donor AS (
             SELECT i.shard, i.available FROM inventory i, dry
              WHERE i.sku = $1 AND i.shard <> $2 AND i.available >= 2
              ORDER BY i.available DESC LIMIT 1
              FOR UPDATE OF i SKIP LOCKED),
         gave AS (
             UPDATE inventory i SET available = d.available - d.available / 2
               FROM donor d WHERE i.sku = $1 AND i.shard = d.shard
             RETURNING d.available / 2 AS moved)
         UPDATE inventory i SET available = i.available + g.moved
           FROM gave g WHERE i.sku = $1 AND i.shard = $2",
    )
    .bind(sku)
    .bind(shard)
    .execute(&mut *conn)
    .await
    .during("refill a stock shard a one-statement order emptied")?;
    Ok(())
}

/// [`refill_emptied`] after a one-statement order (alone or batched) on its kept connection,
/// best effort: a row left empty only makes later orders skip it until the next order that
/// empties a row refills, or the slow path spreads the stock. A failure is logged, and a
/// connection Postgres did not answer on does not go back on the stack.
pub async fn refill_emptied_after_order(conn: &mut Lease, sku: &str, shard: i32) {
    if let Err(e) = refill_emptied(conn, sku, shard).await {
        if let Some(answered) = e.answered() {
            conn.ended_if(answered);
        }
        tracing::warn!(error = ?e, sku, shard, "refilling an emptied stock row failed");
    }
}

/// Slow path: locks every row of the SKU in shard order; when their sum covers `q`, reserves
/// it on one active row (chosen at random) and spreads the remaining available units evenly
/// over the active rows (`shard < stock_shards`; rows above it are drained). `false` when the
/// sum is short (or the SKU has no rows); nothing changed then, but the rows stay locked.
async fn take_from_sum(
    conn: &mut PgConnection,
    order_id: &str,
    sku: &str,
    q: i64,
) -> Result<bool, OrderError> {
    let pick = i32::from(rand::random::<u8>() % 64);
    let took: Option<i32> = sqlx::query_scalar(
        "WITH locked AS (
             SELECT shard, available FROM inventory WHERE sku = $1 ORDER BY shard FOR UPDATE),
         n AS (SELECT stock_shards AS n FROM products WHERE sku = $1),
         tot AS (SELECT sum(available)::bigint - $2 AS left FROM locked),
         plan AS (
             SELECT l.shard,
                    CASE WHEN l.shard < n.n
                         THEN tot.left / n.n + CASE WHEN l.shard < tot.left % n.n THEN 1 ELSE 0 END
                         ELSE 0 END AS available,
                    CASE WHEN l.shard = $4 % n.n THEN $2 ELSE 0 END AS took
               FROM locked l, n, tot
              WHERE tot.left >= 0),
         moved AS (
             UPDATE inventory i SET available = p.available, reserved = i.reserved + p.took
               FROM plan p WHERE i.sku = $1 AND i.shard = p.shard
             RETURNING i.shard, p.took)
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT $3, $1, shard, took FROM moved WHERE took > 0
         RETURNING shard",
    )
    .bind(sku)
    .bind(q)
    .bind(order_id)
    .bind(pick)
    .fetch_optional(&mut *conn)
    .await
    .during("reserve a cart line's stock across the shards")?;
    Ok(took.is_some())
}

/// What happens to the units an order's SKU lines took.
#[derive(Clone, Copy)]
pub enum StockMove {
    /// reserved → sold (payment).
    Sell,
    /// reserved → available (expiry, cancel).
    Return,
    /// sold → available (refund or dispute, stock back on sale).
    Release,
    /// sold → held_back (refund or dispute, stock held back).
    HoldBack,
}

/// Applies `how` to the units the SKU lines of `order_ids` took, per SKU and shard row (rows
/// locked in (sku, shard) order first, so concurrent transitions cannot deadlock). Returns
/// the SKUs touched, in order.
pub async fn move_order_stock_tx(
    conn: &mut PgConnection,
    order_ids: &[String],
    how: StockMove,
) -> Result<Vec<String>, OrderError> {
    move_stock_tx(conn, order_ids, None, how).await
}

/// [`move_order_stock_tx`] for the lines of SKUs `skus` of one order only (a per-line refund).
pub async fn move_order_lines_stock_tx(
    conn: &mut PgConnection,
    order_id: &str,
    skus: &[String],
    how: StockMove,
) -> Result<Vec<String>, OrderError> {
    if skus.is_empty() {
        return Ok(Vec::new());
    }
    move_stock_tx(conn, &[order_id.to_owned()], Some(skus), how).await
}

async fn move_stock_tx(
    conn: &mut PgConnection,
    order_ids: &[String],
    only_skus: Option<&[String]>,
    how: StockMove,
) -> Result<Vec<String>, OrderError> {
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT i.sku, i.shard, l.q
           FROM (SELECT sku, shard, sum(quantity)::bigint AS q FROM order_stock
                  WHERE order_id = ANY($1) AND ($2::text[] IS NULL OR sku = ANY($2))
                  GROUP BY sku, shard) l
           JOIN inventory i ON i.sku = l.sku AND i.shard = l.shard
          ORDER BY i.sku, i.shard
            FOR UPDATE OF i",
    )
    .bind(order_ids)
    .bind(only_skus)
    .fetch_all(&mut *conn)
    .await
    .during("lock the orders' stock shards")?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut skus = Vec::with_capacity(rows.len());
    let mut shards = Vec::with_capacity(rows.len());
    let mut qs = Vec::with_capacity(rows.len());
    for (sku, shard, q) in rows {
        skus.push(sku);
        shards.push(shard);
        qs.push(q);
    }
    // The same update for every move; only the columns the units move between differ.
    macro_rules! move_units {
        ($set:literal) => {
            concat!(
                "UPDATE inventory i SET ",
                $set,
                " FROM unnest($1::text[], $2::int[], $3::bigint[]) AS l(sku, shard, q)
                  WHERE i.sku = l.sku AND i.shard = l.shard"
            )
        };
    }
    let (sql, statement) = match how {
        StockMove::Sell => (
            move_units!("reserved = i.reserved - l.q, sold = i.sold + l.q"),
            "move reserved units to sold",
        ),
        StockMove::Return => (
            move_units!("reserved = i.reserved - l.q, available = i.available + l.q"),
            "return reserved units to available",
        ),
        StockMove::Release => (
            move_units!("sold = i.sold - l.q, available = i.available + l.q"),
            "put refunded units back on sale",
        ),
        StockMove::HoldBack => (
            move_units!("sold = i.sold - l.q, held_back = i.held_back + l.q"),
            "hold refunded units back",
        ),
    };
    sqlx::query(sql)
        .bind(&skus)
        .bind(&shards)
        .bind(&qs)
        .execute(&mut *conn)
        .await
        .during(statement)?;
    skus.dedup();
    Ok(skus)
}

/// Creates the `shards` stock rows of a new product, `stock` spread evenly over them.
pub async fn create_rows_tx(
    conn: &mut PgConnection,
    sku: &str,
    stock: i64,
    shards: i32,
) -> Result<(), OrderError> {
    sqlx::query(
        "INSERT INTO inventory (sku, shard, available)
         SELECT $1, s, $2 / $3 + CASE WHEN s < $2 % $3 THEN 1 ELSE 0 END
           FROM generate_series(0, $3 - 1) AS s",
    )
    .bind(sku)
    .bind(stock)
    .bind(i64::from(shards))
    .execute(&mut *conn)
    .await
    .during("insert the product's stock rows")?;
    Ok(())
}

/// Sets the product's shard count (adding missing rows) and/or its total stock
/// (`available = stock - reserved - sold`, summed over its rows), then spreads the available
/// units evenly over the active rows, all on the locked rows. Refused with
/// [`OrderError::StockBelowCommitted`] when `stock` undercuts units reserved or sold.
pub async fn reshape_tx(
    conn: &mut PgConnection,
    sku: &str,
    stock: Option<i64>,
    shards: Option<i32>,
) -> Result<(), OrderError> {
    if let Some(n) = shards {
        sqlx::query(
            "INSERT INTO inventory (sku, shard, available)
             SELECT $1, s, 0 FROM generate_series(0, $2 - 1) AS s
             ON CONFLICT (sku, shard) DO NOTHING",
        )
        .bind(sku)
        .bind(n)
        .execute(&mut *conn)
        .await
        .during("add the product's stock rows")?;
    }
    let changed = sqlx::query(
        "WITH locked AS (
             SELECT shard, available, reserved, sold FROM inventory
              WHERE sku = $1 ORDER BY shard FOR UPDATE),
         n AS (SELECT stock_shards AS n FROM products WHERE sku = $1),
         tot AS (SELECT COALESCE($2 - sum(reserved) - sum(sold), sum(available))::bigint AS t
                   FROM locked),
         plan AS (
             SELECT l.shard,
                    CASE WHEN l.shard < n.n
                         THEN tot.t / n.n + CASE WHEN l.shard < tot.t % n.n THEN 1 ELSE 0 END
                         ELSE 0 END AS available
               FROM locked l, n, tot
              WHERE tot.t >= 0)
         UPDATE inventory i SET available = p.available
           FROM plan p WHERE i.sku = $1 AND i.shard = p.shard",
    )
    .bind(sku)
    .bind(stock)
    .execute(&mut *conn)
    .await
    .during("spread the product's stock over its shards")?
    .rows_affected();
    if changed == 0 {
        let committed: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(reserved + sold), 0)::bigint FROM inventory WHERE sku = $1",
        )
        .bind(sku)
        .fetch_one(&mut *conn)
        .await
        .during("read the product's reserved and sold units")?;
        return Err(OrderError::StockBelowCommitted { committed });
    }
    Ok(())
}
