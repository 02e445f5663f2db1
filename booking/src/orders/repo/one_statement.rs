//! A cart order in ONE autocommit statement (issue 16): the order, its items, each line's units
//! taken from one stock row, `order.created` and the stored answer of its `Idempotency-Key`,
//! or nothing at all.
//!
//! It serves the common case; anything else writes nothing, and the request then runs the full
//! transaction ([`super::create_cart_order_tx`]), which also words every refusal:
//! - The body is built from prices this process read before (`products::Catalog::order_prices`:
//!   by an earlier order, or by [`read_prices`] for a SKU it has not seen). The statement takes
//!   the order only if every line's product still has that name, price and event, so a stale
//!   price costs one statement, never a wrong order.
//! - The stock rows are locked last (the order, its items, `order.created` and the key are
//!   written first), and a line that got no row makes the statement fail, which undoes it. A
//!   one-line cart takes a random row with enough units and waits for it (it holds no other
//!   stock row then); each line of a longer cart takes a row no one else has locked, and does
//!   not wait.
//! - The key is inserted plainly, last, from the order's row: a key already stored (a retry,
//!   a key used for another request, a stale claim) makes the statement fail with a unique
//!   violation, and a failed statement undoes all of it. So does an order key a purged
//!   idempotency row left on an order.
//! - The database clock is read by the statement itself, so the body's two timestamps are
//!   spliced in by it, printed exactly as chrono prints them (the body is the same bytes the
//!   full transaction would store, and `GET /api/orders/{id}` would show).

use super::{During, OrderError};
use crate::orders::OrderSettings;
use crate::orders::model::{AccountId, EventId, OrderId, OrderKey, PricedSku};
use crate::platform::idempotency::Fingerprint;
use sqlx::PgConnection;
use std::collections::BTreeMap;

mod text;
pub use text::{OrderText, order_text};

/// What the one statement did.
#[derive(Debug)]
pub enum OneStatement {
    /// The order is committed.
    Created {
        /// The response body, as stored under the key.
        body: Vec<u8>,
        /// The account's checkout end with the order (`platform::session_until`).
        live_until_ms: i64,
        /// Stock rows (SKU, shard) the order emptied: the caller refills them from a fuller
        /// row of their SKU, as the full transaction does (`stock::refill_emptied`).
        emptied: Vec<(String, i32)>,
    },
    /// Nothing was written: line `sku` wants `requested` units and its rows have
    /// `available` left in all (fewer). The answer is `409`; no transaction needed.
    Short {
        sku: String,
        requested: i64,
        available: i64,
    },
    /// Nothing was written; run the full transaction. `stale_prices`: a line's product no
    /// longer has the name, price or event the body was built with. `busy`: the prices held
    /// and every line's units were there, but on rows others had locked.
    NotServed { stale_prices: bool, busy: bool },
}

/// How the statement takes each line's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Carts of several lines: each from a row no one else has locked; never waits for a row
    /// (it may hold another line's), so rows all busy send the order to the transaction.
    FreeRow,
    /// One-line carts: one row with enough units in the statement's snapshot (random), waited
    /// for alone and re-checked once locked; the statement holds no other stock row then.
    /// Measured against trying a free row first and waiting only after every row was busy
    /// (the failed try writes the order and throws it away): 623–669 against 501–548 split
    /// orders/s, three runs each, 64 clients on 8 rows.
    WaitForOne,
}

impl Take {
    /// The way for a cart of `lines` lines.
    pub fn for_lines(lines: usize) -> Take {
        if lines == 1 {
            Take::WaitForOne
        } else {
            Take::FreeRow
        }
    }
}

/// Tries the cart order `lines` (SKU → quantity, at `prices`) as one statement.
#[expect(
    clippy::too_many_arguments,
    reason = "one order's whole input, each a distinct typed value"
)]
pub async fn create_cart_order_one_statement(
    conn: &mut PgConnection,
    settings: &OrderSettings,
    order_id: OrderId<'_>,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: OrderKey<'_>,
    fingerprint: &Fingerprint,
    lines: &BTreeMap<String, i64>,
    prices: &BTreeMap<String, PricedSku>,
    take: Take,
) -> Result<OneStatement, OrderError> {
    let not_served = OneStatement::NotServed {
        stale_prices: false,
        busy: false,
    };
    if lines.is_empty() || (take == Take::WaitForOne && lines.len() != 1) {
        return Ok(not_served);
    }
    // A cart these prices cannot price (another event, an overflow) is for the full
    // transaction to refuse, with the prices it reads.
    let Some(text) = order_text(settings, order_id, account, event, lines, prices)? else {
        return Ok(not_served);
    };
    let OrderText {
        view,
        head,
        tail,
        payload,
    } = text;
    let total = view.total;
    let n = view.items.len();
    let mut skus = Vec::with_capacity(n);
    let mut qtys = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    let mut unit_prices = Vec::with_capacity(n);
    for it in &view.items {
        skus.push(it.sku.as_deref().unwrap_or_default());
        qtys.push(it.quantity);
        names.push(it.name.as_str());
        unit_prices.push(it.unit_price);
    }
    let row: Result<Row, sqlx::Error> = sqlx::query_as(CART_ORDER)
        .bind(order_id.as_str())
        .bind(account.as_str())
        .bind(key.as_str())
        .bind(fingerprint.as_bytes())
        .bind(event.as_str())
        .bind(total)
        .bind(&settings.currency)
        .bind(f64::from(settings.ttl_s))
        .bind(&skus)
        .bind(&qtys)
        .bind(&names)
        .bind(&unit_prices)
        .bind(shared::ids::new_id())
        .bind(&payload)
        .bind(&head)
        .bind(&tail)
        .bind(take == Take::WaitForOne)
        .bind(settings.async_commit)
        .fetch_one(&mut *conn)
        .await;
    let (
        live_until_ms,
        body,
        prices_ok,
        _units_seen,
        _written,
        short_sku,
        short_available,
        emptied_skus,
        emptied_shards,
    ) = match row {
        Ok(row) => row,
        Err(e) if busy(&e) => {
            return Ok(OneStatement::NotServed {
                stale_prices: false,
                busy: true,
            });
        }
        // The statement undid itself: the full transaction tells a retry, a used key or a
        // deadlock apart and answers each.
        Err(e) if undone(&e) => return Ok(not_served),
        Err(e) => return Err(e).during("create the cart order in one statement"),
    };
    Ok(match body {
        Some(body) => OneStatement::Created {
            body,
            live_until_ms,
            emptied: emptied_skus.into_iter().zip(emptied_shards).collect(),
        },
        None if let (Some(sku), Some(available)) = (short_sku, short_available) => {
            let requested = lines.get(&sku).copied().unwrap_or_default();
            OneStatement::Short {
                sku,
                requested,
                available,
            }
        }
        // Nothing written: a product changed, a line's units were not on one row, the key
        // was used, or the event is cancelled.
        None => OneStatement::NotServed {
            stale_prices: !prices_ok.unwrap_or(false),
            busy: false,
        },
    })
}

/// The current name, price and event of each SKU of `lines` (the SKUs without a product are
/// missing from the map), for a process that has not read them yet.
pub async fn read_prices(
    conn: &mut PgConnection,
    lines: &BTreeMap<String, i64>,
) -> Result<BTreeMap<String, PricedSku>, OrderError> {
    let skus: Vec<&str> = lines.keys().map(String::as_str).collect();
    let rows: Vec<SkuPrice> = sqlx::query_as(
        "SELECT sku, name, price, event_id, stock_shards FROM products WHERE sku = ANY($1)",
    )
    .bind(&skus)
    .fetch_all(&mut *conn)
    .await
    .during("read the cart's prices")?;
    Ok(rows.into_iter().map(|r| (r.sku, r.priced)).collect())
}

/// A product row as the order paths read it with the prices: `sku` and the [`PricedSku`]
/// columns (`name, price, event_id, stock_shards`).
#[derive(sqlx::FromRow)]
pub(super) struct SkuPrice {
    pub sku: String,
    #[sqlx(flatten)]
    pub priced: PricedSku,
}

/// The checkout end, the body (as stored), whether the prices matched, whether every line's
/// units were there, the rows written by `items` and `e`, the short line and its units left,
/// the emptied rows (SKUs, shards).
type Row = (
    i64,
    Option<Vec<u8>>,
    Option<bool>,
    Option<bool>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Vec<String>,
    Vec<i32>,
);

/// Errors after which the statement has written nothing and the full transaction should run:
/// unique violations (the key or the order's key already used), a stock row's check (cannot
/// happen, `took` re-checks; kept as a guard), deadlocks and serialization failures.
pub(super) fn undone(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("23505" | "23514" | "40P01" | "40001")
    )
}

/// A `timestamptz` expression as chrono prints a `DateTime<Utc>` in JSON (RFC 3339, `Z`, the
/// fraction as 0, 3 or 6 digits: `SecondsFormat::AutoSi` at microsecond precision).
#[macro_export]
macro_rules! chrono_text_sql {
    ($ts:literal) => {
        concat!(
            // Dots for colons, put back by `replace`: pgbench, which runs this text in the
            // benchmark, would take `:MI` for a variable.
            "(replace(to_char(",
            $ts,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24.MI.SS'), '.', ':') ||
              CASE WHEN date_part('microseconds', ",
            $ts,
            " AT TIME ZONE 'UTC')::bigint % 1000000 = 0 THEN ''
                   WHEN date_part('microseconds', ",
            $ts,
            " AT TIME ZONE 'UTC')::bigint % 1000 = 0
                   THEN '.' || lpad((date_part('microseconds', ",
            $ts,
            " AT TIME ZONE 'UTC')::bigint % 1000000 / 1000)::text, 3, '0')
                   ELSE '.' || lpad((date_part('microseconds', ",
            $ts,
            " AT TIME ZONE 'UTC')::bigint % 1000000)::text, 6, '0') END || 'Z')"
        )
    };
}

/// The advisory lock of an order key (account, key): class 17995, the key's hash. A collision
/// of two keys' hashes only makes their orders take turns.
macro_rules! order_key_lock_sql {
    ($account:literal, $key:literal) => {
        concat!("17995, hashtext(", $account, " || '/' || ", $key, ")")
    };
}

/// Waits, inside the caller's transaction and before its key claim, until no one-statement
/// order of the same key is running. Without it a copy of the request that reached the full
/// transaction could claim the key while the statement, holding stock rows, was about to
/// insert it, and each would wait for the other (a deadlock, broken after a second).
pub async fn wait_for_copies(
    conn: &mut PgConnection,
    account: AccountId<'_>,
    key: OrderKey<'_>,
) -> Result<(), OrderError> {
    sqlx::query(concat!(
        "SELECT pg_advisory_xact_lock(",
        order_key_lock_sql!("$1", "$2"),
        ")"
    ))
    .bind(account.as_str())
    .bind(key.as_str())
    .execute(&mut *conn)
    .await
    .during("wait for a one-statement order of the same key")?;
    Ok(())
}

/// The statement. `$1` order id, `$2` account, `$3` key, `$4` fingerprint, `$5` event, `$6`
/// total, `$7` currency, `$8` the order's TTL (s), `$9`..`$12` the lines (SKU, quantity, name,
/// unit price; SKU order), `$13` the outbox row's id, `$14` its payload without `expires_at`,
/// `$15`/`$16` the body around its timestamps, `$17` [`Take::WaitForOne`], `$18` asynchronous
/// commit.
///
/// The stock rows are locked LAST, so a hot row is held only for its own update, the stock
/// record and the commit (pgbench on one hot row: 880 orders/s against 670 when the rows were
/// taken first, docs/benchmarks.md). Hence the order is written before its units are taken:
/// - the order row `o` only if every line's product matches the body, the event is not
///   cancelled and the snapshot has, for every line, one row with enough units (so a sold-out
///   SKU writes nothing and fails nothing); its items, `order.created` and the key hang off it;
/// - then `pick` finds one row per line (locked, or in waiting mode chosen and left to `took`
///   to wait for), `took` takes the units, and `rec` records each line's row: a line that got
///   none leaves a NULL shard, whose NOT NULL violation undoes the whole statement ([`busy`]).
///
/// The main query reads `o`, `k`, `items` and `e` before `took`, and `rec` (read by nothing)
/// runs after it, which puts the lock last. Correctness does not depend on that order: it is
/// one statement, and `rec` reads all of `took`.
const CART_ORDER: &str = concat!(
    "WITH now AS MATERIALIZED (
         SELECT clock_timestamp() AS t,
                CASE WHEN $18 THEN set_config('synchronous_commit', 'off', true) END AS sc),
     lines AS (
         SELECT * FROM unnest($9::text[], $10::int[], $11::text[], $12::bigint[])
                       WITH ORDINALITY AS l(sku, q, name, price, line)),
     -- Copies of this request queue here, before anything is written (`wait_for_copies`).
     keylock AS MATERIALIZED (
         SELECT pg_advisory_xact_lock(",
    order_key_lock_sql!("$2", "$3"),
    ") AS held),
     priced AS MATERIALIZED (
         SELECT count(*) = cardinality($9::text[]) AS ok
           FROM keylock, lines l
           JOIN products p ON p.sku = l.sku AND p.name = l.name AND p.price = l.price
                          AND p.event_id = $5),
     -- Every line has a row with enough units in the snapshot (no lock taken).
     seen AS MATERIALIZED (
         SELECT bool_and(EXISTS (SELECT 1 FROM inventory i
                                  WHERE i.sku = l.sku AND i.available >= l.q)) AS ok
           FROM lines l),
     o AS (
         INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, currency,
                             expires_at, created_at)
         SELECT $1, $2, $3, 'cart', $5, $6, $7, now.t + make_interval(secs => $8), now.t
           FROM now
          WHERE cardinality($9::text[]) > 0 AND (SELECT ok FROM priced) AND (SELECT ok FROM seen)
            AND NOT EXISTS (SELECT 1 FROM events e WHERE e.id = $5 AND e.cancelled_at IS NOT NULL)
         RETURNING id, expires_at, created_at),
     items AS (
         INSERT INTO order_items (order_id, line, kind, sku, name, quantity, unit_price)
         SELECT o.id, l.line, 'sku', l.sku, l.name, l.q, l.price FROM o, lines l
         RETURNING 1),
     ts AS (
         SELECT ",
    chrono_text_sql!("o.expires_at"),
    " AS expires, ",
    chrono_text_sql!("o.created_at"),
    " AS created FROM o),
     e AS (
         INSERT INTO outbox (event_id, topic, aggregate_id, payload)
         SELECT $13, 'order.created', o.id, $14::jsonb || jsonb_build_object('expires_at', ts.expires)
           FROM o, ts
         RETURNING 1),
     k AS (
         INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id,
                                       response_status, response_body, completed_at)
         SELECT $2, $3, $4, 'done', o.id, 201,
                convert_to($15 || ts.expires || '\",\"created_at\":\"' || ts.created || $16, 'UTF8'),
                clock_timestamp()
           FROM o, ts
         RETURNING response_body),
     pick AS MATERIALIZED (
         SELECT l.sku, l.q, r.shard, r.locked
           FROM lines l
           CROSS JOIN LATERAL (
               SELECT shard, available AS locked FROM (
                   SELECT shard, available FROM inventory
                    WHERE NOT $17 AND sku = l.sku AND available >= l.q
                    ORDER BY random() LIMIT 1
                    FOR UPDATE SKIP LOCKED) free
               UNION ALL
               -- Waiting mode (one-line carts): one row with enough units as the snapshot has
               -- it; `took` waits for it alone (the statement holds no other stock row).
               SELECT shard, NULL FROM (
                   SELECT shard FROM inventory
                    WHERE $17 AND sku = l.sku AND available >= l.q
                    ORDER BY random() LIMIT 1) chosen
               LIMIT 1) r
          WHERE EXISTS (SELECT 1 FROM o)),
     took AS (
         -- A row `pick` locked counts from its locked count (`p.locked`): this update's own
         -- read is the snapshot's, which Postgres filters and checks against
         -- `CHECK (available >= 0)` before it finds the newer version a return may have made.
         -- A row waited for here is re-checked: it may have fewer units once locked.
         UPDATE inventory i SET available = COALESCE(p.locked, i.available) - p.q,
                                reserved = i.reserved + p.q
           FROM pick p
          WHERE i.sku = p.sku AND i.shard = p.shard
            AND (p.locked IS NOT NULL OR i.available >= p.q)
         RETURNING i.sku, i.shard, i.available),
     rec AS (
         -- A line without a row has a NULL shard: the statement fails and writes nothing.
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT o.id, l.sku, t.shard, l.q FROM o CROSS JOIN lines l LEFT JOIN took t USING (sku))
     SELECT ",
    crate::live_until_ms_sql!("$2", "$5", "(SELECT expires_at FROM o)", "NULL"),
    " AS live_until_ms, (SELECT response_body FROM k) AS body,
       (SELECT ok FROM priced) AS prices_ok, (SELECT ok FROM seen) AS units_seen,
       (SELECT count(*) FROM items) + (SELECT count(*) FROM e) AS written,
       -- Nothing written because a line is short over all its rows: that line and what is
       -- left of it, when the answer is certainly `409` (the key was never used, the event
       -- is not cancelled).
       short.sku AS short_sku, short.available AS short_available,
       ARRAY(SELECT sku FROM took WHERE available = 0 ORDER BY sku, shard) AS emptied_skus,
       ARRAY(SELECT shard FROM took WHERE available = 0 ORDER BY sku, shard) AS emptied_shards
       FROM (SELECT 1) one
       LEFT JOIN LATERAL (
           SELECT l.sku, l.q, a.available
             FROM lines l,
                  LATERAL (SELECT COALESCE(sum(i.available), 0)::bigint AS available
                             FROM inventory i WHERE i.sku = l.sku) a
            WHERE NOT (SELECT ok FROM seen) AND (SELECT ok FROM priced)
              AND a.available < l.q
              AND NOT EXISTS (SELECT 1 FROM idempotency_keys x WHERE x.account_id = $2 AND x.key = $3)
              AND NOT EXISTS (SELECT 1 FROM events ev WHERE ev.id = $5 AND ev.cancelled_at IS NOT NULL)
            ORDER BY l.sku LIMIT 1) short ON true"
);

/// The statement failed because a line got no stock row (`rec`'s NULL shard): its rows were
/// busy, or drained since the snapshot.
fn busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.code().as_deref() == Some("23502") && d.table() == Some("order_stock"))
}

pub mod batch;

#[cfg(test)]
mod bench_mirror;
