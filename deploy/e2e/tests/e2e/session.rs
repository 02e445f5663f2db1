//! Admission lasts through checkout (issue 14, item 3), over the real gateway and booking:
//! a fan whose holds and order outlive the admission token stays admitted until they end
//! (sliding refresh, bounded by `max_session_s`), the `max_active` slot is counted as long and
//! freed as soon as the last hold ends, and a revocation reaches booking itself (direct calls
//! and open auction WebSockets).
//!
//! The checkout test waits in real time (about a minute and a half): the admission token's
//! lifetime cannot be shorter than 30 s, and the point is a payment after it.

use crate::journey_api::{Fan, admitted_fan};
use crate::stack::{ADMIN, Stack, demo_event, json};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;
use testkit::wait::eventually;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const REFRESHED: &str = "x-floodgate-admission-token";

/// The claims of an admission token (signature not checked: the gateway and booking do).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("token payload");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64 payload"))
        .expect("claims json")
}

fn token_of(cookie: &str) -> &str {
    cookie
        .strip_prefix("fg_admission=")
        .expect("admission cookie")
}

/// A checkout write through the gateway, as a browser sends it: the cookie goes out, and a
/// refreshed cookie that comes back replaces it. Returns the refreshed token, if any.
async fn write(
    stack: &Stack,
    fan: &mut Fan,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value, Option<String>) {
    let mut req = stack
        .http
        .request(method, stack.gw(path))
        .header(reqwest::header::COOKIE, &fan.cookie)
        .header("Idempotency-Key", shared::ids::new_id());
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("checkout write");
    assert!(
        resp.headers().get("x-floodgate-session-until").is_none(),
        "the gateway must not pass booking's session header on"
    );
    let refreshed = resp
        .headers()
        .get(REFRESHED)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let cookie = resp
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("fg_admission="))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    if let Some(t) = &refreshed {
        let c = cookie.expect("a refreshed token comes with its cookie");
        assert_eq!(
            token_of(&c),
            t,
            "the cookie and the header carry the same token"
        );
        fan.cookie = c;
    }
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"))
    };
    (status, v, refreshed)
}

async fn free_seats(stack: &Stack, fan: &Fan, event: &str, n: usize) -> Vec<String> {
    let (status, map) = fan.get(stack, &format!("/api/events/{event}/seats")).await;
    assert_eq!(status, 200, "{map}");
    let seats: Vec<String> = map["seats"]
        .as_array()
        .expect("seats")
        .iter()
        .filter(|s| s["status"] == "available")
        .take(n)
        .map(|s| s["seat_id"].as_str().expect("seat id").to_owned())
        .collect();
    assert_eq!(seats.len(), n);
    seats
}

/// Holds one seat; returns the hold id and the refreshed token.
async fn hold(stack: &Stack, fan: &mut Fan, event: &str, seat: &str) -> (String, String) {
    let (status, hold, refreshed) = write(
        stack,
        fan,
        reqwest::Method::POST,
        &format!("/api/events/{event}/holds"),
        Some(&json!({"seats": [seat]})),
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let refreshed = refreshed.expect("a hold outliving the token refreshes the admission");
    (
        hold["hold_id"].as_str().expect("hold id").to_owned(),
        refreshed,
    )
}

async fn order(stack: &Stack, fan: &mut Fan, hold_id: &str) -> String {
    let (status, order, _) = write(
        stack,
        fan,
        reqwest::Method::POST,
        "/api/orders",
        Some(&json!({"hold_id": hold_id})),
    )
    .await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["status"], "PENDING_PAYMENT");
    order["id"].as_str().expect("order id").to_owned()
}

/// Unix ms of a hold's or order's end, from Postgres.
async fn ends_ms(stack: &Stack, table: &str, id: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT (extract(epoch FROM expires_at) * 1000)::bigint FROM {table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(&stack.pool)
    .await
    .expect("expires_at")
}

async fn redis() -> shared::redis_conn::Conn {
    let settings = shared::config::RedisSettings {
        url: secrecy::SecretString::from(crate::stack::queue_redis_url()),
        mode: crate::stack::queue_redis_mode(),
        ..Default::default()
    };
    shared::redis_conn::Connector::new(&settings)
        .expect("redis settings")
        .conn()
        .await
        .expect("redis connection")
}

/// The fan's `max_active` slot deadline (unix ms), `None` when the slot is free.
async fn slot(
    stack: &Stack,
    conn: &mut shared::redis_conn::Conn,
    event: &str,
    account: &str,
) -> Option<i64> {
    redis::cmd("ZSCORE")
        .arg(format!("{}fg:{{{event}}}:active", stack.prefix))
        .arg(account)
        .query_async::<Option<f64>>(conn)
        .await
        .expect("zscore")
        .map(|s| s as i64)
}

/// Issue 14 item 3's acceptance test: `token_ttl_s = 30`, hold, order at 20 s, pay at 45 s →
/// paid; a fan who does not pay is refused (`401`) once the order has expired.
#[tokio::test]
async fn a_fan_in_checkout_stays_admitted_past_the_token_until_the_order_ends() {
    let stack = Stack::start_with(|b| b.orders.ttl_s = 60, |g| g.gateway.session_slack_s = 4).await;
    let mut ev = demo_event("e2e-checkout");
    ev["hold_ttl_s"] = 30.into();
    let event = stack
        .create_event(
            &ev,
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue", "token_ttl_s": 30}),
        )
        .await;
    let (mut payer, mut lapser) = tokio::join!(
        admitted_fan(&stack, &event, "checkout-payer"),
        admitted_fan(&stack, &event, "checkout-lapser")
    );
    let t0 = Instant::now();
    let first = claims(token_of(&payer.cookie));
    assert_eq!(
        first["exp"].as_i64().unwrap() - first["iat"].as_i64().unwrap(),
        30
    );
    let seats = free_seats(&stack, &payer, &event, 2).await;

    let (hold_p, refreshed) = hold(&stack, &mut payer, &event, &seats[0]).await;
    let hold_end = ends_ms(&stack, "holds", &hold_p).await;
    let c = claims(&refreshed);
    assert!(
        c["exp"].as_i64().unwrap() * 1000 >= hold_end,
        "the token lasts as long as the hold: {c} vs {hold_end}"
    );
    assert_eq!(c["adm"], first["adm"], "same admission");
    assert_eq!(c["sid"], first["sid"]);
    let (hold_l, _) = hold(&stack, &mut lapser, &event, &seats[1]).await;

    tokio::time::sleep_until(t0 + Duration::from_secs(20)).await;
    let order_p = order(&stack, &mut payer, &hold_p).await;
    let order_l = order(&stack, &mut lapser, &hold_l).await;
    let order_end = ends_ms(&stack, "orders", &order_l).await;
    let c = claims(token_of(&lapser.cookie));
    assert!(
        c["exp"].as_i64().unwrap() * 1000 >= order_end,
        "the token lasts as long as the order: {c} vs {order_end}"
    );

    // 45 s after admission, 15 s past the original token's expiry: the payment goes through.
    tokio::time::sleep_until(t0 + Duration::from_secs(45)).await;
    let (status, paid, _) = write(
        &stack,
        &mut payer,
        reqwest::Method::POST,
        &format!("/api/orders/{order_p}/pay"),
        Some(&json!({"payment_method": "pm_card_visa"})),
    )
    .await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["status"], "PAID");

    // The other fan never pays: the order expires, and the admission ends with it.
    eventually(
        Duration::from_secs(90),
        "the unpaid order to expire",
        || async {
            let s: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
                .bind(&order_l)
                .fetch_one(&stack.pool)
                .await
                .expect("order status");
            (s == "EXPIRED").then_some(())
        },
    )
    .await;
    // Slack (4 s) and the verifiers' leeway (5 s) after the order's end.
    let (status, body) = eventually(Duration::from_secs(30), "the lapsed fan's 401", || async {
        let (s, b) = lapser.get(&stack, &format!("/api/orders/{order_l}")).await;
        (s == 401).then_some((s, b))
    })
    .await;
    assert_eq!(status, 401);
    assert_eq!(body["code"], "ADMISSION_REQUIRED");
    assert_eq!(body["reason"], "expired");
    stack.stop().await;
}

/// The `max_active` slot is counted until the hold ends (not the token), and freed at once
/// when the fan lets the last hold go: the next fan in the queue is admitted.
#[tokio::test]
async fn the_max_active_slot_lasts_with_the_hold_and_is_freed_when_it_is_released() {
    let stack = Stack::start_with(|_| {}, |g| g.gateway.session_slack_s = 4).await;
    let mut ev = demo_event("e2e-slot");
    ev["hold_ttl_s"] = 300.into();
    let event = stack
        .create_event(
            &ev,
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue", "token_ttl_s": 30, "max_active": 1}),
        )
        .await;
    let conn = redis().await;
    let mut first = admitted_fan(&stack, &event, "slot-first").await;
    let seats = free_seats(&stack, &first, &event, 1).await;
    let (hold_id, _) = hold(&stack, &mut first, &event, &seats[0]).await;
    let hold_end = ends_ms(&stack, "holds", &hold_id).await;
    // The slot now lasts until the hold ends (plus slack), not the 30 s token lifetime.
    let (st, ev) = (&stack, event.as_str());
    let deadline = eventually(
        Duration::from_secs(5),
        "the slot extended to the hold",
        || {
            let mut c = conn.clone();
            async move {
                slot(st, &mut c, ev, "slot-first")
                    .await
                    .filter(|d| *d >= hold_end)
            }
        },
    )
    .await;
    assert!(deadline <= hold_end + 5_000, "{deadline} vs {hold_end}");

    let (status, body, _) = write(
        &stack,
        &mut first,
        reqwest::Method::DELETE,
        &format!("/api/holds/{hold_id}"),
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    eventually(Duration::from_secs(5), "the slot freed", || {
        let mut c = conn.clone();
        async move {
            slot(st, &mut c, ev, "slot-first")
                .await
                .is_none()
                .then_some(())
        }
    })
    .await;
    // With `max_active = 1` the next fan gets in only through that slot.
    let next = admitted_fan(&stack, &event, "slot-next").await;
    assert!(!next.cookie.is_empty());
    stack.stop().await;
}

/// A refresh never carries an admission past `max_session_s` from the admission.
#[tokio::test]
async fn max_session_bounds_the_refresh() {
    let stack = Stack::start_with(|_| {}, |g| g.gateway.session_slack_s = 4).await;
    let mut ev = demo_event("e2e-bound");
    ev["hold_ttl_s"] = 300.into();
    let event = stack
        .create_event(
            &ev,
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue", "token_ttl_s": 30, "max_session_s": 40}),
        )
        .await;
    let mut fan = admitted_fan(&stack, &event, "bound-fan").await;
    let first = claims(token_of(&fan.cookie));
    let admitted = first["adm"].as_i64().expect("adm claim");
    assert_eq!(admitted, first["iat"].as_i64().unwrap());
    let seats = free_seats(&stack, &fan, &event, 1).await;
    let (hold_id, refreshed) = hold(&stack, &mut fan, &event, &seats[0]).await;
    let c = claims(&refreshed);
    assert_eq!(c["adm"].as_i64(), Some(admitted));
    assert_eq!(
        c["exp"].as_i64(),
        Some(admitted + 40),
        "the hold lasts 300 s, the session 40 s: {c}"
    );
    // And the session does end there, hold or not.
    let (status, body) = eventually(Duration::from_secs(60), "the session's end", || async {
        let (s, b) = fan.get(&stack, &format!("/api/events/{event}/seats")).await;
        (s == 401).then_some((s, b))
    })
    .await;
    assert_eq!(status, 401, "{body}");
    let live: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(&hold_id)
        .fetch_one(&stack.pool)
        .await
        .expect("hold");
    assert_eq!(live, "active", "the hold outlived the session");
    stack.stop().await;
}

/// A revoked fan is refused by booking too (called directly, around the gateway), refreshed
/// tokens included, and their open auction WebSocket is closed.
#[tokio::test]
async fn a_revocation_reaches_booking_and_closes_open_websockets() {
    let stack = Stack::start().await;
    let event = stack
        .create_event(
            &demo_event("e2e-revoke"),
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue", "token_ttl_s": 30}),
        )
        .await;
    let mut fan = admitted_fan(&stack, &event, "revoked-fan").await;
    let seats = free_seats(&stack, &fan, &event, 1).await;
    // A refreshed token: revocation must reach it too (it counts from the admission).
    let (_, token) = hold(&stack, &mut fan, &event, &seats[0]).await;

    let end_time: String = sqlx::query_scalar(
        "SELECT to_char((now() + interval '1 hour') AT TIME ZONE 'UTC',
                        'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
    )
    .fetch_one(&stack.pool)
    .await
    .expect("end time");
    let (status, auction) = json(
        stack
            .http
            .post(format!("{}/api/auctions", stack.booking_url))
            .bearer_auth(&token)
            .header("Idempotency-Key", shared::ids::new_id())
            .json(
                &json!({"title": "Signed poster", "event": event, "start_price": 1000,
                          "min_increment": 100, "end_time": end_time}),
            )
            .send()
            .await
            .expect("create auction"),
    )
    .await;
    assert_eq!(status, 201, "{auction}");
    let auction = auction["id"].as_str().expect("auction id").to_owned();
    let ws_url = format!(
        "{}/ws/auctions/{auction}?token={token}",
        stack.booking_url.replacen("http://", "ws://", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("ws connect");
    let snapshot = ws.next().await.expect("snapshot").expect("snapshot frame");
    assert!(snapshot.to_text().expect("text").contains("snapshot"));

    let direct = |path: &str| {
        stack
            .http
            .get(format!("{}{path}", stack.booking_url))
            .bearer_auth(&token)
    };
    let (status, before) = json(direct("/api/orders/ord_none").send().await.expect("get")).await;
    assert_eq!(status, 404, "booking accepts the token before: {before}");

    let (status, body) = json(
        stack
            .http
            .post(format!(
                "{}/admin/events/{event}/revoke",
                stack.gateway_admin_url
            ))
            .bearer_auth(ADMIN)
            .json(&json!({"account": "revoked-fan"}))
            .send()
            .await
            .expect("revoke"),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The socket is closed by booking (policy violation), well within the bound.
    let close = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => return frame,
                Some(Ok(_)) => {}
                other => panic!("socket ended without a close frame: {other:?}"),
            }
        }
    })
    .await
    .expect("the revoked fan's socket is closed");
    assert_eq!(close.map(|f| u16::from(f.code)), Some(1008));

    // Booking itself refuses the token now, not only the gateway.
    let (status, body) = eventually(Duration::from_secs(3), "booking refuses", || async {
        let (s, b) = json(direct("/api/orders/ord_none").send().await.expect("get")).await;
        (s == 401).then_some((s, b))
    })
    .await;
    assert_eq!(status, 401);
    assert_eq!(body["reason"], "revoked");
    let (status, body) = json(
        stack
            .http
            .get(stack.gw(&format!("/api/events/{event}/seats")))
            .bearer_auth(&token)
            .send()
            .await
            .expect("gateway"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["reason"], "revoked");
    // A new WebSocket is refused at the upgrade.
    let refused = tokio_tungstenite::connect_async(format!(
        "{}/ws/auctions/{auction}?token={token}",
        stack.booking_url.replacen("http://", "ws://", 1)
    ))
    .await;
    assert!(
        matches!(refused, Err(tokio_tungstenite::tungstenite::Error::Http(ref r)) if r.status() == 401)
    );
    stack.stop().await;
}
