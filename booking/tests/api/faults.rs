//! Fault tests: booking with its Postgres and Redis connections behind a
//! [`testkit::ChaosProxy`] that the test cuts or resets.
//!
//! Each Postgres test breaks the connection twice: before the request (its first statement
//! cannot run) and in the middle of the request's transaction. For the middle, the test holds
//! a lock on its own direct connection that the transaction needs; Postgres parks booking's
//! statement on it, the test sees it waiting in `pg_stat_activity`, cuts the proxy, and only
//! then lets go. So the cut lands inside the transaction on every run, whatever the machine's
//! speed, and Postgres rolls the orphaned transaction back when it finds its client gone.
//!
//! Every broken request must answer `503 UNAVAILABLE` with `Retry-After` (never a `500`) well
//! within [`ANSWER_WITHIN`], leave nothing half-done (checked in the database and at the
//! provider), and succeed exactly once when retried after `restore()`.

mod payments;

use crate::events::{create_event, db_state, small_event};
use crate::helpers::{Chaos, DIRECT_APP_NAME, TestApp, create_product, put_cart_line};
use booking::app::config::BookingConfig;
use reqwest::RequestBuilder;
use serde_json::{Value, json};
use shared::error::codes;
use std::time::{Duration, Instant};
use testkit::wait::until;

/// Far above booking's own bounds (below), so a request that has not answered by then hangs.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// How long, and how tightly, the tests poll Postgres for what booking's backends do.
const POLL_WITHIN: Duration = Duration::from_secs(20);
const POLL_EVERY: Duration = Duration::from_millis(20);

fn fault_settings(c: &mut BookingConfig) {
    // A pool that cannot get a connection gives up after 2 s, a Redis command after 1 s.
    c.database.acquire_timeout_ms = 2_000;
    c.redis.response_timeout_ms = 1_000;
    // A claim the cut attempt could not release (Postgres was gone) is taken over by a retry
    // once stale, exactly as after a crash (idempotency.rs); 1 s keeps the test short.
    c.idempotency.stale_after_s = 1;
}

fn chaos(app: &TestApp) -> &Chaos {
    app.chaos.as_ref().expect("app started through proxies")
}

#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
    retry_after: Option<String>,
}

/// Sends `req`; a request booking does not answer within [`ANSWER_WITHIN`] fails the test.
async fn send(req: RequestBuilder) -> Answer {
    let started = Instant::now();
    let resp = tokio::time::timeout(ANSWER_WITHIN, req.send())
        .await
        .unwrap_or_else(|_| panic!("no answer within {ANSWER_WITHIN:?}: booking hangs"))
        .expect("request");
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp.text().await.expect("body");
    let body =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
    assert!(started.elapsed() < ANSWER_WITHIN, "answered too late");
    Answer {
        status,
        body,
        retry_after,
    }
}

#[track_caller]
fn assert_unavailable(a: &Answer) {
    assert_eq!(a.status, 503, "expected a clean 503: {a:?}");
    assert_eq!(a.body["code"], codes::UNAVAILABLE, "{a:?}");
    assert!(a.retry_after.is_some(), "503 without Retry-After: {a:?}");
}

/// Booking's backends on the test database (the test's own connections excluded) matching
/// `condition`.
async fn booking_backends(app: &TestApp, condition: &'static str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND backend_type = 'client backend'
            AND application_name <> $1 AND {condition}"
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(DIRECT_APP_NAME)
        .fetch_one(&app.pool)
        .await
        .expect("pg_stat_activity")
}

/// Waits until a booking statement waits for a lock (the test's [`Blocker`]).
async fn booking_waits_on_lock(app: &TestApp) {
    until(
        POLL_WITHIN,
        POLL_EVERY,
        "booking never waited for the test's lock",
        || async { booking_backends(app, "wait_event_type = 'Lock'").await > 0 },
    )
    .await;
}

/// Waits until Postgres has ended every backend of booking's (after a cut): from then on
/// whatever its transactions did is rolled back.
async fn booking_disconnected(app: &TestApp) {
    until(
        POLL_WITHIN,
        POLL_EVERY,
        "booking's backends outlived the cut",
        || async { booking_backends(app, "true").await == 0 },
    )
    .await;
}

/// A lock held by the test on its own connection (see the module docs).
struct Blocker(sqlx::Transaction<'static, sqlx::Postgres>);

impl Blocker {
    async fn take(app: &TestApp, sql: &'static str, binds: &[&str]) -> Blocker {
        let mut tx = app.pool.begin().await.expect("begin");
        let mut q = sqlx::query(sql);
        for b in binds {
            q = q.bind(*b);
        }
        q.execute(&mut *tx).await.expect("take the lock");
        Blocker(tx)
    }

    async fn release(self) {
        self.0.rollback().await.expect("release the lock");
    }
}

/// Retries while the cut attempt's orphaned claim is still live (`409
/// IDEMPOTENCY_IN_FLIGHT`, until `stale_after_s`); returns the first other answer.
async fn retry_past_orphaned_claim(make: impl Fn() -> RequestBuilder) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = send(make()).await;
        if !(a.status == 409 && a.body["code"] == codes::IDEMPOTENCY_IN_FLIGHT) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "the orphaned claim never went stale"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count(app: &TestApp, sql: &'static str, bind: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(bind)
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

/// The account's idempotency keys: (all, finished).
async fn claims(app: &TestApp, account: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE state = 'done')
           FROM idempotency_keys WHERE account_id = $1",
    )
    .bind(account)
    .fetch_one(&app.pool)
    .await
    .expect("idempotency keys")
}

#[tokio::test]
async fn seat_hold_cut_from_postgres_answers_503_changes_nothing_and_holds_once_after_restore() {
    let app = TestApp::spawn_through_proxies(fault_settings).await;
    let db = &chaos(&app).db;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let token = app.admission("alice", "ev");
    let hold = || {
        app.client
            .post(app.url("/api/events/ev/holds"))
            .bearer_auth(&token)
            .json(&json!({"seats": ["S1-R1-1", "S1-R1-2"]}))
    };
    let before = db_state(&app.pool).await;

    // Cut before the request.
    db.cut().await;
    assert_unavailable(&send(hold()).await);
    assert_eq!(db_state(&app.pool).await, before);
    db.restore();

    // Cut while the hold statement (one autocommit statement) waits for a seat the test has
    // locked: Postgres notices the client is gone while the statement waits
    // (`client_connection_check_interval`) and aborts it, so the lock's release finds
    // nothing left to commit.
    let lock = Blocker::take(
        &app,
        "SELECT 1 FROM seats WHERE event_id = 'ev' AND seat_id = $1 FOR UPDATE",
        &["S1-R1-2"],
    )
    .await;
    let cut_request = tokio::spawn(send(hold()));
    booking_waits_on_lock(&app).await;
    db.cut().await;
    assert_unavailable(&cut_request.await.expect("request task"));
    booking_disconnected(&app).await;
    lock.release().await;
    assert_eq!(
        db_state(&app.pool).await,
        before,
        "a hold for a request that vanished"
    );

    // The pool reconnects by itself: the same request now holds the seats, once.
    db.restore();
    let a = send(hold()).await;
    assert_eq!(a.status, 201, "{a:?}");
    let after = db_state(&app.pool).await;
    assert_eq!(
        (&after["holds"], &after["held"], &after["usage"]),
        (&json!(1), &json!(2), &json!(2)),
        "{after}"
    );
}

#[tokio::test]
async fn hold_order_reset_from_postgres_answers_503_and_orders_once_after_restore() {
    let app = TestApp::spawn_through_proxies(fault_settings).await;
    let db = &chaos(&app).db;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let token = app.admission("alice", "ev");
    let held = send(
        app.client
            .post(app.url("/api/events/ev/holds"))
            .bearer_auth(&token)
            .json(&json!({"seats": ["S1-R1-1"]})),
    )
    .await;
    assert_eq!(held.status, 201, "{held:?}");
    let hold_id = held.body["hold_id"].as_str().expect("hold id").to_owned();
    let order = || {
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", "order-1")
            .json(&json!({"hold_id": hold_id}))
    };
    let orders = || {
        count(
            &app,
            "SELECT count(*) FROM orders WHERE account_id = $1",
            "alice",
        )
    };
    let hold_status = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM holds WHERE id = $1")
            .bind(&hold_id)
            .fetch_one(&app.pool)
            .await
            .expect("hold")
    };

    // Reset before the request: not even the idempotency claim is written.
    db.reset().await;
    assert_unavailable(&send(order()).await);
    assert_eq!(orders().await, 0);
    assert_eq!(claims(&app, "alice").await, (0, 0), "a claim was written");
    db.restore();

    // Reset inside the order transaction (the claim is committed; pinning the hold waits for
    // the test's lock on it).
    let lock = Blocker::take(
        &app,
        "SELECT 1 FROM holds WHERE id = $1 FOR UPDATE",
        &[&hold_id],
    )
    .await;
    let cut_request = tokio::spawn(send(order()));
    booking_waits_on_lock(&app).await;
    db.reset().await;
    assert_unavailable(&cut_request.await.expect("request task"));
    lock.release().await;
    booking_disconnected(&app).await;
    assert_eq!(orders().await, 0, "a half-done order");
    assert_eq!(hold_status().await, "active");
    assert_eq!(claims(&app, "alice").await.1, 0, "a response was stored");

    // The same key after restore: one order, and a replay of it.
    db.restore();
    let first = retry_past_orphaned_claim(order).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = send(order()).await;
    assert_eq!((again.status, &again.body["id"]), (200, &first.body["id"]));
    assert_eq!(orders().await, 1);
    assert_eq!(hold_status().await, "ordered");
}

#[tokio::test]
async fn cart_and_cart_order_cut_from_redis_answer_503_and_recover_without_restart() {
    let app = TestApp::spawn_through_proxies(fault_settings).await;
    let redis = &chaos(&app).redis;
    create_product(&app, "shop", "MUG", 1500, 10, false).await;
    let token = app.admission("alice", "shop");
    let put_line = |quantity: i64| {
        app.client
            .put(app.url("/api/events/shop/cart/items/MUG"))
            .bearer_auth(&token)
            .json(&json!({ "quantity": quantity }))
    };
    let order = || {
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", "cart-order-1")
            .json(&json!({"source": "cart"}))
    };
    let orders = || {
        count(
            &app,
            "SELECT count(*) FROM orders WHERE account_id = $1",
            "alice",
        )
    };
    let put = put_cart_line(&app, &token, "shop", "MUG", 2).await;
    assert!(put.status().is_success(), "{}", put.status());

    redis.cut().await;
    assert_unavailable(&send(put_line(3)).await);
    // The cart is read before anything is claimed or reserved.
    assert_unavailable(&send(order()).await);
    assert_eq!(orders().await, 0);
    assert_eq!(claims(&app, "alice").await, (0, 0), "a claim was written");

    // Back without a restart: the connection manager reconnects (503s until it has).
    redis.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = send(put_line(3)).await;
        if a.status < 300 {
            break;
        }
        assert_unavailable(&a);
        assert!(
            Instant::now() < deadline,
            "booking never reconnected to Redis"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = send(order()).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body["items"][0]["quantity"], 3, "{first:?}");
    let again = send(order()).await;
    assert_eq!((again.status, &again.body["id"]), (200, &first.body["id"]));
    assert_eq!(orders().await, 1);
}
