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
use sqlx::PgConnection;
use std::collections::BTreeMap;

/// Most rows one SKU's stock may be split over (the `products.stock_shards` CHECK).
pub const MAX_STOCK_SHARDS: i32 = 64;

/// Reserves every line (SKU → quantity) of order `order_id` inside the caller's transaction:
/// `available -= q, reserved += q` on the shard rows it takes from, recorded in
/// `order_stock`. Lines go in SKU order (so carts sharing SKUs lock in one order). On a
/// shortage returns [`OrderError::Shortage`] with earlier lines already reserved: the caller
/// must roll back.
pub async fn reserve_stock_tx(
    conn: &mut PgConnection,
    order_id: &str,
    lines: &BTreeMap<String, i64>,
) -> Result<(), OrderError> {
    for (sku, &q) in lines {
        reserve_line(conn, order_id, sku, q).await?;
    }
    Ok(())
}

async fn reserve_line(
    conn: &mut PgConnection,
    order_id: &str,
    sku: &str,
    q: i64,
) -> Result<(), OrderError> {
    // 1. One free row with enough units; 2. wait for one that has enough (rows whose holders
    // are mid-commit); 3. all rows locked, take from their sum and spread the rest.
    if let Some(left) = take_from_one(conn, order_id, sku, q, true).await? {
        return refill_if_dry(conn, sku, left).await;
    }
    if let Some(left) = take_from_one(conn, order_id, sku, q, false).await? {
        return refill_if_dry(conn, sku, left).await;
    }
    if take_from_sum(conn, order_id, sku, q).await? {
        return Ok(());
    }
    // Still holding every row's lock: the sum is exact.
    let available: Option<i64> =
        sqlx::query_scalar("SELECT sum(available)::bigint FROM inventory WHERE sku = $1")
            .bind(sku)
            .fetch_one(&mut *conn)
            .await
            .during("read the remaining stock after a shortage")?;
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

/// Takes `q` units from one row that has them, rows in random order; `skip_locked` skips rows
/// locked by others, otherwise it waits for the first row that has enough (re-checked once
/// locked, falling through to the next). `None`: no row could serve it.
async fn take_from_one(
    conn: &mut PgConnection,
    order_id: &str,
    sku: &str,
    q: i64,
    skip_locked: bool,
) -> Result<Option<Taken>, OrderError> {
    const SKIP: &str = "WITH pick AS (
             SELECT shard FROM inventory
              WHERE sku = $1 AND available >= $2
              ORDER BY random() LIMIT 1
              FOR UPDATE SKIP LOCKED),
         took AS (
             UPDATE inventory i SET available = i.available - $2, reserved = i.reserved + $2
               FROM pick WHERE i.sku = $1 AND i.shard = pick.shard
             RETURNING i.shard, i.available)
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT $3, $1, shard, $2 FROM took
         RETURNING shard, (SELECT available FROM took)";
    const WAIT: &str = "WITH pick AS (
             SELECT shard FROM inventory
              WHERE sku = $1 AND available >= $2
              ORDER BY random() LIMIT 1
              FOR UPDATE),
         took AS (
             UPDATE inventory i SET available = i.available - $2, reserved = i.reserved + $2
               FROM pick WHERE i.sku = $1 AND i.shard = pick.shard
             RETURNING i.shard, i.available)
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT $3, $1, shard, $2 FROM took
         RETURNING shard, (SELECT available FROM took)";
    let row: Option<(i32, i64)> = sqlx::query_as(if skip_locked { SKIP } else { WAIT })
        .bind(sku)
        .bind(q)
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await
        .during("reserve a cart line's stock from one shard")?;
    Ok(row.map(|(shard, left)| Taken { shard, left }))
}

/// The row an order just emptied (still locked by this transaction) gets half of the fullest
/// other row's units, skipping rows locked elsewhere and rows above the product's shard
/// count (retired rows are not refilled). Nothing to do while the row has units left.
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
             UPDATE inventory i SET available = i.available - d.available / 2
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
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT i.sku, i.shard, l.q
           FROM (SELECT sku, shard, sum(quantity)::bigint AS q FROM order_stock
                  WHERE order_id = ANY($1) GROUP BY sku, shard) l
           JOIN inventory i ON i.sku = l.sku AND i.shard = l.shard
          ORDER BY i.sku, i.shard
            FOR UPDATE OF i",
    )
    .bind(order_ids)
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
    let (sql, statement) = match how {
        StockMove::Sell => (
            "UPDATE inventory i SET reserved = i.reserved - l.q, sold = i.sold + l.q
               FROM unnest($1::text[], $2::int[], $3::bigint[]) AS l(sku, shard, q)
              WHERE i.sku = l.sku AND i.shard = l.shard",
            "move reserved units to sold",
        ),
        StockMove::Return => (
            "UPDATE inventory i SET reserved = i.reserved - l.q, available = i.available + l.q
               FROM unnest($1::text[], $2::int[], $3::bigint[]) AS l(sku, shard, q)
              WHERE i.sku = l.sku AND i.shard = l.shard",
            "return reserved units to available",
        ),
        StockMove::Release => (
            "UPDATE inventory i SET sold = i.sold - l.q, available = i.available + l.q
               FROM unnest($1::text[], $2::int[], $3::bigint[]) AS l(sku, shard, q)
              WHERE i.sku = l.sku AND i.shard = l.shard",
            "put refunded units back on sale",
        ),
        StockMove::HoldBack => (
            "UPDATE inventory i SET sold = i.sold - l.q, held_back = i.held_back + l.q
               FROM unnest($1::text[], $2::int[], $3::bigint[]) AS l(sku, shard, q)
              WHERE i.sku = l.sku AND i.shard = l.shard",
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
