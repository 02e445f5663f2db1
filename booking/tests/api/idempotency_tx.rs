//! Idempotency keys claimed inside the business transaction (`idempotency::claim_tx`, issue
//! 16): concurrent duplicates wait and replay, a rolled-back or killed attempt leaves no
//! claim behind, another body under the same key is `422`.

use crate::events::{create_event, small_event};
use crate::helpers::{TestApp, create_product, json};
use crate::products::{post_order, put_line, stock};
use axum::http::{HeaderValue, Method, StatusCode};
use booking::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use serde_json::json;

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::parse(Some(&HeaderValue::from_str(s).expect("header"))).expect("key")
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of_json(
        &Method::POST,
        "/api/things",
        &serde_json::from_str(body).expect("json"),
    )
}

async fn count(app: &TestApp, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

/// 200 simultaneous requests with one key and one body: exactly one order and one
/// reservation; every other request waits for it and replays its bytes (no `409`).
#[tokio::test]
async fn hundreds_of_concurrent_duplicates_make_one_order_and_replay_it() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "MUG", 1200, 100, false).await;
    let token = app.admission("alice", "shop");
    assert_eq!(put_line(&app, &token, "MUG", json!(3)).await.status(), 200);
    let body = json!({"source": "cart"});
    let results =
        futures::future::join_all((0..200).map(|_| post_order(&app, &token, "dup-1", &body))).await;
    let mut created = Vec::new();
    let mut replayed = Vec::new();
    for r in results {
        let status = r.status().as_u16();
        let was_replayed = r.headers().get("idempotent-replayed").is_some();
        let text = r.text().await.expect("body");
        match status {
            201 => created.push(text),
            200 if was_replayed => replayed.push(text),
            other => panic!("unexpected {other}: {text}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one order created");
    assert_eq!(replayed.len(), 199);
    assert!(
        replayed.iter().all(|b| *b == created[0]),
        "every replay is the first answer byte-for-byte"
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(stock(&app, "MUG").await, (97, 3, 0));
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM idempotency_keys WHERE state = 'done'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM idempotency_keys WHERE state <> 'done'"
        )
        .await,
        0
    );
    app.stop().await;
}

/// The same for an order from a seat hold, with a different body under the key afterwards.
#[tokio::test]
async fn concurrent_hold_orders_with_one_key_pin_once_and_another_body_is_422() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let token = app.admission("alice", "ev");
    let (status, hold) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-1", "S1-R1-2"]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let body = json!({"hold_id": hold["hold_id"]});
    let results =
        futures::future::join_all((0..100).map(|_| post_order(&app, &token, "dup-h", &body))).await;
    let mut bodies = std::collections::BTreeMap::<u16, Vec<String>>::new();
    for r in results {
        let status = r.status().as_u16();
        bodies
            .entry(status)
            .or_default()
            .push(r.text().await.expect("body"));
    }
    assert_eq!(
        bodies.keys().copied().collect::<Vec<_>>(),
        vec![200, 201],
        "{bodies:?}"
    );
    let first = &bodies[&201];
    assert_eq!(first.len(), 1);
    assert!(bodies[&200].iter().all(|b| b == &first[0]));
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM seats WHERE status = 'held' AND held_until IS NOT NULL"
        )
        .await,
        2
    );
    let (status, v) =
        json(post_order(&app, &token, "dup-h", &json!({"source": "cart"})).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED"))
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);
    app.stop().await;
}

/// A duplicate claimed while the first transaction is open waits for it: after the commit
/// it replays the stored bytes; a different request gets `422` instead.
#[tokio::test]
async fn a_waiting_duplicate_replays_what_the_first_committed() {
    let app = TestApp::spawn().await;
    let settings = app.state.idempotency.settings.clone();
    let k = key("wait-1");
    let mut first = app.pool.begin().await.expect("tx");
    let Begin::Started(claim) =
        idempotency::claim_tx(&mut first, &settings, "alice", &k, &fp(r#"{"a":1}"#))
            .await
            .expect("claim")
    else {
        panic!("fresh key replayed")
    };
    let (pool, s2, k2) = (app.pool.clone(), settings.clone(), k.clone());
    let same = tokio::spawn(async move {
        let mut tx = pool.begin().await.expect("tx");
        let r = idempotency::claim_tx(&mut tx, &s2, "alice", &k2, &fp(r#"{"a":1}"#)).await;
        tx.rollback().await.expect("rollback");
        r
    });
    let (pool, s3, k3) = (app.pool.clone(), settings.clone(), k.clone());
    let other = tokio::spawn(async move {
        let mut tx = pool.begin().await.expect("tx");
        let r = idempotency::claim_tx(&mut tx, &s3, "alice", &k3, &fp(r#"{"a":2}"#)).await;
        tx.rollback().await.expect("rollback");
        r
    });
    claim
        .complete_tx(&mut first, StatusCode::CREATED, b"{\"id\":\"o-1\"}")
        .await
        .expect("complete");
    first.commit().await.expect("commit");
    match same.await.expect("task") {
        Ok(Begin::Replay(r)) => {
            assert_eq!(r.status, StatusCode::CREATED);
            assert_eq!(&r.body[..], b"{\"id\":\"o-1\"}");
        }
        Ok(Begin::Started(_)) => panic!("a committed key was claimed again"),
        Err(_) => panic!("the duplicate was refused instead of replayed"),
    }
    match other.await.expect("task") {
        Err(booking::platform::db::TxError::Api(e)) => {
            assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(e.code(), "IDEMPOTENCY_KEY_REUSED");
        }
        _ => panic!("another body under the key must be 422"),
    }
    app.stop().await;
}

/// An attempt whose transaction dies (rolled back, or its connection killed like a crashed
/// process) leaves no claim: the retry runs at once, no `409`, no stale wait.
#[tokio::test]
async fn a_retry_after_a_crash_like_abort_runs_at_once() {
    let app = TestApp::spawn().await;
    let settings = app.state.idempotency.settings.clone();
    let k = key("crash-1");
    // Rolled back.
    let mut tx = app.pool.begin().await.expect("tx");
    assert!(matches!(
        idempotency::claim_tx(&mut tx, &settings, "alice", &k, &fp(r#"{"a":1}"#)).await,
        Ok(Begin::Started(_))
    ));
    tx.rollback().await.expect("rollback");
    // Killed mid-transaction, after claiming and completing.
    let mut conn = app.pool.acquire().await.expect("conn");
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.expect("tx");
    let Ok(Begin::Started(claim)) =
        idempotency::claim_tx(&mut tx, &settings, "alice", &k, &fp(r#"{"a":1}"#)).await
    else {
        panic!("the rolled-back claim is still there")
    };
    claim
        .complete_tx(&mut tx, StatusCode::CREATED, b"{}")
        .await
        .expect("complete");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .expect("pid");
    // Waits (up to 10 s) until the backend is gone, its transaction with it.
    let gone: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
        .bind(pid)
        .fetch_one(&app.pool)
        .await
        .expect("terminate");
    assert!(gone, "the backend did not exit");
    drop(tx);
    drop(conn);
    assert_eq!(
        count(&app, "SELECT count(*) FROM idempotency_keys").await,
        0,
        "the killed attempt's claim died with it"
    );
    // Over HTTP: an order with that key now goes through.
    create_product(&app, "shop", "MUG", 1200, 10, false).await;
    let token = app.admission("alice", "shop");
    assert_eq!(put_line(&app, &token, "MUG", json!(1)).await.status(), 200);
    let resp = post_order(&app, &token, "crash-1", &json!({"source": "cart"})).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(stock(&app, "MUG").await, (9, 1, 0));
    app.stop().await;
}

/// An order from a hold stores its key with the order's own statement (issue 16): a refused
/// hold order leaves no key behind, and a retry of an order that was made (its hold is no
/// longer active, so the pin refuses it) replays the stored bytes instead of the refusal.
#[tokio::test]
async fn a_refused_hold_order_keeps_no_key_and_a_later_retry_replays() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let token = app.admission("alice", "ev");
    let hold = |seat: &'static str| {
        let (app, token) = (&app, &token);
        async move {
            let (status, hold) = json(
                app.post("/api/events/ev/holds", token, &json!({"seats": [seat]}))
                    .await,
            )
            .await;
            assert_eq!(status, 201, "{hold}");
            hold["hold_id"].as_str().expect("hold id").to_owned()
        }
    };
    let expired = hold("S1-R1-1").await;
    crate::holds::expire_in_db(&app, &expired).await;
    let (status, v) =
        json(post_order(&app, &token, "k-exp", &json!({"hold_id": expired})).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("HOLD_EXPIRED")),
        "{v}"
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM idempotency_keys WHERE key = 'k-exp'"
        )
        .await,
        0
    );
    let live = hold("S1-R1-2").await;
    let body = json!({"hold_id": live});
    let first = post_order(&app, &token, "k-live", &body).await;
    assert_eq!(first.status(), 201);
    let first = first.bytes().await.expect("body");
    let again = post_order(&app, &token, "k-live", &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(again.bytes().await.expect("body"), first);
    // Another body under the key is still refused as a reuse, not as an inactive hold.
    let (status, v) =
        json(post_order(&app, &token, "k-live", &json!({"hold_id": expired})).await).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED"))
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);
    app.stop().await;
}
