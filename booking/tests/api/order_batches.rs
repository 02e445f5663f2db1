//! Group commit for a hot SKU (issue 16, `orders::batcher`): many one-line cart orders of one
//! SKU in one statement, each still all or nothing with its own key. The statement on its own
//! (which orders one locked row serves, a stored key left out, the bodies) and under hundreds
//! of concurrent buyers sending every request twice, on one row and on eight.

use crate::helpers::{TestApp, create_product, json};
use crate::products::post_order;
use crate::split_stock::{assert_conserved, create_split, fill_carts};
use booking::orders::model::{AccountId, EventId, OrderId, PricedSku};
use booking::orders::repo::{BatchOrder, OneStatement, create_cart_orders_batched, order_text};
use booking::platform::idempotency::Fingerprint;
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};

/// A batch member ordering `qty` of `sku` for `account` with key `k-{account}`, its text built
/// as the handler builds it.
fn member(
    app: &TestApp,
    event: &str,
    sku: &str,
    priced: &PricedSku,
    account: &str,
    qty: i64,
) -> BatchOrder {
    let lines = BTreeMap::from([(sku.to_owned(), qty)]);
    let prices = BTreeMap::from([(sku.to_owned(), priced.clone())]);
    let order_id = shared::ids::new_id();
    let text = order_text(
        &app.state.orders.settings,
        OrderId::new(&order_id),
        AccountId::new(account),
        EventId::new(event),
        &lines,
        &prices,
    )
    .expect("text")
    .expect("priced");
    BatchOrder {
        order_id,
        account: account.to_owned(),
        key: format!("k-{account}"),
        fingerprint: Fingerprint::of_json(&Method::POST, "/api/orders", &json!({"source": "cart"}))
            .as_bytes()
            .to_vec(),
        quantity: qty,
        head: text.head,
        tail: text.tail,
        outbox_id: shared::ids::new_id(),
        payload: text.payload,
    }
}

/// One row with 5 units, one order (b0, 1 unit) made before. The batch, in arrival order:
/// b1 wants 2, b0 again (its key is stored), b3 wants 2, b4 wants 1. The row serves b1 and b3
/// (4 units), leaves b0 to the one-order path (which replays it), and answers b4 sold out; what
/// it wrote is exactly what the one-order path writes, read back through the API.
#[tokio::test]
async fn one_statement_serves_the_batch_in_arrival_order_while_the_locked_row_has_units() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "BAT", 1000, 5, false).await;
    let t0 = app.admission("b0", "shop");
    fill_carts_of(&app, "shop", &[("b0", "BAT", 1)]).await;
    let first = post_order(&app, &t0, "k-b0", &json!({"source": "cart"})).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");

    let priced = PricedSku {
        name: "Product BAT".into(),
        price: 1000,
        event: Some("shop".into()),
        stock_rows: 1,
    };
    let batch = vec![
        member(&app, "shop", "BAT", &priced, "b1", 2),
        member(&app, "shop", "BAT", &priced, "b0", 1),
        member(&app, "shop", "BAT", &priced, "b3", 2),
        member(&app, "shop", "BAT", &priced, "b4", 1),
    ];
    let mut conn = app.state.orders.statements.acquire().await.expect("conn");
    let out = create_cart_orders_batched(
        &mut conn,
        &app.state.orders.settings,
        "shop",
        "BAT",
        &priced,
        &batch,
    )
    .await
    .expect("batch");
    conn.ended_if(true);
    drop(conn);
    assert_eq!(out.emptied, Some(0), "the batch emptied the only row");
    let mut bodies = Vec::new();
    for (i, o) in out.orders.iter().enumerate() {
        match (i, o) {
            (0 | 2, OneStatement::Created { body, .. }) => bodies.push(body.clone()),
            (
                1,
                OneStatement::NotServed {
                    stale_prices: false,
                    busy: false,
                },
            ) => {}
            (
                3,
                OneStatement::Short {
                    requested: 1,
                    available: 0,
                    ..
                },
            ) => {}
            other => panic!("member {i}: {other:?}"),
        }
    }
    // Each served order is what `GET /api/orders/{id}` shows, its key stores those bytes,
    // and its outbox row and stock record are there.
    for (account, body) in [("b1", &bodies[0]), ("b3", &bodies[1])] {
        let v: Value = serde_json::from_slice(body).expect("json");
        let id = v["id"].as_str().expect("id");
        assert_eq!(v["total"].as_i64(), Some(2000));
        let token = app.admission(account, "shop");
        let shown: Value = app
            .get(&format!("/api/orders/{id}"), &token)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(shown, v, "the answer is the order as it is read back");
        let (state, stored): (String, Vec<u8>) = sqlx::query_as(
            "SELECT state, response_body FROM idempotency_keys WHERE account_id = $1 AND key = $2",
        )
        .bind(account)
        .bind(format!("k-{account}"))
        .fetch_one(&app.pool)
        .await
        .expect("key");
        assert_eq!((state.as_str(), &stored), ("done", body));
        let (outbox, stock): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.created'
                       AND payload->>'expires_at' = $2),
                    (SELECT sum(quantity)::bigint FROM order_stock WHERE order_id = $1)",
        )
        .bind(id)
        .bind(v["expires_at"].as_str())
        .fetch_one(&app.pool)
        .await
        .expect("rows");
        assert_eq!((outbox, stock), (1, 2));
        // A retry of the request replays the stored bytes.
        fill_carts_of(&app, "shop", &[(account, "BAT", 2)]).await;
        let again = post_order(
            &app,
            &token,
            &format!("k-{account}"),
            &json!({"source": "cart"}),
        )
        .await;
        assert_eq!(again.status(), 200);
        assert_eq!(again.bytes().await.expect("body").as_ref(), body.as_slice());
    }
    // b0's request again: the order made before, not a second one.
    let again = post_order(&app, &t0, "k-b0", &json!({"source": "cart"})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.text().await.expect("body"), first);
    let orders: Vec<(String, i64)> = sqlx::query_as(
        "SELECT account_id, count(*) FROM orders GROUP BY account_id ORDER BY account_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("orders");
    assert_eq!(
        orders,
        vec![("b0".into(), 1), ("b1".into(), 1), ("b3".into(), 1)]
    );
    let row: (i64, i64) =
        sqlx::query_as("SELECT available, reserved FROM inventory WHERE sku = 'BAT'")
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert_eq!(row, (0, 5));
    app.stop().await;
}

/// Puts (account, SKU, quantity) lines into the accounts' carts of `event`.
async fn fill_carts_of(app: &TestApp, event: &str, lines: &[(&str, &str, i64)]) {
    let mut pipe = redis::pipe();
    for (account, sku, qty) in lines {
        pipe.cmd("HSET")
            .arg(booking::orders::cart::cart_key(
                &app.state.redis,
                account,
                event,
            ))
            .arg(*sku)
            .arg(*qty)
            .ignore();
    }
    let mut conn = app.state.redis.conn().await.expect("redis");
    pipe.query_async::<()>(&mut conn).await.expect("fill carts");
}

/// 300 units on one row and 300 over eight rows, 600 buyers of each, every buyer sending
/// their order twice at once (same key), 1,200 requests in flight: exactly 300 orders per SKU,
/// one per buyer at most, both copies answered with the same order, the rest `SOLD_OUT`; the
/// units conserved on every row; and the orders did go in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_sell_exactly_the_stock_once_per_key_on_one_row_and_on_eight() {
    let app = TestApp::spawn_with(|c| c.database.acquire_timeout_ms = 60_000).await;
    create_split(&app, "BATCH-1", 300, 1, false).await;
    create_split(&app, "BATCH-8", 300, 8, false).await;
    // The first order of a SKU reads its price (and runs alone); after it, orders batch.
    for sku in ["BATCH-1", "BATCH-8"] {
        let buyer = format!("first-{sku}");
        fill_carts(&app, &[(buyer.clone(), 1)], sku).await;
        let token = app.admission(&buyer, "drop");
        let resp = post_order(&app, &token, "k", &json!({"source": "cart"})).await;
        assert_eq!(resp.status(), 201);
    }
    let mut requests = Vec::new();
    for sku in ["BATCH-1", "BATCH-8"] {
        let buyers: Vec<(String, i64)> = (0..600).map(|i| (format!("{sku}-fan{i}"), 1)).collect();
        fill_carts(&app, &buyers, sku).await;
        for (account, _) in buyers {
            let token = app.admission(&account, "drop");
            requests.push((sku, account.clone(), token.clone()));
            requests.push((sku, account, token));
        }
    }
    let m = &app.state.orders.metrics;
    let (batches0, batched0) = (m.order_batches.get(), m.batched_orders.get());
    let app_ref = &app;
    let answers: Vec<(&str, String, u16, Value)> = futures::stream::iter(requests.iter())
        .map(|(sku, account, token)| async move {
            let app = app_ref;
            let key = format!("k-{account}");
            let (s, v) = json(post_order(app, token, &key, &json!({"source": "cart"})).await).await;
            (*sku, account.clone(), s, v)
        })
        .buffer_unordered(1200)
        .collect()
        .await;
    let mut per_buyer: HashMap<String, Vec<(u16, Value)>> = HashMap::new();
    for (_, account, s, v) in &answers {
        per_buyer
            .entry(account.clone())
            .or_default()
            .push((*s, v.clone()));
    }
    for sku in ["BATCH-1", "BATCH-8"] {
        let mut sold = 0;
        for (account, got) in per_buyer.iter().filter(|(a, _)| a.starts_with(sku)) {
            let ids: Vec<&str> = got
                .iter()
                .filter(|(s, _)| *s == 201 || *s == 200)
                .filter_map(|(_, v)| v["id"].as_str())
                .collect();
            for (s, v) in got {
                assert!(
                    matches!(s, 200 | 201) || (*s == 409 && v["code"] == "SOLD_OUT"),
                    "{account}: {s} {v}"
                );
            }
            if !ids.is_empty() {
                sold += 1;
                assert!(
                    ids.iter().all(|id| *id == ids[0]),
                    "{account}: two orders {ids:?}"
                );
            }
        }
        assert_eq!(
            sold, 299,
            "{sku}: the stock less the first order, once per buyer"
        );
        assert_eq!(assert_conserved(&app, sku, 300).await, 0, "{sku}");
        let orders: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders o JOIN order_items i ON i.order_id = o.id WHERE i.sku = $1",
        )
        .bind(sku)
        .fetch_one(&app.pool)
        .await
        .expect("orders");
        assert_eq!(orders, 300, "{sku}");
    }
    let in_flight: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE state = 'in_flight'")
            .fetch_one(&app.pool)
            .await
            .expect("keys");
    assert_eq!(in_flight, 0);
    let (batches, batched) = (
        m.order_batches.get() - batches0,
        m.batched_orders.get() - batched0,
    );
    assert!(
        batches > 0 && batched > batches,
        "{batched} orders in {batches} batch statements"
    );
    assert_eq!(app.stop_counting_deadlocks().await, 0, "deadlocks");
}

/// Units moved from the batch's row to another row after the batch's snapshot (a refill, the
/// admin's reshaping) are still the SKU's: an order the locked row cannot serve is sent on,
/// not told sold out. Row 0 has 4 units and row 1 none; a mover takes 3 from row 0 to row 1
/// and commits while the batch (1 unit, then 2) waits for row 0. The batch serves the first
/// order from row 0's last unit; the second goes to the one-order path, where row 1 has them.
/// It used to add row 0's locked count to the snapshot's row 1 (0) and answer `SOLD_OUT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn units_moved_to_another_row_meanwhile_are_not_sold_out() {
    let app = TestApp::spawn().await;
    create_split(&app, "MOVE", 4, 2, false).await;
    sqlx::query(
        "UPDATE inventory SET available = CASE shard WHEN 0 THEN 4 ELSE 0 END WHERE sku = 'MOVE'",
    )
    .execute(&app.pool)
    .await
    .expect("all units on row 0");
    let mut mover = app.pool.begin().await.expect("begin");
    sqlx::query(
        "UPDATE inventory SET available = available + CASE shard WHEN 0 THEN -3 ELSE 3 END
          WHERE sku = 'MOVE'",
    )
    .execute(&mut *mover)
    .await
    .expect("move 3 units to row 1");
    let priced = PricedSku {
        name: "Split".into(),
        price: 1000,
        event: Some("drop".into()),
        stock_rows: 4,
    };
    let batch = vec![
        member(&app, "drop", "MOVE", &priced, "m1", 1),
        member(&app, "drop", "MOVE", &priced, "m2", 2),
    ];
    let statements = app.state.orders.statements.clone();
    let settings = app.state.orders.settings.clone();
    let running = tokio::spawn(async move {
        let mut conn = statements.acquire().await.expect("conn");
        let out = create_cart_orders_batched(&mut conn, &settings, "drop", "MOVE", &priced, &batch)
            .await
            .expect("batch");
        conn.ended_if(true);
        out
    });
    // The batch has taken its snapshot and waits for row 0.
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE 'WITH now AS MATERIALIZED%'",
        )
        .fetch_one(&app.pool)
        .await
        .expect("activity");
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    mover.commit().await.expect("commit the move");
    let out = running.await.expect("batch task");
    assert!(
        matches!(out.orders[0], OneStatement::Created { .. }),
        "{:?}",
        out.orders[0]
    );
    assert!(
        matches!(
            out.orders[1],
            OneStatement::NotServed {
                stale_prices: false,
                busy: true
            }
        ),
        "row 1 has the units: {:?}",
        out.orders[1]
    );
    assert_eq!(out.emptied, Some(0));
    assert_eq!(assert_conserved(&app, "MOVE", 4).await, 3);
    app.stop().await;
}
