//! Ops refunds and cancellation of paid orders (issue 18): real booking, real sandbox
//! provider over HTTP, real Postgres. Money goes back at most once whatever races it.

use crate::helpers::{TestApp, json};
use crate::payments::{PayEnv, pay};
use serde_json::{Value, json};

pub const ADMIN: &str = crate::helpers::ADMIN_TOKEN;

/// An ops call: admin bearer, optional actor and idempotency key.
pub async fn ops_post(
    app: &TestApp,
    path: &str,
    actor: Option<&str>,
    key: Option<&str>,
    body: &Value,
) -> (u16, Value, bool) {
    let mut req = app.client.post(app.url(path)).bearer_auth(ADMIN).json(body);
    if let Some(a) = actor {
        req = req.header("X-Floodgate-Actor", a);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.expect("ops request");
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let (status, v) = json(resp).await;
    (status, v, replayed)
}

async fn paid_seat_order(env: &PayEnv, event: &str, account: &str, seats: &[&str]) -> String {
    let o = crate::helpers::order_seats(&env.app, event, account, seats).await;
    let (status, v) = pay(&env.app, &o.token, &o.order_id, "pay", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    o.order_id
}

/// Order status, voided tickets, sold seats, refunded outbox rows, live refund rows, audit
/// entries of refunds.
async fn state(app: &TestApp, order: &str) -> Value {
    let row: (String, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM orders WHERE id = $1),
                (SELECT count(*) FROM tickets WHERE order_id = $1 AND voided_at IS NOT NULL),
                (SELECT count(*) FROM seats WHERE order_id = $1 AND status = 'sold'),
                (SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND topic = 'order.refunded'),
                (SELECT count(*) FROM order_refunds WHERE order_id = $1 AND status <> 'failed'),
                (SELECT count(*) FROM ops_audit WHERE target = 'order:' || $1
                                                   AND action = 'order.refund')",
    )
    .bind(order)
    .fetch_one(&app.pool)
    .await
    .expect("order state");
    json!({"order": row.0, "voided": row.1, "sold": row.2, "refunded_events": row.3,
           "refund_rows": row.4, "audits": row.5})
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
async fn full_refund_racing_its_webhook_and_other_refunds_refunds_once() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seat_order(&env, "ev", "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let path = format!("/admin/orders/{order}/refund");
    // 40 refund requests at once (20 retries of one key, 20 distinct keys), while the
    // provider's charge.refunded webhooks are flushed (duplicated) concurrently.
    let requests = futures::future::join_all((0..40).map(|i| {
        let (env, path) = (&env, &path);
        async move {
            let key = if i % 2 == 0 {
                "same".to_owned()
            } else {
                format!("k{i}")
            };
            let (s, v, _) =
                ops_post(&env.app, path, Some("alice@ops"), Some(&key), &json!({})).await;
            (s, v)
        }
    }));
    let flusher = async {
        for _ in 0..20 {
            env.sandbox.flush_webhooks(false, true).await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let (answers, ()) = tokio::join!(requests, flusher);
    env.sandbox.flush_webhooks(false, true).await;
    let mut ok = 0;
    for (s, v) in &answers {
        match s {
            200 => {
                ok += 1;
                assert_eq!(v["status"], "REFUNDED", "{v}");
                assert_eq!(v["refund"]["status"], "succeeded", "{v}");
            }
            // The same key while its first request runs.
            409 => assert_eq!(v["code"], "IDEMPOTENCY_IN_FLIGHT", "{v}"),
            _ => panic!("unexpected answer {s} {v}"),
        }
    }
    assert!(ok >= 20, "every distinct key got the refund: {answers:?}");
    assert_eq!(env.refunds(&order), 1, "exactly one refund at the provider");
    assert_eq!(env.charges(&order), 1);
    assert_eq!(
        state(&env.app, &order).await,
        json!({"order": "REFUNDED", "voided": 2, "sold": 0, "refunded_events": 1,
               "refund_rows": 1, "audits": 1})
    );
    assert_eq!(seat_status(&env.app, "ev", "S1-R1-1").await, "available");
    // A later request with a new key answers the same refund, refunds nothing more.
    let (s, v, _) = ops_post(&env.app, &path, Some("bob@ops"), Some("later"), &json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(env.refunds(&order), 1);
    // The same key replays byte for byte.
    let (s, _, replayed) =
        ops_post(&env.app, &path, Some("alice@ops"), Some("same"), &json!({})).await;
    assert_eq!((s, replayed), (200, true));
}

#[tokio::test]
async fn a_dashboard_refund_first_leaves_nothing_to_refund_again() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seat_order(&env, "ev", "alice", &["S1-R1-1"]).await;
    let intent = env.intents(&order)[0].clone();
    env.dashboard("refund", &intent).await;
    // The ops refund before the dashboard's webhook arrives: the provider says "already
    // refunded", the order is reversed here, the webhook then changes nothing.
    let (s, v, _) = ops_post(
        &env.app,
        &format!("/admin/orders/{order}/refund"),
        Some("ops"),
        Some("k"),
        &json!({"stock": "kill", "reason": "duplicate purchase"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(env.refunds(&order), 1);
    let st = state(&env.app, &order).await;
    assert_eq!(st["order"], "REFUNDED");
    assert_eq!(st["refunded_events"], 1);
    assert_eq!(
        seat_status(&env.app, "ev", "S1-R1-1").await,
        "held_back",
        "killed"
    );
}

#[tokio::test]
async fn cancel_ends_a_pending_order_and_refunds_a_paid_one() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let pending = crate::helpers::order_seats(&env.app, "ev", "bob", &["S1-R2-1"]).await;
    let (s, v, _) = ops_post(
        &env.app,
        &format!("/admin/orders/{}/cancel", pending.order_id),
        Some("ops"),
        Some("c1"),
        &json!({}),
    )
    .await;
    assert_eq!((s, v["status"].clone()), (200, json!("CANCELLED")), "{v}");
    assert_eq!(seat_status(&env.app, "ev", "S1-R2-1").await, "available");
    let (s, v) = pay(
        &env.app,
        &pending.token,
        &pending.order_id,
        "p",
        "pm_card_visa",
    )
    .await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("ORDER_NOT_PAYABLE")),
        "{v}"
    );
    assert_eq!(env.charges(&pending.order_id), 0);

    let paid = paid_seat_order(&env, "ev", "alice", &["S1-R1-3"]).await;
    let path = format!("/admin/orders/{paid}/cancel");
    let body = json!({"stock": "kill"});
    let (s, v, _) = ops_post(&env.app, &path, Some("ops"), Some("c2"), &body).await;
    assert_eq!((s, v["status"].clone()), (200, json!("REFUNDED")), "{v}");
    let (s, _, replayed) = ops_post(&env.app, &path, Some("ops"), Some("c2"), &body).await;
    assert_eq!((s, replayed), (200, true));
    env.sandbox.flush_webhooks(false, true).await;
    assert_eq!(env.refunds(&paid), 1);
    assert_eq!(seat_status(&env.app, "ev", "S1-R1-3").await, "held_back");
    let audits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ops_audit WHERE action IN ('order.cancel', 'order.refund')",
    )
    .fetch_one(&env.app.pool)
    .await
    .expect("audits");
    assert_eq!(audits, 2);
    // The order's detail shows the refund ops asked for, and who asked.
    let (s, d) = json(env.app.admin_get(&format!("/admin/orders/{paid}")).await).await;
    assert_eq!(s, 200, "{d}");
    let asked = d["ops_refunds"].as_array().expect("ops_refunds");
    assert_eq!(asked.len(), 1, "{d}");
    assert_eq!(
        (
            asked[0]["status"].clone(),
            asked[0]["stock"].clone(),
            asked[0]["actor"].clone()
        ),
        (json!("succeeded"), json!("kill"), json!("bootstrap"))
    );
    // Asked with the bootstrap secret: the name it sent is kept as a note.
    assert_eq!(asked[0]["actor_detail"]["note"], json!("ops"), "{d}");
    assert_eq!(d["order"]["status"], "REFUNDED");
}

#[tokio::test]
async fn bad_refund_requests_change_nothing() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seat_order(&env, "ev", "alice", &["S1-R1-1"]).await;
    let pending = crate::helpers::order_seats(&env.app, "ev", "bob", &["S1-R1-2"]).await;
    let path = format!("/admin/orders/{order}/refund");
    // (path, actor, key, body, status, code)
    type Case<'a> = (
        String,
        Option<&'a str>,
        Option<&'a str>,
        Value,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            path.clone(),
            None,
            Some("k"),
            json!({}),
            400,
            "ACTOR_REQUIRED",
        ),
        (
            path.clone(),
            Some("ops"),
            None,
            json!({}),
            400,
            "IDEMPOTENCY_KEY_MISSING",
        ),
        (
            path.clone(),
            Some("ops"),
            Some("k"),
            json!({"amount": 1}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            path.clone(),
            Some("ops"),
            Some("k"),
            json!({"stock": "burn"}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            path.clone(),
            Some("ops"),
            Some("k"),
            json!({"items": []}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            path.clone(),
            Some("ops"),
            Some("k"),
            json!({"items": [0]}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            path.clone(),
            Some("ops"),
            Some("k"),
            json!({"reason": ""}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            "/admin/orders/ord_nope/refund".into(),
            Some("ops"),
            Some("k2"),
            json!({}),
            404,
            "NOT_FOUND",
        ),
        (
            format!("/admin/orders/{}/refund", pending.order_id),
            Some("ops"),
            Some("k3"),
            json!({}),
            409,
            "ORDER_NOT_REFUNDABLE",
        ),
    ];
    for (p, actor, key, body, want, code) in cases {
        let (s, v, _) = ops_post(&env.app, &p, actor, key, &body).await;
        assert_eq!(s, want, "{p} {body} -> {v}");
        if !code.is_empty() {
            assert_eq!(v["code"], code, "{p} {body} -> {v}");
        }
    }
    // Without the admin secret.
    let resp = env
        .app
        .client
        .post(env.app.url(&path))
        .header("X-Floodgate-Actor", "ops")
        .header("Idempotency-Key", "k")
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    assert_eq!(env.refunds(&order), 0);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM order_refunds")
        .fetch_one(&env.app.pool)
        .await
        .expect("rows");
    assert_eq!(rows, 0);
    let st = state(&env.app, &order).await;
    assert_eq!(
        (st["order"].clone(), st["sold"].clone()),
        (json!("PAID"), json!(1))
    );
}

async fn ops_patch(app: &TestApp, path: &str, actor: Option<&str>, body: &Value) -> (u16, Value) {
    let mut req = app
        .client
        .patch(app.url(path))
        .bearer_auth(ADMIN)
        .json(body);
    if let Some(a) = actor {
        req = req.header("X-Floodgate-Actor", a);
    }
    json(req.send().await.expect("patch")).await
}

#[tokio::test]
async fn event_update_is_validated_audited_and_refused_once_cancelled() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let bad = [
        (Some("ops"), json!({}), 422),
        (Some("ops"), json!({"name": "  "}), 422),
        (Some("ops"), json!({"hold_ttl_s": 5}), 422),
        (Some("ops"), json!({"max_tickets_per_account": 101}), 422),
        (Some("ops"), json!({"venue": "elsewhere"}), 422),
        (Some("ops"), json!({"sale_start": "tomorrow"}), 422),
        (None, json!({"name": "New"}), 400),
    ];
    for (actor, body, want) in bad {
        let (s, v) = ops_patch(&env.app, "/admin/events/ev", actor, &body).await;
        assert_eq!(s, want, "{body} -> {v}");
    }
    let audits = "SELECT count(*) FROM ops_audit WHERE action = 'event.update'";
    let n: i64 = sqlx::query_scalar(audits)
        .fetch_one(&env.app.pool)
        .await
        .expect("n");
    assert_eq!(n, 0, "refused updates change nothing");
    let (s, v) = ops_patch(
        &env.app,
        "/admin/events/ev",
        Some("ops"),
        &json!({"name": "Moved show", "max_tickets_per_account": 2, "hold_ttl_s": 120}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["name"].clone(),
            v["max_tickets_per_account"].clone(),
            v["hold_ttl_s"].clone()
        ),
        (json!("Moved show"), json!(2), json!(120))
    );
    let detail: Value = sqlx::query_scalar(
        "SELECT detail FROM ops_audit
          WHERE action = 'event.update' AND actor = 'bootstrap' AND note = 'ops'",
    )
    .fetch_one(&env.app.pool)
    .await
    .expect("audit");
    assert_eq!(detail["after"]["name"], "Moved show");
    assert_ne!(detail["before"]["name"], "Moved show");
    let (s, _) = ops_patch(
        &env.app,
        "/admin/events/nope",
        Some("ops"),
        &json!({"name": "x"}),
    )
    .await;
    assert_eq!(s, 404);
    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("ops"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let (s, v) = ops_patch(
        &env.app,
        "/admin/events/ev",
        Some("ops"),
        &json!({"name": "x"}),
    )
    .await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("EVENT_CANCELLED")),
        "{v}"
    );
}

/// Once ops cancel an event nothing of it goes on hold: seat holds, best available and GA
/// holds answer `409 EVENT_CANCELLED` from the hold statement itself (the same condition as
/// the sale start) and write nothing. Before, a cancelled event kept selling holds, and orders
/// made from them were only cancelled or refunded afterwards by the refund job.
#[tokio::test]
async fn holds_on_a_cancelled_event_are_refused_and_write_nothing() {
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let token = env.app.admission("fan-late", "ev");
    let (s, v, _) = ops_post(
        &env.app,
        "/admin/events/ev/cancel",
        Some("ops"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let before = crate::events::db_state(&env.app.pool).await;
    let tries = [
        ("/api/events/ev/holds", json!({"seats": ["S1-R1-1"]})),
        (
            "/api/events/ev/holds",
            json!({"best_available": {"quantity": 2}}),
        ),
        (
            "/api/events/ev/ga-holds",
            json!({"tier": "FLOOR", "quantity": 1}),
        ),
    ];
    for (path, body) in tries {
        let (s, v) = json(env.app.post(path, &token, &body).await).await;
        assert_eq!(
            (s, v["code"].clone()),
            (409, json!("EVENT_CANCELLED")),
            "{path} {body}: {v}"
        );
    }
    assert_eq!(
        crate::events::db_state(&env.app.pool).await,
        before,
        "a refused hold wrote"
    );
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM holds WHERE event_id = 'ev'")
        .fetch_one(&env.app.pool)
        .await
        .expect("count holds");
    assert_eq!(holds, 0);
}

/// A refund the provider does not answer is retried with the same key and audited once per
/// reason (not on every retry of an outage), then completes once (issue 41, item 4).
#[tokio::test]
async fn a_retried_refund_is_audited_once_per_reason_and_refunds_once() {
    use booking::payments::ops::event_cancel::RefundJob;
    let env = PayEnv::spawn().await;
    crate::helpers::create_refund_event(&env.app, "ev", "release").await;
    let order = paid_seat_order(&env, "ev", "alice", &["S1-R1-1"]).await;
    env.sandbox.update(|s| s.failure_rate = 1.0);
    let (s, v, _) = ops_post(
        &env.app,
        &format!("/admin/orders/{order}/refund"),
        Some("ops@example"),
        Some("r1"),
        &json!({"reason": "double booking"}),
    )
    .await;
    assert_eq!(
        (s, v["code"].clone()),
        (502, json!("PAYMENT_PROVIDER_ERROR")),
        "{v}"
    );
    let retrying = || async {
        sqlx::query_as::<_, (String, Value)>(
            "SELECT actor || coalesce('/' || note, ''), detail FROM ops_audit
              WHERE action = 'order.refund.retrying' AND target = 'order:' || $1 ORDER BY id",
        )
        .bind(&order)
        .fetch_all(&env.app.pool)
        .await
        .expect("audit")
    };
    // The job retries twice more through the same outage (leases made due at once).
    let job = RefundJob::new(&env.app.state.payments);
    for _ in 0..2 {
        sqlx::query(
            "UPDATE order_refunds SET leased_until = clock_timestamp() WHERE order_id = $1",
        )
        .bind(&order)
        .execute(&env.app.pool)
        .await
        .expect("lease due");
        assert_eq!(job.pass().await.expect("pass"), (0, 1));
    }
    let entries = retrying().await;
    assert_eq!(entries.len(), 1, "one entry per reason: {entries:?}");
    // The job records the asking operator as they asked: the bootstrap secret, with its note.
    assert_eq!(entries[0].0, "bootstrap/ops@example");
    assert_eq!(entries[0].1["attempts"], json!(1), "{}", entries[0].1);
    assert!(entries[0].1["why"].as_str().is_some_and(|w| !w.is_empty()));
    // The provider is back: the next retry refunds, once.
    env.sandbox.update(|s| s.failure_rate = 0.0);
    sqlx::query("UPDATE order_refunds SET leased_until = clock_timestamp() WHERE order_id = $1")
        .bind(&order)
        .execute(&env.app.pool)
        .await
        .expect("lease due");
    assert_eq!(job.pass().await.expect("pass"), (1, 0));
    let end = state(&env.app, &order).await;
    assert_eq!(end["order"], json!("REFUNDED"), "{end}");
    assert_eq!(end["audits"], json!(1), "{end}");
    assert_eq!(env.refunds(&order), 1);
    assert_eq!(retrying().await.len(), 1);
}
