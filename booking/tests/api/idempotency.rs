//! The idempotency layer on its own (the order endpoint tests exercise it over HTTP).

use crate::helpers::TestApp;
use axum::http::{HeaderValue, Method, StatusCode};
use booking::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};

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

#[tokio::test]
async fn claim_complete_replay_reuse_and_in_flight() {
    let app = TestApp::spawn().await;
    let k = key("k-1");
    let claim = match idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{"a":1}"#))
        .await
        .expect("begin")
    {
        Begin::Started(c) => c,
        Begin::Replay(_) => panic!("fresh key replayed"),
    };
    // While in flight: the same request is 409, a different one 422.
    let err = idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{"a":1}"#))
        .await
        .expect_err("in flight");
    assert_eq!(err.status(), StatusCode::CONFLICT);
    assert_eq!(err.code(), "IDEMPOTENCY_IN_FLIGHT");
    let err = idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{"a":2}"#))
        .await
        .expect_err("reused");
    assert_eq!(err.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(err.code(), "IDEMPOTENCY_KEY_REUSED");
    // Another account may use the same key string.
    assert!(matches!(
        idempotency::begin(&app.state.idempotency, "bob", &k, &fp(r#"{"a":1}"#))
            .await
            .expect("bob"),
        Begin::Started(_)
    ));

    // Completed inside a transaction that rolls back: nothing stored, still in flight.
    let mut tx = app.pool.begin().await.expect("tx");
    claim
        .complete_tx(&mut tx, StatusCode::CREATED, b"{\"id\":\"x\"}")
        .await
        .expect("complete");
    tx.rollback().await.expect("rollback");
    assert!(
        idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{"a":1}"#))
            .await
            .is_err()
    );

    // Committed: replayed byte-for-byte (2xx as 200), key order in the body does not matter.
    let mut tx = app.pool.begin().await.expect("tx");
    claim
        .complete_tx(&mut tx, StatusCode::CREATED, b"{\"id\":\"x\"}")
        .await
        .expect("complete");
    tx.commit().await.expect("commit");
    match idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{ "a" : 1 }"#))
        .await
        .expect("replay")
    {
        Begin::Replay(r) => {
            assert_eq!(r.status, StatusCode::CREATED);
            assert_eq!(&r.body[..], b"{\"id\":\"x\"}");
        }
        Begin::Started(_) => panic!("completed key started again"),
    }
    app.stop().await;
}

#[tokio::test]
async fn release_lets_a_retry_run_and_stale_claims_are_taken_over() {
    let app = TestApp::spawn().await;
    let k = key("k-2");
    let body = fp(r#"{"q":1}"#);
    let Begin::Started(first) = idempotency::begin(&app.state.idempotency, "alice", &k, &body)
        .await
        .expect("begin")
    else {
        panic!("fresh key replayed")
    };
    first.release(&app.pool).await;
    let Begin::Started(second) = idempotency::begin(&app.state.idempotency, "alice", &k, &body)
        .await
        .expect("after release")
    else {
        panic!("released key replayed")
    };

    // The second attempt "crashes": its claim ages past stale_after_s (set in SQL, no sleep).
    sqlx::query(
        "UPDATE idempotency_keys SET locked_at = clock_timestamp() - interval '1 hour'
          WHERE account_id = 'alice' AND key = 'k-2'",
    )
    .execute(&app.pool)
    .await
    .expect("age claim");
    let Begin::Started(third) = idempotency::begin(&app.state.idempotency, "alice", &k, &body)
        .await
        .expect("takeover")
    else {
        panic!("stale claim replayed")
    };
    // The presumed-dead attempt wakes up: it can no longer complete.
    let mut tx = app.pool.begin().await.expect("tx");
    let err = second
        .complete_tx(&mut tx, StatusCode::CREATED, b"{}")
        .await
        .expect_err("lost claim");
    assert_eq!(
        booking::platform::error::ApiError::from(err).code(),
        "IDEMPOTENCY_IN_FLIGHT"
    );
    tx.rollback().await.expect("rollback");
    // A stale claim of a *different* request is not taken over.
    sqlx::query(
        "UPDATE idempotency_keys SET locked_at = clock_timestamp() - interval '1 hour'
          WHERE account_id = 'alice' AND key = 'k-2'",
    )
    .execute(&app.pool)
    .await
    .expect("age claim");
    let err = idempotency::begin(&app.state.idempotency, "alice", &k, &fp(r#"{"q":2}"#))
        .await
        .expect_err("different body");
    assert_eq!(err.code(), "IDEMPOTENCY_KEY_REUSED");
    third
        .complete(&app.pool, StatusCode::OK, b"{\"ok\":true}")
        .await
        .expect("complete");

    // Purge keeps young keys and deletes old ones.
    let settings = app.config.idempotency.clone();
    assert_eq!(
        idempotency::purge_expired(&app.pool, &settings)
            .await
            .expect("purge"),
        0
    );
    sqlx::query("UPDATE idempotency_keys SET created_at = clock_timestamp() - interval '25 hours'")
        .execute(&app.pool)
        .await
        .expect("age keys");
    assert_eq!(
        idempotency::purge_expired(&app.pool, &settings)
            .await
            .expect("purge"),
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn concurrent_begins_start_exactly_one() {
    let app = TestApp::spawn().await;
    let k = key("k-3");
    let body = fp(r#"{"x":true}"#);
    let results = futures::future::join_all(
        (0..100).map(|_| idempotency::begin(&app.state.idempotency, "carol", &k, &body)),
    )
    .await;
    let started = results
        .iter()
        .filter(|r| matches!(r, Ok(Begin::Started(_))))
        .count();
    let in_flight = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.code() == "IDEMPOTENCY_IN_FLIGHT"))
        .count();
    assert_eq!(started, 1);
    assert_eq!(in_flight, 99);
    app.stop().await;
}
