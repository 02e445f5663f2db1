//! Cart orders in one statement (issue 16, `orders::repo::one_statement`): what the statement
//! writes is what the full transaction writes, a stale price never makes a wrong order, the
//! body's timestamps print as chrono prints them, a one-line cart whose rows are all busy
//! waits for one, copies of one request make one order, and sold out is answered at once.

use crate::helpers::{TestApp, create_product, ensure_event, json};
use crate::products::{admin_put, post_order, put_line, stock};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

/// `cart_order_one_statement_total{outcome}` of this process.
pub async fn one_statement_orders(app: &TestApp, outcome: &str) -> u64 {
    let prefix =
        format!("floodgate_booking_cart_order_one_statement_total{{outcome=\"{outcome}\"}} ");
    app.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a counter"))
}

async fn order_cart_of(app: &TestApp, account: &str, sku: &str, qty: i64) -> (u16, String) {
    let token = app.admission(account, "shop");
    assert_eq!(put_line(app, &token, sku, json!(qty)).await.status(), 200);
    let resp = post_order(
        app,
        &token,
        &format!("k-{account}"),
        &json!({"source": "cart"}),
    )
    .await;
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// A one-statement order's answer is the order as `GET /api/orders/{id}` shows it, byte for
/// byte in its timestamps; the key stores the same bytes and a retry replays them; the outbox
/// row, the order's stock record and the SKU's counters are what the transaction writes.
#[tokio::test]
async fn a_one_statement_order_is_what_the_transaction_writes() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "ONE", 1200, 10, false).await;
    let (status, body) = order_cart_of(&app, "alice", "ONE", 3).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        one_statement_orders(&app, "created").await,
        1,
        "served by the statement"
    );
    assert_eq!(one_statement_orders(&app, "read_prices").await, 1);
    let v: Value = serde_json::from_str(&body).expect("json");
    let id = v["id"].as_str().expect("id");
    assert_eq!(
        (v["total"].as_i64(), v["status"].as_str()),
        (Some(3600), Some("PENDING_PAYMENT"))
    );
    assert_eq!(
        v["items"],
        json!([{"kind": "sku", "sku": "ONE", "name": "Product ONE", "quantity": 3,
                "unit_price": 1200, "amount": 3600}])
    );
    let token = app.admission("alice", "shop");
    let shown = app
        .get(&format!("/api/orders/{id}"), &token)
        .await
        .text()
        .await
        .expect("body");
    let shown: Value = serde_json::from_str(&shown).expect("json");
    assert_eq!(shown, v, "the answer is the order as it is read back");
    let expires: DateTime<Utc> = v["expires_at"]
        .as_str()
        .expect("expiry")
        .parse()
        .expect("time");
    let created: DateTime<Utc> = v["created_at"]
        .as_str()
        .expect("created")
        .parse()
        .expect("time");
    assert_eq!(
        (expires - created).num_seconds(),
        900,
        "the order's TTL from one clock read"
    );

    // The stored answer is the same bytes, and a retry replays them.
    let (state, stored): (String, Vec<u8>) = sqlx::query_as(
        "SELECT state, response_body FROM idempotency_keys WHERE account_id = 'alice' AND key = 'k-alice'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("key");
    assert_eq!(
        (state.as_str(), stored.as_slice()),
        ("done", body.as_bytes())
    );
    let again = post_order(&app, &token, "k-alice", &json!({"source": "cart"})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.text().await.expect("body"),
        body,
        "replayed byte for byte"
    );

    // What else the order wrote.
    let (topic, payload): (String, Value) =
        sqlx::query_as("SELECT topic, payload FROM outbox WHERE aggregate_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("outbox row");
    assert_eq!(topic, "order.created");
    assert_eq!(payload["expires_at"], v["expires_at"]);
    assert_eq!(
        (payload["order_id"].as_str(), payload["total"].as_i64()),
        (Some(id), Some(3600))
    );
    assert_eq!(payload["items"], v["items"]);
    let recorded: i64 =
        sqlx::query_scalar("SELECT sum(quantity)::bigint FROM order_stock WHERE order_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("order_stock");
    assert_eq!(recorded, 3);
    assert_eq!(stock(&app, "ONE").await, (7, 3, 0));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = 'alice'")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(orders, 1);
    app.stop().await;
}

/// A price changed after this process read it: the statement writes nothing, the transaction
/// makes the order at the new price, and the next order is one statement again.
#[tokio::test]
async fn a_stale_price_costs_a_statement_never_a_wrong_order() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "TEE", 1000, 10, false).await;
    let (status, body) = order_cart_of(&app, "a1", "TEE", 1).await;
    assert_eq!(status, 201, "{body}");
    let resp = admin_put(&app, "/admin/products/TEE", &json!({"price": 1500})).await;
    assert_eq!(resp.status(), 200);
    let (status, body) = order_cart_of(&app, "a2", "TEE", 2).await;
    assert_eq!(status, 201, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (v["total"].as_i64(), v["items"][0]["unit_price"].as_i64()),
        (Some(3000), Some(1500))
    );
    assert_eq!(one_statement_orders(&app, "stale_prices").await, 1);
    assert_eq!(
        one_statement_orders(&app, "created").await,
        1,
        "only the first"
    );
    let (status, body) = order_cart_of(&app, "a3", "TEE", 1).await;
    assert_eq!(status, 201, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["total"].as_i64(), Some(1500));
    assert_eq!(
        one_statement_orders(&app, "created").await,
        2,
        "the new price was learnt"
    );
    assert_eq!(stock(&app, "TEE").await, (6, 4, 0));
    app.stop().await;
}

/// The statement prints `timestamptz` as chrono prints a `DateTime<Utc>` (0, 3 or 6 digits of
/// fraction), whatever the session's time zone.
#[tokio::test]
async fn the_statement_prints_timestamps_as_chrono_does() {
    let app = TestApp::spawn().await;
    let mut conn = app.pool.acquire().await.expect("conn");
    sqlx::query("SET TimeZone = 'Asia/Kathmandu'")
        .execute(&mut *conn)
        .await
        .expect("set tz");
    for t in [
        "2026-12-04T04:05:06Z",
        "2026-12-04T04:05:06.100Z",
        "2026-12-04T04:05:06.120Z",
        "2026-12-04T04:05:06.123456Z",
        "2026-12-04T04:05:06.000001Z",
        "2026-12-04T04:05:06.010Z",
        "1999-12-31T23:59:59.999999Z",
        "2024-02-29T00:00:00.000500Z",
    ] {
        let at: DateTime<Utc> = t.parse().expect("time");
        let printed: String = sqlx::query_scalar(concat!(
            "SELECT ",
            booking::chrono_text_sql!("$1::timestamptz")
        ))
        .bind(at)
        .fetch_one(&mut *conn)
        .await
        .expect("print");
        let want = serde_json::to_value(at).expect("json");
        assert_eq!(Some(printed.as_str()), want.as_str(), "{t}");
    }
    drop(conn);
    app.stop().await;
}

/// Every row of a split SKU locked by someone else: a one-line cart's statement waits for one
/// row and takes it once it is free. A two-line cart's statement does not wait (it could hold
/// the other line's row): it fails, writing nothing, and the full transaction serves it.
#[tokio::test]
async fn a_one_line_cart_waits_for_a_busy_row_a_longer_one_goes_to_the_transaction() {
    let app = TestApp::spawn().await;
    ensure_event(&app, "shop").await;
    let (status, v) = json(
        app.admin_post(
            "/admin/products",
            &json!({"sku": "BUSY", "event": "shop", "name": "Busy", "price": 500,
                    "stock": 20, "stock_shards": 2}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{v}");
    create_product(&app, "shop", "OTHER", 100, 5, false).await;

    for (account, skus) in [
        ("one-line", vec!["BUSY"]),
        ("two-lines", vec!["BUSY", "OTHER"]),
    ] {
        let token = app.admission(account, "shop");
        for sku in &skus {
            assert_eq!(put_line(&app, &token, sku, json!(1)).await.status(), 200);
        }
        // Lock both rows of BUSY, as two orders in their commit would.
        let mut locker = app.pool.begin().await.expect("begin");
        sqlx::query("SELECT shard FROM inventory WHERE sku = 'BUSY' FOR UPDATE")
            .fetch_all(&mut *locker)
            .await
            .expect("lock the rows");
        let order = tokio::spawn({
            let client = app.client.clone();
            let url = app.url("/api/orders");
            let key = format!("k-{account}");
            async move {
                client
                    .post(url)
                    .bearer_auth(token)
                    .header("Idempotency-Key", key)
                    .json(&json!({"source": "cart"}))
                    .send()
                    .await
                    .expect("request")
            }
        });
        // The order waits for a row lock: not decided by a clock.
        app.until_a_request_waits_for_a_lock().await;
        locker.rollback().await.expect("release the rows");
        let resp = order.await.expect("order task");
        assert_eq!(resp.status(), 201, "{account}");
    }
    assert_eq!(
        one_statement_orders(&app, "created").await,
        1,
        "the one-line cart waited in its statement"
    );
    assert_eq!(
        one_statement_orders(&app, "busy").await,
        1,
        "the two-line cart found every row busy, wrote nothing and went to the transaction"
    );
    assert_eq!(stock(&app, "BUSY").await, (18, 2, 0));
    assert_eq!(stock(&app, "OTHER").await, (4, 1, 0));
    app.stop().await;
}

/// A client retrying faster than its order commits: 60 copies of one request at once, for a
/// one-line cart on a one-row SKU and for a two-line cart on split SKUs (whose statement does
/// not wait, so some copies reach the full transaction while the first is still in its
/// statement). One order each, every other copy a replay of it or `409` in flight, the stock
/// moved once, and no deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_of_one_order_make_one_order_without_deadlocks() {
    let app = TestApp::spawn().await;
    ensure_event(&app, "shop").await;
    create_product(&app, "shop", "SOLO", 700, 50, false).await;
    for sku in ["PAIR-A", "PAIR-B"] {
        let (status, v) = json(
            app.admin_post(
                "/admin/products",
                &json!({"sku": sku, "event": "shop", "name": sku, "price": 300,
                        "stock": 40, "stock_shards": 2}),
            )
            .await,
        )
        .await;
        assert_eq!(status, 201, "{v}");
    }
    for (account, skus) in [("solo", vec!["SOLO"]), ("pair", vec!["PAIR-A", "PAIR-B"])] {
        let token = app.admission(account, "shop");
        for sku in &skus {
            assert_eq!(put_line(&app, &token, sku, json!(2)).await.status(), 200);
        }
        let cart = json!({"source": "cart"});
        let answers =
            futures::future::join_all((0..60).map(|_| post_order(&app, &token, "same-key", &cart)))
                .await;
        let mut bodies = Vec::new();
        for r in answers {
            let status = r.status().as_u16();
            let text = r.text().await.expect("body");
            match status {
                200 | 201 => bodies.push((status, text)),
                409 => assert!(text.contains("IDEMPOTENCY_IN_FLIGHT"), "{text}"),
                other => panic!("{account}: unexpected {other}: {text}"),
            }
        }
        assert_eq!(
            bodies.iter().filter(|(s, _)| *s == 201).count(),
            1,
            "{account}: one order made"
        );
        assert!(
            bodies.iter().all(|(_, b)| *b == bodies[0].1),
            "{account}: every success is the same order"
        );
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = $1")
            .bind(account)
            .fetch_one(&app.pool)
            .await
            .expect("count");
        assert_eq!(orders, 1, "{account}");
        for sku in &skus {
            assert_eq!(
                stock(&app, sku).await.1,
                2,
                "{account}: {sku} reserved once"
            );
        }
    }
    assert_eq!(app.stop_counting_deadlocks().await, 0, "deadlocks");
}

/// A line short over all its rows is answered `409` by the statement itself (nothing written,
/// no transaction), but never for a key that already made its order: a retry of a made order
/// on a sold-out SKU still replays it.
#[tokio::test]
async fn sold_out_is_answered_by_the_statement_but_a_made_order_still_replays() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "LAST", 800, 3, false).await;
    let (status, made) = order_cart_of(&app, "first", "LAST", 3).await;
    assert_eq!(status, 201, "{made}");
    let (status, body) = order_cart_of(&app, "late", "LAST", 1).await;
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (status, v["code"].as_str(), v["available"].as_i64()),
        (409, Some("SOLD_OUT"), Some(0)),
        "{body}"
    );
    assert_eq!(one_statement_orders(&app, "short").await, 1);
    // The same request again: its key made the order, so it replays rather than "sold out".
    let token = app.admission("first", "shop");
    let again = post_order(&app, &token, "k-first", &json!({"source": "cart"})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.text().await.expect("body"), made);
    assert_eq!(
        one_statement_orders(&app, "short").await,
        1,
        "not answered short"
    );
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE account_id = 'late'")
            .fetch_one(&app.pool)
            .await
            .expect("keys");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.pool)
        .await
        .expect("orders");
    assert_eq!((keys, orders), (0, 1), "the refusal wrote nothing");
    assert_eq!(stock(&app, "LAST").await, (0, 3, 0));
    app.stop().await;
}
