//! The background jobs' claims read what is due, not the whole sale: they run every second on
//! every instance, so a claim that walks every pending order costs a launch more the bigger it
//! gets.

use crate::helpers::TestApp;
use crate::plans::{rows_read_by, sale_on_stale_statistics};

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
