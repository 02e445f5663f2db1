//! One admission, one event (issue 14 item 2, DESIGN.md section 8): a token admitted to one
//! event (here a passthrough walk-in event) never puts another event's SKU in a cart, orders
//! it, pays for that event's order, bids on its auction or opens its auction's WebSocket —
//! `403 WRONG_EVENT`, nothing changed — while a token of the right event can.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failure must panic the test"
)]

use crate::auctions::in_secs;
use crate::helpers::{TestApp, create_auction, create_product, ensure_event, json, put_cart_line};
use crate::payments::{PayEnv, pay};
use crate::products::{admin_put, post_order, stock};
use booking::orders::model::{AccountId, EventId, OrderId, OrderKey};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The queued flash sale whose goods the intruder wants, and the walk-in event the
/// intruder was admitted to straight away.
const FLASH: &str = "flash";
const WALKIN: &str = "walkin";

fn wrong_event(status: u16, body: &Value, what: &str) {
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("WRONG_EVENT")),
        "{what}: {body}"
    );
}

/// Lines in every cart `account` could have: the old per-account key and one per event.
async fn cart_lines(app: &TestApp, account: &str) -> i64 {
    let mut conn = app.state.redis.conn().await.unwrap();
    let mut n = 0;
    for key in [
        booking::orders::cart::cart_key(&app.state.redis, account, FLASH),
        booking::orders::cart::cart_key(&app.state.redis, account, WALKIN),
        app.state.redis.key(&format!("cart:{{{account}}}")),
    ] {
        n += redis::cmd("HLEN")
            .arg(key)
            .query_async::<i64>(&mut conn)
            .await
            .unwrap();
    }
    n
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

async fn bid(app: &TestApp, token: &str, auction: &str, key: &str, amount: i64) -> (u16, Value) {
    json(
        app.client
            .post(app.url(&format!("/api/auctions/{auction}/bids")))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&json!({ "amount": amount }))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Opens `/ws/auctions/{id}` with `token`: `Ok(first text message)` or `Err(HTTP status)` of
/// a refused handshake.
async fn open_ws(app: &TestApp, auction: &str, token: &str) -> Result<Value, u16> {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::{Error, Message};
    let mut req = format!("ws://127.0.0.1:{}/ws/auctions/{auction}", app.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((mut ws, _)) => loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
                .await
                .expect("a snapshot within 30 s");
            if let Some(Ok(Message::Text(t))) = next {
                return Ok(serde_json::from_str(t.as_str()).unwrap());
            }
            assert!(
                matches!(next, Some(Ok(_))),
                "socket ended before a snapshot"
            );
        },
        Err(Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("ws connect: {e}"),
    }
}

#[tokio::test]
async fn a_token_of_another_event_cannot_cart_order_pay_or_bid() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    ensure_event(app, WALKIN).await;
    create_product(app, FLASH, "FLASH-1", 5000, 10, true).await;
    // The same fan, admitted to the walk-in event only, and then (legitimately) to the sale.
    let intruder = app.admission("fan", WALKIN);
    let admitted = app.admission("fan", FLASH);

    // Cart: the flash SKU never enters any cart of the intruder.
    let attempts = [
        ("SKU of another event in the token's cart", WALKIN),
        ("another event's cart", FLASH),
    ];
    for (what, cart_event) in attempts {
        let (s, v) = json(put_cart_line(app, &intruder, cart_event, "FLASH-1", 2).await).await;
        wrong_event(s, &v, what);
    }
    let (s, v) = json(crate::products::put_line(app, &intruder, "FLASH-1", json!(2)).await).await;
    wrong_event(s, &v, "the /api/cart alias");
    let (s, v) = json(
        app.get(&format!("/api/events/{FLASH}/cart"), &intruder)
            .await,
    )
    .await;
    wrong_event(s, &v, "reading another event's cart");
    assert_eq!(cart_lines(app, "fan").await, 0, "nothing was written");

    // Order from the cart: even if the intruder's cart held the SKU (a cart written before
    // carts were per event, or any bug above), the order is refused and changes nothing.
    let mut conn = app.state.redis.conn().await.unwrap();
    redis::cmd("HSET")
        .arg(booking::orders::cart::cart_key(
            &app.state.redis,
            "fan",
            WALKIN,
        ))
        .arg("FLASH-1")
        .arg(2)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let (s, v) =
        json(post_order(app, &intruder, "steal-1", &json!({"source": "cart"})).await).await;
    wrong_event(s, &v, "order from a cart holding another event's SKU");
    assert_eq!(stock(app, "FLASH-1").await, (10, 0, 0));
    assert_eq!(
        booking::orders::flash::current(&app.state.redis, "FLASH-1")
            .await
            .unwrap(),
        Some(10),
        "the flash gate gave no slot away"
    );
    assert_eq!(count(app, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(count(app, "SELECT count(*) FROM idempotency_keys").await, 0);
    // Postgres decides too: the order transaction itself refuses the SKU for that event.
    let lines = std::collections::BTreeMap::from([("FLASH-1".to_owned(), 2)]);
    let mut tx = app.pool.begin().await.unwrap();
    let err = booking::orders::create_cart_order_tx(
        &mut tx,
        &app.config.orders,
        OrderId::new("order-steal"),
        AccountId::new("fan"),
        EventId::new(WALKIN),
        OrderKey::new("k"),
        &lines,
        None,
        booking::orders::StockWay::FreeRow,
    )
    .await
    .expect_err("another event's SKU");
    drop(tx);
    assert_eq!(
        booking::platform::error::ApiError::from(err).code(),
        "WRONG_EVENT"
    );
    assert_eq!(stock(app, "FLASH-1").await, (10, 0, 0));

    // The right admission: cart, order (the order records its event).
    let r = put_cart_line(app, &admitted, FLASH, "FLASH-1", 2).await;
    assert_eq!(r.status(), 200);
    let (s, cart) = json(
        app.get(&format!("/api/events/{FLASH}/cart"), &admitted)
            .await,
    )
    .await;
    assert_eq!((s, cart["total"].as_i64()), (200, Some(10_000)), "{cart}");
    let (s, order) =
        json(post_order(app, &admitted, "buy-1", &json!({"source": "cart"})).await).await;
    assert_eq!(s, 201, "{order}");
    assert_eq!(order["event_id"], FLASH);
    let order_id = order["id"].as_str().unwrap().to_owned();
    assert_eq!(stock(app, "FLASH-1").await, (8, 2, 0));

    // Pay: the order's event decides; the refused attempt creates no payment attempt.
    let (s, v) = pay(app, &intruder, &order_id, "pay-1", "pm_card_visa").await;
    wrong_event(s, &v, "paying another event's order");
    assert_eq!(count(app, "SELECT count(*) FROM payments").await, 0);
    assert_eq!(env.sandbox.order_summary(&order_id).amount_charged, 0);
    let (s, v) = pay(app, &admitted, &order_id, "pay-1", "pm_card_visa").await;
    assert_eq!((s, v["status"].as_str()), (200, Some("PAID")), "{v}");
    assert_eq!(stock(app, "FLASH-1").await, (8, 0, 2));

    // Auctions of the sale, cold and hot.
    for hot in [false, true] {
        let (s, auction) = create_auction(
            app,
            FLASH,
            "seller",
            json!({"title": "Signed poster", "start_price": 1000, "min_increment": 10,
                   "end_time": in_secs(3600), "hot": hot}),
        )
        .await;
        assert_eq!(s, 201, "{auction}");
        assert_eq!(auction["event"], FLASH);
        let id = auction["id"].as_str().unwrap().to_owned();
        let (s, v) = bid(app, &intruder, &id, "b-1", 5000).await;
        wrong_event(s, &v, "bidding on another event's auction");
        let (s, v) = json(app.get(&format!("/api/auctions/{id}"), &intruder).await).await;
        wrong_event(s, &v, "reading another event's auction");
        assert_eq!(open_ws(app, &id, &intruder).await, Err(403), "hot={hot}");
        let (s, view) = json(app.get(&format!("/api/auctions/{id}"), &admitted).await).await;
        assert_eq!(s, 200, "{view}");
        assert_eq!(
            (view["bid_count"].as_i64(), view["current_price"].as_i64()),
            (Some(0), Some(1000)),
            "the refused bid changed nothing (hot={hot})"
        );
        assert_eq!(
            count(
                app,
                &format!("SELECT count(*) FROM bids WHERE auction_id = '{id}'")
            )
            .await,
            0
        );
        // The right admission bids and watches.
        let (s, v) = bid(app, &admitted, &id, "b-1", 5000).await;
        assert_eq!(s, 201, "{v}");
        let snapshot = open_ws(app, &id, &admitted)
            .await
            .expect("the right token opens it");
        assert_eq!(snapshot["type"], "snapshot");
        assert_eq!(snapshot["current_price"], 5000);
    }
    env.app.stop().await;
}

#[tokio::test]
async fn products_and_auctions_need_an_existing_event_and_a_token_for_it() {
    let app = TestApp::spawn().await;
    ensure_event(&app, FLASH).await;
    let product = |event: Option<&str>| {
        let mut b = json!({"sku": "P-1", "name": "Cap", "price": 100, "stock": 5});
        if let Some(e) = event {
            b["event"] = e.into();
        }
        b
    };
    let (s, v) = json(app.admin_post("/admin/products", &product(None)).await).await;
    assert_eq!(s, 422, "missing event: {v}");
    let (s, v) = json(
        app.admin_post("/admin/products", &product(Some("nope")))
            .await,
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (422, Some("UNKNOWN_EVENT")), "{v}");
    assert_eq!(count(&app, "SELECT count(*) FROM products").await, 0);
    let (s, v) = json(
        app.admin_post("/admin/products", &product(Some(FLASH)))
            .await,
    )
    .await;
    assert_eq!((s, v["event"].as_str()), (201, Some(FLASH)), "{v}");
    let (s, v) = json(app.admin_get("/admin/products/P-1").await).await;
    assert_eq!((s, v["event"].as_str()), (200, Some(FLASH)), "{v}");
    // A product's event is set once.
    let (s, v) =
        json(admin_put(&app, "/admin/products/P-1", &json!({"event": WALKIN})).await).await;
    assert_eq!(s, 422, "unknown event: {v}");
    ensure_event(&app, WALKIN).await;
    let (s, v) =
        json(admin_put(&app, "/admin/products/P-1", &json!({"event": WALKIN})).await).await;
    assert_eq!(s, 409, "moving a product to another event: {v}");
    let (s, v) = json(admin_put(&app, "/admin/products/P-1", &json!({"event": FLASH})).await).await;
    assert_eq!((s, v["event"].as_str()), (200, Some(FLASH)), "{v}");

    // A product from before events were required (as the migration leaves it) opens for no
    // token until ops assign it.
    sqlx::query(
        "WITH p AS (INSERT INTO products (sku, name, price) VALUES ('OLD-1', 'Old mug', 100)
                    RETURNING sku)
         INSERT INTO inventory (sku, available) SELECT sku, 5 FROM p",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let token = app.admission("fan", FLASH);
    let (s, v) = json(put_cart_line(&app, &token, FLASH, "OLD-1", 1).await).await;
    wrong_event(s, &v, "a product without an event");
    let (s, v) = json(app.admin_get("/admin/products/OLD-1").await).await;
    assert_eq!((s, &v["event"]), (200, &Value::Null), "{v}");
    let (s, v) =
        json(admin_put(&app, "/admin/products/OLD-1", &json!({"event": FLASH})).await).await;
    assert_eq!((s, v["event"].as_str()), (200, Some(FLASH)), "{v}");
    let r = put_cart_line(&app, &token, FLASH, "OLD-1", 1).await;
    assert_eq!(r.status(), 200);

    // Auctions: the seller's token must be for the auction's event, which must exist.
    let body = json!({"title": "Vase", "start_price": 500, "min_increment": 5,
                      "end_time": in_secs(3600)});
    let walkin_seller = app.admission("seller", WALKIN);
    let post = |token: String, body: Value| {
        app.client
            .post(app.url("/api/auctions"))
            .bearer_auth(token)
            .header("Idempotency-Key", shared::ids::new_id())
            .json(&body)
            .send()
    };
    let mut other = body.clone();
    other["event"] = FLASH.into();
    let (s, v) = json(post(walkin_seller.clone(), other).await.unwrap()).await;
    wrong_event(s, &v, "creating an auction in another event");
    let (s, v) = json(post(walkin_seller.clone(), body.clone()).await.unwrap()).await;
    assert_eq!(s, 422, "missing event: {v}");
    let mut unknown = body.clone();
    unknown["event"] = "nope".into();
    let (s, v) = json(
        post(app.admission("seller", "nope"), unknown)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (422, Some("UNKNOWN_EVENT")), "{v}");
    assert_eq!(count(&app, "SELECT count(*) FROM auctions").await, 0);
    assert_eq!(
        count(&app, "SELECT count(*) FROM idempotency_keys").await,
        0
    );
    app.stop().await;
}
