//! Many one-line cart orders of one SKU in ONE autocommit statement (issue 16's hot SKU).
//!
//! One inventory row serialises every order of its SKU behind its lock and its commit, and on
//! this box Postgres' CPU per commit caps even pgbench's one-statement order near 900/s. The
//! batch statement takes the row's lock and commits once for every order that arrived while
//! the previous batch ran (`orders::batcher`), and each order in it is still all or nothing:
//! - The stock row is picked and locked FIRST (one with units, chosen from the snapshot and
//!   waited for alone), and the orders are accepted in arrival order while their running sum
//!   of units fits what the LOCKED row has: `available >= 0` holds by construction, and
//!   `CHECK (available >= 0)` still guards it.
//! - Every accepted order gets its order row, item, `order.created`, stock record (its shard)
//!   and the stored answer of its `Idempotency-Key`; one that is not accepted gets nothing.
//!   The stock record joins the row's update, so an update that did not happen (it cannot: the
//!   row is locked) fails the statement rather than leaving orders without units.
//! - An order whose key is already stored is left out (its request replays the stored answer
//!   through the one-order path). A key stored concurrently makes the unique index fail the
//!   statement, which undoes every order of the batch: each then runs on its own.
//! - Every order's key takes its advisory lock first, as the one-order statement does
//!   (`wait_for_copies`), so a copy of a request in the full transaction waits for the batch.

use super::super::{During, OrderError};
use super::{OneStatement, undone};
use crate::orders::OrderSettings;
use crate::orders::model::PricedSku;
use sqlx::PgConnection;

/// One order of a batch: its own ids, key and text (`super::order_text`).
#[derive(Debug)]
pub struct BatchOrder {
    pub order_id: String,
    pub account: String,
    pub key: String,
    pub fingerprint: Vec<u8>,
    pub quantity: i64,
    /// The body before and after its two timestamps.
    pub head: String,
    pub tail: String,
    /// The `order.created` row's id and payload (without `expires_at`).
    pub outbox_id: String,
    pub payload: serde_json::Value,
}

/// What the batch statement did, in the batch's order; and the stock row it emptied, if any
/// (its shard: the caller refills it once for the batch).
#[derive(Debug)]
pub struct BatchOutcome {
    pub orders: Vec<OneStatement>,
    pub emptied: Option<i32>,
}

/// Runs `orders` (one line each, all of `sku` at `priced`, all of `event`) as one statement.
/// A database error that undid the statement (a key stored meanwhile, a deadlock) is
/// `Ok` with every order [`OneStatement::NotServed`]; other errors are the caller's.
pub async fn create_cart_orders_batched(
    conn: &mut PgConnection,
    settings: &OrderSettings,
    event: &str,
    sku: &str,
    priced: &PricedSku,
    orders: &[BatchOrder],
) -> Result<BatchOutcome, OrderError> {
    let not_served = |busy| OneStatement::NotServed {
        stale_prices: false,
        busy,
    };
    if orders.is_empty() {
        return Ok(BatchOutcome {
            orders: Vec::new(),
            emptied: None,
        });
    }
    let n = orders.len();
    let mut ids = Vec::with_capacity(n);
    let mut accounts = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut fingerprints = Vec::with_capacity(n);
    let mut quantities = Vec::with_capacity(n);
    let mut heads = Vec::with_capacity(n);
    let mut tails = Vec::with_capacity(n);
    let mut outbox_ids = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    for o in orders {
        ids.push(o.order_id.as_str());
        accounts.push(o.account.as_str());
        keys.push(o.key.as_str());
        fingerprints.push(o.fingerprint.as_slice());
        quantities.push(i32::try_from(o.quantity).map_err(|_| OrderError::Overflow)?);
        heads.push(o.head.as_str());
        tails.push(o.tail.as_str());
        outbox_ids.push(o.outbox_id.as_str());
        payloads.push(&o.payload);
    }
    let rows: Result<Vec<Row>, sqlx::Error> = sqlx::query_as(BATCH_ORDER)
        .bind(sku)
        .bind(event)
        .bind(&priced.name)
        .bind(priced.price)
        .bind(&settings.currency)
        .bind(f64::from(settings.ttl_s))
        .bind(settings.async_commit)
        .bind(&ids)
        .bind(&accounts)
        .bind(&keys)
        .bind(&fingerprints)
        .bind(&quantities)
        .bind(&heads)
        .bind(&tails)
        .bind(&outbox_ids)
        .bind(&payloads)
        .fetch_all(&mut *conn)
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) if undone(&e) => {
            return Ok(BatchOutcome {
                orders: (0..n).map(|_| not_served(false)).collect(),
                emptied: None,
            });
        }
        Err(e) => return Err(e).during("create a batch of cart orders in one statement"),
    };
    let mut emptied = None;
    let mut out: Vec<OneStatement> = (0..n).map(|_| not_served(false)).collect();
    for (n, body, live_until_ms, prices_ok, open, fresh, left, empty) in rows {
        emptied = emptied.or(empty);
        let Some(at) = usize::try_from(n - 1).ok().filter(|&at| at < orders.len()) else {
            continue;
        };
        let requested = orders[at].quantity;
        let slot = &mut out[at];
        *slot = match body {
            Some(body) => OneStatement::Created {
                body,
                live_until_ms,
                emptied: Vec::new(),
            },
            None if !prices_ok => OneStatement::NotServed {
                stale_prices: true,
                busy: false,
            },
            // Short as the statement saw the SKU's rows after its own take: `409` now, as the
            // one-order statement answers it (sold out beats two more statements).
            None if open && fresh && left < requested => OneStatement::Short {
                sku: sku.to_owned(),
                requested,
                available: left,
            },
            // Units on other rows, a stored key, a cancelled event: the one-order path.
            None => not_served(open && fresh),
        };
    }
    Ok(BatchOutcome {
        orders: out,
        emptied,
    })
}

/// Per order, in the batch's order: its position (1-based), the stored body (accepted orders),
/// the account's checkout end, whether the product still had the batch's name, price and
/// event, whether the event is open, whether the key was unused, the SKU's units left as the
/// statement saw them, the emptied row's shard.
type Row = (
    i64,
    Option<Vec<u8>>,
    i64,
    bool,
    bool,
    bool,
    i64,
    Option<i32>,
);

/// The statement. `$1` SKU, `$2` event, `$3`/`$4` the product's name and unit price the bodies
/// were built with, `$5` currency, `$6` TTL (s), `$7` asynchronous commit; per order (arrays in
/// arrival order): `$8` order id, `$9` account, `$10` key, `$11` fingerprint, `$12` quantity,
/// `$13`/`$14` the body around its timestamps, `$15` the outbox row's id, `$16` its payload.
///
/// Rows read by the final `SELECT`: `k` (accepted orders' bodies), `took` and `pick`; the
/// other writes hang off `ok`, which only holds orders whose units the locked row has.
const BATCH_ORDER: &str = concat!(
    "WITH now AS MATERIALIZED (
         SELECT clock_timestamp() AS t,
                CASE WHEN $7 THEN set_config('synchronous_commit', 'off', true) END AS sc),
     req AS MATERIALIZED (
         SELECT * FROM unnest($8::text[], $9::text[], $10::text[], $11::bytea[], $12::int[],
                              $13::text[], $14::text[], $15::text[], $16::jsonb[])
                       WITH ORDINALITY AS r(id, account, key, fp, q, head, tail, eid, payload, n)),
     -- Copies of these requests queue here, before anything is read or written. In the
     -- locks' order: two batches holding copies of the same two requests would otherwise
     -- each wait for the other (a deadlock the concurrent test hit).
     keylock AS MATERIALIZED (
         SELECT count(pg_advisory_xact_lock(",
    order_key_lock_sql!("s.account", "s.key"),
    ")) AS held
           FROM (SELECT r.account, r.key FROM req r
                  ORDER BY hashtext(r.account || '/' || r.key), r.account, r.key) s),
     priced AS MATERIALIZED (
         SELECT EXISTS (SELECT 1 FROM products p
                         WHERE p.sku = $1 AND p.name = $3 AND p.price = $4 AND p.event_id = $2) AS ok,
                NOT EXISTS (SELECT 1 FROM events e WHERE e.id = $2 AND e.cancelled_at IS NOT NULL) AS open
           FROM keylock),
     -- One index probe per order (`LIMIT` keeps the planner from hashing every stored key
     -- of the same name: 7,000 rows read per batch in the bench with `NOT EXISTS`).
     fresh AS MATERIALIZED (
         SELECT r.*, u.used IS NULL AS unused
           FROM req r
           LEFT JOIN LATERAL (SELECT true AS used FROM idempotency_keys x
                               WHERE x.account_id = r.account AND x.key = r.key LIMIT 1) u ON true),
     want AS MATERIALIZED (
         SELECT f.*, sum(f.q) OVER (ORDER BY f.n) AS run
           FROM fresh f, priced
          WHERE f.unused AND priced.ok AND priced.open),
     -- One row, chosen from the snapshot among those with units for the smallest order, then
     -- locked by its key: the statement waits for that row alone and keeps no other. (A
     -- locking scan that moves on to a second row after the first failed its re-check keeps
     -- the first one locked: waiting for one row while holding another out of shard order
     -- deadlocked with the admin's reshaping in `split_stock::rebalancing_racing_orders_...`.)
     -- Its count is the LOCKED row's, whatever it is now.
     chosen AS MATERIALIZED (
         SELECT shard FROM inventory
          WHERE sku = $1 AND available >= (SELECT min(q) FROM want)
          ORDER BY random() LIMIT 1),
     pick AS MATERIALIZED (
         SELECT i.shard, i.available FROM inventory i, chosen c
          WHERE i.sku = $1 AND i.shard = c.shard
          FOR UPDATE OF i),
     -- The orders the row serves: arrival order, while the running sum fits.
     ok AS MATERIALIZED (
         SELECT w.*, p.shard FROM want w, pick p WHERE w.run <= p.available),
     took AS (
         UPDATE inventory i SET available = p.available - s.total, reserved = i.reserved + s.total
           FROM pick p, (SELECT sum(q) AS total FROM ok) s
          WHERE i.sku = $1 AND i.shard = p.shard AND s.total > 0
         RETURNING i.shard, i.available),
     ts AS MATERIALIZED (
         SELECT now.t + make_interval(secs => $6) AS expires_at, now.t AS created_at FROM now),
     stamps AS MATERIALIZED (
         SELECT ts.expires_at, ",
    crate::chrono_text_sql!("ts.expires_at"),
    " AS expires, ",
    crate::chrono_text_sql!("ts.created_at"),
    " AS created FROM ts),
     o AS (
         INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, currency,
                             expires_at, created_at)
         SELECT ok.id, ok.account, ok.key, 'cart', $2, ok.q * $4, $5, ts.expires_at, ts.created_at
           FROM ok, ts
         RETURNING 1),
     items AS (
         INSERT INTO order_items (order_id, line, kind, sku, name, quantity, unit_price)
         SELECT ok.id, 1, 'sku', $1, $3, ok.q, $4 FROM ok
         RETURNING 1),
     e AS (
         INSERT INTO outbox (event_id, topic, aggregate_id, payload)
         SELECT ok.eid, 'order.created', ok.id, ok.payload || jsonb_build_object('expires_at', st.expires)
           FROM ok, stamps st
         RETURNING 1),
     k AS (
         INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id,
                                       response_status, response_body, completed_at)
         SELECT ok.account, ok.key, ok.fp, 'done', ok.id, 201,
                convert_to(ok.head || st.expires || '\",\"created_at\":\"' || st.created || ok.tail, 'UTF8'),
                clock_timestamp()
           FROM ok, stamps st
         RETURNING claim_id, response_body),
     -- No update, no shard: the NOT NULL fails the statement (cannot happen: the row is locked).
     rec AS (
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT ok.id, $1, t.shard, ok.q FROM ok LEFT JOIN took t ON true),
     -- The SKU's units as the statement saw them, less its own take: the snapshot's sum over
     -- every row. Not the locked row's count plus the snapshot's others: units moved between
     -- rows after the snapshot (a refill, the admin's reshaping) would be missed on both sides
     -- and a buyer told sold out while another row had their units
     -- (`order_batches::units_moved_to_another_row_meanwhile_are_not_sold_out`).
     units AS MATERIALIZED (
         SELECT (COALESCE((SELECT sum(i.available) FROM inventory i WHERE i.sku = $1), 0)
                 - COALESCE((SELECT sum(q) FROM ok), 0))::bigint AS left)
     SELECT r.n, k.response_body,
            CASE WHEN k.response_body IS NULL THEN 0 ELSE ",
    crate::live_until_ms_sql!("r.account", "$2", "(SELECT expires_at FROM stamps)", "NULL"),
    " END AS live_until_ms,
            priced.ok, priced.open, r.unused, units.left,
            (SELECT shard FROM took WHERE available = 0) AS emptied
       FROM fresh r CROSS JOIN priced CROSS JOIN units
       LEFT JOIN k ON k.claim_id = r.id
      ORDER BY r.n"
);

#[cfg(test)]
mod tests {
    use super::BATCH_ORDER;

    /// Parameters the statement names, so a missed bind shows here rather than at runtime.
    #[test]
    fn the_statement_uses_each_parameter() {
        for p in 1..=16 {
            assert!(
                BATCH_ORDER.contains(&format!("${p}")),
                "parameter ${p} is bound but unused"
            );
        }
        assert!(!BATCH_ORDER.contains("$17"));
    }
}
