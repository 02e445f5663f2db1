//! Per-line refunds by ops (issue 18): real booking, the real sandbox provider over HTTP, real
//! Postgres. A line is refunded once whatever races it; the order stays `PAID` until its last
//! line goes, then is `REFUNDED` as by a full refund.

use crate::helpers::{TestApp, json};
use crate::ops_refunds::ops_post;
use crate::payments::{PayEnv, pay};
use serde_json::{Value, json};
use std::collections::BTreeMap;

async fn paid_seats(env: &PayEnv, account: &str, seats: &[&str]) -> String {
    let o = crate::helpers::order_seats(&env.app, "ev", account, seats).await;
    let (s, v) = pay(&env.app, &o.token, &o.order_id, "pay", "pm_card_visa").await;
    assert_eq!(s, 200, "{v}");
    o.order_id
}

/// line -> (seat, unit price x quantity).
async fn lines(app: &TestApp, order: &str) -> BTreeMap<i32, (String, i64)> {
    let rows: Vec<(i32, Option<String>, i64)> = sqlx::query_as(
        "SELECT line, seat_id, unit_price * quantity FROM order_items
          WHERE order_id = $1 ORDER BY line",
    )
    .bind(order)
    .fetch_all(&app.pool)
    .await
    .expect("lines");
    rows.into_iter()
        .map(|(l, s, a)| (l, (s.unwrap_or_default(), a)))
        .collect()
}

/// Order status, seats by status, valid tickets, ticket usage, refund rows, refunded-line rows,
/// order.refunded outbox rows.
async fn state(app: &TestApp, order: &str) -> Value {
    let row: (String, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM orders WHERE id = $1),
                (SELECT count(*) FROM seats WHERE order_id = $1 AND status = 'sold'),
                (SELECT count(*) FROM seats WHERE event_id = 'ev' AND status = 'available'),
                (SELECT count(*) FROM tickets WHERE order_id = $1 AND voided_at IS NULL),
                (SELECT COALESCE(sum(tickets), 0)::bigint FROM account_event_usage),
                (SELECT count(*) FROM order_refunds WHERE order_id = $1 AND status <> 'failed'),
                (SELECT count(*) FROM order_refund_lines WHERE order_id = $1),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.refunded')",
    )
    .bind(order)
    .fetch_one(&app.pool)
    .await
    .expect("state");
    json!({"order": row.0, "sold": row.1, "available": row.2, "valid_tickets": row.3,
           "usage": row.4, "refund_rows": row.5, "refunded_lines": row.6,
           "refunded_events": row.7})
}

async fn seat(app: &TestApp, seat: &str) -> String {
    sqlx::query_scalar("SELECT status FROM seats WHERE event_id = 'ev' AND seat_id = $1")
        .bind(seat)
        .fetch_one(&app.pool)
        .await
        .expect("seat")
}

async fn refund(env: &PayEnv, order: &str, key: &str, body: Value) -> (u16, Value, bool) {
    ops_post(
        &env.app,
        &format!("/admin/orders/{order}/refund"),
        Some("ops@example"),
        Some(key),
        &body,
    )
    .await
}

#[tokio::test]
async fn lines_refunded_one_by_one_keep_the_order_paid_until_the_last() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S2-R1-1"]).await;
    let items = lines(&env.app, &order).await;
    let (seat1, amount1) = items[&1].clone();
    let (seat2, amount2) = items[&2].clone();
    assert_ne!(amount1, amount2, "two prices, so a wrong line shows");
    let before = state(&env.app, &order).await;

    let (s, v, _) = refund(
        &env,
        &order,
        "k1",
        json!({"items": [1], "reason": "wrong seat"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let first = v.clone();
    assert_eq!(v["status"], "PAID", "{v}");
    assert_eq!(v["refund"]["amount"], amount1, "{v}");
    assert_eq!(v["refund"]["lines"], json!([1]), "{v}");
    assert_eq!(v["refund"]["reverses_order"], false, "{v}");
    // The provider's partial charge.refunded changes nothing more.
    env.sandbox.flush_webhooks(false, true).await;
    let summary = env.sandbox.order_summary(&order);
    assert_eq!((summary.refunds, summary.amount_refunded), (1, amount1));
    assert_eq!(seat(&env.app, &seat1).await, "available");
    assert_eq!(seat(&env.app, &seat2).await, "sold");
    let after_one = state(&env.app, &order).await;
    assert_eq!(
        after_one,
        json!({"order": "PAID", "sold": 1,
               "available": before["available"].as_i64().unwrap_or(0) + 1,
               "valid_tickets": 1, "usage": 1, "refund_rows": 1, "refunded_lines": 1,
               "refunded_events": 0})
    );
    // Another fan can buy the returned seat.
    let bob = paid_seats(&env, "bob", &[&seat1]).await;
    assert_eq!(
        state(&env.app, &bob).await["order"],
        "PAID",
        "the refunded seat sold again"
    );

    // The same line again (new key): refused, nothing refunded.
    let (s, v, _) = refund(&env, &order, "k2", json!({"items": [1]})).await;
    assert_eq!(
        (s, v["code"].clone(), v["lines"].clone()),
        (409, json!("LINES_ALREADY_REFUNDED"), json!([1])),
        "{v}"
    );
    // The same key and body replays the first answer.
    let (s, replay, replayed) = refund(
        &env,
        &order,
        "k1",
        json!({"items": [1], "reason": "wrong seat"}),
    )
    .await;
    assert_eq!((s, replayed), (200, true), "{replay}");
    assert_eq!(replay["refund"]["id"], first["refund"]["id"]);

    // The last line: the order is refunded as by a full refund.
    let (s, v, _) = refund(&env, &order, "k3", json!({"items": [2]})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "REFUNDED", "{v}");
    assert_eq!(v["refund"]["amount"], amount2, "{v}");
    assert_eq!(v["refund"]["reverses_order"], true, "{v}");
    env.sandbox.flush_webhooks(false, true).await;
    let summary = env.sandbox.order_summary(&order);
    assert_eq!(
        (summary.refunds, summary.amount_refunded),
        (2, amount1 + amount2)
    );
    assert_eq!(seat(&env.app, &seat2).await, "available");
    let end = state(&env.app, &order).await;
    assert_eq!(
        (
            end["order"].clone(),
            end["sold"].clone(),
            end["valid_tickets"].clone(),
            end["refund_rows"].clone(),
            end["refunded_lines"].clone(),
            end["refunded_events"].clone()
        ),
        (
            json!("REFUNDED"),
            json!(0),
            json!(0),
            json!(2),
            json!(2),
            json!(1)
        ),
        "{end}"
    );
    // Alice's usage went back line by line; bob holds one ticket.
    assert_eq!(end["usage"], 1, "{end}");
    // A full refund now answers the last refund and moves no money.
    let (s, v, _) = refund(&env, &order, "k4", json!({})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("REFUNDED")), "{v}");
    assert_eq!(env.refunds(&order), 2);
    let audits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ops_audit WHERE action = 'order.refund' AND target = 'order:' || $1",
    )
    .bind(&order)
    .fetch_one(&env.app.pool)
    .await
    .expect("audits");
    assert_eq!(audits, 2);
}

#[tokio::test]
async fn a_cart_line_refund_returns_that_skus_units_only() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    crate::helpers::create_event_product(&env.app, "ev", "EV-CAP", 2000, 10, false).await;
    crate::helpers::create_event_product(&env.app, "ev", "EV-MUG", 1500, 10, true).await;
    let token = env.app.admission("carol", "ev");
    for (sku, q) in [("EV-CAP", 2), ("EV-MUG", 3)] {
        let resp = crate::helpers::put_cart_line(&env.app, &token, "ev", sku, q).await;
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    let (s, o) = json(
        crate::products::post_order(&env.app, &token, "cart-1", &json!({"source": "cart"})).await,
    )
    .await;
    assert_eq!(s, 201, "{o}");
    let order = o["id"].as_str().expect("id").to_owned();
    let (s, v) = pay(&env.app, &token, &order, "p", "pm_card_visa").await;
    assert_eq!(s, 200, "{v}");
    let mug_line: i32 =
        sqlx::query_scalar("SELECT line FROM order_items WHERE order_id = $1 AND sku = 'EV-MUG'")
            .bind(&order)
            .fetch_one(&env.app.pool)
            .await
            .expect("line");
    let (s, v, _) = refund(
        &env,
        &order,
        "c1",
        json!({"items": [mug_line], "stock": "kill"}),
    )
    .await;
    assert_eq!((s, v["status"].clone()), (200, json!("PAID")), "{v}");
    assert_eq!(v["refund"]["amount"], 4500, "{v}");
    let stock: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT sku, sum(available)::bigint, sum(sold)::bigint, sum(held_back)::bigint
           FROM inventory GROUP BY sku ORDER BY sku",
    )
    .fetch_all(&env.app.pool)
    .await
    .expect("stock");
    assert_eq!(
        stock,
        [
            ("EV-CAP".to_owned(), 8, 2, 0),
            ("EV-MUG".to_owned(), 7, 0, 3)
        ],
        "the mugs are held back (killed), the caps still sold"
    );
    assert_eq!(env.sandbox.order_summary(&order).amount_refunded, 4500);
}

#[tokio::test]
async fn fifty_requests_for_one_line_refund_it_once() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S1-R1-2", "S2-R1-1"]).await;
    let items = lines(&env.app, &order).await;
    let answers = futures::future::join_all((0..50).map(|i| {
        let (env, order) = (&env, &order);
        async move { refund(env, order, &format!("k{i}"), json!({"items": [2]})).await }
    }));
    let flusher = async {
        for _ in 0..20 {
            env.sandbox.flush_webhooks(false, true).await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let (answers, ()) = tokio::join!(answers, flusher);
    env.sandbox.flush_webhooks(false, true).await;
    let mut ok = 0;
    for (s, v, _) in &answers {
        match s {
            200 => {
                ok += 1;
                assert_eq!(v["status"], "PAID", "{v}");
            }
            409 => assert_eq!(v["code"], "LINES_ALREADY_REFUNDED", "{v}"),
            _ => panic!("unexpected answer {s} {v}"),
        }
    }
    assert_eq!(ok, 1, "one request refunded the line: {answers:?}");
    let summary = env.sandbox.order_summary(&order);
    assert_eq!((summary.refunds, summary.amount_refunded), (1, items[&2].1));
    assert_eq!(seat(&env.app, &items[&2].0).await, "available");
    assert_eq!(seat(&env.app, &items[&1].0).await, "sold");
    assert_eq!(seat(&env.app, &items[&3].0).await, "sold");
    assert_eq!(state(&env.app, &order).await["refunded_lines"], 1);
}

#[tokio::test]
async fn a_line_refund_racing_a_full_refund_refunds_each_line_once() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S2-R1-1"]).await;
    let total: i64 = lines(&env.app, &order).await.values().map(|l| l.1).sum();
    let answers = futures::future::join_all((0..40).map(|i| {
        let (env, order) = (&env, &order);
        let body = if i % 2 == 0 {
            json!({"items": [1]})
        } else {
            json!({})
        };
        async move { refund(env, order, &format!("k{i}"), body).await }
    }));
    let flusher = async {
        for _ in 0..20 {
            env.sandbox.flush_webhooks(false, true).await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let (answers, ()) = tokio::join!(answers, flusher);
    env.sandbox.flush_webhooks(false, true).await;
    for (s, v, _) in &answers {
        assert!(
            *s == 200 || *s == 202 || (*s == 409 && v["code"] == "LINES_ALREADY_REFUNDED"),
            "unexpected answer {s} {v}"
        );
    }
    // Every full request answered the order refunded, or accepted (`202`: its refund waits for
    // a line refund still under way, and the refund job completes it).
    for (i, (s, v, _)) in answers.iter().enumerate() {
        if i % 2 == 1 {
            assert!(
                (*s, v["status"].clone()) == (200, json!("REFUNDED"))
                    || (*s, v["refund"]["status"].clone()) == (202, json!("pending")),
                "{s} {v}"
            );
        }
    }
    let job = booking::payments::ops::event_cancel::RefundJob::new(&env.app.state.payments);
    testkit::wait::eventually(
        std::time::Duration::from_secs(20),
        "the order refunded",
        || async {
            job.pass().await.expect("refund pass");
            env.sandbox.flush_webhooks(false, true).await;
            (state(&env.app, &order).await["order"] == json!("REFUNDED")).then_some(())
        },
    )
    .await;
    let summary = env.sandbox.order_summary(&order);
    assert!(summary.refunds <= 2, "{} refunds", summary.refunds);
    assert_eq!(
        summary.amount_refunded, total,
        "the whole payment back, once"
    );
    let end = state(&env.app, &order).await;
    assert_eq!(
        (
            end["order"].clone(),
            end["sold"].clone(),
            end["valid_tickets"].clone()
        ),
        (json!("REFUNDED"), json!(0), json!(0)),
        "{end}"
    );
    assert_eq!(end["refunded_lines"], 2, "{end}");
    assert_eq!(end["usage"], 0, "usage given back once: {end}");
}

#[tokio::test]
async fn bad_line_refunds_change_nothing() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let one = paid_seats(&env, "alice", &["S1-R1-1"]).await;
    let two = paid_seats(&env, "bob", &["S1-R2-1", "S1-R2-2"]).await;
    let before = (state(&env.app, &one).await, state(&env.app, &two).await);
    // (order, body, status, code)
    let cases = [
        (&one, json!({"items": [9]}), 422, "UNKNOWN_ORDER_LINES"),
        // Line 2 exists, in the other order only.
        (&one, json!({"items": [2]}), 422, "UNKNOWN_ORDER_LINES"),
        (&two, json!({"items": [1, 1]}), 422, "VALIDATION_FAILED"),
        (&two, json!({"items": []}), 422, "VALIDATION_FAILED"),
        (&two, json!({"items": [0]}), 422, "VALIDATION_FAILED"),
        (&two, json!({"items": ["1"]}), 422, "VALIDATION_FAILED"),
        (&two, json!({"items": [1, 3]}), 422, "UNKNOWN_ORDER_LINES"),
    ];
    for (i, (order, body, want, code)) in cases.into_iter().enumerate() {
        let (s, v, _) = refund(&env, order, &format!("bad-{i}"), body.clone()).await;
        assert_eq!((s, v["code"].clone()), (want, json!(code)), "{body} -> {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    assert_eq!(
        (state(&env.app, &one).await, state(&env.app, &two).await),
        before,
        "a refused refund wrote"
    );
    assert_eq!(env.refunds(&one) + env.refunds(&two), 0);
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'bad-%'")
            .fetch_one(&env.app.pool)
            .await
            .expect("keys");
    assert_eq!(keys, 0, "refusals keep no answer");
}

/// An event cancelled after some lines of an order were refunded refunds the rest, once.
#[tokio::test]
async fn cancelling_the_event_refunds_what_line_refunds_left() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S2-R1-1"]).await;
    let items = lines(&env.app, &order).await;
    let total: i64 = items.values().map(|l| l.1).sum();
    let (s, v, _) = refund(&env, &order, "k1", json!({"items": [2]})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("PAID")), "{v}");
    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("ops"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!((s, v["refunds_queued_now"].clone()), (202, json!(1)), "{v}");
    // The refund job, as booking runs it.
    let job = booking::payments::ops::event_cancel::RefundJob::new(&env.app.state.payments);
    let (done, left) = job.pass().await.expect("refund pass");
    assert_eq!((done, left), (1, 0));
    let (_, p) = json(env.app.admin_get("/admin/events/ev/cancellation").await).await;
    assert_eq!(p["done"], true, "{p}");
    env.sandbox.flush_webhooks(false, true).await;
    let summary = env.sandbox.order_summary(&order);
    assert_eq!((summary.refunds, summary.amount_refunded), (2, total));
    let end = state(&env.app, &order).await;
    assert_eq!(
        (
            end["order"].clone(),
            end["valid_tickets"].clone(),
            end["refunded_lines"].clone()
        ),
        (json!("REFUNDED"), json!(0), json!(2)),
        "{end}"
    );
    // The line refunded first went back on sale; the rest is killed (the show is off).
    assert_eq!(seat(&env.app, &items[&2].0).await, "available");
    assert_eq!(seat(&env.app, &items[&1].0).await, "held_back");
}

/// A cancelled event's refund that the provider refuses is `failed` and stays so: ops retry it
/// by hand (docs/operations.md). The job's sweep used to queue a new refund row (with a new
/// provider key) for that order on every pass, asking the provider again every second.
#[tokio::test]
async fn a_refused_event_cancel_refund_is_not_queued_again_by_the_sweep() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S2-R1-1"]).await;
    let (s, v, _) = refund(&env, &order, "k1", json!({"items": [2]})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("PAID")), "{v}");
    // The provider refuses the event's refund: the payment as booking recorded it is one the
    // provider does not know (say, made under another account's key): `404 resource_missing`.
    // (A dashboard refund no longer makes it refuse: the final refund asks for what is left.)
    sqlx::query(
        "UPDATE payments SET provider_payment_id = 'pi_elsewhere_' || id WHERE order_id = $1",
    )
    .bind(&order)
    .execute(&env.app.pool)
    .await
    .expect("point the payment elsewhere");
    let provider_refunds = env.refunds(&order);
    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("ops"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!((s, v["refunds_queued_now"].clone()), (202, json!(1)), "{v}");
    let job = booking::payments::ops::event_cancel::RefundJob::new(&env.app.state.payments);
    for _ in 0..4 {
        job.pass().await.expect("refund pass");
    }
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT status, origin FROM order_refunds WHERE order_id = $1 ORDER BY created_at",
    )
    .bind(&order)
    .fetch_all(&env.app.pool)
    .await
    .expect("refund rows");
    let cancel_rows: Vec<&(String, String)> =
        rows.iter().filter(|(_, o)| o == "event_cancel").collect();
    assert_eq!(
        cancel_rows,
        vec![&("failed".to_owned(), "event_cancel".to_owned())],
        "one refused event refund, not queued again: {rows:?}"
    );
    // The provider was asked once (refused: no refund was made) and the order is still paid.
    assert_eq!(env.refunds(&order), provider_refunds);
    let end = state(&env.app, &order).await;
    assert_eq!(end["order"], json!("PAID"), "{end}");
    let (_, p) = json(env.app.admin_get("/admin/events/ev/cancellation").await).await;
    assert_eq!(p["failed"], json!(1), "{p}");
}

/// A line refund still unanswered when the order's full refund is asked for, then refused by
/// the provider: its money is not lost. The full refund waits for the order's earlier refunds
/// to settle and then asks the provider for everything it still holds (issue 41, item 3).
#[tokio::test]
async fn a_line_refund_refused_after_the_full_refund_was_asked_loses_no_money() {
    use booking::payments::ops::event_cancel::RefundJob;
    use booking::payments::ops::refund::{self, Claimed, Origin, RefundAsk, Worked};
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seats(&env, "alice", &["S1-R1-1", "S2-R1-1"]).await;
    let paid = env.sandbox.order_summary(&order).amount_charged;
    assert_eq!(paid, 12_000 + 8_000);
    // Line 1's refund is claimed; its provider call has no answer yet (a worker that died).
    let actor = booking::platform::audit::Operator::system("ops@example");
    let ask = RefundAsk {
        stock: None,
        reason: Some("seat broken"),
        actor: &actor,
        origin: Origin::Ops,
    };
    let mut tx = env.app.pool.begin().await.expect("begin");
    let Claimed::Row(line1) = refund::claim_tx(&mut tx, &order, Some(&[1]), &ask)
        .await
        .expect("claim line 1")
    else {
        panic!("line 1 not claimed");
    };
    tx.commit().await.expect("commit");
    // The whole order's refund, while line 1's is under way.
    let (s, v, _) = refund(&env, &order, "full", json!({})).await;
    assert!(s == 200 || s == 202, "{s} {v}");
    // Money goes back outside booking (the provider's dashboard), then line 1's call is made:
    // the provider no longer holds line 1's 12,000 and refuses it.
    let intent = env.intents(&order)[0].clone();
    let (s, v) = json(
        env.app
            .client
            .post(format!(
                "{}/_sandbox/payment_intents/{intent}/refund",
                env.provider_url
            ))
            .bearer_auth(crate::payments::API_KEY)
            .json(&json!({"amount": 10_000}))
            .send()
            .await
            .expect("dashboard refund"),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let worked = refund::work(
        &env.app.state.payments.clients(),
        &env.app.state.redis,
        &line1,
    )
    .await
    .expect("work line 1");
    assert!(matches!(worked, Worked::Failed(_)), "{worked:?}");
    // The refund job finishes whatever waits.
    let job = RefundJob::new(&env.app.state.payments);
    testkit::wait::eventually(
        std::time::Duration::from_secs(20),
        "the order refunded",
        || async {
            job.pass().await.expect("refund pass");
            let end = state(&env.app, &order).await;
            (end["order"] == json!("REFUNDED")).then_some(())
        },
    )
    .await;
    // Every unit of the payment went back, once: the refused line's money with the rest.
    let summary = env.sandbox.order_summary(&order);
    assert_eq!(summary.amount_refunded, paid, "refunded at the provider");
    let rows: Vec<(String, i64, bool)> = sqlx::query_as(
        "SELECT status, amount, reverses_order FROM order_refunds WHERE order_id = $1
          ORDER BY created_at",
    )
    .bind(&order)
    .fetch_all(&env.app.pool)
    .await
    .expect("refund rows");
    assert_eq!(
        rows,
        vec![
            ("failed".to_owned(), 12_000, false),
            ("succeeded".to_owned(), paid - 10_000, true)
        ],
        "the final refund asked for what the provider still held"
    );
    // The refused line went to the final refund; both seats are back on sale.
    let lines: Vec<(i32, String)> = sqlx::query_as(
        "SELECT l.line, r.status FROM order_refund_lines l JOIN order_refunds r ON r.id = l.refund_id
          WHERE l.order_id = $1 ORDER BY l.line",
    )
    .bind(&order)
    .fetch_all(&env.app.pool)
    .await
    .expect("refund lines");
    assert_eq!(
        lines,
        vec![(1, "succeeded".to_owned()), (2, "succeeded".to_owned())]
    );
    assert_eq!(seat(&env.app, "S1-R1-1").await, "available");
    assert_eq!(seat(&env.app, "S2-R1-1").await, "available");
    // The refusal is in the audit log.
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ops_audit WHERE action = 'order.refund.refused' AND target = $1",
    )
    .bind(format!("order:{order}"))
    .fetch_one(&env.app.pool)
    .await
    .expect("audit");
    assert_eq!(refused, 1);
}
