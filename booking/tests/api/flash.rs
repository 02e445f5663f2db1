//! The flash-sale gate: at most the remaining stock reaches Postgres, the rest is `409
//! SOLD_OUT` without a query; failures release slots; reconcile; retries are never "sold out".

use crate::helpers::create_product;
use crate::helpers::{TestApp, json};
use crate::products::{admin_put, post_order, put_line, stock};
use futures::StreamExt;
use serde_json::json;
use std::collections::BTreeMap;

static CART: std::sync::LazyLock<serde_json::Value> =
    std::sync::LazyLock::new(|| json!({"source": "cart"}));

/// Puts `qty` of `sku` into `account`'s cart directly in Redis (setup speed; the cart
/// endpoint itself is tested in cart.rs).
async fn fill_cart(app: &TestApp, account: &str, sku: &str, qty: i64) {
    let mut conn = app.state.redis.conn().await.expect("redis");
    redis::cmd("HSET")
        .arg(booking::orders::cart::cart_key(
            &app.state.redis,
            account,
            "drop",
        ))
        .arg(sku)
        .arg(qty)
        .query_async::<()>(&mut conn)
        .await
        .expect("hset");
}

/// Orders that reached Postgres: each order transaction or statement of its own, plus every
/// order sent in a batch statement (one statement, many orders: `orders::batcher`).
fn db_transactions(app: &TestApp) -> u64 {
    let m = &app.state.orders.metrics;
    m.order_db_transactions.get() - m.order_batches.get() + m.batched_orders.get()
}

/// 1,000 units, 4,000 concurrent buyers: exactly 1,000 sold, the rest SOLD_OUT, and only
/// about 1,000 order transactions reached Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_units_thousands_of_buyers_through_the_gate() {
    // The admitted thousand queue on one inventory row; on a loaded 2-core test machine with a
    // debug build that queue can outlast the default 3 s pool wait (a 503, load shedding).
    // This test is about the counts; speed is measured by the benchmark on a release build.
    let app = TestApp::spawn_with(|c| c.database.acquire_timeout_ms = 60_000).await;
    create_product(&app, "drop", "DROP-1", 15000, 1000, true).await;
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "DROP-1")
            .await
            .expect("gate"),
        Some(1000)
    );
    let buyers = 4000;
    let accounts: Vec<String> = (0..buyers).map(|i| format!("fan{i}")).collect();
    let mut pipe = redis::pipe();
    for a in &accounts {
        pipe.cmd("HSET")
            .arg(booking::orders::cart::cart_key(&app.state.redis, a, "drop"))
            .arg("DROP-1")
            .arg(1)
            .ignore();
    }
    let mut conn = app.state.redis.conn().await.expect("redis");
    pipe.query_async::<()>(&mut conn).await.expect("fill carts");
    let tokens: Vec<String> = accounts.iter().map(|a| app.admission(a, "drop")).collect();
    let before = db_transactions(&app);
    // All requests are started at once; 1,000 are in flight at any moment (client sockets).
    let statuses: Vec<(u16, serde_json::Value)> = futures::stream::iter(tokens.iter())
        .map(|t| async { json(post_order(&app, t, "buy", &json!({"source": "cart"})).await).await })
        .buffer_unordered(1000)
        .collect()
        .await;
    let created = statuses.iter().filter(|(s, _)| *s == 201).count();
    let sold_out = statuses
        .iter()
        .filter(|(s, v)| *s == 409 && v["code"] == "SOLD_OUT")
        .count();
    let others: Vec<_> = statuses
        .iter()
        .filter(|(s, v)| !(*s == 201 || (*s == 409 && v["code"] == "SOLD_OUT")))
        .take(3)
        .collect();
    assert!(others.is_empty(), "unexpected answers: {others:?}");
    assert_eq!((created, sold_out), (1000, buyers - 1000));
    assert_eq!(stock(&app, "DROP-1").await, (0, 1000, 0));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(orders, 1000);
    let txs = db_transactions(&app) - before;
    // Each admitted request runs one transaction (plus rare deadlock retries); refusals none.
    assert!(
        (1000..=1020).contains(&txs),
        "{txs} order transactions reached Postgres"
    );
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "DROP-1")
            .await
            .expect("gate"),
        Some(0)
    );
    app.stop().await;
}

/// Without a gate (not hot) Postgres alone still sells exactly the stock; every request
/// reaches it.
#[tokio::test]
async fn without_the_gate_postgres_decides_alone() {
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "COLD", 100, 50, false).await;
    for i in 0..200 {
        fill_cart(&app, &format!("fan{i}"), "COLD", 1).await;
    }
    let tokens: Vec<String> = (0..200)
        .map(|i| app.admission(&format!("fan{i}"), "drop"))
        .collect();
    let before = db_transactions(&app);
    let results =
        futures::future::join_all(tokens.iter().map(|t| post_order(&app, t, "buy", &CART))).await;
    let created = results.iter().filter(|r| r.status() == 201).count();
    assert_eq!(created, 50);
    assert_eq!(stock(&app, "COLD").await, (0, 50, 0));
    assert!(db_transactions(&app) - before >= 200);
    app.stop().await;
}

/// A retry of an order that succeeded is replayed even after the gate hit zero; a new buyer
/// is refused without any database transaction.
#[tokio::test]
async fn retries_are_replayed_not_sold_out() {
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "ONE", 100, 1, true).await;
    let alice = app.admission("alice", "drop");
    fill_cart(&app, "alice", "ONE", 1).await;
    let first = post_order(&app, &alice, "k", &json!({"source": "cart"})).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");

    // Same key, cart cleared: replay.
    let again = post_order(&app, &alice, "k", &json!({"source": "cart"})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.text().await.expect("body"), first);
    // Same key, the cart refilled with the sold-out SKU: still a replay, not SOLD_OUT.
    fill_cart(&app, "alice", "ONE", 1).await;
    let again = post_order(&app, &alice, "k", &json!({"source": "cart"})).await;
    assert_eq!(again.status(), 200);

    let bob = app.admission("bob", "drop");
    fill_cart(&app, "bob", "ONE", 1).await;
    let before = db_transactions(&app);
    let (status, v) = json(post_order(&app, &bob, "k", &json!({"source": "cart"})).await).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("SOLD_OUT")));
    assert_eq!(
        db_transactions(&app),
        before,
        "refused without touching Postgres"
    );
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE account_id = 'bob'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(keys, 0);
    assert_eq!(stock(&app, "ONE").await, (0, 1, 0));
    app.stop().await;
}

/// The completed marker: a retry of an order that had no hot line, whose cart now holds a hot
/// SKU at zero, is replayed (the gate never saw that key, so only the marker tells it the key
/// already made an order); the first order's cart lines are gone, the sold-out line stays.
#[tokio::test]
async fn a_retry_meeting_a_sold_out_gate_it_never_passed_is_replayed() {
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "PLAIN", 100, 5, false).await;
    create_product(&app, "drop", "HOT", 100, 1, true).await;
    let bob = app.admission("bob", "drop");
    fill_cart(&app, "bob", "HOT", 1).await;
    let sold = post_order(&app, &bob, "b", &CART).await;
    assert_eq!(sold.status(), 201, "the only HOT unit");

    let alice = app.admission("alice", "drop");
    fill_cart(&app, "alice", "PLAIN", 2).await;
    let first = post_order(&app, &alice, "k", &CART).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");
    let mut conn = app.state.redis.conn().await.expect("redis");
    let cart: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(booking::orders::cart::cart_key(
            &app.state.redis,
            "alice",
            "drop",
        ))
        .query_async(&mut conn)
        .await
        .expect("cart");
    assert!(cart.is_empty(), "the ordered line left the cart: {cart:?}");

    // The same request again, the cart now holding the sold-out HOT: the gate refuses HOT,
    // the marker turns the refusal into the stored answer.
    fill_cart(&app, "alice", "HOT", 1).await;
    let again = post_order(&app, &alice, "k", &CART).await;
    assert_eq!(again.status(), 200, "replayed, not SOLD_OUT");
    assert_eq!(again.text().await.expect("body"), first);
    // A new key with that cart is sold out, and nothing else was ordered.
    let (status, v) = json(post_order(&app, &alice, "k2", &CART).await).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("SOLD_OUT")));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = 'alice'")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(orders, 1);
    assert_eq!(stock(&app, "PLAIN").await.0, 3);
    app.stop().await;
}

/// A failed order gives its gate slots back; the gate follows restocks and expiry; a gate that
/// is wrong or missing never makes us sell more than Postgres has.
#[tokio::test]
async fn failures_release_slots_and_reconcile_fixes_the_gate() {
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "HOT", 100, 5, true).await;
    create_product(&app, "drop", "NONE-LEFT", 100, 0, false).await;
    let alice = app.admission("alice", "drop");
    fill_cart(&app, "alice", "HOT", 2).await;
    fill_cart(&app, "alice", "NONE-LEFT", 1).await;
    let (status, v) = json(post_order(&app, &alice, "k", &json!({"source": "cart"})).await).await;
    assert_eq!((status, v["sku"].as_str()), (409, Some("NONE-LEFT")));
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "HOT")
            .await
            .expect("gate"),
        Some(5)
    );

    // More than the gate has left: refused with the gate's count.
    let bob = app.admission("bob", "drop");
    fill_cart(&app, "bob", "HOT", 6).await;
    let (status, v) = json(post_order(&app, &bob, "k", &json!({"source": "cart"})).await).await;
    assert_eq!(
        (status, v["code"].as_str(), v["available"].as_i64()),
        (409, Some("INSUFFICIENT_STOCK"), Some(5))
    );

    // A restock through the admin API moves the gate.
    admin_put(&app, "/admin/products/HOT", &json!({"stock": 8})).await;
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "HOT")
            .await
            .expect("gate"),
        Some(8)
    );

    // A gate that says more than Postgres has cannot oversell.
    let mut conn = app.state.redis.conn().await.expect("redis");
    redis::cmd("SET")
        .arg(app.state.redis.key("flash:stock:{HOT}"))
        .arg(1000)
        .query_async::<()>(&mut conn)
        .await
        .expect("set");
    let tokens: Vec<String> = (0..30)
        .map(|i| app.admission(&format!("fan{i}"), "drop"))
        .collect();
    for i in 0..30 {
        fill_cart(&app, &format!("fan{i}"), "HOT", 1).await;
    }
    let results =
        futures::future::join_all(tokens.iter().map(|t| post_order(&app, t, "buy", &CART))).await;
    assert_eq!(results.iter().filter(|r| r.status() == 201).count(), 8);
    assert_eq!(stock(&app, "HOT").await, (0, 8, 0));
    // Reconcile resets it from Postgres (also exposed to ops).
    let (status, v) = json(
        app.admin_post("/admin/products/HOT/flash/reconcile", &json!({}))
            .await,
    )
    .await;
    assert_eq!((status, v["gate"].as_i64()), (200, Some(0)));
    // The reset is audited (actor `bootstrap`, no note without X-Floodgate-Actor), with the gate
    // before.
    let (actor, detail): (String, serde_json::Value) = sqlx::query_as(
        "SELECT actor, detail FROM ops_audit
          WHERE action = 'product.flash_gate.reset' AND target = 'product:HOT'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("the flash gate reset's audit entry");
    assert_eq!(actor, "bootstrap");
    assert_eq!(detail["gate"], json!(0), "{detail}");
    assert!(detail.get("before").is_some(), "{detail}");
    // An unknown SKU is not reset (nor audited).
    let (status, _) = json(
        app.admin_post("/admin/products/NOPE/flash/reconcile", &json!({}))
            .await,
    )
    .await;
    assert_eq!(status, 404);

    // Expiry returns units and the gate follows.
    sqlx::query("UPDATE orders SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&app.pool)
        .await
        .expect("age");
    assert_eq!(
        booking::orders::expire_due(&app.state.orders)
            .await
            .expect("expire"),
        8
    );
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "HOT")
            .await
            .expect("gate"),
        Some(8)
    );

    // No gate at all (Redis lost it): Postgres still decides.
    redis::cmd("DEL")
        .arg(app.state.redis.key("flash:stock:{HOT}"))
        .query_async::<()>(&mut conn)
        .await
        .expect("del");
    let carol = app.admission("carol", "drop");
    fill_cart(&app, "carol", "HOT", 9).await;
    let (status, v) = json(post_order(&app, &carol, "k", &json!({"source": "cart"})).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("INSUFFICIENT_STOCK"))
    );
    put_line(&app, &carol, "HOT", json!(8)).await;
    let (status, _) = json(post_order(&app, &carol, "k", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 201);
    // Clearing the hot flag removes the gate.
    admin_put(&app, "/admin/products/HOT", &json!({"hot": false})).await;
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "HOT")
            .await
            .expect("gate"),
        None
    );
    app.stop().await;
}

/// Reconcile subtracts the units of admitted orders still in flight: Postgres' `available`
/// counts them until they commit, and a gate reset to plain `available` let one extra buyer
/// through per order in flight (each to wait on the hot row only to be refused). Settled
/// admissions are not in flight and give nothing back; one stuck past the in-flight window
/// (a process that died mid-order) stops holding units back.
#[tokio::test]
async fn reconcile_keeps_in_flight_admissions_out_of_the_gate() {
    use booking::orders::flash::{self, Gate};
    const ADMISSION_TTL_S: u64 = 24 * 3600;
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "INFL", 100, 10, true).await;
    let current = || async {
        flash::current(&app.state.redis, "INFL")
            .await
            .expect("gate")
    };
    let reconcile = || async {
        flash::reconcile(&app.state.pool, &app.state.redis, "INFL")
            .await
            .expect("reconcile")
    };
    assert_eq!(current().await, Some(10));

    assert_eq!(
        flash::acquire(&app.state.redis, "INFL", 3, "a1", ADMISSION_TTL_S).await,
        Gate::Admitted
    );
    assert_eq!(current().await, Some(7));
    assert_eq!(reconcile().await, Some(7), "the 3 in flight stay given out");
    // The same admission again takes nothing.
    assert_eq!(
        flash::acquire(&app.state.redis, "INFL", 3, "a1", ADMISSION_TTL_S).await,
        Gate::Retry
    );

    flash::release(&app.state.redis, "INFL", "a1").await;
    assert_eq!(current().await, Some(10));
    assert_eq!(reconcile().await, Some(10));

    // Settled (its order committed): not in flight, and a stray release gives nothing back.
    assert_eq!(
        flash::acquire(&app.state.redis, "INFL", 2, "a2", ADMISSION_TTL_S).await,
        Gate::Admitted
    );
    flash::settle(&app.state.redis, "INFL", "a2").await;
    flash::release(&app.state.redis, "INFL", "a2").await;
    assert_eq!(current().await, Some(8));
    assert_eq!(
        reconcile().await,
        Some(10),
        "Postgres decides what a settled order sold"
    );

    // An admission stuck far past the in-flight window is not held back.
    let mut conn = app.state.redis.conn().await.expect("redis");
    redis::cmd("HSET")
        .arg(app.state.redis.key("flash:adm:{INFL}"))
        .arg("stuck")
        .arg("4:1000")
        .query_async::<()>(&mut conn)
        .await
        .expect("hset");
    assert_eq!(reconcile().await, Some(10));
    app.stop().await;
}

/// The moment between an order's commit and its request settling the admission: the units
/// are already out of Postgres' `available` and the admission still looks in flight. A
/// reconcile then must count that order once, not twice (before the fix the gate came out one
/// lower than the stock left, and in a rush a fan was answered `SOLD_OUT` with a unit unsold).
#[tokio::test]
async fn reconcile_between_a_commit_and_its_settle_counts_the_order_once() {
    use booking::orders::flash;
    let app = TestApp::spawn().await;
    create_product(&app, "drop", "GAP", 100, 10, true).await;
    fill_cart(&app, "gapper", "GAP", 1).await;
    let token = app.admission("gapper", "drop");
    let resp = post_order(&app, &token, "gap-key", &CART).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(stock(&app, "GAP").await, (9, 1, 0));
    // Put the admission back to "in flight" (quantity:admitted_ms), as it is between the
    // order's commit and its settle.
    let mut conn = app.state.redis.conn().await.expect("redis");
    let (secs, micros): (String, String) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("time");
    let now_ms = secs.parse::<i64>().unwrap() * 1000 + micros.parse::<i64>().unwrap() / 1000;
    let adm_key = app.state.redis.key("flash:adm:{GAP}");
    redis::cmd("HSET")
        .arg(&adm_key)
        .arg("gapper\u{1f}gap-key")
        .arg(format!("1:{now_ms}"))
        .query_async::<()>(&mut conn)
        .await
        .expect("hset");
    let gate = flash::reconcile(&app.state.pool, &app.state.redis, "GAP")
        .await
        .expect("reconcile");
    assert_eq!(gate, Some(9), "the committed order counted twice");
    // ... and the reconcile settled it, as the request would have.
    let v: Option<String> = redis::cmd("HGET")
        .arg(&adm_key)
        .arg("gapper\u{1f}gap-key")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert_eq!(v.as_deref(), Some("done"));
    app.stop().await;
}

/// Reconcile running over and over while hundreds of buyers order at once: still exactly the
/// stock is sold, every other buyer gets a clear refusal, and the gate's bookkeeping ends
/// clean — every admitted order that committed is settled, every other admission released, so
/// nothing is left counted as in flight and the final reconcile finds the gate at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_racing_a_rush_sells_exactly_the_stock_and_settles_every_slot() {
    let app = TestApp::spawn_with(|c| c.database.acquire_timeout_ms = 60_000).await;
    let stock_units = 200;
    let buyers = 800;
    create_product(&app, "drop", "RACE", 100, stock_units, true).await;
    let accounts: Vec<String> = (0..buyers).map(|i| format!("racer{i}")).collect();
    for a in &accounts {
        fill_cart(&app, a, "RACE", 1).await;
    }
    let tokens: Vec<String> = accounts.iter().map(|a| app.admission(a, "drop")).collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reconciler = {
        let (state, done) = (app.state.clone(), done.clone());
        tokio::spawn(async move {
            let mut runs = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                booking::orders::flash::reconcile(&state.pool, &state.redis, "RACE")
                    .await
                    .expect("reconcile");
                runs += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            runs
        })
    };
    let answers: Vec<(u16, serde_json::Value)> = futures::stream::iter(tokens.iter())
        .map(|t| async { json(post_order(&app, t, "buy", &CART).await).await })
        .buffer_unordered(200)
        .collect()
        .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = reconciler.await.expect("reconciler");
    assert!(runs > 1, "reconcile ran {runs} times during the rush");

    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(s, v)| {
            *s == 409 && matches!(v["code"].as_str(), Some("SOLD_OUT" | "INSUFFICIENT_STOCK"))
        })
        .collect();
    let others: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s != 201 && *s != 409)
        .take(3)
        .collect();
    assert!(others.is_empty(), "unexpected answers: {others:?}");
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for (s, v) in &answers {
        *codes
            .entry(format!("{s} {}", v["code"].as_str().unwrap_or("")))
            .or_default() += 1;
    }
    let left = stock(&app, "RACE").await;
    assert_eq!(
        created, stock_units as usize,
        "answers: {codes:?}, stock {left:?}"
    );
    assert_eq!(
        refused.len(),
        buyers - stock_units as usize,
        "answers: {codes:?}"
    );
    assert_eq!(stock(&app, "RACE").await, (0, stock_units, 0));

    // Every admission is either settled (its order committed) or gone (released).
    let mut conn = app.state.redis.conn().await.expect("redis");
    let admissions: Vec<String> = redis::cmd("HVALS")
        .arg(app.state.redis.key("flash:adm:{RACE}"))
        .query_async(&mut conn)
        .await
        .expect("hvals");
    let settled = admissions.iter().filter(|v| *v == "done").count();
    assert_eq!(
        (settled, admissions.len()),
        (stock_units as usize, stock_units as usize),
        "admissions left: {:?}",
        admissions
            .iter()
            .filter(|v| *v != "done")
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        booking::orders::flash::reconcile(&app.state.pool, &app.state.redis, "RACE")
            .await
            .expect("reconcile"),
        Some(0)
    );
    app.stop().await;
}
