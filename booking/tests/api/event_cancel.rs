//! Event cancellation (issue 18): every paid order refunded exactly once at the provider,
//! including when the refund job dies halfway and two booking instances resume it.

use crate::helpers::json;
use crate::ops_refunds::ops_post;
use crate::payments::{PayEnv, pay};
use booking::payments::ops::event_cancel::RefundJob;
use booking::payments::provider::CreatePayment;
use futures::StreamExt;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// Paid orders without the purchase path: real charges at the sandbox (through booking's own
/// provider adapter, real HTTP), then the matching `PAID` orders and succeeded attempts in
/// one SQL statement each. 2,000 purchases through the whole API would cost minutes of CI.
async fn paid_fixture_orders(env: &PayEnv, event: &str, n: usize) -> Vec<String> {
    let provider = env.app.state.payments.provider.clone();
    let orders: Vec<String> = (0..n).map(|i| format!("ord_fx_{i:05}")).collect();
    let intents: Vec<String> = futures::stream::iter(orders.iter())
        .map(|order| {
            let provider = provider.clone();
            async move {
                let req = CreatePayment {
                    idempotency_key: format!("{order}-1"),
                    amount: 5000,
                    currency: "jpy".into(),
                    payment_method: "pm_card_visa".into(),
                    metadata: BTreeMap::from([
                        ("order_id".to_owned(), order.clone()),
                        ("payment_id".to_owned(), format!("pay_{order}")),
                        ("attempt".to_owned(), "1".to_owned()),
                    ]),
                };
                provider.create_payment(&req).await.expect("charge").id
            }
        })
        .buffered(32)
        .collect()
        .await;
    sqlx::query(
        "INSERT INTO orders (id, account_id, idempotency_key, status, source, event_id, total,
                             currency, expires_at, paid_at)
         SELECT o, 'fan-' || o, 'k', 'PAID', 'cart', $2, 5000, 'JPY', now(), now()
           FROM unnest($1::text[]) AS o",
    )
    .bind(&orders)
    .bind(event)
    .execute(&env.app.pool)
    .await
    .expect("fixture orders");
    sqlx::query(
        "INSERT INTO payments (id, order_id, account_id, attempt, provider_key, amount, currency,
                               payment_method, status, provider_payment_id, next_check_at)
         SELECT 'pay_' || o, o, 'fan-' || o, 1, o || '-1', 5000, 'jpy', 'pm_card_visa',
                'succeeded', i, now() + interval '1 day'
           FROM unnest($1::text[], $2::text[]) AS t(o, i)",
    )
    .bind(&orders)
    .bind(&intents)
    .execute(&env.app.pool)
    .await
    .expect("fixture payments");
    orders
}

async fn count(env: &PayEnv, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&env.app.pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn cancelling_an_event_refunds_2000_paid_orders_once_across_a_crash_and_two_instances() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    // Two real purchases (seats, API path) and a pending order among the fixtures.
    let seat_order = crate::helpers::order_seats(&env.app, "ev", "alice", &["S1-R1-1"]).await;
    let (s, v) = pay(
        &env.app,
        &seat_order.token,
        &seat_order.order_id,
        "p",
        "pm_card_visa",
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let pending = crate::helpers::order_seats(&env.app, "ev", "bob", &["S1-R1-2"]).await;
    let mut orders = paid_fixture_orders(&env, "ev", 2000).await;
    orders.push(seat_order.order_id.clone());

    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("promoter@ops"),
        None,
        &json!({"reason": "postponed"}),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(v["refunds_queued_now"], 2001, "{v}");
    assert_eq!(v["progress"]["paid_remaining"], 2001, "{v}");
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(&pending.order_id)
        .fetch_one(&env.app.pool)
        .await
        .expect("pending order");
    assert_eq!(status, "CANCELLED");
    // Cancelling again is a no-op.
    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("ops"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!((s, v["cancelled_now"].clone()), (200, json!(false)), "{v}");

    // The job dies halfway: its pass is aborted once some refunds committed, leaving others
    // refunded at the provider but not recorded (the crash window).
    let job = RefundJob::new(&env.app.state.payments);
    let run = tokio::spawn(async move { job.pass().await });
    loop {
        let done = count(
            &env,
            "SELECT count(*) FROM order_refunds WHERE status = 'succeeded'",
        )
        .await;
        if done >= 300 {
            break;
        }
        assert!(!run.is_finished(), "the pass ended before the crash point");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.abort();
    let _ = run.await;
    let done_at_crash = count(
        &env,
        "SELECT count(*) FROM order_refunds WHERE status = 'succeeded'",
    )
    .await;
    assert!(done_at_crash < 2001, "crashed halfway ({done_at_crash})");
    // The crashed worker's leases run out (time passing, shortened here).
    sqlx::query("UPDATE order_refunds SET leased_until = now() WHERE status = 'pending'")
        .execute(&env.app.pool)
        .await
        .expect("leases end");

    // Restart: two booking instances resume the job at once.
    let peer = env.app.spawn_peer(|_| {}).await;
    let a = RefundJob::new(&env.app.state.payments);
    let b = RefundJob::new(&peer.state.payments);
    for _ in 0..50 {
        let (ra, rb) = tokio::join!(a.pass(), b.pass());
        ra.expect("pass a");
        rb.expect("pass b");
        let (s, p) = json(env.app.admin_get("/admin/events/ev/cancellation").await).await;
        assert_eq!(s, 200, "{p}");
        if p["done"] == true {
            break;
        }
    }
    let (_, p) = json(env.app.admin_get("/admin/events/ev/cancellation").await).await;
    assert_eq!(
        (
            p["done"].clone(),
            p["refunded"].clone(),
            p["paid_remaining"].clone(),
            p["failed"].clone()
        ),
        (json!(true), json!(2001), json!(0), json!(0)),
        "{p}"
    );
    // The provider's own charge.refunded events arrive after: they change nothing.
    env.sandbox.flush_webhooks(false, false).await;
    for order in &orders {
        assert_eq!(env.refunds(order), 1, "{order} refunded exactly once");
    }
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM orders WHERE status = 'REFUNDED'"
        )
        .await,
        2001
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM outbox WHERE topic = 'order.refunded'"
        )
        .await,
        2001
    );
    // Each refund is recorded under whoever cancelled the event, with their role: the bootstrap
    // secret here, its X-Floodgate-Actor kept as the note.
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM ops_audit WHERE action = 'event.cancel.refund'
                AND actor = 'bootstrap' AND role = 'admin' AND note = 'promoter@ops'"
        )
        .await,
        2001
    );
    // The show is off: the refunded seat is not put back on sale.
    let seat: String = sqlx::query_scalar(
        "SELECT status FROM seats WHERE event_id = 'ev' AND seat_id = 'S1-R1-1'",
    )
    .fetch_one(&env.app.pool)
    .await
    .expect("seat");
    assert_eq!(seat, "held_back");
    peer.stop().await;
}
