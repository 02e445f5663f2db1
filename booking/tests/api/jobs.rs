//! The background jobs' claims read what is due, not the whole sale: they run every second on
//! every instance, so a claim that walks every pending order costs a launch more the bigger it
//! gets.

use crate::helpers::{TestApp, ensure_event};
use crate::plans::{rows_read_by, run_prepared, sale_on_stale_statistics};

/// 3,000 pending orders, none due, no event cancelled, statistics from before the sale (as at
/// a launch) and generic plans: the expiry job's claim and the cancelled events' pending
/// orders each read a handful of rows. Before, the claim filtered its way through every pending
/// order (a volatile `clock_timestamp()` bound is no index condition): 3,000 rows read here.
/// The cancelled-event queries walked every order's primary key with a million pending orders
/// (1.65 s per run, measured on a bench database) or hashed every order (233 ms per run in the
/// orders bench); at this test's 3,000 rows the old text's plan happened to be good, so these
/// checks guard the rewrite rather than reproduce that plan. Not covered: once an event IS
/// cancelled, its orders are read per event, and with these stale statistics the planner
/// scans `orders` for them (3,010 rows here) instead of using `orders_event_created`.
#[tokio::test]
async fn the_background_claims_read_only_what_is_due() {
    let app = TestApp::spawn().await;
    sale_on_stale_statistics(&app, &["orders", "events"]).await;
    let mut conn = app.pool.acquire().await.expect("conn");
    // No JIT on booking's connections: a stale estimate made Postgres compile these queries
    // on every run (`platform::db::pool`).
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&mut *conn)
        .await
        .expect("jit");
    assert_eq!(jit, "off");
    let statements = [
        ("claim_due", booking::orders::expiry::CLAIM_DUE, "(200)"),
        (
            "pending_of_cancelled",
            booking::payments::ops::event_cancel::PENDING_OF_CANCELLED,
            "(NULL)",
        ),
        (
            "paid_of_cancelled",
            booking::payments::ops::event_cancel::PAID_OF_CANCELLED,
            "(NULL)",
        ),
    ];
    for mode in ["generic", "custom"] {
        for (name, sql, args) in statements {
            let name = format!("{name}_{mode}");
            let (read, plan) = rows_read_by(&mut conn, mode, &name, sql, args).await;
            assert!(read < 50.0, "{name}: {read} rows read: {plan:#}");
        }
    }
}

/// One background claim: its statement, the plan booking runs it with (`generic`: cached by a
/// kept prepared statement; `custom`: planned on each run), the arguments of a run (a batch of
/// 100), the rows it can claim (3,000), and how many it claimed.
struct Claim {
    name: &'static str,
    sql: String,
    plan: &'static str,
    args: String,
    table: &'static str,
    fill: &'static str,
    claimed: &'static str,
}

/// Every batch claim of the background jobs, each a `FOR UPDATE SKIP LOCKED` sub-select of
/// `LIMIT` rows that the statement then updates or deletes.
fn claims() -> Vec<Claim> {
    vec![
        Claim {
            name: "outbox_relay",
            sql: booking::outbox::relay::CLAIM_BATCH.to_owned(),
            plan: "generic",
            args: "(100, 30)".to_owned(),
            table: "outbox",
            fill: "INSERT INTO outbox (event_id, topic, aggregate_id, payload)
                   SELECT 'e' || g, 'order.created', 'o' || g, '{}'
                     FROM generate_series(1, 3000) g",
            claimed: "SELECT count(*) FROM outbox WHERE claimed_until IS NOT NULL",
        },
        Claim {
            name: "delivery_catch_up",
            sql: booking::outbox::delivery::CATCH_UP.to_owned(),
            // Its sub-select joins `orders`: a plan cached while `orders` was empty scans
            // `orders` for every outbox row (4.5 million rows read here), so booking plans it
            // on each run (`persistent(false)`).
            plan: "custom",
            args: "(1, 3600, 100)".to_owned(),
            table: "outbox",
            fill: "WITH o AS (
                       INSERT INTO orders (id, account_id, idempotency_key, source, event_id,
                                           total, status, paid_at, expires_at)
                       SELECT 'paid' || g, 'a' || g, 'k', 'cart', 'shop', 1000, 'PAID',
                              clock_timestamp(), clock_timestamp()
                         FROM generate_series(1, 3000) g
                       RETURNING id)
                   INSERT INTO outbox (event_id, topic, aggregate_id, payload, published_at)
                   SELECT 'order.paid:' || o.id, 'order.paid', o.id, '{}',
                          clock_timestamp() - interval '1 min'
                     FROM o",
            claimed: "SELECT count(*) FROM outbox
                       WHERE topic = 'order.paid' AND published_at IS NULL",
        },
        Claim {
            name: "payments_reconcile",
            sql: booking::payments::repo::CLAIM_DUE.to_owned(),
            plan: "generic",
            args: "(100, 30)".to_owned(),
            table: "payments",
            fill: "WITH o AS (
                       INSERT INTO orders (id, account_id, idempotency_key, source, event_id,
                                           total, expires_at)
                       SELECT 'pay' || g, 'p' || g, 'k', 'cart', 'shop', 1000,
                              clock_timestamp() + interval '10 min'
                         FROM generate_series(1, 3000) g
                       RETURNING id, account_id)
                   INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount,
                                         currency, payment_method, next_check_at)
                   SELECT 'pa_' || o.id, o.id, o.account_id, 1, o.id || '-1', 1000, 'JPY',
                          'card', clock_timestamp() - interval '1 min'
                     FROM o",
            claimed: "SELECT count(*) FROM payments WHERE next_check_at > clock_timestamp()",
        },
        Claim {
            name: "refund_lease",
            sql: booking::payments::ops::event_cancel::lease_sql(),
            plan: "generic",
            args: "(100, 30)".to_owned(),
            table: "order_refunds",
            fill: "WITH o AS (
                       INSERT INTO orders (id, account_id, idempotency_key, source, event_id,
                                           total, status, paid_at, expires_at)
                       SELECT 'ref' || g, 'r' || g, 'k', 'cart', 'shop', 1000, 'PAID',
                              clock_timestamp(), clock_timestamp()
                         FROM generate_series(1, 3000) g
                       RETURNING id)
                   INSERT INTO order_refunds (id, order_id, event_id, payment_id,
                                              provider_payment_id, amount, stock, origin, actor,
                                              leased_until)
                   SELECT 'rf_' || o.id, o.id, 'shop', 'pa_' || o.id, 'pi_' || o.id, 1000,
                          'kill', 'event_cancel', 'ops', clock_timestamp() - interval '1 min'
                     FROM o",
            claimed: "SELECT count(*) FROM order_refunds WHERE leased_until > clock_timestamp()",
        },
        Claim {
            name: "idempotency_purge",
            sql: booking::platform::idempotency::PURGE_BATCH.to_owned(),
            plan: "generic",
            args: "(24, 100)".to_owned(),
            table: "idempotency_keys",
            fill: "INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id,
                                                 created_at)
                   SELECT 'i' || g, 'k', '\\x00', 'in_flight', 'c' || g,
                          clock_timestamp() - interval '2 days'
                     FROM generate_series(1, 3000) g",
            claimed: "SELECT 3000 - count(*) FROM idempotency_keys",
        },
        Claim {
            name: "hold_sweep",
            sql: booking::inventory::sweeper::SWEEP_SQL.to_owned(),
            plan: "generic",
            args: "(100)".to_owned(),
            table: "holds",
            fill: "INSERT INTO holds (id, event_id, account_id, kind, quantity, expires_at,
                                     seat_ids)
                   SELECT 'h' || g, 'shop', 'h' || g, 'seats', 1,
                          clock_timestamp() - interval '1 min', '{}'
                     FROM generate_series(1, 3000) g",
            claimed: "SELECT count(*) FROM holds WHERE status = 'expired'",
        },
        // Not a job: a seat hold ends the due holds of the seats it reclaimed (by id).
        Claim {
            name: "reclaimed_holds",
            sql: booking::inventory::holds::EXPIRE_RECLAIMED.to_owned(),
            plan: "generic",
            args: format!(
                "('{{{}}}'::text[])",
                (1..=100)
                    .map(|g| format!("r{g}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            table: "holds",
            fill: "INSERT INTO holds (id, event_id, account_id, kind, quantity, expires_at,
                                     seat_ids)
                   SELECT 'r' || g, 'shop', 'r' || g, 'seats', 1,
                          clock_timestamp() - interval '1 min', '{}'
                     FROM generate_series(1, 3000) g",
            claimed: "SELECT count(*) FROM holds WHERE status = 'expired' AND id LIKE 'r%'",
        },
        // Nor this: a fan's hold first ends the fan's own due holds.
        Claim {
            name: "own_holds",
            sql: booking::inventory::holds::EXPIRE_OWN.to_owned(),
            plan: "generic",
            args: "('shop', 'me')".to_owned(),
            table: "holds",
            fill: "INSERT INTO holds (id, event_id, account_id, kind, quantity, expires_at,
                                     seat_ids)
                   SELECT 'm' || g, 'shop', CASE WHEN g <= 100 THEN 'me' ELSE 'm' || g END,
                          'seats', 1, clock_timestamp() - interval '1 min', '{}'
                     FROM generate_series(1, 3000) g",
            claimed: "SELECT count(*) FROM holds WHERE status = 'expired' AND account_id = 'me'",
        },
    ]
}

/// Each claim takes its batch, once, whatever plan its connection cached. Booking's
/// connections keep their prepared statements, and Postgres keeps a generic plan until the
/// table's statistics change: a plan cached while the table was empty (a deployment's first
/// boot, the bench's fresh database) joined `IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`
/// by a nested loop that ran the sub-select again for every row of the table, re-sorting and
/// re-locking, and passing over the rows the statement had just updated: the claim took EVERY
/// row instead of its batch, in time quadratic in the table. The outbox relay's claim ran for
/// six minutes over 116,000 unpublished rows in the orders bench (the process's graceful stop
/// waited for it). Before the fix, here: each claim took all 3,000 rows, reading millions.
#[tokio::test]
async fn claims_take_their_batch_once_whatever_plan_was_cached() {
    let app = TestApp::spawn().await;
    ensure_event(&app, "shop").await;
    let claims = claims();
    let mut conn = app.pool.acquire().await.expect("conn");
    // As at a first boot: the tables analysed empty, autovacuum not yet caught up (off here,
    // so that no analyse replaces the cached plans mid-test).
    for table in [
        "outbox",
        "orders",
        "payments",
        "order_refunds",
        "idempotency_keys",
        "holds",
    ] {
        for sql in [
            format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
            format!("ANALYZE {table}"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
                .expect("stale statistics");
        }
    }
    for c in &claims {
        // The first run, on the empty table, caches a generic plan.
        for sql in [
            format!("SET plan_cache_mode = force_{}_plan", c.plan),
            format!("PREPARE {} AS {}", c.name, c.sql),
            format!("EXECUTE {}{}", c.name, c.args),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
    for c in &claims {
        let mode = format!("SET plan_cache_mode = force_{}_plan", c.plan);
        sqlx::query(sqlx::AssertSqlSafe(mode))
            .execute(&mut *conn)
            .await
            .expect("plan mode");
        sqlx::query(sqlx::AssertSqlSafe(c.fill))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{} ({}): {e}", c.name, c.table));
        let (read, plan) = run_prepared(&mut conn, c.name, &c.args).await;
        let claimed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(c.claimed))
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(
            claimed, 100,
            "{}: its batch of 100, not more: {plan:#}",
            c.name
        );
        // Linear: the due rows read (and sorted) once, plus the batch; not rows × batch.
        assert!(read < 30_000.0, "{}: {read} rows read: {plan:#}", c.name);
    }
}
