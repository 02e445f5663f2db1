//! The benchmark's raw side runs [`CART_ORDER`] itself through pgbench: its parameters spelt
//! as pgbench variables (`deploy/bench/sql/order_hot.sql`, `order_hot_split.sql`).

use super::CART_ORDER;

/// `$n` → pgbench's spelling, highest first (so `$1` does not eat `$10`..`$18`).
const VARS: [(&str, &str); 18] = [
    ("$18", ":async::bool"),
    ("$17", ":wait::bool"),
    ("$16", "'\"}'"),
    ("$15", "'{\"id\":\"pg\",\"expires_at\":\"'"),
    ("$14", "'{}'"),
    ("$13", "('pg-' || :client_id::text || '-' || :r::text)"),
    ("$12", "ARRAY[1000]"),
    ("$11", "ARRAY['bench ' || :sku::text]"),
    ("$10", "ARRAY[1]"),
    ("$9", "ARRAY[:sku::text]"),
    ("$8", "900"),
    ("$7", "'JPY'"),
    ("$6", "1000"),
    ("$5", ":event::text"),
    ("$4", "'\\x00'::bytea"),
    ("$3", "'k'"),
    ("$2", "('pg-' || :client_id::text || '-' || :r::text)"),
    ("$1", "('pg-' || :client_id::text || '-' || :r::text)"),
];

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn pgbench_text() -> String {
    let mut sql = CART_ORDER.to_owned();
    for (param, var) in VARS {
        sql = sql.replace(param, var);
    }
    sql
}

#[test]
fn the_benchmark_scripts_run_the_statement_booking_runs() {
    let want = squash(&pgbench_text());
    if std::env::var_os("PRINT_CART_ORDER").is_some() {
        println!("{}", pgbench_text());
    }
    for (file, text) in [
        (
            "order_hot.sql",
            include_str!("../../../../../deploy/bench/sql/order_hot.sql"),
        ),
        (
            "order_hot_split.sql",
            include_str!("../../../../../deploy/bench/sql/order_hot_split.sql"),
        ),
    ] {
        assert!(
            squash(text).contains(&want),
            "deploy/bench/sql/{file} does not run CART_ORDER (PRINT_CART_ORDER=1 prints it)"
        );
    }
}
