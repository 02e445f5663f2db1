//! General admission: never more than the capacity, with one counter row or many; the
//! fallback that splits a quantity across shards; release returns units to their shards.

use crate::events::{create_event, db_state, small_event};
use crate::helpers::{TestApp, json};
use futures::future::join_all;
use serde_json::{Value, json};

async fn ga_hold(
    app: &TestApp,
    event: &str,
    account: &str,
    tier: &str,
    quantity: i64,
) -> (u16, Value) {
    let token = app.admission(account, event);
    json(
        app.post(
            &format!("/api/events/{event}/ga-holds"),
            &token,
            &json!({"tier": tier, "quantity": quantity}),
        )
        .await,
    )
    .await
}

async fn counters(app: &TestApp, event: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT available FROM ga_counters WHERE event_id = $1 ORDER BY shard")
        .bind(event)
        .fetch_all(&app.pool)
        .await
        .expect("test query")
}

/// N concurrent single-unit requests for a tier of capacity C: exactly C succeed.
async fn exactly_capacity(shards: i32) {
    let app = TestApp::spawn().await;
    let capacity = 120;
    create_event(&app, &small_event("ga", 1, 1, capacity, shards)).await;
    let results = join_all((0..400).map(|i| {
        let app = &app;
        async move { ga_hold(app, "ga", &format!("fan-{i}"), "FLOOR", 1).await }
    }))
    .await;
    let ok = results.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(ok, capacity as usize, "shards={shards}");
    for (status, body) in &results {
        if *status != 201 {
            assert_eq!(
                (*status, body["code"].as_str()),
                (409, Some("SOLD_OUT")),
                "{body}"
            );
        }
    }
    let c = counters(&app, "ga").await;
    assert_eq!(c.len(), shards as usize);
    assert!(c.iter().all(|&a| a == 0), "{c:?}");
    let state = db_state(&app.pool).await;
    assert_eq!(state["ga_available"], 0);
    assert_eq!(state["holds"], capacity);
    let items: i64 = sqlx::query_scalar("SELECT sum(quantity)::bigint FROM hold_ga_items")
        .fetch_one(&app.pool)
        .await
        .expect("test query");
    assert_eq!(items, capacity as i64);
    let (_, ev) = json(app.admin_get("/admin/events/ga").await).await;
    assert_eq!(
        (
            ev["ga_tiers"][0]["available"].as_i64(),
            ev["ga_tiers"][0]["held"].as_i64()
        ),
        (Some(0), Some(capacity as i64))
    );
    assert_eq!(
        app.stop_counting_deadlocks().await,
        0,
        "deadlocks among holds"
    );
}

#[tokio::test]
async fn ga_sells_exactly_capacity_with_one_counter() {
    exactly_capacity(1).await;
}

#[tokio::test]
async fn ga_sells_exactly_capacity_with_eight_shards() {
    exactly_capacity(8).await;
}

#[tokio::test]
async fn ga_mixed_quantities_never_exceed_capacity() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("mix", 1, 1, 100, 6)).await;
    let results = join_all((0..300).map(|i| {
        let app = &app;
        async move {
            (
                ga_hold(app, "mix", &format!("fan-{i}"), "FLOOR", 1 + (i % 4) as i64).await,
                1 + (i % 4) as i64,
            )
        }
    }))
    .await;
    let sold: i64 = results
        .iter()
        .filter(|((s, _), _)| *s == 201)
        .map(|(_, q)| q)
        .sum();
    let left: i64 = counters(&app, "mix").await.iter().map(|&a| a as i64).sum();
    assert_eq!(sold + left, 100);
    assert!(
        left < 4,
        "units left unsold while bigger requests were refused: {left}"
    );
    for ((status, body), _) in &results {
        assert!(
            *status == 201 || (*status == 409 && body["code"] == "SOLD_OUT"),
            "{status} {body}"
        );
    }
    // Retries hide a deadlock from the fan but not its cost (a second of `deadlock_timeout`):
    // holds must take shard locks in an order that cannot form a cycle.
    assert_eq!(
        app.stop_counting_deadlocks().await,
        0,
        "deadlocks among holds"
    );
}

#[tokio::test]
async fn a_quantity_split_over_shards_is_taken_and_returned_exactly() {
    let app = TestApp::spawn().await;
    let mut body = small_event("frag", 1, 1, 10, 5); // five shards of 2
    body["max_tickets_per_account"] = json!(10);
    create_event(&app, &body).await;
    // No single shard has 3: the fallback takes 2 + 1 across shards in shard order.
    let (status, h) = ga_hold(&app, "frag", "fan", "FLOOR", 3).await;
    assert_eq!(status, 201, "{h}");
    assert_eq!(h["total"], 27000);
    let items: Vec<(i32, i32)> = sqlx::query_as(
        "SELECT shard, quantity FROM hold_ga_items WHERE hold_id = $1 ORDER BY shard",
    )
    .bind(h["hold_id"].as_str().unwrap())
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(items.iter().map(|(_, q)| q).sum::<i32>(), 3);
    assert!(items.len() >= 2);
    assert_eq!(counters(&app, "frag").await.iter().sum::<i32>(), 7);
    // Not enough left: SOLD_OUT says how many there are.
    let (status, err) = ga_hold(&app, "frag", "other", "FLOOR", 8).await;
    assert_eq!(
        (status, err["code"].as_str(), err["available"].as_i64()),
        (409, Some("SOLD_OUT"), Some(7))
    );
    // Release puts the units back on the shards they came from.
    let token = app.admission("fan", "frag");
    let resp = app
        .client
        .delete(app.url(&format!("/api/holds/{}", h["hold_id"].as_str().unwrap())))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(counters(&app, "frag").await, vec![2, 2, 2, 2, 2]);
    assert_eq!(db_state(&app.pool).await["usage"], 0);
    // Now the whole tier in one request.
    let (status, _) = ga_hold(&app, "frag", "whale", "FLOOR", 10).await;
    assert_eq!(status, 201);
    assert_eq!(counters(&app, "frag").await, vec![0, 0, 0, 0, 0]);
    let (status, err) = ga_hold(&app, "frag", "late", "FLOOR", 1).await;
    assert_eq!((status, err["code"].as_str()), (409, Some("SOLD_OUT")));
    assert!(err.get("available").is_none());
    app.stop().await;
}
