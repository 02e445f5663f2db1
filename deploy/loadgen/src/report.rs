//! `loadgen report`: turns one surge benchmark run (the files `deploy/bench/surge.sh` leaves in
//! its output directory: `surge.json`, `k6-<script>.json` from `k6 --summary-export`,
//! `verify.json`) into the markdown section of `docs/benchmarks.md`, plus the SVG plots.
//! `loadgen report --summary` writes the top of that document instead: the machine, how to
//! run, and the issue-7 targets against what the last surge measured.
//!
//! It reports what was measured, including misses: a target that was not met is marked so,
//! with the measured value next to the goal.

use crate::surge::{Quantiles, SurgeReport, Tick, latency_chart, queue_chart};
use crate::verify::VerifyReport;
use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The surge benchmark's output directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// Where the SVG plots are written.
    #[arg(long)]
    pub plots: PathBuf,
    /// How the markdown refers to the plots (a path prefix relative to the document).
    #[arg(long, default_value = "")]
    pub href: String,
    /// Smoke profile: say that the numbers are not representative.
    #[arg(long)]
    pub quick: bool,
    /// The section's heading (without `## `).
    #[arg(
        long,
        default_value = "Launch surge: waiting room → hold → order → pay (issue 7)"
    )]
    pub title: String,
    /// File-name prefix of the plots (`<prefix>-queue.svg`, `<prefix>-latency.svg`).
    #[arg(long, default_value = "surge")]
    pub plot_prefix: String,
}

/// What `deploy/bench/surge.sh` records about a run across processes (`scale.json`).
#[derive(Debug, Deserialize)]
pub struct ScaleRun {
    pub gateways: u32,
    pub bookings: u32,
    pub redis: String,
    pub killed: String,
    /// Wall-clock time of the kill (Unix ms).
    pub killed_at_ms: i64,
    /// From the kill until another gateway's `/metrics` shows it holding the lease.
    pub takeover_ms: i64,
    pub new_leader: String,
}

/// Admissions per second in `[from, to)` seconds of the run's timeline (counter difference
/// between the samples nearest each end).
fn admitted_per_s(r: &SurgeReport, from: f64, to: f64) -> Option<f64> {
    let first = r.timeline.iter().find(|t| t.t >= from)?;
    let last = r.timeline.iter().rev().find(|t| t.t <= to)?;
    let span = last.t - first.t;
    (span >= 1.0).then(|| (last.admitted_total - first.admitted_total) / span)
}

/// The table of a run across processes: the kill, the takeover and the admit rate around it.
fn scale_section(out: &mut String, r: &SurgeReport, s: &ScaleRun) {
    let configured = r.admit_rate_configured_per_s;
    let kill_t = (s.killed_at_ms - r.started_at_ms) as f64 / 1000.0;
    let around = |from: f64, to: f64| {
        admitted_per_s(r, from, to).map_or_else(
            || "–".to_owned(),
            |v| format!("{v:.1}/s ({:+.1} %)", (v / configured - 1.0) * 100.0),
        )
    };
    let takeover_ok = s.takeover_ms <= 5_000;
    let _ = writeln!(
        out,
        "### Across processes (issue 17)\n\n\
         {} gateway processes and {} booking processes, the waiting room on a {} Redis; \
         every gateway proxies to every booking, fans are spread over the gateways round \
         robin and move to the other one when theirs stops answering (as a load balancer \
         would). {} (the event's admission leader) was killed with `kill -9` {kill_t:.0} s \
         into the run.\n\n\
         | | goal | measured | |\n| --- | --- | --- | --- |\n\
         | lease taken over by {} | within a few seconds (≤ 5 s) | {:.1} s after the kill | {} |\n\
         | admit rate, 10 s before the kill | configured {configured:.1}/s | {} | |\n\
         | admit rate, 10 s after the kill | | {} | |\n\
         | fans moved to the other gateway | | {} | |\n",
        s.gateways,
        s.bookings,
        s.redis,
        s.killed,
        s.new_leader,
        s.takeover_ms as f64 / 1000.0,
        if takeover_ok { "met" } else { "**missed**" },
        around(kill_t - 10.0, kill_t),
        around(kill_t, kill_t + 10.0),
        thousands(r.counters.get("failovers").copied().unwrap_or(0) as f64),
    );
}

/// The issue-7 targets for the surge on this machine.
pub struct Target {
    pub what: &'static str,
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

pub fn targets(r: &SurgeReport) -> Vec<Target> {
    // A single second can exceed the configured rate when the spawner catches up after a
    // stall (the box is saturated), so the peak is the best 5-second average.
    let arrivals: Vec<f64> = r.timeline.iter().map(|t| t.arrivals_per_s).collect();
    let peak5 = arrivals
        .windows(5)
        .map(|w| w.iter().sum::<f64>() / 5.0)
        .fold(0.0, f64::max);
    let status_p99 = r.latency_ms.get("status").map_or(f64::NAN, |q| q.p99);
    let dev = if r.admit_rate_configured_per_s > 0.0 {
        (r.admit_rate_measured_per_s / r.admit_rate_configured_per_s - 1.0) * 100.0
    } else {
        f64::NAN
    };
    let violations: i64 = r
        .verify
        .as_ref()
        .map_or(-1, |v| v.checks.iter().map(|c| c.violations).sum());
    vec![
        Target {
            what: "simulated fans",
            goal: "≥ 200,000".into(),
            measured: thousands(r.fans as f64),
            met: r.fans >= 200_000,
        },
        Target {
            what: "arrival peak (best 5 s average)",
            goal: "≥ 5,000/s".into(),
            measured: format!(
                "{}/s (configured {}/s)",
                thousands(peak5),
                thousands(r.config["peak_rate"].as_f64().unwrap_or(0.0))
            ),
            met: peak5 >= 5_000.0,
        },
        Target {
            what: "status p99 (client side)",
            goal: "< 50 ms".into(),
            measured: format!("{status_p99:.1} ms"),
            met: status_p99 < 50.0,
        },
        Target {
            what: "measured admit rate vs configured",
            goal: "within 5 %".into(),
            measured: format!(
                "{:.1}/s vs {:.1}/s ({dev:+.1} %)",
                r.admit_rate_measured_per_s, r.admit_rate_configured_per_s
            ),
            met: dev.abs() <= 5.0,
        },
        Target {
            what: "sold out, no seat left held after hold expiry",
            goal: format!("{} sold, 0 held", thousands(r.seats as f64)),
            measured: format!(
                "{} sold, {} held{}",
                thousands(r.final_sold),
                thousands(r.final_held),
                r.sold_out_at_s
                    .map(|t| format!(" (sold out at {t:.0} s)"))
                    .unwrap_or_default()
            ),
            met: r.final_sold >= r.seats as f64 && r.final_held == 0.0,
        },
        Target {
            what: "invariant violations",
            goal: "0".into(),
            measured: if violations < 0 {
                "not checked".into()
            } else {
                violations.to_string()
            },
            met: violations == 0,
        },
    ]
}

/// Join latency second by second at the arrival peak (the seconds with at least 90 % of the
/// configured peak rate, or of the busiest second's arrivals when none is configured): the
/// whole run's join p99 hides whether the peak was slow throughout or in a few seconds (e.g.
/// those where the sale's work shared the CPU). `None` for reports without the column.
pub fn join_by_second(timeline: &[Tick], peak_rate: Option<f64>) -> Option<String> {
    let peak = peak_rate.filter(|p| *p > 0.0).unwrap_or_else(|| {
        timeline
            .iter()
            .map(|x| x.arrivals_per_s)
            .fold(0.0_f64, f64::max)
    });
    let mut at_peak: Vec<(f64, f64, f64)> = timeline
        .iter()
        .filter(|x| x.arrivals_per_s >= 0.9 * peak && x.join_p99_ms.is_finite())
        .map(|x| (x.t, x.join_p99_ms, x.holds_per_s))
        .collect();
    if peak <= 0.0 || at_peak.is_empty() {
        return None;
    }
    let under = at_peak.iter().filter(|x| x.1 < 50.0).count();
    at_peak.sort_by(|a, b| a.1.total_cmp(&b.1));
    let median = at_peak[at_peak.len() / 2].1;
    let (worst_t, worst, worst_holds) = at_peak[at_peak.len() - 1];
    Some(format!(
        "Join p99 second by second at the arrival peak ({} seconds with ≥ 90 % of {} \
         arrivals/s): {under} of them under 50 ms, the median second {median:.1} ms, \
         the worst {worst:.1} ms at t = {worst_t:.0} s ({} holds/s then); column \
         `join_p99_ms` of the timeline.",
        at_peak.len(),
        thousands(peak),
        thousands(worst_holds),
    ))
}

/// 12345.6 -> "12,346".
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// One table row per issue-7 target.
fn target_rows(out: &mut String, r: &SurgeReport) {
    for t in targets(r) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            t.what,
            t.goal,
            t.measured,
            mark(t.met)
        );
    }
}

fn mark(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// One line describing this machine (CPU, cores, memory, kernel).
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let virt = if cpuinfo.contains(" hypervisor") {
        ", virtual machine"
    } else {
        ""
    };
    format!(
        "{model}, {cores} cores{virt}, {mem_gib:.0} GiB RAM, Linux {}",
        kernel.trim()
    )
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

fn latency_table(out: &mut String, rows: &[(String, Quantiles)], duration_s: f64) {
    let _ = writeln!(
        out,
        "| endpoint | requests | per second | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (e, q) in rows {
        let _ = writeln!(
            out,
            "| {e} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} |",
            thousands(q.count as f64),
            q.count as f64 / duration_s.max(1.0),
            q.p50,
            q.p90,
            q.p99,
            q.p999,
            q.max
        );
    }
}

fn surge_section(out: &mut String, r: &SurgeReport, a: &ReportArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.plots).with_context(|| format!("creating {}", a.plots.display()))?;
    let (queue_svg, latency_svg) = (
        format!("{}-queue.svg", a.plot_prefix),
        format!("{}-latency.svg", a.plot_prefix),
    );
    std::fs::write(a.plots.join(&queue_svg), queue_chart(r).render())
        .with_context(|| format!("writing {queue_svg}"))?;
    std::fs::write(a.plots.join(&latency_svg), latency_chart(r).render())
        .with_context(|| format!("writing {latency_svg}"))?;
    let c = &r.config;
    let _ = writeln!(
        out,
        "### Launch surge from one machine (`loadgen surge`)\n\n\
         Arrivals ramp to {} fans/s over {} s, stay there {} s, ramp down over {} s; \
         {} seats ({} per fan), waiting room in fixed mode at {} admitted/min, \
         hold TTL {} s, {} % of fans vanish after holding (their holds must expire and the \
         seats sell again). Login tokens: {}. Fans poll as told by `poll_after_ms`.\n",
        thousands(c["peak_rate"].as_f64().unwrap_or(0.0)),
        c["ramp_s"],
        c["hold_s"],
        c["ramp_down_s"],
        thousands(r.seats as f64),
        c["seats_per_fan"],
        thousands(c["admit_per_minute"].as_f64().unwrap_or(0.0)),
        c["hold_ttl_s"],
        c["vanish"].as_f64().unwrap_or(0.0) * 100.0,
        c["identity"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        out,
        "| target (issue 7) | goal | measured | |\n| --- | --- | --- | --- |"
    );
    target_rows(out, r);
    let _ = writeln!(
        out,
        "\n{} requests in {:.0} s ({:.0}/s through the gateway). Time in queue p50 {:.1} s, \
         p99 {:.1} s; arrival to paid ticket p50 {:.1} s, p99 {:.1} s.\n",
        thousands(r.requests as f64),
        r.duration_s,
        r.requests_per_s,
        r.time_in_queue_s.p50,
        r.time_in_queue_s.p99,
        r.time_to_ticket_s.p50,
        r.time_to_ticket_s.p99
    );
    let rows: Vec<(String, Quantiles)> = crate::surge::ENDPOINTS
        .iter()
        .filter_map(|e| r.latency_ms.get(*e).map(|q| (e.to_string(), q.clone())))
        .collect();
    latency_table(out, &rows, r.duration_s);
    if let Some(line) = join_by_second(&r.timeline, r.config["peak_rate"].as_f64()) {
        let _ = writeln!(out, "\n{line}");
    }
    let k = |n: &str| thousands(r.counters.get(n).copied().unwrap_or(0) as f64);
    let _ = writeln!(
        out,
        "\nFans: {} arrived, {} admitted, {} holds ({} lost a seat race and retried), \
         {} vanished after holding, {} orders, {} paid ({} tickets); told sold out: {} in \
         the queue, {} at the seat map; still waiting when the run ended: {}; errors: {}.\n",
        k("arrivals"),
        k("admitted"),
        k("holds"),
        k("seat_taken"),
        k("vanished"),
        k("orders"),
        k("paid"),
        k("tickets"),
        k("sold_out_queue"),
        k("sold_out_hold"),
        k("still_waiting_at_end"),
        k("errors"),
    );
    if !r.errors_by_kind.is_empty() {
        let list: Vec<String> = r
            .errors_by_kind
            .iter()
            .map(|(k, v)| format!("`{k}` × {v}"))
            .collect();
        let _ = writeln!(out, "Errors by kind: {}.\n", list.join(", "));
    }
    let _ = writeln!(
        out,
        "![queue length and admit rate over time]({h}{queue_svg})\n\n\
         ![latency quantiles per endpoint]({h}{latency_svg})\n",
        h = a.href
    );
    Ok(())
}

/// The k6 runs: thresholds, per-endpoint latency, the scripts' own counters.
fn k6_section(out: &mut String, name: &str, v: &Value) {
    let m = &v["metrics"];
    let Some(metrics) = m.as_object() else {
        return;
    };
    let mut failed = Vec::new();
    for (metric, body) in metrics {
        if let Some(th) = body["thresholds"].as_object() {
            for (expr, crossed) in th {
                if crossed.as_bool() == Some(true) {
                    failed.push(format!("`{metric}: {expr}`"));
                }
            }
        }
    }
    let reqs = m["http_reqs"]["count"].as_f64().unwrap_or(0.0);
    let rate = m["http_reqs"]["rate"].as_f64().unwrap_or(0.0);
    // One script may run in several profiles (`launch-surge-registered`: ACCESS=registered).
    let script = match name.strip_suffix("-registered") {
        Some(base) => format!("`{base}.js` (`ACCESS=registered`)"),
        None => format!("`{name}.js`"),
    };
    let _ = writeln!(
        out,
        "**{script}** — {} requests ({rate:.0}/s), thresholds: {}.\n",
        thousands(reqs),
        if failed.is_empty() {
            "all passed".to_owned()
        } else {
            format!("**crossed** {}", failed.join(", "))
        }
    );
    let _ = writeln!(
        out,
        "| endpoint | requests | p50 ms | p95 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: | ---: | ---: |"
    );
    for (metric, body) in metrics {
        let Some(ep) = metric
            .strip_prefix("http_req_duration{name:")
            .and_then(|s| s.strip_suffix('}'))
        else {
            continue;
        };
        let count = body["count"].as_f64().unwrap_or(0.0);
        if count == 0.0 {
            continue;
        }
        let f = |k: &str| body[k].as_f64().unwrap_or(f64::NAN);
        let _ = writeln!(
            out,
            "| {ep} | {} | {:.2} | {:.2} | {:.2} | {:.1} |",
            thousands(count),
            f("med"),
            f("p(95)"),
            f("p(99)"),
            f("max")
        );
    }
    let counters: Vec<String> = [
        "tickets",
        "orders_paid",
        "orders_created",
        "sold_out",
        "seat_taken",
        "hold_gave_up",
        "bids_accepted",
        "bids_too_low",
        "bids_after_close",
        "bid_replays",
        "abandoned_fans",
        "unexpected_responses",
    ]
    .iter()
    .filter_map(|c| {
        m[*c]["count"]
            .as_f64()
            .map(|n| format!("{c} {}", thousands(n)))
    })
    .collect();
    let trends: Vec<String> = ["time_in_queue", "time_to_ticket", "time_to_order"]
        .iter()
        .filter_map(|t| {
            let b = &m[*t];
            Some(format!(
                "{t} p50 {:.1} s / p95 {:.1} s",
                b["med"].as_f64()? / 1000.0,
                b["p(95)"].as_f64()? / 1000.0
            ))
        })
        .collect();
    let _ = writeln!(
        out,
        "\n{}{}\n",
        counters.join(", "),
        if trends.is_empty() {
            String::new()
        } else {
            format!("; {}", trends.join(", "))
        }
    );
}

fn verify_section(out: &mut String, v: &VerifyReport) {
    let _ = writeln!(
        out,
        "### Invariants after the run (`loadgen verify`, Postgres + payment sandbox)\n\n\
         | check | rows checked | violations |\n| --- | ---: | ---: |"
    );
    for c in &v.checks {
        match &c.skipped {
            Some(why) => {
                let _ = writeln!(out, "| {} | skipped ({why}) | – |", c.name);
            }
            None => {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} |",
                    c.name,
                    thousands(c.checked as f64),
                    if c.violations == 0 {
                        "0".to_owned()
                    } else {
                        format!("**{}** (e.g. {})", c.violations, c.examples.join(", "))
                    }
                );
            }
        }
    }
    let _ = writeln!(out);
}

/// The surge benchmark's section of `docs/benchmarks.md`.
pub fn section(a: &ReportArgs) -> anyhow::Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## {}\n\n\
         Measured {} on {} — gateway, booking, payment sandbox, Postgres, Redis and the load \
         generator all share this machine. `deploy/bench/surge.sh` (via `deploy/stack bench`).{}\n",
        a.title,
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine(),
        if a.quick {
            " **Smoke profile (`--quick`): the numbers are not representative.**"
        } else {
            ""
        }
    );
    match read_json(&a.dir.join("surge.json")) {
        Some(v) => {
            let r: SurgeReport =
                serde_json::from_value(v).context("surge.json has an unexpected shape")?;
            surge_section(&mut out, &r, a)?;
            if let Some(v) = read_json(&a.dir.join("scale.json")) {
                let s: ScaleRun =
                    serde_json::from_value(v).context("scale.json has an unexpected shape")?;
                scale_section(&mut out, &r, &s);
            }
        }
        None => {
            let _ = writeln!(out, "_The loadgen surge did not run or left no results._\n");
        }
    }
    let mut any_k6 = false;
    for name in [
        "launch-surge",
        "launch-surge-registered",
        "hot-auction",
        "flash-sale",
    ] {
        if let Some(v) = read_json(&a.dir.join(format!("k6-{name}.json"))) {
            if !any_k6 {
                let _ = writeln!(
                    out,
                    "### The k6 scripts against the same stack (`deploy/k6`)\n\n\
                     Client-side numbers from k6 itself (a heavier client than loadgen: each \
                     waiting fan is a JavaScript VU); they prove the scripts' flows end to end.\n"
                );
                any_k6 = true;
            }
            k6_section(&mut out, name, &v);
        }
    }
    if let Some(v) = read_json(&a.dir.join("verify.json")) {
        let v: VerifyReport =
            serde_json::from_value(v).context("verify.json has an unexpected shape")?;
        verify_section(&mut out, &v);
    }
    Ok(out)
}

#[derive(Debug, Clone, clap::Args)]
pub struct SummaryArgs {
    /// The benchmark runner's output directory (one sub-directory per benchmark).
    #[arg(long)]
    pub dir: PathBuf,
    /// The document whose top part is (re)written.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub doc: PathBuf,
}

const TOP_BEGIN: &str = "<!-- bench:top -->";
const TOP_END: &str = "<!-- /bench:top -->";

fn command_version(cmd: &str, arg: &str) -> String {
    std::process::Command::new(cmd)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.lines().next().unwrap_or("").trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{cmd} (version unknown)"))
}

/// The top of `docs/benchmarks.md`: machine, how to run, the issue-7 targets as measured by
/// the surge of this run, and issue 16's from the other benchmarks of the same run.
pub fn top(a: &SummaryArgs) -> anyhow::Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Summary\n\n\
         Last full run: {}. **Machine:** {} — the services, Postgres, Redis and the load \
         generators all share it, so every figure includes the cost of generating the load. \
         Postgres: {}; Redis: {}; k6 v1.1.0 (pinned); Rust release profile (`lto = \"fat\"`, \
         one codegen unit).\n\n\
         **How to run.** `deploy/stack bench` runs every `deploy/bench/*.sh` (release build, each \
         benchmark on its own private ports and fresh database) and rewrites its section of this \
         file; `deploy/stack bench surge holds` runs only those; `deploy/stack bench --quick` is \
         the CI smoke profile (a few minutes: every scenario and every k6 script in a small \
         profile, invariants checked, no thresholds on timings, this file left alone). \
         `BENCH_KEEP=dir` keeps the raw results (JSON, logs, timelines). The baselines — \
         redis-benchmark, pgbench, nginx as a plain proxy — are measured in the same run, in \
         the section of the benchmark they belong to.\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine(),
        command_version("psql", "--version"),
        command_version("redis-server", "--version"),
    );
    match read_json(&a.dir.join("surge").join("surge.json")) {
        Some(v) => {
            let r: SurgeReport =
                serde_json::from_value(v).context("surge.json has an unexpected shape")?;
            let _ = writeln!(
                out,
                "**Launch-surge targets (issue 7)**, from the surge section below \
                 ({} fans, {} seats):\n\n| target | goal | measured | |\n| --- | --- | --- | --- |",
                thousands(r.fans as f64),
                thousands(r.seats as f64)
            );
            target_rows(&mut out, &r);
            let _ = writeln!(out);
        }
        None => {
            let _ = writeln!(
                out,
                "_The surge benchmark did not run in the last full run._\n"
            );
        }
    }
    out.push_str(&crate::scoreboard::section(
        &crate::scoreboard::Inputs::read(&a.dir),
    ));
    Ok(out)
}

/// The document with `section` between the top markers: replaced where they exist, else
/// inserted before the first benchmark section (or at the end).
pub fn splice_top(doc: &str, section: &str) -> String {
    let block = format!("{TOP_BEGIN}\n{section}{TOP_END}\n");
    match (doc.find(TOP_BEGIN), doc.find(TOP_END)) {
        (Some(b), Some(e)) if e > b => format!(
            "{}{block}{}",
            &doc[..b],
            doc[e + TOP_END.len()..].trim_start_matches('\n')
        ),
        _ => match doc.find("<!-- bench:") {
            Some(i) => format!("{}{block}\n{}", &doc[..i], &doc[i..]),
            None => format!("{}\n\n{block}", doc.trim_end()),
        },
    }
}

/// Replaces the top part of the document (between its markers), or inserts it right after
/// the document's title paragraph the first time.
pub fn write_top(a: &SummaryArgs) -> anyhow::Result<()> {
    let section = top(a)?;
    let doc = std::fs::read_to_string(&a.doc).unwrap_or_else(|_| {
        "# Benchmarks\n\nRecorded by `deploy/bench/run` (`deploy/stack bench`); each section is\n\
         replaced by the next full run of its script.\n"
            .to_owned()
    });
    let new = splice_top(&doc, &section);
    std::fs::write(&a.doc, new).with_context(|| format!("writing {}", a.doc.display()))
}

#[cfg(test)]
mod tests {
    use super::{join_by_second, splice_top, thousands};
    use crate::surge::Tick;

    fn tick(t: f64, arrivals: f64, join_p99: Option<f64>, holds: f64) -> Tick {
        serde_json::from_value(serde_json::json!({
            "t": t, "arrivals_per_s": arrivals, "queue_length": 0.0, "admitted_per_s": 0.0,
            "admitted_total": 0.0, "admit_rate_per_s": 0.0, "active_admitted": 0.0,
            "holds_per_s": holds, "sold": null, "held": null, "available": null,
            "tickets": 0.0, "errors_per_s": 0.0, "requests_per_s": 0.0, "status_p99_ms": 0.0,
            "join_p99_ms": join_p99, "fans_in_flight": 0.0
        }))
        .expect("a tick")
    }

    #[test]
    fn join_p99_is_summarised_over_the_peak_seconds_only() {
        let timeline = [
            tick(1.0, 100.0, Some(900.0), 0.0), // far below the peak: ignored
            tick(2.0, 4_600.0, Some(12.0), 0.0),
            tick(3.0, 5_000.0, Some(700.0), 180.0),
            tick(4.0, 4_950.0, Some(30.0), 5.0),
            tick(5.0, 4_900.0, None, 0.0), // no join answered: ignored
        ];
        let line = join_by_second(&timeline, None).expect("a summary");
        assert!(line.contains("(3 seconds with"), "{line}");
        assert!(line.contains("90 % of 5,000 arrivals/s"), "{line}");
        assert!(line.contains("2 of them under 50 ms"), "{line}");
        assert!(line.contains("the median second 30.0 ms"), "{line}");
        assert!(
            line.contains("the worst 700.0 ms at t = 3 s (180 holds/s then)"),
            "{line}"
        );
        // A report from before the column (every join_p99_ms missing) has no summary.
        let old: Tick = serde_json::from_str(
            r#"{"t":1,"arrivals_per_s":5000,"queue_length":0,"admitted_per_s":0,
                "admitted_total":0,"admit_rate_per_s":0,"active_admitted":0,"holds_per_s":0,
                "sold":null,"held":null,"available":null,"tickets":0,"errors_per_s":0,
                "requests_per_s":0,"status_p99_ms":1,"fans_in_flight":0}"#,
        )
        .expect("an old tick parses");
        assert!(old.join_p99_ms.is_nan());
        assert_eq!(join_by_second(&[old], Some(5_000.0)), None);
        // The configured peak decides which seconds count: 4,600 is 92 % of 5,000.
        let line = join_by_second(&timeline, Some(5_100.0)).expect("a summary");
        assert!(line.contains("(3 seconds with ≥ 90 % of 5,100"), "{line}");
        let line = join_by_second(&timeline, Some(5_500.0)).expect("a summary");
        assert!(line.contains("(2 seconds with"), "{line}");
    }

    #[test]
    fn top_is_inserted_once_then_replaced_in_place() {
        let doc =
            "# Benchmarks\n\nintro\n\n<!-- bench:holds -->\n## Holds\n<!-- /bench:holds -->\n";
        let once = splice_top(doc, "## Summary\nv1\n");
        assert!(once.starts_with("# Benchmarks\n\nintro\n\n<!-- bench:top -->\n## Summary\nv1\n"));
        assert!(once.find("v1").unwrap() < once.find("## Holds").unwrap());
        let twice = splice_top(&once, "## Summary\nv2\n");
        assert!(twice.contains("v2") && !twice.contains("v1"));
        assert_eq!(twice.matches("<!-- bench:top -->").count(), 1);
        assert!(twice.contains("<!-- bench:holds -->\n## Holds\n<!-- /bench:holds -->"));
        let bare = splice_top("# Benchmarks\n", "S\n");
        assert_eq!(
            bare,
            "# Benchmarks\n\n<!-- bench:top -->\nS\n<!-- /bench:top -->\n"
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(225_000.0), "225,000");
        assert_eq!(thousands(-1_234_567.0), "-1,234,567");
        assert_eq!(thousands(f64::NAN), "–");
    }
}
