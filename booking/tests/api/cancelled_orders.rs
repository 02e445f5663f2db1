//! Orders on a cancelled event (issue 18): a hold taken, or a cart filled, before ops cancelled
//! the event cannot become an order afterwards. The order statement itself refuses
//! (`409 EVENT_CANCELLED`) and nothing is written: no order row, the hold still active (it
//! ends by its own expiry, as an abandoned hold does), the stock unchanged.

use crate::helpers::{TestApp, json};
use crate::ops_refunds::ops_post;
use serde_json::{Value, json};

async fn cancel(app: &TestApp, event: &str) {
    let (s, v, _) = ops_post(
        app,
        &format!("/admin/events/{event}/cancel"),
        Some("ops"),
        None,
        &json!({"reason": "show called off"}),
    )
    .await;
    assert_eq!(s, 202, "{v}");
}

/// Orders, their items and outbox rows, the holds by status, seats by status, SKU stock.
async fn written(app: &TestApp) -> Value {
    let row: (i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders),
                (SELECT count(*) FROM order_items),
                (SELECT count(*) FROM outbox WHERE topic = 'order.created'),
                (SELECT count(*) FROM holds WHERE status = 'active'),
                (SELECT count(*) FROM seats WHERE status = 'held'),
                (SELECT count(*) FROM seats WHERE status = 'available'),
                (SELECT COALESCE(sum(available), 0)::bigint FROM inventory),
                (SELECT COALESCE(sum(reserved), 0)::bigint FROM inventory)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("state");
    json!({"orders": row.0, "items": row.1, "created_events": row.2, "active_holds": row.3,
           "held_seats": row.4, "available_seats": row.5, "sku_available": row.6,
           "sku_reserved": row.7})
}

#[tokio::test]
async fn a_hold_taken_before_the_cancellation_cannot_become_an_order() {
    let app = TestApp::spawn().await;
    crate::helpers::create_refund_event(&app, "ev", "release").await;
    let token = app.admission("early-fan", "ev");
    let (s, hold) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-1", "S1-R1-2"]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 201, "{hold}");
    let (s, ga) = json(
        app.post(
            "/api/events/ev/ga-holds",
            &token,
            &json!({"tier": "FLOOR", "quantity": 2}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 201, "{ga}");
    cancel(&app, "ev").await;
    let before = written(&app).await;
    assert_eq!(before["orders"], 0, "{before}");
    assert_eq!(before["active_holds"], 2, "{before}");
    for (i, h) in [&hold, &ga].into_iter().enumerate() {
        let (s, v) = json(
            crate::products::post_order(
                &app,
                &token,
                &format!("late-{i}"),
                &json!({"hold_id": h["hold_id"]}),
            )
            .await,
        )
        .await;
        assert_eq!(
            (s, v["code"].clone()),
            (409, json!("EVENT_CANCELLED")),
            "{v}"
        );
    }
    assert_eq!(written(&app).await, before, "a refused order wrote");
    // The key is not used up by the refusal: it answers the same way again.
    let (s, v) = json(
        crate::products::post_order(&app, &token, "late-0", &json!({"hold_id": hold["hold_id"]}))
            .await,
    )
    .await;
    assert_eq!((s, v["code"].clone()), (409, json!("EVENT_CANCELLED")));
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&app.pool)
        .await
        .expect("keys");
    assert_eq!(keys, 0, "a refused order keeps no idempotency answer");
}

#[tokio::test]
async fn a_cart_of_a_cancelled_events_products_cannot_become_an_order() {
    let app = TestApp::spawn().await;
    crate::helpers::create_refund_event(&app, "ev", "release").await;
    crate::helpers::create_event_product(&app, "ev", "EV-SHIRT", 3000, 5, false).await;
    crate::helpers::create_event_product(&app, "ev", "EV-HOT", 1000, 5, true).await;
    let token = app.admission("early-fan", "ev");
    for sku in ["EV-SHIRT", "EV-HOT"] {
        let resp = crate::helpers::put_cart_line(&app, &token, "ev", sku, 2).await;
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    cancel(&app, "ev").await;
    let before = written(&app).await;
    assert_eq!(before["sku_available"], 10, "{before}");
    let (s, v) = json(
        crate::products::post_order(&app, &token, "late-cart", &json!({"source": "cart"})).await,
    )
    .await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("EVENT_CANCELLED")),
        "{v}"
    );
    assert_eq!(written(&app).await, before, "a refused order wrote");
    // Another event's cart still orders (the condition is the order's own event).
    crate::helpers::create_product(&app, "other", "OT-CAP", 500, 3, false).await;
    let (_, id) = crate::helpers::order_cart(&app, "other", "fan-2", "OT-CAP", 1).await;
    assert!(!id.is_empty());
}
