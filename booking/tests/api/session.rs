//! Admission through checkout, booking's half: successful checkout writes say when the
//! caller's checkout ends (`x-floodgate-session-until`), and revocations recorded by the
//! gateway in Redis are enforced by booking itself.

use crate::events::{create_event, small_event};
use crate::helpers::{TestApp, json};
use serde_json::json;
use std::time::{Duration, Instant};

const UNTIL: &str = "x-floodgate-session-until";

fn until(resp: &reqwest::Response) -> Option<i64> {
    resp.headers()
        .get(UNTIL)
        .map(|v| v.to_str().expect("ascii").parse().expect("unix ms"))
}

/// Unix ms (rounded up) of a hold's or order's end.
async fn end_ms(app: &TestApp, table: &str, id: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT ceil(extract(epoch FROM expires_at) * 1000)::bigint FROM {table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .expect("expires_at")
}

async fn hold(app: &TestApp, token: &str, seat: &str) -> (String, Option<i64>) {
    let resp = app
        .post("/api/events/ses/holds", token, &json!({"seats": [seat]}))
        .await;
    let until = until(&resp);
    let (status, body) = json(resp).await;
    assert_eq!(status, 201, "{body}");
    (body["hold_id"].as_str().expect("hold id").to_owned(), until)
}

async fn delete(app: &TestApp, token: &str, path: &str) -> (u16, Option<i64>) {
    let resp = app
        .client
        .delete(app.url(path))
        .bearer_auth(token)
        .send()
        .await
        .expect("delete");
    (resp.status().as_u16(), until(&resp))
}

#[tokio::test]
async fn checkout_writes_say_when_the_callers_checkout_ends() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ses", 2, 4, 10, 1)).await;
    let fan = app.admission("ses-fan", "ses");
    let (h1, u1) = hold(&app, &fan, "S1-R1-1").await;
    assert_eq!(u1, Some(end_ms(&app, "holds", &h1).await));
    let (h2, u2) = hold(&app, &fan, "S1-R1-2").await;
    let end2 = end_ms(&app, "holds", &h2).await;
    assert_eq!(u2, Some(end2), "the latest end of the fan's live holds");

    // A GA hold reads its fan's checkout end in its own statement, like the seat hold.
    let ga_fan = app.admission("ses-ga", "ses");
    let resp = app
        .post(
            "/api/events/ses/ga-holds",
            &ga_fan,
            &json!({"tier": "FLOOR", "quantity": 1}),
        )
        .await;
    let u = until(&resp);
    let (status, ga) = json(resp).await;
    assert_eq!(status, 201, "{ga}");
    let ga_hold = ga["hold_id"].as_str().expect("hold id");
    assert_eq!(u, Some(end_ms(&app, "holds", ga_hold).await));

    // Reads, other fans' writes and refused writes say nothing.
    let resp = app.get("/api/events/ses/seats", &fan).await;
    assert_eq!(until(&resp), None);
    let other = app.admission("ses-other", "ses");
    let (status, u) = delete(&app, &other, &format!("/api/holds/{h1}")).await;
    assert_eq!((status, u), (404, None));

    // An order from a hold: the order's end.
    let resp = app
        .client
        .post(app.url("/api/orders"))
        .bearer_auth(&fan)
        .header("Idempotency-Key", "ses-order-1")
        .json(&json!({"hold_id": h2}))
        .send()
        .await
        .expect("order");
    let u = until(&resp);
    let (status, order) = json(resp).await;
    assert_eq!(status, 201, "{order}");
    let order_end = end_ms(&app, "orders", order["id"].as_str().expect("id")).await;
    assert_eq!(u, Some(order_end.max(end_ms(&app, "holds", &h1).await)));

    // Releasing a hold while the order lives: the order's end; after the order is gone and
    // the last hold released: 0.
    let (status, u) = delete(&app, &fan, &format!("/api/holds/{h1}")).await;
    assert_eq!((status, u), (204, Some(order_end)));
    sqlx::query("UPDATE orders SET status = 'CANCELLED' WHERE id = $1")
        .bind(order["id"].as_str())
        .execute(&app.pool)
        .await
        .expect("cancel");
    let (h3, _) = hold(&app, &fan, "S1-R1-3").await;
    let (status, u) = delete(&app, &fan, &format!("/api/holds/{h3}")).await;
    assert_eq!((status, u), (204, Some(0)), "nothing left");

    // Another event's token speaks for that event only.
    create_event(&app, &small_event("ses2", 1, 2, 10, 1)).await;
    let elsewhere = app.admission("ses-fan", "ses2");
    let resp = app
        .post(
            "/api/events/ses2/holds",
            &elsewhere,
            &json!({"seats": ["S1-R1-1"]}),
        )
        .await;
    let u = until(&resp);
    let (status, body) = json(resp).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        u,
        Some(end_ms(&app, "holds", body["hold_id"].as_str().expect("id")).await)
    );
    app.stop().await;
}

#[tokio::test]
async fn booking_refuses_tokens_the_gateway_revoked() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("rev", 1, 2, 10, 1)).await;
    let fan = app.admission("rev-fan", "rev");
    let bystander = app.admission("rev-other", "rev");
    let resp = app.get("/api/events/rev/seats", &fan).await;
    assert_eq!(resp.status(), 200);

    // What the gateway's revoke script writes (same prefix, same layout).
    let prefix = &app.config.redis.key_prefix;
    let mut conn = redis::Client::open(crate::helpers::redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let now = chrono::Utc::now().timestamp();
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg(format!("{prefix}fg:events"))
        .arg("rev")
        .ignore()
        .cmd("HSET")
        .arg(format!("{prefix}fg:{{rev}}:revoked"))
        .arg("a:rev-fan")
        .arg(now)
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("revoke");

    let started = Instant::now();
    loop {
        let (status, body) = json(app.get("/api/events/rev/seats", &fan).await).await;
        if status == 401 {
            assert_eq!(body["code"], "ADMISSION_REQUIRED");
            assert_eq!(body["reason"], "revoked");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "booking never refused the revoked token: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Other fans, and the same fan admitted again later, are not affected.
    assert_eq!(
        app.get("/api/events/rev/seats", &bystander).await.status(),
        200
    );
    let later = app
        .tokens()
        .mint("rev-fan", "sess-2", "rev", now + 1, 600)
        .expect("mint")
        .0;
    assert_eq!(app.get("/api/events/rev/seats", &later).await.status(), 200);
    app.stop().await;
}

/// The pay answer carries the checkout end read in its own transaction (the order is paid, so
/// only the fan's other live hold counts), and its replay the same value, from the middleware.
#[tokio::test]
async fn a_paid_order_says_when_the_rest_of_the_checkout_ends() {
    let env = crate::payments::PayEnv::spawn().await;
    let app = &env.app;
    let o = crate::payments::seat_order(app, "ses-pay", true, "payer", &["S1-R1-1"]).await;
    let other = {
        let resp = app
            .post(
                "/api/events/ses-pay/holds",
                &o.token,
                &json!({"seats": ["S1-R1-2"]}),
            )
            .await;
        let (status, body) = json(resp).await;
        assert_eq!(status, 201, "{body}");
        body["hold_id"].as_str().expect("hold id").to_owned()
    };
    let pay = || async {
        app.client
            .post(app.url(&format!("/api/orders/{}/pay", o.order_id)))
            .bearer_auth(&o.token)
            .header("Idempotency-Key", "ses-pay-1")
            .json(&json!({"payment_method": "pm_card_visa"}))
            .send()
            .await
            .expect("pay")
    };
    let resp = pay().await;
    let u = until(&resp);
    let (status, body) = json(resp).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "PAID");
    let hold_end = end_ms(app, "holds", &other).await;
    assert_eq!(
        u,
        Some(hold_end),
        "the paid order no longer counts; the live hold does"
    );
    let replay = pay().await;
    assert_eq!(replay.status(), 200);
    assert_eq!(until(&replay), Some(hold_end), "the replay says the same");
    env.app.stop().await;
}

/// The session end a checkout statement answers (`live_until_ms_sql!`) comes from the fan's
/// own holds and orders. With 3,000 other fans' pending orders and live holds, its generic plan
/// (the checkout pool's) reads a handful of rows. It used to let the planner answer `max`
/// by walking the pending-expiry index backwards through every other fan's pending order (and
/// the sweeper's index through every live hold): 1.8 ms per order in the hot-SKU bench, growing
/// with the sale.
#[tokio::test]
async fn the_session_end_reads_only_the_fans_own_rows() {
    let app = TestApp::spawn().await;
    crate::plans::sale_on_stale_statistics(&app, &["orders", "holds"]).await;
    sqlx::query(
        "INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
         SELECT 'h' || g, 'shop', 'other' || g, 'ga', 'floor', 1,
                clock_timestamp() + interval '10 min' + g * interval '1 ms'
           FROM generate_series(1, 3000) g",
    )
    .execute(&app.pool)
    .await
    .expect("holds");
    let mut conn = app.pool.acquire().await.expect("conn");
    let until = concat!(
        "SELECT ",
        booking::live_until_ms_sql!("$1::text", "$2::text", "NULL::timestamptz", "NULL")
    );
    let (read, plan) =
        crate::plans::rows_read_by(&mut conn, "generic", "until", until, "('fan', 'shop')").await;
    assert!(read < 50.0, "{read} rows read for one fan: {plan:#}");
}
