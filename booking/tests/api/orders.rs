//! Orders: stock under concurrency, idempotency over HTTP, rollback, deadlock-freedom,
//! expiry (and its race with a late payment), hold orders, bad input.

use crate::helpers::create_product;
use crate::helpers::{TestApp, json};
use crate::products::{post_order, put_line, stock};
use booking::orders::model::{AccountId, EventId, OrderId, OrderKey};
use booking::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use reqwest::header::HeaderValue;
use serde_json::json;

static CART: std::sync::LazyLock<serde_json::Value> =
    std::sync::LazyLock::new(|| json!({"source": "cart"}));
use std::collections::BTreeMap;

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

/// Stock 5, 20 concurrent buyers of 1: exactly 5 orders, available 0.
#[tokio::test]
async fn stock_of_five_twenty_concurrent_buyers() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "LIMITED", 9900, 5, false).await;
    let tokens: Vec<String> = (0..20)
        .map(|i| app.admission(&format!("fan{i}"), "shop"))
        .collect();
    for t in &tokens {
        assert_eq!(put_line(&app, t, "LIMITED", json!(1)).await.status(), 200);
    }
    let results =
        futures::future::join_all(tokens.iter().map(|t| post_order(&app, t, "order-1", &CART)))
            .await;
    let mut created = 0;
    let mut refused = 0;
    for r in results {
        let (status, v) = json(r).await;
        match status {
            201 => {
                created += 1;
                assert_eq!(v["status"], "PENDING_PAYMENT");
                assert_eq!(v["total"], 9900);
                assert_eq!(v["items"][0]["unit_price"], 9900);
            }
            409 => {
                refused += 1;
                assert_eq!(v["code"], "SOLD_OUT", "{v}");
                assert_eq!(v["available"], 0);
                assert_eq!(v["requested"], 1);
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert_eq!((created, refused), (5, 15));
    assert_eq!(stock(&app, "LIMITED").await, (0, 5, 0));
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 5);
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM outbox WHERE topic = 'order.created'"
        )
        .await,
        5
    );
    // Refused attempts released their keys; nothing is left in flight.
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM idempotency_keys WHERE state = 'in_flight'"
        )
        .await,
        0
    );
    app.stop().await;
}

/// 50 concurrent retries of one request: one order, one decrement; the rest are replays or
/// in-flight 409s; later retries replay the first body byte-for-byte; a different body is 422.
#[tokio::test]
async fn concurrent_same_key_retries_create_one_order() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 100, false).await;
    let token = app.admission("alice", "shop");
    put_line(&app, &token, "MUG", json!(2)).await;
    let body = json!({"source": "cart"});
    let results =
        futures::future::join_all((0..50).map(|_| post_order(&app, &token, "retry-me", &body)))
            .await;
    let mut first: Option<String> = None;
    let (mut created, mut replayed, mut in_flight) = (0, 0, 0);
    for r in results {
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        match status {
            201 => {
                created += 1;
                first = Some(text);
            }
            200 => replayed += 1,
            409 => {
                assert!(text.contains("IDEMPOTENCY_IN_FLIGHT"), "{text}");
                in_flight += 1;
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    assert_eq!(created, 1, "replayed {replayed}, in flight {in_flight}");
    assert_eq!(stock(&app, "MUG").await, (98, 2, 0));
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);

    let first = first.expect("one 201");
    let replay = post_order(&app, &token, "retry-me", &body).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(
        replay.headers().get("idempotent-replayed"),
        Some(&HeaderValue::from_static("true"))
    );
    assert_eq!(
        replay.text().await.expect("body"),
        first,
        "byte-for-byte replay"
    );

    let (status, v) =
        json(post_order(&app, &token, "retry-me", &json!({"hold_id": "h1"})).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED"))
    );
    // The cart was cleared after the commit.
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(0));
    assert_eq!(stock(&app, "MUG").await, (98, 2, 0));
    app.stop().await;
}

/// A repeat while the first attempt is still running is 409 and touches no stock.
#[tokio::test]
async fn in_flight_repeat_is_409() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 10, false).await;
    let token = app.admission("alice", "shop");
    put_line(&app, &token, "MUG", json!(1)).await;
    let body = json!({"source": "cart"});
    let key = IdempotencyKey::parse(Some(&HeaderValue::from_static("slow-1"))).expect("key");
    let fp = Fingerprint::of_json(&axum::http::Method::POST, "/api/orders", &body);
    let Begin::Started(claim) = idempotency::begin(&app.state.idempotency, "alice", &key, &fp)
        .await
        .expect("claim")
    else {
        panic!("fresh key replayed")
    };
    let resp = post_order(&app, &token, "slow-1", &body).await;
    assert!(resp.headers().get("retry-after").is_some());
    let (status, v) = json(resp).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("IDEMPOTENCY_IN_FLIGHT"))
    );
    assert_eq!(stock(&app, "MUG").await, (10, 0, 0));
    // Once the first attempt gives up, the retry goes through.
    claim.release(&app.pool).await;
    assert_eq!(
        post_order(&app, &token, "slow-1", &body).await.status(),
        201
    );
    app.stop().await;
}

/// The second line runs short: the first line's reservation is rolled back.
#[tokio::test]
async fn multi_line_shortage_rolls_back_earlier_lines() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "A-FIRST", 100, 10, false).await;
    create_product(&app, "shop", "B-SECOND", 200, 2, false).await;
    let lines = BTreeMap::from([("A-FIRST".to_owned(), 3), ("B-SECOND".to_owned(), 5)]);
    let mut tx = app.pool.begin().await.expect("tx");
    let err = booking::orders::create_cart_order_tx(
        &mut tx,
        &app.config.orders,
        OrderId::new("order-x"),
        AccountId::new("alice"),
        EventId::new("shop"),
        OrderKey::new("k"),
        &lines,
        None,
        booking::orders::StockWay::FreeRow,
    )
    .await
    .expect_err("shortage");
    // The first line really was reserved inside the transaction before the shortage...
    let (a,): (i64,) = sqlx::query_as("SELECT available FROM inventory WHERE sku = 'A-FIRST'")
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    assert_eq!(a, 7);
    drop(tx);
    // ...and the rollback undid it.
    let err = booking::platform::error::ApiError::from(err);
    assert_eq!(err.code(), "INSUFFICIENT_STOCK");
    assert_eq!(stock(&app, "A-FIRST").await, (10, 0, 0));
    assert_eq!(stock(&app, "B-SECOND").await, (2, 0, 0));

    // Over HTTP: the real remaining quantity is reported, nothing changes.
    let token = app.admission("alice", "shop");
    put_line(&app, &token, "A-FIRST", json!(3)).await;
    put_line(&app, &token, "B-SECOND", json!(5)).await;
    let (status, v) = json(post_order(&app, &token, "k1", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 409);
    assert_eq!(
        (
            v["code"].as_str(),
            v["sku"].as_str(),
            v["requested"].as_i64(),
            v["available"].as_i64()
        ),
        (
            Some("INSUFFICIENT_STOCK"),
            Some("B-SECOND"),
            Some(5),
            Some(2)
        )
    );
    assert_eq!(stock(&app, "A-FIRST").await, (10, 0, 0));
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 0);
    // The refusal was not stored: after a restock the same key succeeds.
    crate::products::admin_put(&app, "/admin/products/B-SECOND", &json!({"stock": 10})).await;
    let (status, v) = json(post_order(&app, &token, "k1", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["total"], 3 * 100 + 5 * 200);
    app.stop().await;
}

/// Carts filled in opposite orders, ordered concurrently many times: no deadlock reaches a
/// client and every unit is accounted for.
#[tokio::test]
async fn opposite_orders_never_surface_a_deadlock() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "X", 100, 10_000, false).await;
    create_product(&app, "shop", "Y", 100, 10_000, false).await;
    let n = 200;
    let tokens: Vec<String> = (0..n)
        .map(|i| app.admission(&format!("fan{i}"), "shop"))
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        let (first, second) = if i % 2 == 0 { ("X", "Y") } else { ("Y", "X") };
        put_line(&app, t, first, json!(1)).await;
        put_line(&app, t, second, json!(2)).await;
    }
    let results =
        futures::future::join_all(tokens.iter().map(|t| post_order(&app, t, "o", &CART))).await;
    for r in results {
        let (status, v) = json(r).await;
        assert_eq!(status, 201, "{v}");
    }
    let (ax, rx, _) = stock(&app, "X").await;
    let (ay, ry, _) = stock(&app, "Y").await;
    // Half the carts have X:1,Y:2 and half X:2,Y:1.
    assert_eq!((ax + rx, ay + ry), (10_000, 10_000));
    assert_eq!((rx, ry), (300, 300));
    app.stop().await;
}

#[tokio::test]
async fn orders_are_private_and_expire_once() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 10, false).await;
    let alice = app.admission("alice", "shop");
    put_line(&app, &alice, "MUG", json!(4)).await;
    let (status, order) =
        json(post_order(&app, &alice, "k", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 201);
    let id = order["id"].as_str().expect("id").to_owned();

    let (status, v) = json(app.get(&format!("/api/orders/{id}"), &alice).await).await;
    assert_eq!((status, v["total"].as_i64()), (200, Some(4800)));
    let bob = app.admission("bob", "shop");
    let (status, _) = json(app.get(&format!("/api/orders/{id}"), &bob).await).await;
    assert_eq!(status, 404);
    let (status, _) = json(app.get("/api/orders/nope", &alice).await).await;
    assert_eq!(status, 404);

    // Not due yet: nothing happens.
    assert_eq!(
        booking::orders::expire_due(&app.state.orders)
            .await
            .expect("expire"),
        0
    );
    sqlx::query("UPDATE orders SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&app.pool)
        .await
        .expect("age");
    assert_eq!(stock(&app, "MUG").await, (6, 4, 0));
    assert_eq!(
        booking::orders::expire_due(&app.state.orders)
            .await
            .expect("expire"),
        1
    );
    assert_eq!(
        booking::orders::expire_due(&app.state.orders)
            .await
            .expect("expire"),
        0
    );
    assert_eq!(stock(&app, "MUG").await, (10, 0, 0));
    let (_, v) = json(app.get(&format!("/api/orders/{id}"), &alice).await).await;
    assert_eq!(v["status"], "EXPIRED");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM outbox WHERE topic = 'order.expired'"
        )
        .await,
        1
    );
    // A late payment loses: nothing changes.
    let mut tx = app.pool.begin().await.expect("tx");
    assert!(
        booking::orders::mark_paid_tx(&mut tx, &id)
            .await
            .expect("pay")
            .is_none()
    );
    tx.commit().await.expect("commit");
    assert_eq!(stock(&app, "MUG").await, (10, 0, 0));
    app.stop().await;
}

/// The expiry job races late payments (the payment transition is the same conditional
/// UPDATE as the real one): every order ends PAID or EXPIRED, stock is sold or returned
/// exactly once.
#[tokio::test]
async fn expiry_racing_late_payments_returns_stock_exactly_once() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "HOTDOG", 500, 1000, false).await;
    let n = 60;
    let mut ids = Vec::new();
    for i in 0..n {
        let t = app.admission(&format!("fan{i}"), "shop");
        put_line(&app, &t, "HOTDOG", json!(2)).await;
        let (status, v) = json(post_order(&app, &t, "k", &json!({"source": "cart"})).await).await;
        assert_eq!(status, 201);
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    sqlx::query("UPDATE orders SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&app.pool)
        .await
        .expect("age");
    let payments = futures::future::join_all(ids.iter().map(|id| {
        let pool = app.pool.clone();
        let id = id.clone();
        tokio::spawn(async move {
            booking::platform::db::retry(5, || async {
                let mut tx = pool.begin().await?;
                let won = booking::orders::mark_paid_tx(&mut tx, &id).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(won.is_some())
            })
            .await
            .expect("payment tx")
        })
    }));
    let expiries = futures::future::join_all((0..4).map(|_| {
        let state = app.state.clone();
        tokio::spawn(async move {
            booking::orders::expire_due(&state.orders)
                .await
                .expect("expiry")
        })
    }));
    let (paid, expired) = tokio::join!(payments, expiries);
    let paid = paid
        .into_iter()
        .filter(|r| *r.as_ref().expect("join"))
        .count() as i64;
    let expired: u64 = expired.into_iter().map(|r| r.expect("join")).sum();
    assert_eq!(paid + expired as i64, n, "every order ended exactly once");
    assert_eq!(stock(&app, "HOTDOG").await, (1000 - 2 * paid, 0, 2 * paid));
    assert_eq!(
        count(&app, "SELECT count(*) FROM orders WHERE status = 'PAID'").await,
        paid
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM outbox WHERE topic = 'order.expired'"
        )
        .await,
        expired as i64
    );
    app.stop().await;
}

#[tokio::test]
async fn bad_order_requests_change_nothing() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 10, false).await;
    let token = app.admission("alice", "shop");
    put_line(&app, &token, "MUG", json!(1)).await;
    let body = json!({"source": "cart"});

    // Missing and empty keys.
    let resp = app.post("/api/orders", &token, &body).await;
    let (status, v) = json(resp).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("IDEMPOTENCY_KEY_MISSING"))
    );
    let (status, v) = json(post_order(&app, &token, "", &body).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("IDEMPOTENCY_KEY_MISSING"))
    );
    let long = "k".repeat(256);
    let (status, _) = json(post_order(&app, &token, &long, &body).await).await;
    assert_eq!(status, 422);

    for bad in [
        json!({}),
        json!({"source": "wishlist"}),
        json!({"source": "cart", "hold_id": "h"}),
        json!({"source": "cart", "extra": true}),
        json!({"hold_id": ""}),
        json!([1, 2]),
    ] {
        let (status, v) = json(post_order(&app, &token, "bad", &bad).await).await;
        assert_eq!(status, 422, "{bad} -> {v}");
    }
    let malformed = app
        .client
        .post(app.url("/api/orders"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "bad")
        .header("content-type", "application/json")
        .body("{\"source\": \"cart\"")
        .send()
        .await
        .expect("request");
    assert_eq!(json(malformed).await.0, 400);
    let oversized = app
        .client
        .post(app.url("/api/orders"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "bad")
        .header("content-type", "application/json")
        .body(format!(
            "{{\"source\": \"cart\", \"pad\": \"{}\"}}",
            "x".repeat(200_000)
        ))
        .send()
        .await
        .expect("request");
    assert_eq!(oversized.status(), 413);
    // No token.
    let resp = app
        .client
        .post(app.url("/api/orders"))
        .header("Idempotency-Key", "x")
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    // Empty cart.
    let bob = app.admission("bob", "shop");
    let (status, v) = json(post_order(&app, &bob, "e", &body).await).await;
    assert_eq!((status, v["code"].as_str()), (422, Some("CART_EMPTY")));
    // An unknown hold.
    let (status, v) = json(post_order(&app, &bob, "h", &json!({"hold_id": "nope"})).await).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("HOLD_EXPIRED")));

    assert_eq!(stock(&app, "MUG").await, (10, 0, 0));
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        count(&app, "SELECT count(*) FROM idempotency_keys").await,
        0
    );
    app.stop().await;
}

/// An order from a seat hold: prices from the tiers, the hold is pinned and becomes
/// `ordered`; a second order for it is refused; expiry releases the seats.
#[tokio::test]
async fn order_from_a_seat_hold_and_its_expiry() {
    let app = TestApp::spawn().await;
    let (status, v) = json(
        app.admin_post(
            "/admin/events",
            &json!({"id": "tour", "name": "Tour", "venue": "Dome",
                    "sale_start": "2020-01-01T00:00:00Z", "hold_ttl_s": 600,
                    "max_tickets_per_account": 4,
                    "price_tiers": [{"tier": "A", "price": 12000}],
                    "seat_map": {"sections": [{"name": "S1", "rows": 2, "seats_per_row": 5,
                                               "price_tier": "A"}]},
                    "ga_tiers": []}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let token = app.admission("alice", "tour");
    let (status, hold) = json(
        app.post(
            "/api/events/tour/holds",
            &token,
            &json!({"seats": ["S1-R1-1", "S1-R1-2"]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let hold_id = hold["hold_id"].as_str().expect("hold id").to_owned();

    // A token for another event cannot order this hold.
    let other = app.admission("alice", "other-event");
    let (status, v) =
        json(post_order(&app, &other, "o0", &json!({"hold_id": hold_id})).await).await;
    assert_eq!((status, v["code"].as_str()), (403, Some("WRONG_EVENT")));

    let (status, order) =
        json(post_order(&app, &token, "o1", &json!({"hold_id": hold_id})).await).await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["total"], 24000);
    assert_eq!(order["source"], "hold");
    assert_eq!(order["event_id"], "tour");
    assert_eq!(order["items"].as_array().map(Vec::len), Some(2));
    let status: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(&hold_id)
        .fetch_one(&app.pool)
        .await
        .expect("hold");
    assert_eq!(status, "ordered");
    let (status, v) =
        json(post_order(&app, &token, "o2", &json!({"hold_id": hold_id})).await).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("HOLD_EXPIRED")));

    sqlx::query("UPDATE orders SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&app.pool)
        .await
        .expect("age");
    assert_eq!(
        booking::orders::expire_due(&app.state.orders)
            .await
            .expect("expire"),
        1
    );
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats WHERE event_id = 'tour' AND status <> 'available'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("seats");
    assert_eq!(held, 0);
    let status: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(&hold_id)
        .fetch_one(&app.pool)
        .await
        .expect("hold");
    assert_eq!(status, "expired");
    app.stop().await;
}
