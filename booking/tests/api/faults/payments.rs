//! Payment faults: the pay request and a provider webhook with Postgres cut or reset mid-way
//! (see the parent module for how the cut is placed inside the transaction).

use super::{
    Blocker, assert_unavailable, booking_disconnected, booking_waits_on_lock, chaos, count,
    fault_settings, retry_past_orphaned_claim, send,
};
use crate::payments::{PayEnv, WEBHOOK_SECRET, pay, payment_state, seat_order};
use serde_json::json;

#[tokio::test]
async fn pay_cut_from_postgres_after_the_charge_pays_once_with_the_same_key() {
    let env = PayEnv::spawn_opts(true, fault_settings, |_| {}).await;
    let app = &env.app;
    let db = &chaos(app).db;
    let o = seat_order(app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let pay_request = || {
        app.client
            .post(app.url(&format!("/api/orders/{}/pay", o.order_id)))
            .bearer_auth(&o.token)
            .header("Idempotency-Key", "pay-1")
            .json(&json!({"payment_method": "pm_card_visa"}))
    };
    let pending_attempts = || {
        count(
            app,
            "SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'pending'",
            &o.order_id,
        )
    };
    let before = payment_state(app, &o.order_id).await;

    // Cut before the request: nothing recorded, nothing charged.
    db.cut().await;
    assert_unavailable(&send(pay_request()).await);
    assert_eq!(payment_state(app, &o.order_id).await, before);
    assert_eq!(pending_attempts().await, 0);
    assert_eq!(env.charges(&o.order_id), 0);
    db.restore();

    // Cut after the provider took the money, inside the transaction that records it (its
    // `order.paid` outbox row waits for the test's lock on the outbox).
    let lock = Blocker::take(app, "LOCK TABLE outbox IN EXCLUSIVE MODE", &[]).await;
    let cut_request = tokio::spawn(send(pay_request()));
    booking_waits_on_lock(app).await;
    db.cut().await;
    assert_unavailable(&cut_request.await.expect("request task"));
    lock.release().await;
    booking_disconnected(app).await;
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(
        payment_state(app, &o.order_id).await,
        before,
        "a half-recorded payment"
    );
    assert_eq!(
        pending_attempts().await,
        1,
        "the charged attempt stays open"
    );

    // The same key after restore reuses the attempt and its provider key: paid, one charge.
    db.restore();
    let paid = retry_past_orphaned_claim(pay_request).await;
    assert_eq!(paid.status, 200, "{paid:?}");
    assert_eq!(paid.body["status"], "PAID");
    assert_eq!(env.charges(&o.order_id), 1);
    let state = payment_state(app, &o.order_id).await;
    assert_eq!(
        state,
        json!({"order": "PAID", "tickets": 2, "sold": 2, "succeeded": 1,
               "refunds": 0, "events": 1, "webhooks": 0})
    );
    let (status, again) = pay(app, &o.token, &o.order_id, "pay-1", "pm_card_visa").await;
    assert_eq!((status, &again["tickets"]), (200, &paid.body["tickets"]));
    assert_eq!(env.charges(&o.order_id), 1);
    assert_eq!(payment_state(app, &o.order_id).await, state);
}

#[tokio::test]
async fn webhook_reset_from_postgres_answers_503_and_is_applied_once_on_redelivery() {
    // The pay answer times out (the provider charges but answers after 30 s), so only the
    // webhook can complete the order.
    let env = PayEnv::spawn_opts(
        true,
        |c| {
            fault_settings(c);
            c.payments.request_timeout_ms = 1_500;
        },
        |s| {
            s.timeout_delay_ms = 30_000;
            s.webhooks_enabled = false;
        },
    )
    .await;
    let app = &env.app;
    let db = &chaos(app).db;
    let o = seat_order(app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, v) = pay(app, &o.token, &o.order_id, "k", "pm_card_sandbox_timeout").await;
    assert_eq!(status, 504, "{v}");
    let intent = env.sandbox.order_summary(&o.order_id).intents[0].clone();
    let event = serde_json::to_vec(&json!({
        "id": "evt_fault_1",
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": intent},
    }))
    .expect("event");
    let deliver = || {
        let now = sandbox_provider::webhooks::unix_now();
        app.client
            .post(app.url("/webhooks/payments"))
            .header("content-type", "application/json")
            .header(
                "Stripe-Signature",
                sandbox_provider::webhooks::signature_header(WEBHOOK_SECRET, now, &event),
            )
            .body(event.clone())
    };
    let before = payment_state(app, &o.order_id).await;
    assert_eq!(before["order"], "PENDING_PAYMENT");

    // Cut before the delivery: the provider will retry it.
    db.cut().await;
    assert_unavailable(&send(deliver()).await);
    assert_eq!(payment_state(app, &o.order_id).await, before);
    db.restore();

    // Reset inside the transaction applying it (its outbox row waits for the test's lock):
    // the event is not recorded as processed, so the redelivery is not taken for a duplicate.
    let lock = Blocker::take(app, "LOCK TABLE outbox IN EXCLUSIVE MODE", &[]).await;
    let cut_request = tokio::spawn(send(deliver()));
    booking_waits_on_lock(app).await;
    db.reset().await;
    assert_unavailable(&cut_request.await.expect("request task"));
    lock.release().await;
    booking_disconnected(app).await;
    assert_eq!(
        payment_state(app, &o.order_id).await,
        before,
        "a half-applied webhook"
    );

    // Redelivered after restore: applied once; a further copy is a duplicate.
    db.restore();
    let applied = send(deliver()).await;
    assert_eq!(
        (applied.status, &applied.body),
        (200, &json!({"received": true}))
    );
    let state = payment_state(app, &o.order_id).await;
    assert_eq!(
        state,
        json!({"order": "PAID", "tickets": 2, "sold": 2, "succeeded": 1,
               "refunds": 0, "events": 1, "webhooks": 1})
    );
    let duplicate = send(deliver()).await;
    assert_eq!(
        (duplicate.status, &duplicate.body["duplicate"]),
        (200, &json!(true))
    );
    assert_eq!(payment_state(app, &o.order_id).await, state);
    assert_eq!(env.charges(&o.order_id), 1);
}
