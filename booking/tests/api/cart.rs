//! The Redis cart over HTTP.

use crate::helpers::create_product;
use crate::helpers::{TestApp, json};
use crate::products::{admin_put, put_line};
use serde_json::json;

#[tokio::test]
async fn put_get_delete_with_current_prices() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 50, false).await;
    create_product(&app, "shop", "CAP", 2500, 50, false).await;
    let token = app.admission("alice", "shop");

    let (status, v) = json(put_line(&app, &token, "MUG", json!(2)).await).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["quantity"].as_i64(), v["lines"].as_i64()),
        (Some(2), Some(1))
    );
    // Absolute: the same PUT twice leaves quantity 2.
    json(put_line(&app, &token, "MUG", json!(2)).await).await;
    json(put_line(&app, &token, "CAP", json!(1)).await).await;

    let (status, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(status, 200);
    assert_eq!(cart["total"], 2 * 1200 + 2500);
    assert_eq!(cart["lines"][0]["sku"], "CAP");
    assert_eq!(cart["lines"][1]["quantity"], 2);

    // Prices are not stored in the cart: a price change shows up at once.
    admin_put(&app, "/admin/products/MUG", &json!({"price": 1000})).await;
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["total"], 2 * 1000 + 2500);

    // 0 removes; DELETE removes (and is idempotent).
    json(put_line(&app, &token, "MUG", json!(0)).await).await;
    for _ in 0..2 {
        let resp = app
            .client
            .delete(app.url("/api/cart/items/CAP"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), 204);
    }
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(0));
    assert_eq!(cart["total"], 0);

    // Another account has its own cart; no token is 401.
    let bob = app.admission("bob", "shop");
    json(put_line(&app, &bob, "MUG", json!(5)).await).await;
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(0));
    let status = app
        .client
        .get(app.url("/api/cart"))
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, 401);

    // The TTL is refreshed on write (30 days).
    let mut conn = app.state.redis.conn().await.expect("redis");
    let ttl: i64 = redis::cmd("TTL")
        .arg(booking::orders::cart::cart_key(
            &app.state.redis,
            "bob",
            "shop",
        ))
        .query_async(&mut conn)
        .await
        .expect("ttl");
    assert!(ttl > 29 * 24 * 3600 && ttl <= 30 * 24 * 3600, "ttl {ttl}");
    app.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 50, false).await;
    let token = app.admission("alice", "shop");
    json(put_line(&app, &token, "MUG", json!(3)).await).await;

    for bad in [
        json!(-1),
        json!(100),
        json!(1_000_000_000_000i64),
        json!(1.5),
        json!("2"),
    ] {
        let (status, v) = json(put_line(&app, &token, "MUG", bad.clone()).await).await;
        assert_eq!(status, 422, "{bad} -> {v}");
    }
    let (status, v) = json(put_line(&app, &token, "NOPE", json!(1)).await).await;
    assert_eq!((status, v["code"].as_str()), (404, Some("UNKNOWN_SKU")));
    let (status, _) = json(put_line(&app, &token, "bad%20sku", json!(1)).await).await;
    assert_eq!(status, 404);

    let malformed = app
        .client
        .put(app.url("/api/cart/items/MUG"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{\"quantity\": ")
        .send()
        .await
        .expect("request");
    let (status, v) = json(malformed).await;
    assert_eq!((status, v["code"].as_str()), (400, Some("MALFORMED_JSON")));
    let oversized = app
        .client
        .put(app.url("/api/cart/items/MUG"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(format!(
            "{{\"quantity\": 1, \"pad\": \"{}\"}}",
            "x".repeat(200_000)
        ))
        .send()
        .await
        .expect("request");
    assert_eq!(oversized.status(), 413);

    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"][0]["quantity"], 3);
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(1));
    app.stop().await;
}

/// 100 lines fit; concurrent adds of 120 different SKUs leave exactly 100 and refuse the
/// rest with 422 CART_FULL; updating an existing line still works when full.
#[tokio::test]
async fn line_limit_holds_under_concurrency() {
    let app = TestApp::spawn().await;
    for i in 0..120 {
        create_product(&app, "shop", &format!("SKU-{i:03}"), 100, 10, false).await;
    }
    let token = app.admission("alice", "shop");
    let skus: Vec<String> = (0..120).map(|i| format!("SKU-{i:03}")).collect();
    let results =
        futures::future::join_all(skus.iter().map(|s| put_line(&app, &token, s, json!(1)))).await;
    let mut ok = 0;
    let mut full = 0;
    for r in results {
        let (status, v) = json(r).await;
        match status {
            200 => ok += 1,
            422 if v["code"] == "CART_FULL" => full += 1,
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert_eq!((ok, full), (100, 20));
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(100));
    let first = cart["lines"][0]["sku"].as_str().expect("sku").to_owned();
    let (status, _) = json(put_line(&app, &token, &first, json!(7)).await).await;
    assert_eq!(status, 200);
    app.stop().await;
}

/// Two devices editing different SKUs concurrently never overwrite each other.
#[tokio::test]
async fn devices_editing_different_skus_do_not_collide() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "A", 100, 10, false).await;
    create_product(&app, "shop", "B", 100, 10, false).await;
    let token = app.admission("alice", "shop");
    let mut futs = Vec::new();
    for q in 1..=50 {
        futs.push(put_line(&app, &token, "A", json!(q % 9 + 1)));
        futs.push(put_line(&app, &token, "B", json!(q % 7 + 1)));
    }
    for r in futures::future::join_all(futs).await {
        assert_eq!(r.status(), 200);
    }
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["lines"].as_array().map(Vec::len), Some(2));
    app.stop().await;
}

/// Prices come from each process's catalogue cache: a change made through one process shows
/// on the next cart read of every process (the catalogue version in Redis), names included.
#[tokio::test]
async fn a_price_change_reaches_the_cart_on_every_process() {
    let app = TestApp::spawn().await;
    let peer = app.spawn_peer(|_| {}).await;
    create_product(&app, "shop", "MUG", 1200, 50, false).await;
    create_product(&app, "shop", "CAP", 2500, 50, false).await;
    let token = app.admission("alice", "shop");
    json(put_line(&app, &token, "MUG", json!(2)).await).await;
    json(put_line(&peer, &token, "CAP", json!(1)).await).await;
    // Both processes have read (and cached) the prices.
    for node in [&app, &peer] {
        let (status, cart) = json(node.get("/api/cart", &token).await).await;
        assert_eq!(
            (status, cart["total"].as_i64()),
            (200, Some(2 * 1200 + 2500))
        );
    }

    let resp = admin_put(
        &app,
        "/admin/products/MUG",
        &json!({"price": 1000, "name": "Big mug"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    for node in [&peer, &app] {
        let (_, cart) = json(node.get("/api/events/shop/cart", &token).await).await;
        assert_eq!(cart["total"], 2 * 1000 + 2500, "{cart}");
        assert_eq!(cart["lines"][1]["sku"], "MUG");
        assert_eq!(cart["lines"][1]["name"], "Big mug");
        assert_eq!(cart["lines"][1]["unit_price"], 1000);
    }
    // A stock change is not a price change, and a second price change is seen as well.
    admin_put(&peer, "/admin/products/CAP", &json!({"stock": 60})).await;
    admin_put(&peer, "/admin/products/CAP", &json!({"price": 3000})).await;
    for node in [&app, &peer] {
        let (_, cart) = json(node.get("/api/cart", &token).await).await;
        assert_eq!(cart["total"], 2 * 1000 + 3000, "{cart}");
    }
    peer.stop().await;
    app.stop().await;
}

/// Reading a cart (and changing a line of a known product) needs no Postgres while prices are
/// unchanged: with booking's Postgres connections cut, both still answer from Redis and the
/// catalogue cache.
#[tokio::test]
async fn cart_reads_and_writes_of_known_products_need_no_postgres() {
    let app = TestApp::spawn_through_proxies(|c| {
        c.database.acquire_timeout_ms = 2_000;
        // Far longer than the test, so the cache cannot age out while Postgres is cut.
        c.orders.cart_price_max_age_ms = 3_600_000;
    })
    .await;
    create_product(&app, "shop", "MUG", 1200, 50, false).await;
    let token = app.admission("alice", "shop");
    json(put_line(&app, &token, "MUG", json!(2)).await).await;
    let (_, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(cart["total"], 2400);

    let db = &app.chaos.as_ref().expect("proxied").db;
    db.cut().await;
    let (status, v) = json(put_line(&app, &token, "MUG", json!(3)).await).await;
    assert_eq!(status, 200, "{v}");
    let (status, cart) = json(app.get("/api/cart", &token).await).await;
    assert_eq!(status, 200, "{cart}");
    assert_eq!(cart["total"], 3 * 1200);
    // A product this process has never seen does need Postgres: a clean 503, not a guess.
    let (status, v) = json(put_line(&app, &token, "NEW", json!(1)).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (503, Some("UNAVAILABLE")),
        "{v}"
    );
    db.restore();
    app.stop().await;
}
