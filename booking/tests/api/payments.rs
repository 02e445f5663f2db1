//! Payments against the real sandbox provider over HTTP: at most one charge however the pay
//! request is repeated, declines, provider timeouts and 5xx, reconciliation, and money that
//! arrives after the hold expired. Also the helpers the webhook and outbox tests share.

use crate::events::{create_event, small_event};
use crate::helpers::{TestApp, json};
use crate::holds::expire_in_db;
use booking::app::config::BookingConfig;
use sandbox_provider::config::{SandboxSettings, WebhookMode};
use sandbox_provider::{Application as SandboxApp, Sandbox};
use secrecy::SecretString;
use serde_json::{Value, json};
use std::collections::HashSet;

pub const API_KEY: &str = "sk_test_payments_suite";
/// The secret the sandbox signs with; booking also accepts [`OLD_WEBHOOK_SECRET`] (rotation).
pub const WEBHOOK_SECRET: &str = "whsec_test_current_secret";
pub const OLD_WEBHOOK_SECRET: &str = "whsec_test_previous_secret";

/// Booking plus an in-process sandbox provider on port 0, wired to each other. Webhooks
/// are held (manual mode) until a test flushes them, unless the test says otherwise.
pub struct PayEnv {
    pub app: TestApp,
    pub sandbox: Sandbox,
    /// The sandbox's base URL (its API and "dashboard" endpoints).
    pub provider_url: String,
}

impl PayEnv {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}, |_| {}).await
    }

    pub async fn spawn_with(
        booking: impl FnOnce(&mut BookingConfig),
        sandbox: impl FnOnce(&mut SandboxSettings),
    ) -> Self {
        Self::spawn_opts(false, booking, sandbox).await
    }

    /// With booking's Postgres and Redis behind fault proxies (`TestApp::chaos`).
    pub async fn spawn_opts(
        proxied: bool,
        booking: impl FnOnce(&mut BookingConfig),
        sandbox: impl FnOnce(&mut SandboxSettings),
    ) -> Self {
        let mut s = SandboxSettings {
            listen: "127.0.0.1:0".into(),
            api_key: SecretString::from(API_KEY),
            webhook_secret: SecretString::from(WEBHOOK_SECRET),
            webhook_mode: WebhookMode::Manual,
            webhook_backoff_ms: 50,
            webhook_max_attempts: 3,
            ..SandboxSettings::default()
        };
        sandbox(&mut s);
        let sb = SandboxApp::build(s).await.expect("start sandbox");
        let port = sb.port();
        let handle = sb.sandbox();
        tokio::spawn(sb.run_until_stopped(std::future::pending()));
        let url = format!("http://127.0.0.1:{port}");
        let provider_url = url.clone();
        let app = TestApp::spawn_opts(proxied, move |c| {
            c.payments.provider_url = url;
            c.payments.api_key = SecretString::from(API_KEY);
            c.payments.webhook_secrets = vec![
                SecretString::from(OLD_WEBHOOK_SECRET),
                SecretString::from(WEBHOOK_SECRET),
            ];
            c.payments.request_timeout_ms = 3_000;
            booking(c);
        })
        .await;
        let hook = app.url("/webhooks/payments");
        handle.update(|s| s.webhook_url = hook);
        PayEnv {
            app,
            sandbox: handle,
            provider_url,
        }
    }

    /// The provider's payment intent ids for `order`, oldest first.
    pub fn intents(&self, order: &str) -> Vec<String> {
        self.sandbox
            .order_summary(order)
            .intents
            .into_iter()
            .map(|i| i.id)
            .collect()
    }

    /// A refund (`"refund"`) or dispute (`"dispute"`) of a payment made in the provider's
    /// dashboard; its webhook is queued or sent per the sandbox's webhook mode.
    pub async fn dashboard(&self, action: &str, intent: &str) -> Value {
        let (status, v) = json(
            self.app
                .client
                .post(format!(
                    "{}/_sandbox/payment_intents/{intent}/{action}",
                    self.provider_url
                ))
                .bearer_auth(API_KEY)
                .send()
                .await
                .expect("dashboard request"),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Charges the provider recorded for `order`.
    pub fn charges(&self, order: &str) -> usize {
        self.sandbox.order_summary(order).charges
    }

    pub fn refunds(&self, order: &str) -> usize {
        self.sandbox.order_summary(order).refunds
    }
}

/// A seat order ready to pay.
pub struct SeatOrder {
    pub token: String,
    pub hold_id: String,
    pub order_id: String,
}

/// Creates event `event` (if `create`), holds `seats` for `account` and orders them.
pub async fn seat_order(
    app: &TestApp,
    event: &str,
    create: bool,
    account: &str,
    seats: &[&str],
) -> SeatOrder {
    if create {
        create_event(app, &small_event(event, 2, 5, 10, 1)).await;
    }
    let token = app.admission(account, event);
    let (status, hold) = json(
        app.post(
            &format!("/api/events/{event}/holds"),
            &token,
            &json!({ "seats": seats }),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let hold_id = hold["hold_id"].as_str().expect("hold id").to_owned();
    let (status, order) = json(
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("order-{hold_id}"))
            .json(&json!({ "hold_id": hold_id }))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(order["status"], "PENDING_PAYMENT");
    SeatOrder {
        token,
        hold_id,
        order_id: order["id"].as_str().expect("order id").to_owned(),
    }
}

/// `POST /api/orders/{id}/pay`.
pub async fn pay(app: &TestApp, token: &str, order: &str, key: &str, method: &str) -> (u16, Value) {
    json(
        app.client
            .post(app.url(&format!("/api/orders/{order}/pay")))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&json!({ "payment_method": method }))
            .send()
            .await
            .expect("request"),
    )
    .await
}

pub async fn scalar(app: &TestApp, sql: &str, bind: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(bind)
        .fetch_one(&app.pool)
        .await
        .expect("scalar query")
}

pub async fn order_status(app: &TestApp, order: &str) -> String {
    sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(order)
        .fetch_one(&app.pool)
        .await
        .expect("order")
}

/// Everything a payment can change, for "nothing changed" assertions.
pub async fn payment_state(app: &TestApp, order: &str) -> Value {
    let row: (String, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM orders WHERE id = $1),
                (SELECT count(*) FROM tickets WHERE order_id = $1),
                (SELECT count(*) FROM seats WHERE order_id = $1 AND status = 'sold'),
                (SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'succeeded'),
                (SELECT count(*) FROM payments WHERE order_id = $1 AND status LIKE 'refund%'),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1
                   AND topic IN ('order.paid', 'order.refunded')),
                (SELECT count(*) FROM payment_webhook_events)",
    )
    .bind(order)
    .fetch_one(&app.pool)
    .await
    .expect("payment state");
    json!({"order": row.0, "tickets": row.1, "sold": row.2, "succeeded": row.3,
           "refunds": row.4, "events": row.5, "webhooks": row.6})
}

/// Moves every open attempt of `order` into the reconciliation window.
/// A sandbox that answers `pm_card_sandbox_timeout` only after booking's 1.5 s provider
/// timeout, so the charge happens but the answer is lost.
pub async fn timeout_env() -> PayEnv {
    PayEnv::spawn_with(
        |c| c.payments.request_timeout_ms = 1_500,
        |s| s.timeout_delay_ms = 30_000,
    )
    .await
}

/// Puts an order's expiry in the past by the database clock.
pub async fn expire_order_in_db(app: &TestApp, order: &str) {
    sqlx::query(
        "UPDATE orders SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
    )
    .bind(order)
    .execute(&app.pool)
    .await
    .expect("expire order");
}

pub async fn make_due(app: &TestApp, order: &str) {
    sqlx::query(
        "UPDATE payments SET next_check_at = clock_timestamp() - interval '1 second'
          WHERE order_id = $1",
    )
    .bind(order)
    .execute(&app.pool)
    .await
    .expect("make due");
}

#[tokio::test]
async fn pay_issues_one_ticket_per_seat_and_announces_it() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "pay-1", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "PAID");
    assert_eq!(v["total"], 24000);
    let seats: HashSet<&str> = v["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .filter_map(|t| t["seat_id"].as_str())
        .collect();
    assert_eq!(seats, HashSet::from(["S1-R1-1", "S1-R1-2"]));
    assert_eq!(v["payment"]["attempt"], 1);
    assert_eq!(env.charges(&o.order_id), 1);
    let summary = env.sandbox.order_summary(&o.order_id);
    assert_eq!(summary.amount_charged, 24000);
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(state["tickets"], 2);
    assert_eq!(state["sold"], 2);
    assert_eq!(state["events"], 1, "one order.paid in the outbox");
    let hold: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(&o.hold_id)
        .fetch_one(&env.app.pool)
        .await
        .unwrap();
    assert_eq!(hold, "sold");
    // The same key replays; a new key on a paid order answers the paid order. Neither charges.
    let (status, again) = pay(&env.app, &o.token, &o.order_id, "pay-1", "pm_card_visa").await;
    assert_eq!((status, &again["tickets"]), (200, &v["tickets"]));
    let (status, other) = pay(&env.app, &o.token, &o.order_id, "pay-2", "pm_card_visa").await;
    assert_eq!((status, other["status"].as_str()), (200, Some("PAID")));
    assert_eq!(env.charges(&o.order_id), 1);
}

/// The pay answer of a hold order comes from the sale's own statement (issue 16): it must be
/// exactly the order as read after the commit (`GET`), its tickets exactly the issued rows,
/// and `order.paid` must announce those same tickets; a replay returns the same bytes.
#[tokio::test]
async fn the_sales_own_answer_is_the_order_as_read_after_it() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-2", "S1-R1-1"]).await;
    let resp = pay_raw(&env.app, &o.token, &o.order_id, "pay-1").await;
    assert_eq!(resp.status(), 200);
    let until = resp
        .headers()
        .get("x-floodgate-session-until")
        .map(|v| v.to_str().expect("header").to_owned());
    let first = resp.bytes().await.expect("body");
    let v: Value = serde_json::from_slice(&first).expect("json");
    // The order part is what GET shows now.
    let (status, read) = json(
        env.app
            .get(&format!("/api/orders/{}", o.order_id), &o.token)
            .await,
    )
    .await;
    assert_eq!(status, 200, "{read}");
    let mut order_part = v.clone();
    let obj = order_part.as_object_mut().expect("object");
    let tickets = obj.remove("tickets").expect("tickets");
    let payment = obj.remove("payment").expect("payment");
    assert_eq!(order_part, read);
    assert!(v["paid_at"].is_string(), "{v}");
    // The tickets are the issued rows, seats in seat order.
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT id, event_id, seat_id FROM tickets WHERE order_id = $1 ORDER BY seat_id",
    )
    .bind(&o.order_id)
    .fetch_all(&env.app.pool)
    .await
    .expect("tickets");
    let listed: Vec<(String, String, Option<String>)> = tickets
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().expect("id").to_owned(),
                t["event_id"].as_str().expect("event").to_owned(),
                t["seat_id"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(listed, rows);
    assert_eq!(rows.len(), 2);
    let (pid, attempt, provider): (String, i32, String) = sqlx::query_as(
        "SELECT id, attempt, provider_payment_id FROM payments
          WHERE order_id = $1 AND status = 'succeeded'",
    )
    .bind(&o.order_id)
    .fetch_one(&env.app.pool)
    .await
    .expect("payment");
    assert_eq!(
        payment,
        json!({"id": pid, "attempt": attempt, "status": "succeeded",
               "provider_payment_id": provider})
    );
    // order.paid names the same tickets and payment.
    let event: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE aggregate_id = $1 AND topic = 'order.paid'",
    )
    .bind(&o.order_id)
    .fetch_one(&env.app.pool)
    .await
    .expect("order.paid");
    assert_eq!(event["order_id"], o.order_id.as_str());
    assert_eq!(event["account_id"], "alice");
    assert_eq!(event["event"], "ev");
    assert_eq!(event["source"], "hold");
    assert_eq!(event["total"], v["total"]);
    assert_eq!(event["payment_id"], pid.as_str());
    assert_eq!(event["provider_payment_id"], provider.as_str());
    let announced: Vec<(String, Option<String>)> = event["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().expect("id").to_owned(),
                t["seat_id"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let issued: Vec<(String, Option<String>)> =
        rows.iter().map(|r| (r.0.clone(), r.2.clone())).collect();
    assert_eq!(announced, issued);
    // The paid order no longer keeps the fan's checkout open (the statement's snapshot still
    // showed it pending): nothing else of alice's is live.
    assert_eq!(until.as_deref(), Some("0"));
    // A replay is the same bytes.
    let again = pay_raw(&env.app, &o.token, &o.order_id, "pay-1").await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.bytes().await.expect("body"), first);
    assert_eq!(env.charges(&o.order_id), 1);
}

/// A GA hold larger than the ticket ids the sale statement is given (ten) still gets one
/// ticket per unit, each with its own id, announced by `order.paid` and sold on its shards.
#[tokio::test]
async fn a_large_ga_order_gets_one_ticket_per_unit_from_the_sale_statement() {
    let env = PayEnv::spawn().await;
    let mut event = small_event("ev", 1, 2, 100, 4);
    event["max_tickets_per_account"] = json!(30);
    create_event(&env.app, &event).await;
    let token = env.app.admission("alice", "ev");
    let order_id = ga_order(&env.app, &token, 25).await;
    let (status, v) = pay(&env.app, &token, &order_id, "p", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    let mut answered: Vec<String> = v["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| {
            assert_eq!(t["ga_tier"], "FLOOR");
            t["id"].as_str().expect("id").to_owned()
        })
        .collect();
    answered.sort();
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT id FROM tickets WHERE order_id = $1 ORDER BY id")
            .bind(&order_id)
            .fetch_all(&env.app.pool)
            .await
            .expect("tickets");
    assert_eq!(stored.len(), 25);
    assert_eq!(answered, stored);
    let event: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE aggregate_id = $1 AND topic = 'order.paid'",
    )
    .bind(&order_id)
    .fetch_one(&env.app.pool)
    .await
    .expect("order.paid");
    let mut announced: Vec<String> = event["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| t["id"].as_str().expect("id").to_owned())
        .collect();
    announced.sort();
    assert_eq!(announced, stored);
    let (sold, held): (i64, i64) = sqlx::query_as(
        "SELECT sum(sold)::bigint, (SELECT count(*) FROM holds WHERE status = 'sold')
           FROM ga_counters WHERE event_id = 'ev'",
    )
    .fetch_one(&env.app.pool)
    .await
    .expect("sold");
    assert_eq!((sold, held), (25, 1));
    assert_eq!(env.charges(&order_id), 1);
}

/// Holds `quantity` FLOOR units of event `ev` for `token`'s fan and orders them; the order id.
async fn ga_order(app: &TestApp, token: &str, quantity: i64) -> String {
    let (status, hold) = json(
        app.post(
            "/api/events/ev/ga-holds",
            token,
            &json!({"tier": "FLOOR", "quantity": quantity}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let (status, order) = json(
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(token)
            .header("Idempotency-Key", "o")
            .json(&json!({"hold_id": hold["hold_id"]}))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 201, "{order}");
    order["id"].as_str().expect("id").to_owned()
}

/// `POST /api/orders/{id}/pay` with a card that succeeds, the raw response.
async fn pay_raw(app: &TestApp, token: &str, order: &str, key: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/api/orders/{order}/pay")))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({ "payment_method": "pm_card_visa" }))
        .send()
        .await
        .expect("request")
}

/// The pay request's first statement claims the key and pins the order only together: a pay
/// with another event's admission pins nothing (the order's expiry stays) and keeps no key.
#[tokio::test]
async fn a_pay_refused_for_another_event_pins_nothing_and_keeps_no_key() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1"]).await;
    create_event(&env.app, &small_event("other", 1, 2, 10, 1)).await;
    let expiry = |app: &TestApp| {
        let pool = app.pool.clone();
        let id = o.order_id.clone();
        async move {
            sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
                "SELECT expires_at FROM orders WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("order")
        }
    };
    let before = expiry(&env.app).await;
    let elsewhere = env.app.admission("alice", "other");
    let (s, v) = pay(&env.app, &elsewhere, &o.order_id, "k1", "pm_card_visa").await;
    assert_eq!((s, v["code"].as_str()), (403, Some("WRONG_EVENT")), "{v}");
    assert_eq!(expiry(&env.app).await, before);
    assert_eq!(
        scalar(
            &env.app,
            "SELECT count(*) FROM idempotency_keys WHERE key = $1",
            "k1"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(
            &env.app,
            "SELECT count(*) FROM payments WHERE order_id = $1",
            &o.order_id
        )
        .await,
        0
    );
    // The same key then pays with the right admission.
    let (s, v) = pay(&env.app, &o.token, &o.order_id, "k1", "pm_card_visa").await;
    assert_eq!((s, v["status"].as_str()), (200, Some("PAID")), "{v}");
    assert_eq!(env.charges(&o.order_id), 1);
}

#[tokio::test]
async fn double_click_and_concurrent_retries_charge_once() {
    // Latency widens the window in which the requests overlap at the provider.
    let env = PayEnv::spawn_with(|_| {}, |s| s.latency_ms = 150).await;
    let o = seat_order(
        &env.app,
        "ev",
        true,
        "alice",
        &["S1-R1-1", "S1-R1-2", "S1-R1-3"],
    )
    .await;
    // 100 simultaneous pay requests: half repeat one key (double click), half carry their own
    // key (a client that retries with fresh keys).
    let futures = (0..100).map(|i| {
        let key = if i % 2 == 0 {
            "click".to_owned()
        } else {
            format!("retry-{i}")
        };
        let app = &env.app;
        let token = o.token.clone();
        let order = o.order_id.clone();
        async move { pay(app, &token, &order, &key, "pm_card_visa").await }
    });
    let started = std::time::Instant::now();
    let results = futures::future::join_all(futures).await;
    eprintln!(
        "100 concurrent pay requests answered in {:?}",
        started.elapsed()
    );
    let mut paid = 0;
    for (status, v) in &results {
        match status {
            200 => {
                assert_eq!(v["status"], "PAID", "{v}");
                paid += 1;
            }
            // Same key still running, or the attempt still running at the provider.
            409 => assert!(
                v["code"] == "IDEMPOTENCY_IN_FLIGHT" || v["code"] == "PAYMENT_IN_PROGRESS",
                "{v}"
            ),
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert!(paid > 0);
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "after", "pm_card_visa").await;
    assert_eq!((status, v["status"].as_str()), (200, Some("PAID")));
    assert_eq!(
        env.charges(&o.order_id),
        1,
        "exactly one charge at the provider"
    );
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(state["tickets"], 3, "one ticket per seat");
    assert_eq!(state["succeeded"], 1);
    assert_eq!(state["events"], 1);
    let attempts = scalar(
        &env.app,
        "SELECT count(*) FROM payments WHERE order_id = $1",
        &o.order_id,
    )
    .await;
    assert_eq!(attempts, 1, "every request reused the one attempt");
}

#[tokio::test]
async fn decline_then_good_card_succeeds_with_one_charge() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R1-1"]).await;
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_chargeDeclined",
    )
    .await;
    assert_eq!(status, 402, "{v}");
    assert_eq!(v["code"], "CARD_DECLINED");
    assert_eq!(v["decline_code"], "generic_decline");
    // The decline is stored under its key and replayed, not retried at the provider.
    let (status, again) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_chargeDeclined",
    )
    .await;
    assert_eq!((status, &again), (402, &v));
    assert_eq!(env.sandbox.order_summary(&o.order_id).intents.len(), 1);
    // The hold is kept: the order is still payable, the seat still held by it.
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    let held = scalar(
        &env.app,
        "SELECT count(*) FROM seats WHERE hold_id = $1 AND status = 'held' AND held_until > clock_timestamp()",
        &o.hold_id,
    )
    .await;
    assert_eq!(held, 1);
    // A different card is a new attempt with a new provider key.
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "k2", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["payment"]["attempt"], 2);
    let summary = env.sandbox.order_summary(&o.order_id);
    assert_eq!((summary.charges, summary.declines), (1, 1));
    let keys: Vec<(i32, String, String)> = sqlx::query_as(
        "SELECT attempt, provider_key, status FROM payments WHERE order_id = $1 ORDER BY attempt",
    )
    .bind(&o.order_id)
    .fetch_all(&env.app.pool)
    .await
    .unwrap();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0].1, keys[1].1);
    assert_eq!(
        (keys[0].2.as_str(), keys[1].2.as_str()),
        ("declined", "succeeded")
    );
}

#[tokio::test]
async fn provider_timeout_then_retry_charges_once() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-1"]).await;
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "t1",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["code"], "PAYMENT_PROVIDER_TIMEOUT");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    assert_eq!(env.charges(&o.order_id), 1, "the provider did charge");
    // The retry (same key, or another key: the attempt is still pending) reuses the provider
    // key, which replays the charge instead of making a second one.
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "t1",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "PAID");
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(payment_state(&env.app, &o.order_id).await["tickets"], 1);
}

#[tokio::test]
async fn provider_5xx_keeps_the_order_pending_and_the_retry_charges_once() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-2"]).await;
    env.sandbox.update(|s| s.failure_rate = 1.0);
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "f1", "pm_card_visa").await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["code"], "PAYMENT_PROVIDER_ERROR");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    env.sandbox.update(|s| s.failure_rate = 0.0);
    // Same Idempotency-Key: the 502 was not stored, the request runs again.
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "f1", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(env.charges(&o.order_id), 1);
    let attempts = scalar(
        &env.app,
        "SELECT count(*) FROM payments WHERE order_id = $1",
        &o.order_id,
    )
    .await;
    assert_eq!(
        attempts, 1,
        "the retry reused the attempt and its provider key"
    );
}

#[tokio::test]
async fn unreachable_provider_is_502_and_nothing_is_charged() {
    let env = PayEnv::spawn_with(
        |c| c.payments.provider_url = "http://127.0.0.1:9".into(),
        |_| {},
    )
    .await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-3"]).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "u1", "pm_card_visa").await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    // The request never left: the attempt is closed, the next one gets a new key.
    let st: String = sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1")
        .bind(&o.order_id)
        .fetch_one(&env.app.pool)
        .await
        .unwrap();
    assert_eq!(st, "failed");
}

#[tokio::test]
async fn reconciliation_completes_an_order_whose_answer_was_lost() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-4", "S1-R1-5"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "r1",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    // Not due yet: the job leaves fresh attempts alone.
    assert_eq!(
        booking::payments::reconcile::run_once(&env.app.state.payments.clients())
            .await
            .unwrap(),
        0
    );
    make_due(&env.app, &o.order_id).await;
    assert_eq!(
        booking::payments::reconcile::run_once(&env.app.state.payments.clients())
            .await
            .unwrap(),
        1
    );
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(state["order"], "PAID");
    assert_eq!(state["tickets"], 2);
    assert_eq!(env.charges(&o.order_id), 1);
    // Running it again changes nothing.
    make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(payment_state(&env.app, &o.order_id).await, state);
}

/// Inserts an attempt recorded just before the process died, before the provider was called.
async fn insert_lost_attempt(app: &TestApp, order: &str) {
    sqlx::query(
        "INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount, currency,
                               payment_method, next_check_at)
         VALUES ('p-lost', $1, 'alice', 1, $1 || '-1', 8000, 'JPY', 'pm_card_visa',
                 clock_timestamp() - interval '1 second')",
    )
    .bind(order)
    .execute(&app.pool)
    .await
    .expect("insert attempt");
}

async fn attempt_status(app: &TestApp, payment: &str) -> String {
    sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
        .bind(payment)
        .fetch_one(&app.pool)
        .await
        .expect("attempt")
}

/// Contract change (issue 14 item 6): an attempt the provider's search does not show is no
/// longer closed as failed. While its order is payable it is settled by its own key: the
/// replay makes the charge the fan asked for, once, and the order is paid by attempt 1.
#[tokio::test]
async fn reconciliation_settles_an_attempt_search_does_not_show_by_its_own_key() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R2-1"]).await;
    insert_lost_attempt(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(attempt_status(&env.app, "p-lost").await, "succeeded");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PAID");
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "k", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["payment"]["attempt"], 1);
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(env.refunds(&o.order_id), 0);
}

/// An attempt of an order that can no longer be paid is never replayed (that could charge
/// for nothing); it is closed only once the provider's search can be trusted to list it.
#[tokio::test]
async fn an_unseen_attempt_of_an_unpayable_order_is_closed_only_after_the_search_horizon() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R2-1"]).await;
    insert_lost_attempt(&env.app, &o.order_id).await;
    expire_order_in_db(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(attempt_status(&env.app, "p-lost").await, "pending");
    sqlx::query(
        "UPDATE payments SET created_at = clock_timestamp() - interval '2 hours',
                             next_check_at = clock_timestamp() - interval '1 second'
          WHERE id = 'p-lost'",
    )
    .execute(&env.app.pool)
    .await
    .unwrap();
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(attempt_status(&env.app, "p-lost").await, "failed");
    assert_eq!(env.sandbox.order_summary(&o.order_id).intents.len(), 0);
}

/// Issue 14 item 6: the provider's search lags (the sandbox hides intents younger than an
/// hour), the first attempt times out at booking although the provider charged it, and
/// reconciliation runs before the fan pays again. Exactly one charge, no refund, paid once.
#[tokio::test]
async fn lagging_search_never_lets_a_second_charge_through() {
    // The provider takes 2.5 s, booking gives up after 1.5 s.
    let env = PayEnv::spawn_with(
        |c| c.payments.request_timeout_ms = 1_500,
        |s| {
            s.latency_ms = 2_500;
            s.search_lag_s = 3_600;
        },
    )
    .await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "first", "pm_card_visa").await;
    assert_eq!(status, 504, "{v}");
    env.sandbox.update(|s| s.latency_ms = 0);
    // Wait (bounded) until the provider has made the charge booking never heard about.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.charges(&o.order_id) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never charged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Search does not show it.
    let found = env
        .app
        .state
        .payments
        .provider
        .find_by_order(&o.order_id)
        .await
        .unwrap();
    assert!(found.is_empty());
    // Reconciliation comes round before the fan does.
    make_due(&env.app, &o.order_id).await;
    assert_eq!(
        booking::payments::reconcile::run_once(&env.app.state.payments.clients())
            .await
            .unwrap(),
        1
    );
    // The fan pays again, with a new key and even another card.
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "second", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "PAID");
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "third", "pm_card_amex").await;
    assert_eq!((status, v["status"].as_str()), (200, Some("PAID")), "{v}");
    let summary = env.sandbox.order_summary(&o.order_id);
    assert_eq!(summary.charges, 1, "exactly one charge at the provider");
    assert_eq!(summary.refunds, 0, "no refund needed");
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (
            &state["order"],
            &state["tickets"],
            &state["succeeded"],
            &state["refunds"],
            &state["events"]
        ),
        (&json!("PAID"), &json!(2), &json!(1), &json!(0), &json!(1))
    );
    let attempts = scalar(
        &env.app,
        "SELECT count(*) FROM payments WHERE order_id = $1",
        &o.order_id,
    )
    .await;
    assert_eq!(attempts, 1, "no second attempt was ever started");
}

/// While an attempt's outcome is unknown, no other attempt starts: a pay with another card
/// is told to wait (`409 PAYMENT_IN_PROGRESS`, `Retry-After`), and once the attempt is settled
/// by its key the order is paid by it, once.
#[tokio::test]
async fn no_new_attempt_while_an_earlier_one_is_unknown() {
    let env = PayEnv::spawn_with(
        |c| c.payments.request_timeout_ms = 1_500,
        |s| {
            s.latency_ms = 2_500;
            s.search_lag_s = 3_600;
        },
    )
    .await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-1"]).await;
    let (status, _) = pay(&env.app, &o.token, &o.order_id, "first", "pm_card_visa").await;
    assert_eq!(status, 504);
    env.sandbox.update(|s| s.latency_ms = 0);
    let resp = env
        .app
        .client
        .post(env.app.url(&format!("/api/orders/{}/pay", o.order_id)))
        .bearer_auth(&o.token)
        .header("Idempotency-Key", "other-card")
        .json(&json!({"payment_method": "pm_card_mastercard"}))
        .send()
        .await
        .expect("request");
    assert!(resp.headers().contains_key("retry-after"));
    let (status, v) = json(resp).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("PAYMENT_IN_PROGRESS")),
        "{v}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.charges(&o.order_id) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never charged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "other-card",
        "pm_card_mastercard",
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("PAID")), "{v}");
    assert_eq!(v["payment"]["attempt"], 1);
    assert_eq!(env.charges(&o.order_id), 1);
}

#[tokio::test]
async fn success_after_hold_expiry_is_refunded_once_and_the_seat_stays_with_its_new_holder() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "a1",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    // The pin runs out and nobody heard back: the hold expires and bob takes the seat.
    expire_in_db(&env.app, &o.hold_id).await;
    expire_order_in_db(&env.app, &o.order_id).await;
    let bob = seat_order(&env.app, "ev", false, "bob", &["S1-R1-1"]).await;
    // Alice retries: the provider replays the success of her open attempt, which can no
    // longer be honoured: refunded, and she is told so.
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "a2",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["refunded"], true, "{v}");
    assert_eq!(env.refunds(&o.order_id), 1);
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(state["tickets"], 0);
    assert_eq!(state["refunds"], 1);
    assert_eq!(state["events"], 1, "one order.refunded");
    assert_ne!(state["order"], "PAID", "never resurrected");
    // The late webhook, duplicated, then reconciliation: no second refund, nothing moves.
    env.sandbox.flush_webhooks(false, true).await;
    make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(env.refunds(&o.order_id), 1, "refunded exactly once");
    let after = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&after["tickets"], &after["refunds"], &after["events"]),
        (&json!(0), &json!(1), &json!(1))
    );
    let seat: (String, Option<String>) = sqlx::query_as(
        "SELECT status, hold_id FROM seats WHERE event_id = 'ev' AND seat_id = 'S1-R1-1'",
    )
    .fetch_one(&env.app.pool)
    .await
    .unwrap();
    assert_eq!(seat, ("held".to_owned(), Some(bob.hold_id.clone())));
    // And bob can still buy it.
    let (status, v) = pay(&env.app, &bob.token, &bob.order_id, "b1", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn expired_order_is_refused_before_any_charge() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-4"]).await;
    expire_order_in_db(&env.app, &o.order_id).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "x", "pm_card_visa").await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["code"], "ORDER_NOT_PAYABLE");
    assert_eq!(v["status"], "EXPIRED");
    assert_eq!(env.sandbox.order_summary(&o.order_id).intents.len(), 0);
}

#[tokio::test]
async fn bad_pay_requests_change_nothing() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R2-2"]).await;
    let before = payment_state(&env.app, &o.order_id).await;
    let url = env.app.url(&format!("/api/orders/{}/pay", o.order_id));
    let send = |req: reqwest::RequestBuilder| async move {
        json(req.send().await.expect("request")).await
    };
    // No Idempotency-Key.
    let (s, v) = send(
        env.app
            .client
            .post(&url)
            .bearer_auth(&o.token)
            .json(&json!({"payment_method": "pm_card_visa"})),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (400, Some("IDEMPOTENCY_KEY_MISSING"))
    );
    // No admission token.
    let (s, _) = send(
        env.app
            .client
            .post(&url)
            .header("Idempotency-Key", "k")
            .json(&json!({"payment_method": "pm_card_visa"})),
    )
    .await;
    assert_eq!(s, 401);
    // Bad bodies.
    for body in [
        json!({}),
        json!({"payment_method": 5}),
        json!({"payment_method": "card"}),
        json!({"payment_method": "pm_card_visa", "amount": 1}),
        json!({"payment_method": "pm_' OR 1=1"}),
    ] {
        let (s, v) = send(
            env.app
                .client
                .post(&url)
                .bearer_auth(&o.token)
                .header("Idempotency-Key", "k")
                .json(&body),
        )
        .await;
        assert_eq!(s, 422, "{body} -> {v}");
    }
    // Someone else's order, and no order at all, look the same.
    let mallory = env.app.admission("mallory", "ev");
    let (s, v) = pay(&env.app, &mallory, &o.order_id, "m", "pm_card_visa").await;
    assert_eq!((s, v["code"].as_str()), (404, Some("NOT_FOUND")));
    let (s, _) = pay(&env.app, &o.token, "no-such-order", "n", "pm_card_visa").await;
    assert_eq!(s, 404);
    // An unknown payment method is refused by the provider: nothing charged, attempt closed.
    let (s, _) = pay(&env.app, &o.token, &o.order_id, "u", "pm_card_unknown").await;
    assert_eq!(s, 502);
    assert_eq!(payment_state(&env.app, &o.order_id).await, before);
    assert_eq!(env.charges(&o.order_id), 0);
}

#[tokio::test]
async fn paying_a_cart_order_moves_reserved_stock_to_sold() {
    use crate::helpers::create_product;
    use crate::products::{post_order, put_line, stock};
    let env = PayEnv::spawn().await;
    create_product(&env.app, "shop", "MUG", 1500, 10, false).await;
    let token = env.app.admission("alice", "shop");
    let resp = put_line(&env.app, &token, "MUG", json!(3)).await;
    assert!(resp.status().is_success());
    let (status, order) =
        json(post_order(&env.app, &token, "o1", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 201, "{order}");
    let order_id = order["id"].as_str().expect("id").to_owned();
    assert_eq!(stock(&env.app, "MUG").await, (7, 3, 0));
    let (status, v) = pay(&env.app, &token, &order_id, "p1", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["total"], 4500);
    assert_eq!(stock(&env.app, "MUG").await, (7, 0, 3));
    assert_eq!(env.sandbox.order_summary(&order_id).amount_charged, 4500);
}

#[tokio::test]
async fn paying_a_ga_hold_issues_one_ticket_per_unit() {
    let env = PayEnv::spawn().await;
    create_event(&env.app, &small_event("ev", 1, 2, 10, 2)).await;
    let token = env.app.admission("alice", "ev");
    let order_id = ga_order(&env.app, &token, 3).await;
    let (status, v) = pay(&env.app, &token, &order_id, "p", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    let tiers: Vec<&str> = v["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .filter_map(|t| t["ga_tier"].as_str())
        .collect();
    assert_eq!(tiers, ["FLOOR", "FLOOR", "FLOOR"]);
    let sold: i64 =
        sqlx::query_scalar("SELECT sum(sold)::bigint FROM ga_counters WHERE event_id = 'ev'")
            .fetch_one(&env.app.pool)
            .await
            .unwrap();
    assert_eq!(sold, 3);
    assert_eq!(env.sandbox.order_summary(&order_id).amount_charged, 27000);
}

#[tokio::test]
async fn http_adapter_round_trip_against_the_sandbox() {
    use booking::payments::provider::{CreatePayment, PaymentStatus, ProviderError};
    use std::collections::BTreeMap;
    let env = PayEnv::spawn().await;
    let provider = &env.app.state.payments.provider;
    let req = |key: &str, method: &str| CreatePayment {
        idempotency_key: key.to_owned(),
        amount: 5000,
        currency: "JPY".into(),
        payment_method: method.to_owned(),
        metadata: BTreeMap::from([("order_id".to_owned(), "ord-1".to_owned())]),
    };
    let paid = provider
        .create_payment(&req("k1", "pm_card_visa"))
        .await
        .unwrap();
    assert_eq!(paid.status, PaymentStatus::Succeeded);
    let again = provider
        .create_payment(&req("k1", "pm_card_visa"))
        .await
        .unwrap();
    assert_eq!(again.id, paid.id, "same key, same payment");
    let err = provider
        .create_payment(&req("k1", "pm_card_amex"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Rejected { status: 400, .. }),
        "{err:?}"
    );
    let declined = provider
        .create_payment(&req("k2", "pm_card_chargeDeclinedInsufficientFunds"))
        .await
        .unwrap();
    assert_eq!(
        declined.status,
        PaymentStatus::Declined {
            decline_code: "insufficient_funds".into()
        }
    );
    assert_eq!(provider.retrieve(&paid.id).await.unwrap().amount, 5000);
    assert_eq!(provider.find_by_order("ord-1").await.unwrap().len(), 2);
    let r1 = provider.refund("rf", &paid.id, None).await.unwrap();
    let r2 = provider.refund("rf", &paid.id, None).await.unwrap();
    assert_eq!((r1.id.clone(), r1.amount), (r2.id, 5000));
    assert_eq!(
        provider.retrieve(&paid.id).await.unwrap().amount_refunded,
        5000
    );
    assert_eq!(env.refunds("ord-1"), 1);
    // A wrong API key is a refusal, not an outage.
    env.sandbox
        .update(|s| s.api_key = SecretString::from("sk_rotated"));
    let err = provider.retrieve(&paid.id).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Rejected { status: 401, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn two_hundred_fans_pay_at_once() {
    let env = PayEnv::spawn().await;
    create_event(&env.app, &small_event("big", 10, 10, 10, 1)).await;
    let seats: Vec<String> = (0..200)
        .map(|i| format!("S{}-R{}-{}", i / 100 + 1, (i % 100) / 10 + 1, i % 10 + 1))
        .collect();
    let orders = futures::future::join_all(seats.iter().enumerate().map(|(i, seat)| {
        let app = &env.app;
        async move { seat_order(app, "big", false, &format!("fan{i}"), &[seat.as_str()]).await }
    }))
    .await;
    let started = std::time::Instant::now();
    let results = futures::future::join_all(orders.iter().map(|o| {
        let app = &env.app;
        async move { pay(app, &o.token, &o.order_id, "pay", "pm_card_visa").await }
    }))
    .await;
    eprintln!("200 orders paid concurrently in {:?}", started.elapsed());
    for (status, v) in &results {
        assert_eq!(*status, 200, "{v}");
    }
    let (paid, tickets, distinct_seats, sold): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE status = 'PAID'),
                (SELECT count(*) FROM tickets),
                (SELECT count(DISTINCT seat_id) FROM tickets),
                (SELECT count(*) FROM seats WHERE event_id = 'big' AND status = 'sold')",
    )
    .fetch_one(&env.app.pool)
    .await
    .unwrap();
    assert_eq!((paid, tickets, distinct_seats, sold), (200, 200, 200, 200));
    for o in &orders {
        assert_eq!(env.charges(&o.order_id), 1);
    }
}

#[tokio::test]
async fn a_refund_that_fails_is_retried_by_reconciliation_once() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "a1",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    expire_in_db(&env.app, &o.hold_id).await;
    expire_order_in_db(&env.app, &o.order_id).await;
    seat_order(&env.app, "ev", false, "bob", &["S1-R1-1"]).await;
    // The provider fails every new request (the charge itself is replayed from its key).
    env.sandbox.update(|s| s.failure_rate = 1.0);
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "a2",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["refund_pending"], true, "{v}");
    assert_eq!(env.refunds(&o.order_id), 0);
    let st: String = sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1")
        .bind(&o.order_id)
        .fetch_one(&env.app.pool)
        .await
        .unwrap();
    assert_eq!(st, "refund_pending");
    // The provider recovers; reconciliation refunds, once, however often it runs.
    env.sandbox.update(|s| s.failure_rate = 0.0);
    for _ in 0..3 {
        make_due(&env.app, &o.order_id).await;
        booking::payments::reconcile::run_once(&env.app.state.payments.clients())
            .await
            .unwrap();
    }
    assert_eq!(env.refunds(&o.order_id), 1);
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&state["refunds"], &state["events"], &state["tickets"]),
        (&json!(1), &json!(1), &json!(0))
    );
}
