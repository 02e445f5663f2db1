//! Floodgate's load generator: the launch-day scenarios from one machine with many
//! concurrent virtual fans (tokio tasks over a pooled HTTP client), HDR latency quantiles,
//! and the invariant checks that decide whether a run passed. Each scenario is a
//! subcommand; `deploy/bench/run` drives them and writes `docs/benchmarks.md`.

mod auctions;
mod conn;
mod holds;
mod orders;
mod report;
mod scoreboard;
mod seatmap;
mod statements;
mod stats;
mod surge;
mod svg;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Floodgate load generator and invariant checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Launch surge through the waiting room: arrivals, queue, admission, hold, order, pay;
    /// a per-second timeline and the invariants at the end.
    Surge(Box<surge::SurgeArgs>),
    /// Check the invariants in Postgres and the payment sandbox; non-zero exit on a violation.
    Verify(verify::VerifyArgs),
    /// The surge benchmark's markdown section and plots, from a run's output directory.
    Report(report::ReportArgs),
    /// The top of docs/benchmarks.md (machine, how to run, issue-7 targets) from a full run.
    Summary(report::SummaryArgs),
    /// Seat (or GA) holds straight against booking as fast as possible: holds/s, p50/p99.
    Holds(holds::HoldsArgs),
    /// Carts and orders straight against booking: cart ops/s, or orders/s on one SKU
    /// (a flash-sale rush when its stock is small).
    Orders(orders::OrdersArgs),
    /// Hundreds of concurrent bidders on one cold or hot auction: bids/s, p50/p99.
    Auctions(auctions::AuctionsArgs),
    /// Postgres statements and round trips per booking operation (pg_stat_statements).
    Statements(statements::StatementsArgs),
    /// Fans refreshing one event's seat map (JSON or compact) while writers change it:
    /// bytes per fetch, p50/p99.
    Seatmap(seatmap::SeatMapArgs),
}

// mimalloc: a surge keeps ~200,000 fan tasks alive and allocates per request; glibc malloc
// (its arena locks and consolidation) was a tenth of the load generator's samples in perf.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Surge(a) => run_surge(*a).await,
        Command::Verify(a) => run_verify(a).await,
        Command::Report(a) => report::section(&a).map(|md| {
            print!("{md}");
            true
        }),
        Command::Summary(a) => report::write_top(&a).map(|()| true),
        Command::Holds(a) => run_holds(a).await,
        Command::Orders(a) => run_orders(a).await,
        Command::Auctions(a) => run_auctions(a).await,
        Command::Statements(a) => run_statements(a).await,
        Command::Seatmap(a) => run_seatmap(a).await,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("loadgen: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the surge, checks the invariants, writes the outputs. `Ok(false)`: a violation.
async fn run_surge(a: surge::SurgeArgs) -> anyhow::Result<bool> {
    let out = a.out.clone();
    let verify_conn = a.verify.clone();
    let no_verify = a.no_verify;
    let mut report = surge::run(a).await?;
    if !no_verify {
        let v = verify::run(&verify::VerifyArgs {
            conn: verify_conn,
            event: Some(report.event.clone()),
            expect_sold_out: vec![],
            json: None,
        })
        .await?;
        v.print();
        report.verify = Some(v);
    }
    surge::write_outputs(&report, &out)?;
    surge::print_summary(&report);
    Ok(report.verify.as_ref().is_none_or(|v| v.ok))
}

async fn run_verify(a: verify::VerifyArgs) -> anyhow::Result<bool> {
    let v = verify::run(&a).await?;
    v.print();
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(path, text)?;
    }
    Ok(v.ok)
}

async fn run_seatmap(a: seatmap::SeatMapArgs) -> anyhow::Result<bool> {
    let json = a.json.clone();
    let report = seatmap::run(a).await?;
    seatmap::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(true)
}

async fn run_holds(a: holds::HoldsArgs) -> anyhow::Result<bool> {
    let json = a.json.clone();
    let report = holds::run(a).await?;
    holds::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(true)
}

async fn run_auctions(a: auctions::AuctionsArgs) -> anyhow::Result<bool> {
    let json = a.json.clone();
    let report = auctions::run(a).await?;
    auctions::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(true)
}

async fn run_orders(a: orders::OrdersArgs) -> anyhow::Result<bool> {
    let json = a.json.clone();
    let report = orders::run(a).await?;
    orders::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(true)
}

async fn run_statements(a: statements::StatementsArgs) -> anyhow::Result<bool> {
    let (json, md) = (a.json.clone(), a.markdown.clone());
    let report = statements::run(a).await?;
    statements::print(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(path) = md {
        std::fs::write(&path, statements::markdown(&report))?;
    }
    Ok(true)
}
