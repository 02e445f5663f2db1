//! Provider webhooks against the real sandbox: before and after the synchronous answer,
//! duplicated, out of order, alone (after a timeout), and forged or stale.

use crate::payments::{
    OLD_WEBHOOK_SECRET, PayEnv, WEBHOOK_SECRET, expire_order_in_db, pay, payment_state, seat_order,
    timeout_env,
};
use sandbox_provider::config::WebhookMode;
use sandbox_provider::webhooks::{signature_header, unix_now};
use serde_json::{Value, json};

async fn post_webhook(env: &PayEnv, signature: Option<String>, body: &[u8]) -> (u16, Value) {
    let mut req = env
        .app
        .client
        .post(env.app.url("/webhooks/payments"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(sig) = signature {
        req = req.header("Stripe-Signature", sig);
    }
    crate::helpers::json(req.send().await.expect("request")).await
}

#[tokio::test]
async fn webhook_before_the_synchronous_answer() {
    // The sandbox delivers (and waits for) the webhook before answering the charge.
    let env = PayEnv::spawn_with(|_| {}, |s| s.webhook_mode = WebhookMode::BeforeResponse).await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "k", "pm_card_visa").await;
    // The webhook won the transition; the synchronous path found the order paid by this
    // very payment and answers with it.
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "PAID");
    assert_eq!(v["tickets"].as_array().map(Vec::len), Some(2));
    let deliveries = env.sandbox.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].status, Some(200));
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        state,
        json!({"order": "PAID", "tickets": 2, "sold": 2, "succeeded": 1,
                             "refunds": 0, "events": 1, "webhooks": 1})
    );
    assert_eq!(env.charges(&o.order_id), 1);
}

#[tokio::test]
async fn webhook_after_the_answer_and_duplicated_changes_nothing() {
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R1-3"]).await;
    let (status, _) = pay(&env.app, &o.token, &o.order_id, "k", "pm_card_visa").await;
    assert_eq!(status, 200);
    let mut before = payment_state(&env.app, &o.order_id).await;
    // Each copy is acknowledged; only the first is recorded, and it changes nothing else.
    let delivered = env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(delivered.len(), 2);
    assert!(
        delivered.iter().all(|d| d["acknowledged"] == true),
        "{delivered:?}"
    );
    before["webhooks"] = json!(1);
    assert_eq!(payment_state(&env.app, &o.order_id).await, before);
}

#[tokio::test]
async fn webhook_alone_completes_an_order_whose_answer_timed_out() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R1-1", "S2-R1-2"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    assert_eq!(
        payment_state(&env.app, &o.order_id).await["order"],
        "PENDING_PAYMENT"
    );
    env.sandbox.flush_webhooks(false, false).await;
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&state["order"], &state["tickets"]),
        (&json!("PAID"), &json!(2))
    );
    // The fan's retry now finds the order paid: same tickets, still one charge.
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("PAID")));
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(payment_state(&env.app, &o.order_id).await, state);
}

#[tokio::test]
async fn out_of_order_webhooks_do_not_undo_a_payment() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-1"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "a",
        "pm_card_chargeDeclined",
    )
    .await;
    assert_eq!(status, 402);
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "b",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    // Newest first: attempt 2's success, then attempt 1's failure.
    let delivered = env.sandbox.flush_webhooks(true, false).await;
    assert_eq!(delivered[0]["type"], "payment_intent.succeeded");
    assert_eq!(delivered[1]["type"], "payment_intent.payment_failed");
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&state["order"], &state["succeeded"], &state["tickets"]),
        (&json!("PAID"), &json!(1), &json!(1))
    );
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1 ORDER BY attempt")
            .bind(&o.order_id)
            .fetch_all(&env.app.pool)
            .await
            .unwrap();
    assert_eq!(statuses, ["declined", "succeeded"]);
}

#[tokio::test]
async fn bad_or_stale_signatures_are_refused_and_change_nothing() {
    let env = PayEnv::spawn_with(
        |c| c.payments.request_timeout_ms = 1_500,
        |s| {
            s.timeout_delay_ms = 30_000;
            s.webhooks_enabled = false;
        },
    )
    .await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S1-R2-2"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    let intent = env.sandbox.order_summary(&o.order_id).intents[0].clone();
    let body = serde_json::to_vec(&json!({
        "id": "evt_forged_1",
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": intent},
    }))
    .unwrap();
    let before = payment_state(&env.app, &o.order_id).await;
    let now = unix_now();
    let tampered = {
        let mut b = body.clone();
        b.extend_from_slice(b" ");
        b
    };
    let cases: Vec<(&str, Option<String>, &[u8])> = vec![
        ("missing header", None, &body),
        (
            "wrong secret",
            Some(signature_header("whsec_attacker", now, &body)),
            &body,
        ),
        (
            "tampered body",
            Some(signature_header(WEBHOOK_SECRET, now, &body)),
            &tampered,
        ),
        (
            "stale",
            Some(signature_header(WEBHOOK_SECRET, now - 600, &body)),
            &body,
        ),
        (
            "from the future",
            Some(signature_header(WEBHOOK_SECRET, now + 600, &body)),
            &body,
        ),
        ("garbage", Some("t=now,v1=zz".to_owned()), &body),
        ("no v1", Some(format!("t={now}")), &body),
    ];
    for (name, sig, b) in cases {
        let (status, v) = post_webhook(&env, sig, b).await;
        assert_eq!(status, 400, "{name}: {v}");
        assert_eq!(v["code"], "INVALID_SIGNATURE", "{name}");
    }
    assert_eq!(
        payment_state(&env.app, &o.order_id).await,
        before,
        "nothing changed"
    );
    // During rotation the previous secret still verifies; several v1 entries are allowed.
    let good = signature_header(OLD_WEBHOOK_SECRET, now, &body);
    let junk = signature_header("whsec_other", now, &body);
    let header = format!("{junk},{}", good.split(',').nth(1).unwrap());
    let (status, v) = post_webhook(&env, Some(header.clone()), &body).await;
    assert_eq!(status, 200, "{v}");
    let after = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&after["order"], &after["webhooks"]),
        (&json!("PAID"), &json!(1))
    );
    // The same event again (the provider retries): acknowledged, recorded once.
    let (status, v) = post_webhook(&env, Some(header), &body).await;
    assert_eq!((status, &v["duplicate"]), (200, &json!(true)));
    assert_eq!(payment_state(&env.app, &o.order_id).await, after);
}

#[tokio::test]
async fn concurrent_webhook_copies_and_pay_retries_apply_once() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R2-1", "S2-R2-2"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k0",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    let intent = env.sandbox.order_summary(&o.order_id).intents[0].clone();
    let body = serde_json::to_vec(&json!({
        "id": "evt_race", "object": "event", "type": "payment_intent.succeeded",
        "data": {"object": intent},
    }))
    .unwrap();
    // 20 copies of the webhook race 20 pay retries (each replayed by the provider).
    let hooks = (0..20).map(|_| {
        let sig = signature_header(WEBHOOK_SECRET, unix_now(), &body);
        let env = &env;
        let body = &body;
        async move { post_webhook(env, Some(sig), body).await.0 }
    });
    let pays = (0..20).map(|i| {
        let env = &env;
        let o = &o;
        async move {
            pay(
                &env.app,
                &o.token,
                &o.order_id,
                &format!("r{i}"),
                "pm_card_sandbox_timeout",
            )
            .await
            .0
        }
    });
    let (h, p) = futures::future::join(
        futures::future::join_all(hooks),
        futures::future::join_all(pays),
    )
    .await;
    assert!(h.iter().all(|s| *s == 200), "{h:?}");
    assert!(p.iter().all(|s| *s == 200 || *s == 409), "{p:?}");
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        state,
        json!({"order": "PAID", "tickets": 2, "sold": 2, "succeeded": 1,
                             "refunds": 0, "events": 1, "webhooks": 1})
    );
    assert_eq!(env.charges(&o.order_id), 1);
}

#[tokio::test]
async fn late_success_webhook_for_an_expired_order_is_refunded_once() {
    let env = timeout_env().await;
    let o = seat_order(&env.app, "ev", true, "alice", &["S2-R1-3"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    // The order runs out and the expiry job ends it; bob takes the seat.
    crate::holds::expire_in_db(&env.app, &o.hold_id).await;
    expire_order_in_db(&env.app, &o.order_id).await;
    assert_eq!(
        booking::orders::expire_due(&env.app.state.orders)
            .await
            .unwrap(),
        1
    );
    let bob = seat_order(&env.app, "ev", false, "bob", &["S2-R1-3"]).await;
    // The success webhook arrives late, twice.
    let delivered = env.sandbox.flush_webhooks(false, true).await;
    assert!(
        delivered.iter().all(|d| d["acknowledged"] == true),
        "{delivered:?}"
    );
    assert_eq!(env.refunds(&o.order_id), 1, "refunded exactly once");
    let state = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (
            &state["order"],
            &state["tickets"],
            &state["refunds"],
            &state["events"]
        ),
        (&json!("EXPIRED"), &json!(0), &json!(1), &json!(1)),
        "never resurrected; one order.refunded"
    );
    // The refund's own webhook (charge.refunded) changes nothing more.
    env.sandbox.flush_webhooks(false, false).await;
    let after = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (&after["refunds"], &after["events"]),
        (&json!(1), &json!(1))
    );
    let holder: Option<String> = sqlx::query_scalar(
        "SELECT hold_id FROM seats WHERE event_id = 'ev' AND seat_id = 'S2-R1-3'",
    )
    .fetch_one(&env.app.pool)
    .await
    .unwrap();
    assert_eq!(holder, Some(bob.hold_id));
}

// ---------------------------------------------------------------------------------------------
// Provider-side refunds and disputes (issue 14 item 7)
// ---------------------------------------------------------------------------------------------

/// Order status, tickets (all / voided), the order's seats still sold, and the outbox rows
/// for the order by topic.
async fn reversal_state(env: &PayEnv, order: &str) -> Value {
    let row: (String, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM orders WHERE id = $1),
                (SELECT count(*) FROM tickets WHERE order_id = $1),
                (SELECT count(*) FROM tickets WHERE order_id = $1 AND voided_at IS NOT NULL),
                (SELECT count(*) FROM seats WHERE order_id = $1 AND status = 'sold'),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.paid'),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.refunded'),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.disputed')",
    )
    .bind(order)
    .fetch_one(&env.app.pool)
    .await
    .expect("reversal state");
    json!({"order": row.0, "tickets": row.1, "voided": row.2, "sold": row.3,
           "paid_events": row.4, "refunded_events": row.5, "disputed_events": row.6})
}

async fn seat(env: &PayEnv, event: &str, seat: &str) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, order_id FROM seats WHERE event_id = $1 AND seat_id = $2")
        .bind(event)
        .bind(seat)
        .fetch_one(&env.app.pool)
        .await
        .expect("seat")
}

async fn usage(env: &PayEnv, event: &str, account: &str) -> i32 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(tickets), 0)::int FROM account_event_usage
          WHERE event_id = $1 AND account_id = $2",
    )
    .bind(event)
    .bind(account)
    .fetch_one(&env.app.pool)
    .await
    .expect("usage")
}

/// A Stripe-shaped `charge.refunded` body for the whole of `intent`.
fn refunded_event(id: &str, intent: &sandbox_provider::store::Intent) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "object": "event", "type": "charge.refunded",
        "data": {"object": {
            "id": intent.latest_charge, "object": "charge", "amount": intent.amount,
            "amount_refunded": intent.amount, "refunded": true,
            "payment_intent": intent.id, "metadata": intent.metadata,
        }},
    }))
    .expect("event")
}

#[tokio::test]
async fn dashboard_refund_reverses_a_paid_order_once_under_concurrent_duplicates() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let o = crate::helpers::order_seats(&env.app, "ev", "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, _) = pay(&env.app, &o.token, &o.order_id, "k", "pm_card_visa").await;
    assert_eq!(status, 200);
    assert_eq!(usage(&env, "ev", "alice").await, 2);
    let intent_id = env.intents(&o.order_id)[0].clone();
    env.dashboard("refund", &intent_id).await;
    // The provider's own event, then 100 concurrent deliveries: 50 copies of one event and
    // 50 distinct events for the same refund.
    let intent = env.sandbox.order_summary(&o.order_id).intents[0].clone();
    let flushed = env.sandbox.flush_webhooks(false, true).await;
    assert!(
        flushed.iter().all(|d| d["acknowledged"] == true),
        "{flushed:?}"
    );
    let bodies: Vec<Vec<u8>> = (0..100)
        .map(|i| {
            let id = if i % 2 == 0 {
                "evt_dup".to_owned()
            } else {
                format!("evt_refund_{i}")
            };
            refunded_event(&id, &intent)
        })
        .collect();
    let statuses = futures::future::join_all(bodies.iter().map(|body| {
        let env = &env;
        async move {
            let sig = signature_header(WEBHOOK_SECRET, unix_now(), body);
            post_webhook(env, Some(sig), body).await.0
        }
    }))
    .await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // A dispute after the refund changes nothing more.
    env.dashboard("dispute", &intent_id).await;
    env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(
        reversal_state(&env, &o.order_id).await,
        json!({"order": "REFUNDED", "tickets": 2, "voided": 2, "sold": 0, "paid_events": 1,
               "refunded_events": 1, "disputed_events": 0})
    );
    assert_eq!(
        seat(&env, "ev", "S1-R1-1").await,
        ("available".to_owned(), None)
    );
    assert_eq!(
        usage(&env, "ev", "alice").await,
        0,
        "the fan's tickets no longer count"
    );
    let reasons: Vec<String> =
        sqlx::query_scalar("SELECT void_reason FROM tickets WHERE order_id = $1")
            .bind(&o.order_id)
            .fetch_all(&env.app.pool)
            .await
            .unwrap();
    assert_eq!(reasons, ["refunded", "refunded"]);
    let payment: (String, Option<String>) =
        sqlx::query_as("SELECT status, refund_id FROM payments WHERE order_id = $1")
            .bind(&o.order_id)
            .fetch_one(&env.app.pool)
            .await
            .unwrap();
    assert_eq!(payment.0, "refunded");
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(
        env.refunds(&o.order_id),
        1,
        "booking issued no refund of its own"
    );
    // The released seat can be bought by another fan; the voided ticket stays on record.
    let bob = crate::helpers::order_seats(&env.app, "ev", "bob", &["S1-R1-1"]).await;
    let (status, v) = pay(&env.app, &bob.token, &bob.order_id, "b", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    let tickets: Vec<(String, bool)> = sqlx::query_as(
        "SELECT order_id, voided_at IS NULL FROM tickets
          WHERE event_id = 'ev' AND seat_id = 'S1-R1-1' ORDER BY issued_at",
    )
    .fetch_all(&env.app.pool)
    .await
    .unwrap();
    assert_eq!(
        tickets,
        [(o.order_id.clone(), false), (bob.order_id.clone(), true)]
    );
    // The database itself refuses a second valid ticket for the seat.
    let second = sqlx::query(
        "INSERT INTO tickets (id, event_id, seat_id, order_id, account_id, holder_account)
         VALUES ('t-dup', 'ev', 'S1-R1-1', 'o-x', 'mallory', 'mallory')",
    )
    .execute(&env.app.pool)
    .await;
    assert!(second.is_err(), "two valid tickets for one seat");
}

#[tokio::test]
async fn refund_before_the_success_with_stock_held_back() {
    let env = timeout_env().await;
    crate::helpers::create_refund_event(&env.app, "ev", "hold_back").await;
    let o = crate::helpers::order_seats(&env.app, "ev", "alice", &["S2-R1-1"]).await;
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(status, 504);
    let intent_id = env.intents(&o.order_id)[0].clone();
    env.dashboard("refund", &intent_id).await;
    // Newest first, twice each: charge.refunded arrives before payment_intent.succeeded.
    let flushed = env.sandbox.flush_webhooks(true, true).await;
    assert_eq!(flushed[0]["type"], "charge.refunded");
    assert!(
        flushed.iter().all(|d| d["acknowledged"] == true),
        "{flushed:?}"
    );
    let state = reversal_state(&env, &o.order_id).await;
    assert_eq!(
        state,
        json!({"order": "REFUNDED", "tickets": 1, "voided": 1, "sold": 0, "paid_events": 1,
               "refunded_events": 1, "disputed_events": 0})
    );
    // Held back: neither sold nor on sale.
    assert_eq!(
        seat(&env, "ev", "S2-R1-1").await,
        ("held_back".to_owned(), Some(o.order_id.clone()))
    );
    let (_, counts) = crate::helpers::json(env.app.admin_get("/admin/events/ev").await).await;
    assert_eq!(
        (counts["held_back"].as_i64(), counts["sold"].as_i64()),
        (Some(1), Some(0))
    );
    let bob = env.app.admission("bob", "ev");
    let (status, v) = crate::helpers::json(
        env.app
            .post("/api/events/ev/holds", &bob, &json!({"seats": ["S2-R1-1"]}))
            .await,
    )
    .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("SEAT_TAKEN")),
        "{v}"
    );
    // The fan's retry and reconciliation find nothing left to do.
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k2",
        "pm_card_sandbox_timeout",
    )
    .await;
    assert_eq!(
        (status, v["status"].as_str()),
        (409, Some("REFUNDED")),
        "{v}"
    );
    crate::payments::make_due(&env.app, &o.order_id).await;
    booking::payments::reconcile::run_once(&env.app.state.payments.clients())
        .await
        .unwrap();
    assert_eq!(reversal_state(&env, &o.order_id).await, state);
    assert_eq!((env.charges(&o.order_id), env.refunds(&o.order_id)), (1, 1));
}

#[tokio::test]
async fn dispute_before_the_success_then_refund_reverses_a_ga_order_once() {
    let env = timeout_env().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let (token, order) = crate::helpers::order_ga(&env.app, "ev", "alice", 3).await;
    let (status, _) = pay(&env.app, &token, &order, "k", "pm_card_sandbox_timeout").await;
    assert_eq!(status, 504);
    let intent_id = env.intents(&order)[0].clone();
    env.dashboard("dispute", &intent_id).await;
    // The dispute (whose own metadata names nothing of ours) arrives first, twice.
    let flushed = env.sandbox.flush_webhooks(true, true).await;
    assert_eq!(flushed[0]["type"], "charge.dispute.created");
    assert!(
        flushed.iter().all(|d| d["acknowledged"] == true),
        "{flushed:?}"
    );
    let expected = json!({"order": "DISPUTED", "tickets": 3, "voided": 3, "sold": 0,
                          "paid_events": 1, "refunded_events": 0, "disputed_events": 1});
    assert_eq!(reversal_state(&env, &order).await, expected);
    let (_, counts) = crate::helpers::json(env.app.admin_get("/admin/events/ev").await).await;
    let floor = &counts["ga_tiers"][0];
    assert_eq!(
        (
            floor["available"].as_i64(),
            floor["sold"].as_i64(),
            floor["held"].as_i64()
        ),
        (Some(10), Some(0), Some(0)),
        "{counts}"
    );
    // A refund after the dispute: the order was reversed already.
    env.dashboard("refund", &intent_id).await;
    env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(reversal_state(&env, &order).await, expected);
    let (_, counts) = crate::helpers::json(env.app.admin_get("/admin/events/ev").await).await;
    assert_eq!(counts["ga_tiers"][0]["available"], 10);
    assert_eq!(usage(&env, "ev", "alice").await, 0);
}

#[tokio::test]
async fn dashboard_refund_of_a_cart_order_returns_its_stock_once() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "shop", "release").await;
    crate::helpers::create_event_product(&env.app, "shop", "MUG", 1500, 10, false).await;
    let (token, order) = crate::helpers::order_cart(&env.app, "shop", "alice", "MUG", 3).await;
    let (status, v) = pay(&env.app, &token, &order, "k", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(crate::products::stock(&env.app, "MUG").await, (7, 0, 3));
    let intent_id = env.intents(&order)[0].clone();
    env.dashboard("refund", &intent_id).await;
    env.sandbox.flush_webhooks(true, true).await;
    env.sandbox.flush_webhooks(false, true).await;
    let state = reversal_state(&env, &order).await;
    assert_eq!(
        (&state["order"], &state["refunded_events"]),
        (&json!("REFUNDED"), &json!(1))
    );
    assert_eq!(crate::products::stock(&env.app, "MUG").await, (10, 0, 0));
    // Another fan can buy the returned units.
    let (token, bob) = crate::helpers::order_cart(&env.app, "shop", "bob", "MUG", 10).await;
    let (status, v) = pay(&env.app, &token, &bob, "k", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(crate::products::stock(&env.app, "MUG").await, (0, 0, 10));
}

#[tokio::test]
async fn racing_refund_and_dispute_webhooks_reverse_the_order_exactly_once() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let o = crate::helpers::order_seats(&env.app, "ev", "alice", &["S1-R2-1", "S1-R2-2"]).await;
    let (status, _) = pay(&env.app, &o.token, &o.order_id, "k", "pm_card_visa").await;
    assert_eq!(status, 200);
    let intent = env.sandbox.order_summary(&o.order_id).intents[0].clone();
    // 100 concurrent deliveries: refunds and disputes of the same charge, each under its own
    // event id, the way two dashboards (operator and bank) would send them.
    let bodies: Vec<Vec<u8>> = (0..100)
        .map(|i| {
            if i % 2 == 0 {
                refunded_event(&format!("evt_r{i}"), &intent)
            } else {
                serde_json::to_vec(&json!({
                    "id": format!("evt_d{i}"), "object": "event", "type": "charge.dispute.created",
                    "data": {"object": {
                        "id": "dp_race", "object": "dispute", "amount": intent.amount,
                        "charge": intent.latest_charge, "payment_intent": intent.id,
                        "reason": "fraudulent", "status": "needs_response", "metadata": {},
                    }},
                }))
                .expect("event")
            }
        })
        .collect();
    let statuses = futures::future::join_all(bodies.iter().map(|body| {
        let env = &env;
        async move {
            let sig = signature_header(WEBHOOK_SECRET, unix_now(), body);
            post_webhook(env, Some(sig), body).await.0
        }
    }))
    .await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let state = reversal_state(&env, &o.order_id).await;
    let order = state["order"].as_str().expect("status");
    assert!(order == "REFUNDED" || order == "DISPUTED", "{state}");
    let reversals = state["refunded_events"].as_i64().unwrap_or(0)
        + state["disputed_events"].as_i64().unwrap_or(0);
    assert_eq!(reversals, 1, "{state}");
    assert_eq!((&state["voided"], &state["sold"]), (&json!(2), &json!(0)));
    assert_eq!(seat(&env, "ev", "S1-R2-1").await.0, "available");
    assert_eq!(usage(&env, "ev", "alice").await, 0);
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM payment_webhook_events")
        .fetch_one(&env.app.pool)
        .await
        .unwrap();
    assert_eq!(recorded, 100, "every event applied (once)");
}
