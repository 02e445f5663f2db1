//! `loadgen verify`: the invariants checked after every load run, straight from Postgres
//! and the payment sandbox (never from the services' own answers):
//!
//! - no seat sold twice (two tickets for one seat);
//! - sold seats = seat tickets, each sold seat's ticket belongs to the order that bought it,
//!   and every ticket belongs to a paid order;
//! - no seat still held long after its hold expired (the sweeper and the reclaiming hold
//!   statement work), reported per event;
//! - GA stock conserved: available + sold + units in live holds = capacity, per tier;
//! - SKU stock conserved: sold = units in paid orders, reserved = units in pending orders;
//! - one admission, one event: every line of a cart order is a product of the order's event;
//! - no order charged twice: per order, successful charges minus refunds ≤ 1 at the sandbox,
//!   and a paid order was charged;
//! - auctions: the price is the highest recorded bid and its bidder leads, the bid count
//!   matches, no bid is recorded after the auction's end.
//!
//! Asynchronous parts (webhooks, the hot-bid consumer, the sweeper) may lag a run's end, so
//! a failing check is re-run for up to `--settle-s` before it counts. Exit status is non-zero
//! on any violation. A check whose tables do not exist (feature not deployed) is skipped and
//! says so.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, clap::Args)]
pub struct VerifyConn {
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:55432/floodgate"
    )]
    pub database_url: String,
    #[arg(
        long,
        env = "FLOODGATE_SANDBOX_URL",
        default_value = "http://127.0.0.1:8099"
    )]
    pub sandbox_url: String,
    #[arg(
        long,
        env = "FLOODGATE_SANDBOX__API_KEY",
        default_value = "sk_test_floodgate_dev",
        hide_env_values = true
    )]
    pub sandbox_key: String,
    /// Seconds a held seat may stay held past its expiry before it counts as stuck.
    #[arg(long, default_value_t = 30)]
    pub stale_hold_slack_s: u32,
    /// Re-run failing checks for up to this long (asynchronous parts catching up).
    #[arg(long, default_value_t = 20)]
    pub settle_s: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub conn: VerifyConn,
    /// Only this event's seats and tickets (default: every event).
    #[arg(long)]
    pub event: Option<String>,
    /// Also require these events to be sold out (every seat sold, none held).
    #[arg(long)]
    pub expect_sold_out: Vec<String>,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    /// What was looked at (rows, orders, auctions...).
    pub checked: i64,
    pub violations: i64,
    /// Up to a few offending ids, for the log.
    pub examples: Vec<String>,
    pub skipped: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub checks: Vec<Check>,
    pub seconds: f64,
}

impl VerifyReport {
    pub fn print(&self) {
        for c in &self.checks {
            match &c.skipped {
                Some(why) => eprintln!("  skip  {:<34} ({why})", c.name),
                None if c.violations == 0 => {
                    eprintln!("  ok    {:<34} {} checked", c.name, c.checked)
                }
                None => eprintln!(
                    "  FAIL  {:<34} {} of {} checked; e.g. {}",
                    c.name,
                    c.violations,
                    c.checked,
                    c.examples.join(", ")
                ),
            }
        }
        eprintln!(
            "invariants: {}",
            if self.ok { "all hold" } else { "VIOLATED" }
        );
    }
}

async fn table_exists(pool: &PgPool, name: &str) -> anyhow::Result<bool> {
    let r: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(name)
        .fetch_one(pool)
        .await
        .context("checking the schema")?;
    Ok(r.is_some())
}

fn skipped(name: &'static str, why: &str) -> Check {
    Check {
        name: name.to_owned(),
        checked: 0,
        violations: 0,
        examples: vec![],
        skipped: Some(why.to_owned()),
    }
}

/// Runs a check query returning rows of (`checked` total, offending id or NULL): one row per
/// offender (the id) plus the total in every row, or a single row with NULL id when clean.
async fn sql_check(
    pool: &PgPool,
    name: &'static str,
    needs: &[&str],
    sql: &'static str,
    event: Option<&str>,
) -> anyhow::Result<Check> {
    for t in needs {
        if !table_exists(pool, t).await? {
            return Ok(skipped(name, &format!("no table {t}")));
        }
    }
    // Event-scoped checks take the filter as `$1`; global ones (SKUs, auctions) take none.
    let query = sqlx::query(sql);
    let query = if sql.contains("$1") {
        query.bind(event)
    } else {
        query
    };
    let rows = query
        .fetch_all(pool)
        .await
        .with_context(|| format!("running check {name}"))?;
    let checked = rows.first().map_or(0, |r| r.get::<i64, _>(0));
    let offenders: Vec<String> = rows
        .iter()
        .filter_map(|r| r.get::<Option<String>, _>(1))
        .collect();
    Ok(Check {
        name: name.to_owned(),
        checked,
        violations: offenders.len() as i64,
        examples: offenders.into_iter().take(5).collect(),
        skipped: None,
    })
}

// Each query: `$1` (if used) is the event filter, NULL = all. Shape: (checked BIGINT,
// offender TEXT): one row per offender, or one row with a NULL offender when clean.
const SEAT_SOLD_TWICE: &str = "
WITH scope AS (SELECT * FROM tickets WHERE seat_id IS NOT NULL AND ($1::text IS NULL OR event_id = $1)),
     dup AS (SELECT event_id || '/' || seat_id AS id FROM scope GROUP BY event_id, seat_id HAVING count(*) > 1)
SELECT (SELECT count(*) FROM scope), dup.id FROM (SELECT 1) one LEFT JOIN dup ON true";

const SOLD_SEAT_TICKET: &str = "
WITH bad AS (
  SELECT s.event_id || '/' || s.seat_id AS id FROM seats s
  WHERE s.status = 'sold' AND ($1::text IS NULL OR s.event_id = $1)
    AND NOT EXISTS (SELECT 1 FROM tickets t WHERE t.event_id = s.event_id AND t.seat_id = s.seat_id
                    AND t.order_id = s.order_id))
SELECT (SELECT count(*) FROM seats WHERE status = 'sold' AND ($1::text IS NULL OR event_id = $1)), bad.id
FROM (SELECT 1) one LEFT JOIN bad ON true";

const TICKET_SOLD_SEAT: &str = "
WITH scope AS (SELECT * FROM tickets WHERE seat_id IS NOT NULL AND ($1::text IS NULL OR event_id = $1)),
     bad AS (SELECT t.id FROM scope t LEFT JOIN seats s ON s.event_id = t.event_id AND s.seat_id = t.seat_id
             WHERE s.status IS DISTINCT FROM 'sold' OR s.order_id IS DISTINCT FROM t.order_id)
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

const TICKET_PAID_ORDER: &str = "
WITH scope AS (SELECT * FROM tickets WHERE ($1::text IS NULL OR event_id = $1)),
     bad AS (SELECT t.id FROM scope t LEFT JOIN orders o ON o.id = t.order_id
             WHERE o.status IS DISTINCT FROM 'PAID' AND o.status IS DISTINCT FROM 'REFUNDED')
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

const PAID_ORDER_TICKETS: &str = "
WITH scope AS (SELECT * FROM orders WHERE status = 'PAID' AND source = 'hold' AND ($1::text IS NULL OR event_id = $1)),
     bad AS (SELECT o.id FROM scope o
             WHERE (SELECT count(*) FROM tickets t WHERE t.order_id = o.id)
                <> (SELECT coalesce(sum(quantity), 0) FROM order_items i WHERE i.order_id = o.id AND i.kind IN ('seat', 'ga')))
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

const STALE_HOLDS: &str = "
WITH bad AS (
  SELECT s.event_id || '/' || s.seat_id AS id FROM seats s
  WHERE s.status = 'held' AND ($1::text IS NULL OR s.event_id = $1)
    AND s.held_until < clock_timestamp() - make_interval(secs => $2))
SELECT (SELECT count(*) FROM seats WHERE status = 'held' AND ($1::text IS NULL OR event_id = $1)), bad.id
FROM (SELECT 1) one LEFT JOIN bad ON true";

const GA_CONSERVED: &str = "
WITH scope AS (SELECT * FROM ga_tiers WHERE ($1::text IS NULL OR event_id = $1)),
     bad AS (
  SELECT g.event_id || '/' || g.tier AS id FROM scope g
  WHERE g.capacity <> (SELECT coalesce(sum(available + sold), 0) FROM ga_counters c
                       WHERE c.event_id = g.event_id AND c.tier = g.tier)
                    + (SELECT coalesce(sum(i.quantity), 0) FROM holds h JOIN hold_ga_items i ON i.hold_id = h.id
                       WHERE h.event_id = g.event_id AND h.ga_tier = g.tier AND h.status IN ('active', 'ordered')))
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

const SKU_CONSERVED: &str = "
WITH bad AS (
  SELECT v.sku AS id
    FROM (SELECT sku, sum(sold) AS sold, sum(reserved) AS reserved FROM inventory GROUP BY sku) v
  WHERE v.sold <> (SELECT coalesce(sum(i.quantity), 0) FROM order_items i JOIN orders o ON o.id = i.order_id
                   WHERE i.kind = 'sku' AND i.sku = v.sku AND o.status IN ('PAID', 'REFUNDED'))
     OR v.reserved <> (SELECT coalesce(sum(i.quantity), 0) FROM order_items i JOIN orders o ON o.id = i.order_id
                       WHERE i.kind = 'sku' AND i.sku = v.sku AND o.status = 'PENDING_PAYMENT'))
SELECT (SELECT count(DISTINCT sku) FROM inventory), bad.id
FROM (SELECT 1) one LEFT JOIN bad ON true";

/// Cart orders (that record an event) holding a product of another event.
const ORDER_EVENT: &str = "
WITH scope AS (SELECT * FROM orders
               WHERE source = 'cart' AND event_id IS NOT NULL AND ($1::text IS NULL OR event_id = $1)),
     bad AS (
  SELECT DISTINCT o.id FROM scope o JOIN order_items i ON i.order_id = o.id AND i.kind = 'sku'
  JOIN products p ON p.sku = i.sku
  WHERE p.event_id IS DISTINCT FROM o.event_id)
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

const AUCTIONS: &str = "
WITH scope AS (SELECT * FROM auctions WHERE status = 'CLOSED'),
     top AS (SELECT DISTINCT ON (auction_id) auction_id, amount, bidder_id FROM bids
             ORDER BY auction_id, amount DESC, placed_at),
     agg AS (SELECT auction_id, count(*) AS n FROM bids GROUP BY auction_id),
     bad AS (
  SELECT a.id FROM scope a LEFT JOIN top ON top.auction_id = a.id LEFT JOIN agg ON agg.auction_id = a.id
  WHERE (top.auction_id IS NULL AND (a.leader_id IS NOT NULL OR a.bid_count <> 0))
     OR (top.auction_id IS NOT NULL AND (a.current_price <> top.amount OR a.leader_id IS DISTINCT FROM top.bidder_id
                                         OR a.bid_count <> agg.n))
     OR EXISTS (SELECT 1 FROM bids b WHERE b.auction_id = a.id AND b.placed_at > a.end_time))
SELECT (SELECT count(*) FROM scope), bad.id FROM (SELECT 1) one LEFT JOIN bad ON true";

/// Orders charged more than once (net of refunds), or paid without a charge, per the sandbox.
async fn charges(pool: &PgPool, conn: &VerifyConn, event: Option<&str>) -> anyhow::Result<Check> {
    const NAME: &str = "no order charged twice";
    if !table_exists(pool, "orders").await? {
        return Ok(skipped(NAME, "no table orders"));
    }
    let orders: Vec<(String, String)> = sqlx::query_as(
        "SELECT id, status FROM orders WHERE ($1::text IS NULL OR event_id = $1)
           AND status IN ('PAID', 'REFUNDED', 'EXPIRED', 'CANCELLED')",
    )
    .bind(event)
    .fetch_all(pool)
    .await
    .context("listing orders")?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .context("HTTP client")?;
    if client
        .get(format!("{}/healthz", conn.sandbox_url))
        .send()
        .await
        .is_err()
    {
        return Ok(skipped(NAME, "payment sandbox not reachable"));
    }
    use futures::StreamExt;
    let results: Vec<anyhow::Result<Option<String>>> = futures::stream::iter(orders.iter())
        .map(|(id, status)| {
            let client = &client;
            async move {
                let v: serde_json::Value = client
                    .get(format!("{}/_sandbox/orders/{id}", conn.sandbox_url))
                    .bearer_auth(&conn.sandbox_key)
                    .send()
                    .await
                    .with_context(|| format!("sandbox summary of {id}"))?
                    .error_for_status()
                    .with_context(|| format!("sandbox summary of {id}"))?
                    .json()
                    .await
                    .with_context(|| format!("sandbox summary of {id}"))?;
                let charged = v["charges"].as_i64().unwrap_or(0);
                let refunded = v["refunds"].as_i64().unwrap_or(0);
                let bad = charged - refunded > 1 || (status == "PAID" && charged - refunded != 1);
                Ok(bad.then(|| format!("{id} ({status}: {charged} charges, {refunded} refunds)")))
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut offenders = Vec::new();
    for r in results {
        if let Some(o) = r? {
            offenders.push(o);
        }
    }
    Ok(Check {
        name: NAME.to_owned(),
        checked: orders.len() as i64,
        violations: offenders.len() as i64,
        examples: offenders.into_iter().take(5).collect(),
        skipped: None,
    })
}

async fn sold_out(pool: &PgPool, event: &str) -> anyhow::Result<Check> {
    let row: (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'sold'), count(*) FILTER (WHERE status = 'held')
         FROM seats WHERE event_id = $1",
    )
    .bind(event)
    .fetch_one(pool)
    .await
    .context("counting seats")?;
    let (total, sold, held) = row;
    let bad = total == 0 || sold != total;
    Ok(Check {
        name: "event sold out, nothing held".to_owned(),
        checked: total,
        violations: if bad { total - sold } else { 0 },
        examples: if bad {
            vec![format!("{event}: {sold} of {total} sold, {held} held")]
        } else {
            vec![]
        },
        skipped: None,
    })
}

async fn run_once(pool: &PgPool, a: &VerifyArgs) -> anyhow::Result<Vec<Check>> {
    let ev = a.event.as_deref();
    let mut checks = vec![
        sql_check(
            pool,
            "no seat sold twice",
            &["tickets"],
            SEAT_SOLD_TWICE,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "sold seat has its order's ticket",
            &["tickets", "seats"],
            SOLD_SEAT_TICKET,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "seat ticket has a sold seat",
            &["tickets", "seats"],
            TICKET_SOLD_SEAT,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "ticket belongs to a paid order",
            &["tickets", "orders"],
            TICKET_PAID_ORDER,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "paid order has its tickets",
            &["orders", "order_items"],
            PAID_ORDER_TICKETS,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "GA stock conserved",
            &["ga_tiers", "hold_ga_items"],
            GA_CONSERVED,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "SKU stock conserved",
            &["inventory", "order_items"],
            SKU_CONSERVED,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "cart orders sell their own event's products",
            &["orders", "order_items", "products"],
            ORDER_EVENT,
            ev,
        )
        .await?,
        sql_check(
            pool,
            "auction price = highest bid",
            &["auctions", "bids"],
            AUCTIONS,
            ev,
        )
        .await?,
    ];
    // The stale-hold query has a second parameter.
    let rows = sqlx::query(STALE_HOLDS)
        .bind(ev)
        .bind(f64::from(a.conn.stale_hold_slack_s))
        .fetch_all(pool)
        .await
        .context("running check stale holds")?;
    let offenders: Vec<String> = rows
        .iter()
        .filter_map(|r| r.get::<Option<String>, _>(1))
        .collect();
    checks.push(Check {
        name: "no seat held past expiry".to_owned(),
        checked: rows.first().map_or(0, |r| r.get::<i64, _>(0)),
        violations: offenders.len() as i64,
        examples: offenders.into_iter().take(5).collect(),
        skipped: None,
    });
    checks.push(charges(pool, &a.conn, ev).await?);
    for e in &a.expect_sold_out {
        checks.push(sold_out(pool, e).await?);
    }
    Ok(checks)
}

pub async fn run(a: &VerifyArgs) -> anyhow::Result<VerifyReport> {
    let started = Instant::now();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&a.conn.database_url)
        .await
        .context("connecting to Postgres")?;
    let deadline = started + Duration::from_secs(a.conn.settle_s);
    loop {
        let checks = run_once(&pool, a).await?;
        let ok = checks.iter().all(|c| c.violations == 0);
        if ok || Instant::now() >= deadline {
            pool.close().await;
            return Ok(VerifyReport {
                ok,
                checks,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
