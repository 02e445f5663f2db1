//! The hold statements' pool (`platform::kept`, issue 16): a connection goes back on its own
//! stack after a statement Postgres answered, and only then; whatever ended otherwise
//! (cut off midway, a terminated backend) never serves the next statement. Real Postgres.

use crate::helpers::{database_url, fresh_database};
use booking::platform::kept::{IDLE_CHECK, KeptPool};
use sqlx::postgres::PgPoolOptions;
use std::collections::HashSet;
use std::time::Duration;

async fn kept_pool(size: u32) -> KeptPool {
    let (url, _) = fresh_database().await;
    let sized = |n: u32| {
        PgPoolOptions::new()
            .max_connections(n)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(&url)
            .expect("pool")
    };
    KeptPool::new(sized(size), sized(1))
}

async fn pid(pool: &KeptPool) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pid")
}

#[tokio::test]
async fn one_connection_serves_statement_after_statement_and_stays_after_a_database_error() {
    let pool = kept_pool(2).await;
    let first = pid(&pool).await;
    for _ in 0..5 {
        assert_eq!(
            pid(&pool).await,
            first,
            "the kept connection serves the next one"
        );
    }
    assert_eq!(pool.kept(), 1);
    let err = sqlx::query_scalar::<_, i32>("SELECT 1 / 0")
        .fetch_one(&pool)
        .await
        .expect_err("division by zero");
    assert!(err.as_database_error().is_some(), "{err}");
    assert_eq!(
        pool.kept(),
        1,
        "an error Postgres reported leaves the connection good"
    );
    assert_eq!(pid(&pool).await, first);
    // A statement read only in part (one row of many) still hands over a clean connection.
    let one: i32 = sqlx::query_scalar("SELECT g FROM generate_series(1, 5000) g")
        .fetch_one(&pool)
        .await
        .expect("first row");
    assert_eq!(one, 1);
    let next: String = sqlx::query_scalar("SELECT 'next'")
        .fetch_one(&pool)
        .await
        .expect("next");
    assert_eq!(next, "next");
    assert_eq!(pid(&pool).await, first);
    pool.close().await;
}

#[tokio::test]
async fn three_hundred_concurrent_statements_get_their_own_answers_on_four_connections() {
    let pool = kept_pool(4).await;
    let mut tasks = Vec::new();
    for i in 0..300i32 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let (echo, pid): (i32, i32) =
                sqlx::query_as("SELECT $1::int, pg_backend_pid() FROM pg_sleep(0.002)")
                    .bind(i)
                    .fetch_one(&pool)
                    .await
                    .expect("statement");
            (i, echo, pid)
        }));
    }
    let mut pids = HashSet::new();
    for t in tasks {
        let (i, echo, pid) = t.await.expect("task");
        assert_eq!(i, echo, "every statement gets its own answer");
        pids.insert(pid);
    }
    assert!(pids.len() <= 4, "{} backends for a pool of 4", pids.len());
    assert!(pool.kept() <= 4 && pool.kept() >= 1, "kept {}", pool.kept());
    pool.close().await;
}

#[tokio::test]
async fn a_statement_cut_off_midway_never_answers_the_next_one() {
    let pool = kept_pool(1).await;
    let first = pid(&pool).await;
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        sqlx::query_scalar::<_, String>("SELECT 'first' FROM pg_sleep(0.5)").fetch_one(&pool),
    )
    .await;
    assert!(cut.is_err(), "the statement was cut off");
    assert_eq!(pool.kept(), 0, "a connection cut off midway is not kept");
    // The one connection went back through sqlx's pool, which waited for it to be ready.
    let second: String = sqlx::query_scalar("SELECT 'second'")
        .fetch_one(&pool)
        .await
        .expect("second");
    assert_eq!(second, "second");
    assert_eq!(
        pid(&pool).await,
        first,
        "the same connection, drained by sqlx"
    );
    pool.close().await;
}

#[tokio::test]
async fn terminated_backends_fail_one_statement_at_most_and_none_after_an_idle_second() {
    let pool = kept_pool(2).await;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .expect("admin");
    let terminate = |pid: i32| {
        let admin = admin.clone();
        async move {
            let gone: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .expect("terminate");
            assert!(gone);
        }
    };
    // Both connections on the stack, both backends terminated (Postgres went away): the
    // first statement fails, and it sends every kept connection back to sqlx, which pings
    // each before use: the next statement succeeds at once.
    let (a, b) = tokio::join!(
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid() FROM pg_sleep(0.05)")
            .fetch_one(&pool),
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid() FROM pg_sleep(0.05)")
            .fetch_one(&pool),
    );
    let (a, b) = (a.expect("a"), b.expect("b"));
    assert_ne!(a, b);
    assert_eq!(pool.kept(), 2);
    terminate(a).await;
    terminate(b).await;
    let err = sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(&pool)
        .await
        .expect_err("the kept connection's backend is gone");
    assert!(
        !booking::platform::kept::answered(&err),
        "a FATAL or I/O end is not a clean answer: {err}"
    );
    assert_eq!(pool.kept(), 0, "no connection of the dead ones is kept");
    let fresh = pid(&pool).await;
    assert!(fresh != a && fresh != b, "a new backend");
    // Idle past the check: the dead connection is found by the ping, no statement fails.
    terminate(fresh).await;
    tokio::time::sleep(IDLE_CHECK + Duration::from_millis(200)).await;
    let after = pid(&pool).await;
    assert_ne!(after, fresh);
    pool.close().await;
    admin.close().await;
}

/// The stack may hold every statement connection idle; a transaction does not wait for one
/// (it would until the acquire timeout: nobody hands a kept connection back to sqlx).
#[tokio::test]
async fn a_transaction_runs_while_the_stack_holds_every_connection() {
    let pool = kept_pool(2).await;
    let (a, b) = tokio::join!(
        sqlx::query("SELECT pg_sleep(0.05)").execute(&pool),
        sqlx::query("SELECT pg_sleep(0.05)").execute(&pool),
    );
    a.expect("a");
    b.expect("b");
    assert_eq!(pool.kept(), 2, "both connections are on the stack");
    let mut tx = pool.begin().await.expect("a transaction, not a timeout");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *tx)
        .await
        .expect("in the transaction");
    assert_eq!(one, 1);
    tx.commit().await.expect("commit");
    pool.close().await;
}
