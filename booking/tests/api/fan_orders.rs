//! A fan's own orders (issue 18): the list and the cancel of a pending order, including a
//! cancel racing a pay against the real sandbox provider over HTTP.

use crate::events::{create_event, small_event};
use crate::helpers::{TestApp, json};
use crate::payments::{API_KEY, PayEnv, pay, seat_order};
use serde_json::Value;

async fn cancel(app: &TestApp, token: &str, order: &str) -> (u16, Value) {
    json(
        app.post(&format!("/api/orders/{order}/cancel"), token, &Value::Null)
            .await,
    )
    .await
}

async fn seat_status(app: &TestApp, event: &str, seat: &str) -> String {
    sqlx::query_scalar("SELECT status FROM seats WHERE event_id = $1 AND seat_id = $2")
        .bind(event)
        .bind(seat)
        .fetch_one(&app.pool)
        .await
        .expect("seat")
}

#[tokio::test]
async fn a_fan_lists_their_own_orders_and_cancels_a_pending_one() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let a1 = seat_order(app, "ev", true, "ann", &["S1-R1-1"]).await;
    let a2 = seat_order(app, "ev", false, "ann", &["S1-R1-2"]).await;
    let b1 = seat_order(app, "ev", false, "bob", &["S1-R1-3"]).await;

    let (status, page) = json(app.get("/api/orders?limit=1", &a1.token).await).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["orders"][0]["id"], a2.order_id.as_str());
    let cursor = page["next_cursor"].as_str().expect("a second page");
    let (_, page2) = json(
        app.get(&format!("/api/orders?limit=1&cursor={cursor}"), &a1.token)
            .await,
    )
    .await;
    assert_eq!(page2["orders"][0]["id"], a1.order_id.as_str());
    assert!(page2["next_cursor"].is_null(), "{page2}");
    let (_, other) = json(app.get("/api/orders?event=elsewhere", &a1.token).await).await;
    assert_eq!(other["orders"].as_array().expect("orders").len(), 0);
    for bad in ["limit=-1", "limit=500", "cursor=xyz", "account=bob"] {
        let (status, body) = json(app.get(&format!("/api/orders?{bad}"), &a1.token).await).await;
        assert_eq!(status, 422, "{bad}: {body}");
    }
    let resp = app
        .client
        .get(app.url("/api/orders"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);

    // Someone else's order looks missing and is untouched.
    let (status, _) = cancel(app, &a1.token, &b1.order_id).await;
    assert_eq!(status, 404);
    assert_eq!(seat_status(app, "ev", "S1-R1-3").await, "held");

    let (status, v) = cancel(app, &a1.token, &a1.order_id).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "CANCELLED");
    assert_eq!(seat_status(app, "ev", "S1-R1-1").await, "available");
    let (status, v) = cancel(app, &a1.token, &a1.order_id).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["status"], "CANCELLED");

    // A paid order is not the fan's to cancel.
    let (status, v) = pay(app, &a2.token, &a2.order_id, "pay-a2", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = cancel(app, &a2.token, &a2.order_id).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["code"], "ORDER_NOT_CANCELLABLE");
    assert_eq!(v["status"], "PAID");
    assert_eq!(env.charges(&a2.order_id), 1);

    // An attempt whose outcome is unknown refuses the cancel.
    sqlx::query(
        "INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount, currency,
                               payment_method, next_check_at)
         VALUES ('pay-open', $1, 'bob', 1, $1 || '-1', 0, 'JPY', 'pm_card_visa',
                 clock_timestamp() + interval '1 hour')",
    )
    .bind(&b1.order_id)
    .execute(&app.pool)
    .await
    .expect("open attempt");
    let (status, v) = cancel(app, &b1.token, &b1.order_id).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["code"], "PAYMENT_IN_PROGRESS");
    assert_eq!(seat_status(app, "ev", "S1-R1-3").await, "held");
    env.app.stop().await;
}

/// The provider's own record of an order, over HTTP.
async fn sandbox_summary(env: &PayEnv, order: &str) -> Value {
    let (status, v) = json(
        env.app
            .client
            .get(format!("{}/_sandbox/orders/{order}", env.provider_url))
            .bearer_auth(API_KEY)
            .send()
            .await
            .expect("sandbox request"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn a_cancel_racing_a_pay_ends_paid_with_one_charge_or_cancelled_with_none() {
    // Some provider latency so cancels land while charges are in flight.
    let env = PayEnv::spawn_with(|_| {}, |s| s.latency_ms = 20).await;
    let app = &env.app;
    create_event(app, &small_event("race", 5, 10, 10, 1)).await;
    let mut orders = Vec::new();
    for row in 1..=5 {
        for n in 1..=10 {
            let seat = format!("S1-R{row}-{n}");
            let account = format!("fan-{row}-{n}");
            orders.push(seat_order(app, "race", false, &account, &[seat.as_str()]).await);
        }
    }
    let mut tasks = Vec::new();
    for (i, o) in orders.iter().enumerate() {
        let (client, base) = (app.client.clone(), app.url(""));
        let (token, id) = (o.token.clone(), o.order_id.clone());
        tasks.push(tokio::spawn(async move {
            let pay = send(
                &client,
                format!("{base}/api/orders/{id}/pay"),
                &token,
                Some(i),
            );
            let cancel = send(
                &client,
                format!("{base}/api/orders/{id}/cancel"),
                &token,
                None,
            );
            tokio::join!(pay, cancel)
        }));
    }
    let (mut paid_answers, mut cancel_answers) = (0, 0);
    for t in tasks {
        let (p, c) = t.await.expect("task");
        assert!([200, 409].contains(&p), "pay answered {p}");
        assert!([200, 409].contains(&c), "cancel answered {c}");
        paid_answers += usize::from(p == 200);
        cancel_answers += usize::from(c == 200);
    }
    let (mut paid, mut cancelled) = (0, 0);
    for o in &orders {
        let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
            .bind(&o.order_id)
            .fetch_one(&app.pool)
            .await
            .expect("order");
        let summary = sandbox_summary(&env, &o.order_id).await;
        let charges = summary["charges"].as_i64().expect("charges");
        let refunds = summary["refunds"].as_i64().expect("refunds");
        match status.as_str() {
            "PAID" => {
                paid += 1;
                assert_eq!((charges, refunds), (1, 0), "{}: {summary}", o.order_id);
            }
            "CANCELLED" => {
                cancelled += 1;
                assert_eq!(charges - refunds, 0, "{}: {summary}", o.order_id);
                let seat_free: bool = sqlx::query_scalar(
                    "SELECT NOT EXISTS (SELECT 1 FROM seats WHERE event_id = 'race'
                                          AND (order_id = $1 OR hold_id = $2))",
                )
                .bind(&o.order_id)
                .bind(&o.hold_id)
                .fetch_one(&app.pool)
                .await
                .expect("seat");
                assert!(seat_free, "a cancelled order kept its seat");
            }
            other => panic!("order {} ended {other}", o.order_id),
        }
    }
    assert_eq!(paid + cancelled, orders.len());
    eprintln!("cancel racing pay: {paid} paid, {cancelled} cancelled");
    // Every order answered exactly one of its two requests with success.
    assert_eq!((paid, cancelled), (paid_answers, cancel_answers));
    env.app.stop().await;
}

/// One pay (`Some(n)`: with key `race-n`) or cancel request; its status.
async fn send(client: &reqwest::Client, url: String, token: &str, pay: Option<usize>) -> u16 {
    let mut req = client.post(url).bearer_auth(token);
    req = match pay {
        Some(n) => req
            .header("Idempotency-Key", format!("race-{n}"))
            .json(&serde_json::json!({"payment_method": "pm_card_visa"})),
        None => req.json(&Value::Null),
    };
    req.send().await.expect("request").status().as_u16()
}
