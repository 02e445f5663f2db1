//! The fan journey over real HTTP, every call through the gateway: dev login → join → status
//! until admitted → admission cookie → seat map → hold → order → pay → ticket, then the
//! invariants in Postgres and at the provider.

use crate::stack::{Stack, demo_event, json};
use serde_json::{Value, json};
use std::time::Duration;
use testkit::wait::eventually;

/// The `fg_admission` cookie pair from a `Set-Cookie` header, as a browser would send it.
fn admission_cookie(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("fg_admission="))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned)
}

pub struct Fan {
    pub account: String,
    pub cookie: String,
}

/// Logs in, joins the queue and polls status (honouring `poll_after_ms`) until admitted.
pub async fn admitted_fan(stack: &Stack, event: &str, account: &str) -> Fan {
    let (status, login) = json(
        stack
            .http
            .post(stack.gw("/dev/login"))
            .json(&json!({"account": account}))
            .send()
            .await
            .expect("dev login"),
    )
    .await;
    assert_eq!(status, 200, "dev login: {login}");
    let identity = login["token"].as_str().expect("login token").to_owned();

    let (status, joined) = json(
        stack
            .http
            .post(stack.gw(&format!("/queue/{event}/join")))
            .bearer_auth(&identity)
            .json(&json!({}))
            .send()
            .await
            .expect("join"),
    )
    .await;
    assert!(status == 201 || status == 200, "join: {status} {joined}");

    let cookie = eventually(Duration::from_secs(20), "admission", || {
        let identity = identity.clone();
        let url = stack.gw(&format!("/queue/{event}/status"));
        let http = stack.http.clone();
        async move {
            let resp = http
                .get(url)
                .bearer_auth(&identity)
                .send()
                .await
                .expect("status");
            let cookie = admission_cookie(&resp);
            let (status, body) = json(resp).await;
            assert_eq!(status, 200, "status: {body}");
            match body["state"].as_str() {
                Some("admitted") => {
                    assert!(
                        body["token"].is_string(),
                        "admitted without a token: {body}"
                    );
                    assert_eq!(body["next"], format!("/e/{}/shop", body["event"].as_str()?));
                    Some(cookie.expect("admitted status must set the fg_admission cookie"))
                }
                Some("waiting") => {
                    assert!(body["position"].as_u64().is_some_and(|p| p >= 1), "{body}");
                    None
                }
                other => panic!("unexpected queue state {other:?}: {body}"),
            }
        }
    })
    .await;
    Fan {
        account: account.to_owned(),
        cookie,
    }
}

impl Fan {
    pub async fn get(&self, stack: &Stack, path: &str) -> (u16, Value) {
        json(
            stack
                .http
                .get(stack.gw(path))
                .header(reqwest::header::COOKIE, &self.cookie)
                .send()
                .await
                .expect("get"),
        )
        .await
    }

    pub async fn post(
        &self,
        stack: &Stack,
        path: &str,
        key: Option<&str>,
        body: &Value,
    ) -> (u16, Value) {
        let mut req = stack
            .http
            .post(stack.gw(path))
            .header(reqwest::header::COOKIE, &self.cookie)
            .json(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        json(req.send().await.expect("post")).await
    }
}

#[tokio::test]
async fn fan_journey_through_the_gateway_ends_with_a_delivered_ticket() {
    let stack = Stack::start().await;
    let event = stack
        .create_event(
            &demo_event("e2e-api"),
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue"}),
        )
        .await;
    let fan = admitted_fan(&stack, &event, "fan-api-1").await;

    // Without the cookie the gateway refuses the API (and booking never sees the call).
    let (status, body) = json(
        stack
            .http
            .get(stack.gw(&format!("/api/events/{event}/seats")))
            .send()
            .await
            .expect("seats"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "ADMISSION_REQUIRED");

    // Event details and the seat map, as the shop page loads them.
    let (status, info) = fan.get(&stack, &format!("/api/events/{event}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["max_tickets_per_account"], 4);
    let (status, map) = fan.get(&stack, &format!("/api/events/{event}/seats")).await;
    assert_eq!(status, 200, "{map}");
    let seats = map["seats"].as_array().expect("seats");
    assert_eq!(seats.len(), 192);
    let wanted: Vec<String> = seats
        .iter()
        .filter(|s| s["section"] == "S1" && s["row"] == 3 && s["status"] == "available")
        .take(2)
        .map(|s| s["seat_id"].as_str().expect("seat id").to_owned())
        .collect();
    assert_eq!(wanted.len(), 2);

    let (status, hold) = fan
        .post(
            &stack,
            &format!("/api/events/{event}/holds"),
            None,
            &json!({"seats": wanted}),
        )
        .await;
    assert_eq!(status, 201, "{hold}");
    let hold_id = hold["hold_id"].as_str().expect("hold id");
    assert_eq!(hold["total"], 24000);

    // Checkout with one key; the retry of the same attempt replays the same order.
    let order_key = shared::ids::new_id();
    let (status, order) = fan
        .post(
            &stack,
            "/api/orders",
            Some(&order_key),
            &json!({"hold_id": hold_id}),
        )
        .await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["status"], "PENDING_PAYMENT");
    assert_eq!(order["total"], 24000);
    let order_id = order["id"].as_str().expect("order id").to_owned();
    let (status, replay) = fan
        .post(
            &stack,
            "/api/orders",
            Some(&order_key),
            &json!({"hold_id": hold_id}),
        )
        .await;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(replay["id"], order_id.as_str());

    // Pay with the sandbox's good test card; a repeat of the attempt replays, charging once.
    let pay_key = shared::ids::new_id();
    let pay_path = format!("/api/orders/{order_id}/pay");
    let pay_body = json!({"payment_method": "pm_card_visa"});
    let (status, paid) = fan.post(&stack, &pay_path, Some(&pay_key), &pay_body).await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["status"], "PAID");
    let tickets = paid["tickets"].as_array().expect("tickets");
    assert_eq!(tickets.len(), 2, "{paid}");
    let (status, again) = fan.post(&stack, &pay_path, Some(&pay_key), &pay_body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["tickets"], paid["tickets"]);

    // Postgres: order PAID, one ticket per seat for this fan, the seats sold to this order.
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(&order_id)
        .fetch_one(&stack.pool)
        .await
        .expect("order row");
    assert_eq!(status, "PAID");
    let mut ticket_seats: Vec<(String, String)> = sqlx::query_as(
        "SELECT seat_id, account_id FROM tickets WHERE order_id = $1 ORDER BY seat_id",
    )
    .bind(&order_id)
    .fetch_all(&stack.pool)
    .await
    .expect("tickets");
    let mut expected: Vec<(String, String)> = wanted
        .iter()
        .map(|s| (s.clone(), fan.account.clone()))
        .collect();
    expected.sort();
    ticket_seats.sort();
    assert_eq!(ticket_seats, expected);
    let sold: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats WHERE event_id = $1 AND status = 'sold' AND order_id = $2",
    )
    .bind(&event)
    .bind(&order_id)
    .fetch_one(&stack.pool)
    .await
    .expect("sold seats");
    assert_eq!(sold, 2);

    // The provider charged exactly once, the full amount.
    let summary = stack.sandbox.order_summary(&order_id);
    assert_eq!(summary.charges, 1, "{summary:?}");
    assert_eq!(summary.amount_charged, 24000);
    assert_eq!(summary.refunds, 0);

    // The ticket delivery consumer (outbox → Redis Streams → consumer) recorded the delivery
    // once.
    let deliveries = eventually(Duration::from_secs(20), "ticket delivery", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE order_id = $1")
            .bind(&order_id)
            .fetch_one(&stack.pool)
            .await
            .expect("deliveries");
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(deliveries, 1);

    // The seat map now shows the seats sold.
    let (_, map) = eventually(Duration::from_secs(5), "seat map shows sold", || async {
        let (s, m) = fan.get(&stack, &format!("/api/events/{event}/seats")).await;
        let all_sold = m["seats"].as_array().is_some_and(|a| {
            a.iter()
                .filter(|x| wanted.iter().any(|w| x["seat_id"] == w.as_str()))
                .all(|x| x["status"] == "sold")
        });
        all_sold.then_some((s, m))
    })
    .await;
    assert!(map["seats"].is_array());

    stack.stop().await;
}
