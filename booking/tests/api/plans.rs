//! Reading what a statement's plan does, for the tests that guard plans against a launch's
//! statistics (`session`, `jobs`): rows read come from `EXPLAIN ANALYZE`, never from timing.

use crate::helpers::{TestApp, ensure_event};
use sqlx::PgConnection;

/// A sale as a launch sees it: event "shop", `analysed` tables analysed while near empty, then
/// 3,000 pending orders of other fans (`other1`..), none due for 10 minutes, that autovacuum
/// has not caught up with.
pub async fn sale_on_stale_statistics(app: &TestApp, analysed: &[&str]) {
    ensure_event(app, "shop").await;
    for table in analysed {
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {table}")))
            .execute(&app.pool)
            .await
            .expect("analyse");
    }
    sqlx::query(
        "INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, expires_at)
         SELECT 'o' || g, 'other' || g, 'k', 'cart', 'shop', 1000,
                clock_timestamp() + interval '10 min' + g * interval '1 ms'
           FROM generate_series(1, 3000) g",
    )
    .execute(&app.pool)
    .await
    .expect("orders");
}

/// Rows read by `sql` prepared as `name` under `plan_cache_mode = force_{mode}_plan` and run
/// with `args` (`"(200)"`), with its plan for the failure message.
pub async fn rows_read_by(
    conn: &mut PgConnection,
    mode: &str,
    name: &str,
    sql: &str,
    args: &str,
) -> (f64, serde_json::Value) {
    for prepare in [
        format!("SET plan_cache_mode = force_{mode}_plan"),
        format!("PREPARE {name} AS {sql}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(prepare))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    run_prepared(conn, name, args).await
}

/// Runs the prepared statement `name` with `args` under `EXPLAIN ANALYZE`: the rows its plan
/// read, and the plan for the failure message. The statement's effects stay.
pub async fn run_prepared(
    conn: &mut PgConnection,
    name: &str,
    args: &str,
) -> (f64, serde_json::Value) {
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}{args}"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    (rows_read(&plan[0]["Plan"]), plan)
}

/// Rows a plan read: every node's rows out (times its loops) and the rows its filters threw
/// away.
fn rows_read(node: &serde_json::Value) -> f64 {
    let n = |k: &str| node[k].as_f64().unwrap_or(0.0);
    let own = n("Actual Rows") * n("Actual Loops").max(1.0) + n("Rows Removed by Filter");
    own + node["Plans"]
        .as_array()
        .map_or(0.0, |plans| plans.iter().map(rows_read).sum())
}
