//! Issue 41, items 2 and 3: pay calls cannot keep inventory off sale past
//! `created_at + [orders] ttl_s + [payments] pay_grace_s`, an order has at most
//! `[payments] max_attempts` attempts, an attempt still open when its order ends is canceled
//! at the provider, and a success pays an order only when it is its attempt's own intent,
//! amount and currency — against the real sandbox provider and real Postgres.

use crate::helpers::{TestApp, json};
use crate::payments::{API_KEY, PayEnv, make_due, order_status, pay, seat_order};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The order's and its hold's deadlines and the latest `held_until` of its seats, as seconds
/// after the order's `created_at`.
async fn reserved_for_s(app: &TestApp, order: &str) -> (f64, f64, f64) {
    sqlx::query_as(
        "SELECT EXTRACT(EPOCH FROM o.expires_at - o.created_at)::float8,
                EXTRACT(EPOCH FROM h.expires_at - o.created_at)::float8,
                COALESCE((SELECT EXTRACT(EPOCH FROM max(s.held_until) - o.created_at)::float8
                            FROM seats s WHERE s.event_id = h.event_id
                             AND s.seat_id = ANY (h.seat_ids)), 0)
           FROM orders o JOIN holds h ON h.id = o.hold_id WHERE o.id = $1",
    )
    .bind(order)
    .fetch_one(&app.pool)
    .await
    .expect("read the reservation")
}

async fn sandbox_post(env: &PayEnv, path: &str, form: &[(&str, &str)]) -> (u16, Value) {
    json(
        env.app
            .client
            .post(format!("{}{path}", env.provider_url))
            .bearer_auth(API_KEY)
            .form(form)
            .send()
            .await
            .expect("sandbox request"),
    )
    .await
}

fn intent_of(env: &PayEnv, order: &str, id: &str) -> sandbox_provider::store::Intent {
    env.sandbox
        .order_summary(order)
        .intents
        .into_iter()
        .find(|i| i.id == id)
        .expect("the intent")
}

/// A bot loops pay with a 3-D Secure card it never authenticates (each call a fresh key).
/// Every call used to pin the order, its hold and its seats to now + `pay_pin_s`; now none of
/// them is ever reserved past `created_at + ttl_s + pay_grace_s`, the loop ends with the
/// order unpayable at that bound, the open attempt canceled at the provider (the customer
/// can no longer complete it) and the seat on sale again.
#[tokio::test]
async fn a_pay_loop_cannot_reserve_inventory_past_the_bound() {
    const TTL_S: u32 = 3;
    const GRACE_S: u64 = 2;
    let bound = f64::from(TTL_S) + GRACE_S as f64;
    let env = PayEnv::spawn_with(
        |c| {
            c.orders.ttl_s = TTL_S;
            c.payments.pay_pin_s = 60;
            c.payments.pay_grace_s = GRACE_S; // new setting
        },
        |_| {},
    )
    .await;
    let o = seat_order(&env.app, "evpin", true, "mallory", &["S1-R1-1"]).await;
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs_f64(bound + 3.0) {
        i += 1;
        let (status, v) = pay(
            &env.app,
            &o.token,
            &o.order_id,
            &format!("loop-{i}"),
            "pm_card_threeDSecure2Required",
        )
        .await;
        let (order_s, hold_s, seat_s) = reserved_for_s(&env.app, &o.order_id).await;
        assert!(
            order_s <= bound + 0.01 && hold_s <= bound + 0.01 && seat_s <= bound + 0.01,
            "pay #{i} ({status} {v}) reserved past created_at + {bound} s: order {order_s:.1} s, \
             hold {hold_s:.1} s, seat {seat_s:.1} s"
        );
        answers.push((status, v["code"].as_str().unwrap_or_default().to_owned()));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        answers
            .iter()
            .any(|(s, c)| *s == 409 && c == "PAYMENT_IN_PROGRESS"),
        "{answers:?}"
    );
    let (status, code) = answers.last().cloned().expect("answers");
    assert_eq!(
        (status, code.as_str()),
        (409, "ORDER_NOT_PAYABLE"),
        "{answers:?}"
    );
    // One attempt for the whole loop (the pending one is reused), canceled at the provider.
    let intents = env.intents(&o.order_id);
    assert_eq!(intents.len(), 1, "{intents:?}");
    let intent = intent_of(&env, &o.order_id, &intents[0]);
    assert_eq!(intent.status, "canceled");
    let attempt: String = sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1")
        .bind(&o.order_id)
        .fetch_one(&env.app.pool)
        .await
        .expect("attempt");
    assert_eq!(attempt, "failed");
    // Authenticating now is too late.
    let (status, v) = sandbox_post(
        &env,
        &format!("/_sandbox/payment_intents/{}/complete", intents[0]),
        &[],
    )
    .await;
    assert_eq!(status, 400, "{v}");
    // The order expires and the seat is on sale: another fan holds it.
    booking::orders::expire_due(&env.app.state.orders)
        .await
        .expect("expire");
    assert_eq!(order_status(&env.app, &o.order_id).await, "EXPIRED");
    let other = env.app.admission("fan", "evpin");
    let (status, v) = json(
        env.app
            .post(
                "/api/events/evpin/holds",
                &other,
                &json!({"seats": ["S1-R1-1"]}),
            )
            .await,
    )
    .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(env.charges(&o.order_id), 0);
}

/// `max_attempts` (default 5) per order: the next pay is `409 PAYMENT_ATTEMPTS_EXHAUSTED`,
/// with nothing charged, pinned or recorded.
#[tokio::test]
async fn attempts_per_order_are_capped() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "evcap", true, "mallory", &["S1-R1-1"]).await;
    for i in 1..=5 {
        let (status, v) = pay(
            &env.app,
            &o.token,
            &o.order_id,
            &format!("d{i}"),
            "pm_card_chargeDeclined",
        )
        .await;
        assert_eq!(status, 402, "attempt {i}: {v}");
        assert_eq!(v["attempt"], i, "{v}");
    }
    let before = reserved_for_s(&env.app, &o.order_id).await;
    for (key, method) in [("d6", "pm_card_chargeDeclined"), ("v1", "pm_card_visa")] {
        let (status, v) = pay(&env.app, &o.token, &o.order_id, key, method).await;
        assert_eq!(status, 409, "{v}");
        assert_eq!(v["code"], "PAYMENT_ATTEMPTS_EXHAUSTED", "{v}");
        assert_eq!(v["max_attempts"], 5, "{v}");
    }
    assert_eq!(reserved_for_s(&env.app, &o.order_id).await, before);
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE order_id = $1")
        .bind(&o.order_id)
        .fetch_one(&env.app.pool)
        .await
        .expect("count");
    assert_eq!(attempts, 5);
    assert_eq!(env.charges(&o.order_id), 0);
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
}

/// Seen in the review: with an order's 3-D Secure attempt open, a 1 USD PaymentIntent created
/// at the provider with that attempt's id in its metadata paid the order. Now a success pays
/// only for the attempt's own intent, amount and currency: the foreign ones (the wrong amount
/// and currency; then the right ones on another intent) pay nothing and are refunded,
/// counted and audited, through the webhook and reconciliation alike; the real intent's
/// success then pays the order once.
#[tokio::test]
async fn a_success_pays_only_its_own_attempt() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "evmatch", true, "mallory", &["S1-R1-1"]).await;
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_authenticationRequired",
    )
    .await;
    assert_eq!(status, 409, "{v}");
    let (payment_id, amount, currency): (String, i64, String) =
        sqlx::query_as("SELECT id, amount, currency FROM payments WHERE order_id = $1")
            .bind(&o.order_id)
            .fetch_one(&env.app.pool)
            .await
            .expect("attempt");
    let real = env.intents(&o.order_id)[0].clone();
    let amount = amount.to_string();
    let currency = currency.to_ascii_lowercase();
    let mut foreign = Vec::new();
    for (a, c) in [("100", "usd"), (amount.as_str(), currency.as_str())] {
        let (status, pi) = sandbox_post(
            &env,
            "/v1/payment_intents",
            &[
                ("amount", a),
                ("currency", c),
                ("payment_method", "pm_card_visa"),
                ("confirm", "true"),
                ("metadata[order_id]", &o.order_id),
                ("metadata[payment_id]", &payment_id),
                ("metadata[attempt]", "1"),
            ],
        )
        .await;
        assert_eq!(
            (status, pi["status"].as_str()),
            (200, Some("succeeded")),
            "{pi}"
        );
        foreign.push(pi["id"].as_str().expect("id").to_owned());
        let flushed = env.sandbox.flush_webhooks(false, true).await;
        assert!(
            flushed.iter().all(|d| d["acknowledged"] == true),
            "{flushed:?}"
        );
        assert_eq!(
            order_status(&env.app, &o.order_id).await,
            "PENDING_PAYMENT",
            "a foreign success ({a} {c}) paid the order"
        );
    }
    // Reconciliation sees all three intents by their metadata; none settles the attempt.
    make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .expect("reconcile");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    for id in &foreign {
        let i = intent_of(&env, &o.order_id, id);
        assert_eq!(
            i.amount_refunded, i.amount,
            "foreign intent {id} not refunded"
        );
    }
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT detail->>'intent_id') FROM ops_audit
          WHERE action = 'payment.mismatch_refunded' AND target = $1",
    )
    .bind(format!("payment:{payment_id}"))
    .fetch_one(&env.app.pool)
    .await
    .expect("audit");
    assert_eq!(audited, 2);
    let metrics = env.app.metrics_text().await;
    assert!(
        metrics.contains(r#"payment_mismatches_total{path="webhook",result="refunded"} 2"#),
        "{metrics}"
    );
    // The customer authenticates: the attempt's own intent pays the order, once.
    let (status, v) = sandbox_post(
        &env,
        &format!("/_sandbox/payment_intents/{real}/complete"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(order_status(&env.app, &o.order_id).await, "PAID");
    let paid_by: Option<String> = sqlx::query_scalar(
        "SELECT provider_payment_id FROM payments WHERE order_id = $1 AND status = 'succeeded'",
    )
    .bind(&o.order_id)
    .fetch_one(&env.app.pool)
    .await
    .expect("paid by");
    assert_eq!(paid_by.as_deref(), Some(real.as_str()));
}

/// Money an order could not take (`refund_pending`: the 3-D Secure attempt was completed after
/// its order expired, and booking's refund failed) that the provider's dashboard then refunds
/// only partly: the attempt is not closed as refunded — booking refunds the rest.
#[tokio::test]
async fn a_partial_refund_does_not_close_money_owed_back() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "evpart", true, "alice", &["S1-R1-1"]).await;
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_authenticationRequired",
    )
    .await;
    assert_eq!(status, 409, "{v}");
    crate::payments::expire_order_in_db(&env.app, &o.order_id).await;
    booking::orders::expire_due(&env.app.state.orders)
        .await
        .expect("expire");
    assert_eq!(order_status(&env.app, &o.order_id).await, "EXPIRED");
    let intent = env.intents(&o.order_id)[0].clone();
    // The customer authenticates too late, while the provider refuses refunds.
    let (status, v) = sandbox_post(
        &env,
        &format!("/_sandbox/payment_intents/{intent}/complete"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    env.sandbox.update(|s| s.failure_rate = 1.0);
    env.sandbox.flush_webhooks(false, false).await;
    let attempt = |env: &PayEnv| {
        let pool = env.app.pool.clone();
        let order = o.order_id.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM payments WHERE order_id = $1")
                .bind(order)
                .fetch_one(&pool)
                .await
                .expect("attempt")
        }
    };
    assert_eq!(attempt(&env).await, "refund_pending");
    env.sandbox.update(|s| s.failure_rate = 0.0);
    // An operator refunds part of it in the provider's dashboard.
    let amount = intent_of(&env, &o.order_id, &intent).amount;
    let (status, v) = json(
        env.app
            .client
            .post(format!(
                "{}/_sandbox/payment_intents/{intent}/refund",
                env.provider_url
            ))
            .bearer_auth(API_KEY)
            .json(&json!({"amount": 1}))
            .send()
            .await
            .expect("dashboard refund"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    env.sandbox.flush_webhooks(false, false).await;
    assert_eq!(
        attempt(&env).await,
        "refund_pending",
        "a partial refund closed money owed back"
    );
    // Reconciliation refunds the rest.
    make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .expect("reconcile");
    assert_eq!(attempt(&env).await, "refunded");
    let i = intent_of(&env, &o.order_id, &intent);
    assert_eq!((i.amount_refunded, i.amount), (amount, amount));
}
