//! Every statement of booking has a deadline (`[database] statement_timeout_ms`) and no
//! transaction stays open and idle past `idle_in_transaction_timeout_ms`: a lock held by
//! someone else, or a transaction left open, makes requests fail fast with `503` and change
//! nothing, instead of stalling every order of a hot row behind it. Migrations run without
//! the deadline.

use crate::helpers::{TestApp, create_product, empty_database, json, put_cart_line};
use crate::products::post_order;
use booking::platform::db;
use secrecy::SecretString;
use serde_json::json;
use shared::config::DatabaseSettings;
use sqlx::{Connection, Executor, PgConnection};
use std::time::Duration;

/// A connection of the test's own, without booking's limits (an operator's session).
async fn outsider(app: &TestApp) -> PgConnection {
    let url = secrecy::ExposeSecret::expose_secret(&app.config.database.url).to_owned();
    PgConnection::connect(&url).await.expect("connect")
}

/// Booking's backends that wait for a lock right now.
async fn waiting_on_locks(app: &TestApp, me: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
    )
    .bind(&app.db_name)
    .fetch_one(me)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn an_order_stuck_behind_a_lock_fails_fast_and_changes_nothing() {
    let app = TestApp::spawn_with(|c| {
        c.database.statement_timeout_ms = 300;
        // The request's own deadline must not be what answers.
        c.booking.request_timeout_ms = 120_000;
    })
    .await;
    create_product(&app, "drop", "DL-1", 1000, 10, false).await;
    let token = app.admission("fan-dl", "drop");
    assert_eq!(
        put_cart_line(&app, &token, "drop", "DL-1", 2)
            .await
            .status(),
        200
    );
    // Someone else's transaction holds the SKU's stock row and does not end.
    let mut locker = outsider(&app).await;
    locker.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE")
        .bind("DL-1")
        .fetch_all(&mut locker)
        .await
        .expect("lock the stock row");

    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        post_order(&app, &token, "dl-key", &json!({"source": "cart"})),
    )
    .await
    .expect("the order waited on the lock far past its statements' deadline");
    let (status, body) = json(answer).await;
    assert_eq!(status, 503, "{body}");
    // Its statements were cancelled, not left waiting in Postgres (holding a connection each).
    let mut observer = outsider(&app).await;
    assert_eq!(waiting_on_locks(&app, &mut observer).await, 0);
    locker.execute("ROLLBACK").await.expect("rollback");

    let (orders, available, reserved): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE account_id = 'fan-dl'),
                (SELECT sum(available)::bigint FROM inventory WHERE sku = 'DL-1'),
                (SELECT sum(reserved)::bigint FROM inventory WHERE sku = 'DL-1')",
    )
    .fetch_one(&mut observer)
    .await
    .expect("counts");
    assert_eq!((orders, available, reserved), (0, 10, 0));

    // The same request, retried once the row is free, is served exactly once.
    let (status, body) =
        json(post_order(&app, &token, "dl-key", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 201, "{body}");
    let (status, again) =
        json(post_order(&app, &token, "dl-key", &json!({"source": "cart"})).await).await;
    assert_eq!(status, 200, "a replay: {again}");
    assert_eq!(again["id"], body["id"]);
    let reserved: i64 =
        sqlx::query_scalar("SELECT sum(reserved)::bigint FROM inventory WHERE sku = 'DL-1'")
            .fetch_one(&mut observer)
            .await
            .expect("reserved");
    assert_eq!(reserved, 2);
}

fn settings(url: &str, statement_ms: u64, idle_ms: u64) -> DatabaseSettings {
    DatabaseSettings {
        url: SecretString::from(url.to_owned()),
        max_connections: 4,
        acquire_timeout_ms: 20_000,
        statement_timeout_ms: statement_ms,
        idle_in_transaction_timeout_ms: idle_ms,
    }
}

#[tokio::test]
async fn a_transaction_left_open_and_idle_is_ended_and_its_locks_released() {
    let (url, _) = empty_database().await;
    let pool = db::pool(&settings(&url, 30_000, 200)).expect("pool");
    let mut other = PgConnection::connect(&url).await.expect("connect");
    other
        .execute("CREATE TABLE seat_like (id int PRIMARY KEY); INSERT INTO seat_like VALUES (1)")
        .await
        .expect("table");

    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT id FROM seat_like WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .expect("lock");
    // The transaction now does nothing. Another session waits for its row at most until
    // Postgres ends the idle one (bounded here so that a missing limit fails, not hangs).
    other
        .execute("SET lock_timeout = '20s'")
        .await
        .expect("lock_timeout");
    sqlx::query("SELECT id FROM seat_like WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut other)
        .await
        .expect("the idle transaction kept its lock");
    // The abandoned transaction is gone: its next statement fails.
    assert!(sqlx::query("SELECT 1").execute(&mut *tx).await.is_err());
}

/// Runs `SELECT pg_sleep(0.2)` on `pool` and returns its SQLSTATE (`None`: it ran).
async fn sleep_code(pool: &sqlx::PgPool) -> Option<String> {
    match sqlx::query("SELECT pg_sleep(0.2)").execute(pool).await {
        Ok(_) => None,
        Err(e) => Some(
            e.as_database_error()
                .and_then(|d| d.code())
                .map_or_else(|| format!("{e}"), |c| c.into_owned()),
        ),
    }
}

#[tokio::test]
async fn a_statement_past_its_deadline_is_cancelled_but_migrations_are_not() {
    // A deadline no migration file can meet: each runs longer than 1 ms.
    let (url, _) = empty_database().await;
    let pool = db::pool(&settings(&url, 1, 60_000)).expect("pool");
    // The deadline applies: a statement past it is cancelled (57014, answered 503).
    assert_eq!(sleep_code(&pool).await.as_deref(), Some("57014"));
    // The same migrator on the same limit fails; booking's migrate does not.
    let (control, _) = empty_database().await;
    let limited = db::pool(&settings(&control, 1, 60_000)).expect("pool");
    assert!(db::MIGRATOR.run(&limited).await.is_err());
    db::migrate(&pool)
        .await
        .expect("migrations without the deadline");
    let mut other = PgConnection::connect(&url).await.expect("connect");
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('orders', 'seats')",
    )
    .fetch_one(&mut other)
    .await
    .expect("tables");
    assert_eq!(tables, 2);
    // The pool's connections kept their limit (the migrations' one was not returned to it).
    for _ in 0..4 {
        assert_eq!(sleep_code(&pool).await.as_deref(), Some("57014"));
    }
}
