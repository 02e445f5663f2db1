//! Issue 16's targets against one full `deploy/stack bench` run: the summary at the top of
//! `docs/benchmarks.md` gets one table, each row a goal of the issue, what this run measured and
//! the raw baseline measured beside it in the same run (pgbench, redis-benchmark), read from the
//! JSON the benchmark scripts leave in the runner's output directory (`<bench>/<file>.json`).
//!
//! A benchmark that did not run (or left no figure) makes its rows "did not run", never "met".

use crate::report::thousands;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// The JSON files the rows read, by benchmark.
#[derive(Default)]
pub struct Inputs {
    pub holds: Option<Value>,
    pub orders: Option<Value>,
    pub auctions: Option<Value>,
    pub statements: Option<Value>,
    /// The compact map without and with gzip (`seatmap/compact-plain.json`, `compact-gzip.json`).
    pub map_plain: Option<Value>,
    pub map_gzip: Option<Value>,
}

impl Inputs {
    pub fn read(dir: &Path) -> Self {
        let json = |bench: &str, file: &str| -> Option<Value> {
            let text = std::fs::read_to_string(dir.join(bench).join(file)).ok()?;
            serde_json::from_str(&text).ok()
        };
        Self {
            holds: json("holds", "holds.json"),
            orders: json("orders", "orders.json"),
            auctions: json("auctions", "auctions.json"),
            statements: json("statements", "statements.json"),
            map_plain: json("seatmap", "compact-plain.json"),
            map_gzip: json("seatmap", "compact-gzip.json"),
        }
    }
}

/// One goal of the issue: `None` for `met` when the run has no figure for it.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub what: String,
    pub goal: &'static str,
    pub measured: String,
    pub baseline: String,
    pub met: Option<bool>,
}

fn num(v: &Option<Value>, pointer: &str) -> Option<f64> {
    v.as_ref()?
        .pointer(pointer)?
        .as_f64()
        .filter(|x| x.is_finite())
}

fn pct(a: f64, b: f64) -> String {
    format!("{:.0} %", 100.0 * a / b)
}

fn missing(what: impl Into<String>, goal: &'static str) -> Row {
    Row {
        what: what.into(),
        goal,
        measured: "did not run".into(),
        baseline: "–".into(),
        met: None,
    }
}

/// A goal judged on its own figure, with no raw baseline beside it.
fn judged(what: impl Into<String>, goal: &'static str, measured: String, met: bool) -> Row {
    Row {
        what: what.into(),
        goal,
        measured,
        baseline: "–".into(),
        met: Some(met),
    }
}

/// The service's rate against a raw rate: `goal_ratio` of raw or better.
fn share_of_raw(
    what: &str,
    goal: &'static str,
    service: Option<f64>,
    raw: Option<f64>,
    unit: &str,
    goal_ratio: f64,
) -> Row {
    match (service, raw) {
        (Some(s), Some(r)) if r > 0.0 => Row {
            what: what.into(),
            goal,
            measured: format!("{} {unit} ({} of raw)", thousands(s), pct(s, r)),
            baseline: format!("{} {unit}", thousands(r)),
            met: Some(s >= goal_ratio * r),
        },
        _ => missing(what, goal),
    }
}

pub fn rows(i: &Inputs) -> Vec<Row> {
    let mut rows = Vec::new();
    // GA holds (async hold commits; raw = pgbench, async, same SQL).
    let ga1 = num(&i.holds, "/ga_one_row_per_s");
    let ga8 = num(&i.holds, "/ga_shards_per_s");
    rows.push(share_of_raw(
        "GA holds, 1 counter row",
        "≥ 60 % of raw",
        ga1,
        num(&i.holds, "/ga_raw_one_row_per_s"),
        "holds/s",
        0.6,
    ));
    let mut split = share_of_raw(
        "GA holds, tier split over 8 rows",
        "≥ 60 % of raw and ≥ 1.5× the 1-row service rate",
        ga8,
        num(&i.holds, "/ga_raw_shards_per_s"),
        "holds/s",
        0.6,
    );
    if let (Some(met), Some(g1), Some(g8)) = (split.met, ga1, ga8) {
        let _ = write!(
            split.measured,
            ", {:.1}× 1 row",
            g8 / g1.max(f64::MIN_POSITIVE)
        );
        split.met = Some(met && g8 >= 1.5 * g1);
    }
    rows.push(split);
    rows.push(share_of_raw(
        "seat holds, durable commits",
        "≥ 85 % of raw",
        num(&i.holds, "/service_sync_holds_per_s"),
        num(&i.holds, "/pgbench_sync_per_s"),
        "holds/s",
        0.85,
    ));
    rows.push(share_of_raw(
        "seat holds, async commits (default)",
        "≥ 85 % of raw",
        num(&i.holds, "/service_async_holds_per_s"),
        num(&i.holds, "/pgbench_async_per_s"),
        "holds/s",
        0.85,
    ));
    // Orders on one hot SKU: ×, not %, of pgbench's one-order statement on one row.
    let one_row_raw = num(&i.orders, "/pgbench_sync_per_s");
    let shards = num(&i.orders, "/split_shards").unwrap_or(0.0);
    for (what, field) in [
        (
            format!("orders on one hot SKU split over {shards:.0} rows, flash gate"),
            "/orders_split_per_s",
        ),
        (
            "orders on one hot SKU, one row, flash gate".to_owned(),
            "/orders_gated_per_s",
        ),
    ] {
        let goal = "≥ 3× the one-row raw rate";
        rows.push(match (num(&i.orders, field), one_row_raw) {
            (Some(s), Some(r)) if r > 0.0 => Row {
                what,
                goal,
                measured: format!("{} orders/s ({:.2}× raw)", thousands(s), s / r),
                baseline: format!("{} orders/s (one row)", thousands(r)),
                met: Some(s >= 3.0 * r),
            },
            _ => missing(what, goal),
        });
    }
    let rush = (
        num(&i.orders, "/rush_split_sold"),
        num(&i.orders, "/rush_split_stock"),
        num(&i.orders, "/rush_buyers"),
    );
    rows.push(match rush {
        (Some(sold), Some(stock), Some(buyers)) => judged(
            format!("rush of {} buyers on a split SKU", thousands(buyers)),
            "exactly the stock sold",
            format!("{} of {} sold", thousands(sold), thousands(stock)),
            sold == stock,
        ),
        _ => missing("rush on a split SKU", "exactly the stock sold"),
    });
    rows.push(match num(&i.orders, "/cart_ops_per_s") {
        Some(ops) => judged(
            "cart operations",
            "≥ 20,000 ops/s",
            format!("{} ops/s", thousands(ops)),
            ops >= 20_000.0,
        ),
        None => missing("cart operations", "≥ 20,000 ops/s"),
    });
    let hot = (
        num(&i.auctions, "/hot_decided_per_s"),
        num(&i.auctions, "/hot_p99_ms"),
        num(&i.auctions, "/raw_redis_per_s"),
        num(&i.auctions, "/clients"),
    );
    let goal = "≥ 25,000 decided bids/s, p99 < 20 ms";
    rows.push(match hot {
        (Some(rate), Some(p99), Some(raw), Some(clients)) => Row {
            what: format!("hot auction, {clients:.0} bidders"),
            goal,
            measured: format!("{} bids/s, p99 {p99:.1} ms", thousands(rate)),
            baseline: format!(
                "{} scripts/s (redis-benchmark, same script)",
                thousands(raw)
            ),
            met: Some(rate >= 25_000.0 && p99 < 20.0),
        },
        _ => missing("hot auction", goal),
    });
    let purchase = i.statements.as_ref().and_then(|s| {
        s.get("ops")?
            .as_array()?
            .iter()
            .find(|op| op.get("name").and_then(Value::as_str) == Some("whole purchase"))?
            .get("statements_per_op")?
            .as_f64()
    });
    rows.push(match purchase {
        Some(n) => judged(
            "a whole purchase (hold → order → pay → webhook)",
            "≤ 12 statements",
            format!("{n:.1} statements"),
            n <= 12.0,
        ),
        None => missing("a whole purchase, statements", "≤ 12 statements"),
    });
    rows.push(match num(&i.statements, "/purchase_rate/per_s") {
        Some(rate) => judged(
            "purchases with the sandbox provider",
            "≥ 400 purchases/s",
            format!("{} purchases/s", thousands(rate)),
            rate >= 400.0,
        ),
        None => missing("purchases with the sandbox provider", "≥ 400 purchases/s"),
    });
    // The compact map: the layout (read once) plus one availability body, without gzip.
    let size = num(&i.map_plain, "/layout_bytes")
        .zip(num(&i.map_plain, "/bytes_per_200"))
        .map(|(layout, avail)| layout + avail);
    rows.push(match size {
        Some(bytes) => judged(
            "compact seat map, 60,000 seats",
            "≤ 300 KB",
            format!("{} bytes (layout + availability)", thousands(bytes)),
            bytes <= 300.0 * 1024.0,
        ),
        None => missing("compact seat map, size", "≤ 300 KB"),
    });
    let goal = "1,000 fans at p99 < 50 ms";
    rows.push(
        match (num(&i.map_gzip, "/fetch/p99_ms"), num(&i.map_gzip, "/fans")) {
            (Some(p99), Some(fans)) => judged(
                format!("compact seat map, {} fans refreshing", thousands(fans)),
                goal,
                format!("p99 {p99:.1} ms"),
                fans >= 1000.0 && p99 < 50.0,
            ),
            _ => missing("compact seat map, fans", goal),
        },
    );
    rows
}

/// The summary's issue-16 table.
pub fn section(i: &Inputs) -> String {
    let mut out = String::from(
        "**Booking's write path (issue 16)**, every figure from this run, the raw baseline \
         measured beside it (details in each benchmark's section below):\n\n\
         | goal | target | measured | raw baseline, same run | |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for r in rows(i) {
        let mark = match r.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "–",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {mark} |",
            r.what, r.goal, r.measured, r.baseline
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::{Inputs, rows, section};
    use serde_json::json;

    fn full() -> Inputs {
        Inputs {
            holds: Some(json!({
                "service_async_holds_per_s": 2001.0, "service_sync_holds_per_s": 1617.0,
                "pgbench_async_per_s": 2243.0, "pgbench_sync_per_s": 1978.0,
                "ga_one_row_per_s": 636.0, "ga_shards_per_s": 1410.0,
                "ga_raw_one_row_per_s": 839.0, "ga_raw_shards_per_s": 1644.0
            })),
            orders: Some(json!({
                "cart_ops_per_s": 29806.2, "orders_gated_per_s": 3183.1,
                "orders_split_per_s": 3255.0, "pgbench_sync_per_s": 782.3, "split_shards": 8,
                "rush_split_sold": 1000, "rush_split_stock": 1000, "rush_buyers": 4000
            })),
            auctions: Some(json!({
                "clients": 256, "hot_decided_per_s": 34281.0, "hot_p99_ms": 14.855,
                "raw_redis_per_s": 86123.0
            })),
            statements: Some(json!({
                "ops": [{"name": "seat hold", "statements_per_op": 1.0},
                        {"name": "whole purchase", "statements_per_op": 11.0}],
                "purchase_rate": {"per_s": 404.2}
            })),
            map_plain: Some(json!({"layout_bytes": 35391, "bytes_per_200": 7520.0})),
            map_gzip: Some(json!({"fans": 1000, "fetch": {"p99_ms": 8.9}})),
        }
    }

    #[test]
    fn each_goal_is_judged_against_its_own_figures() {
        let rows = rows(&full());
        let verdicts: Vec<(&str, Option<bool>)> =
            rows.iter().map(|r| (r.what.as_str(), r.met)).collect();
        assert_eq!(
            verdicts,
            vec![
                ("GA holds, 1 counter row", Some(true)),
                ("GA holds, tier split over 8 rows", Some(true)),
                // 1,617 / 1,978 = 82 %: under 85 %.
                ("seat holds, durable commits", Some(false)),
                ("seat holds, async commits (default)", Some(true)),
                (
                    "orders on one hot SKU split over 8 rows, flash gate",
                    Some(true)
                ),
                ("orders on one hot SKU, one row, flash gate", Some(true)),
                ("rush of 4,000 buyers on a split SKU", Some(true)),
                ("cart operations", Some(true)),
                ("hot auction, 256 bidders", Some(true)),
                (
                    "a whole purchase (hold → order → pay → webhook)",
                    Some(true)
                ),
                ("purchases with the sandbox provider", Some(true)),
                ("compact seat map, 60,000 seats", Some(true)),
                ("compact seat map, 1,000 fans refreshing", Some(true)),
            ]
        );
        assert_eq!(rows[4].measured, "3,255 orders/s (4.16× raw)");
        assert_eq!(rows[4].baseline, "782 orders/s (one row)");
        assert_eq!(rows[1].measured, "1,410 holds/s (86 % of raw), 2.2× 1 row");
    }

    #[test]
    fn a_split_that_does_not_scale_misses_even_above_its_raw_share() {
        let mut i = full();
        // 90 % of raw, but only 1.2× the one-row rate.
        i.holds = Some(json!({
            "ga_one_row_per_s": 1000.0, "ga_shards_per_s": 1200.0,
            "ga_raw_one_row_per_s": 1200.0, "ga_raw_shards_per_s": 1333.0
        }));
        let rows = rows(&i);
        assert_eq!(rows[0].met, Some(true));
        assert_eq!(rows[1].met, Some(false));
    }

    #[test]
    fn a_benchmark_that_did_not_run_is_never_met() {
        let i = Inputs {
            orders: full().orders,
            ..Inputs::default()
        };
        let rows = rows(&i);
        assert_eq!(rows.len(), 13);
        let ran: Vec<bool> = rows.iter().map(|r| r.met.is_some()).collect();
        assert_eq!(
            ran,
            vec![
                false, false, false, false, true, true, true, true, false, false, false, false,
                false
            ]
        );
        assert!(section(&i).contains("| did not run | – | – |"));
        // An oversold or undersold rush is a miss, whatever the rates.
        let mut i = full();
        i.orders =
            Some(json!({"rush_split_sold": 999, "rush_split_stock": 1000, "rush_buyers": 4000}));
        assert_eq!(
            rows_met(&i, "rush of 4,000 buyers on a split SKU"),
            Some(false)
        );
    }

    fn rows_met(i: &Inputs, what: &str) -> Option<bool> {
        rows(i)
            .into_iter()
            .find(|r| r.what == what)
            .and_then(|r| r.met)
    }
}
