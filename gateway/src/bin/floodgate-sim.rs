//! `floodgate-sim`: a launch dry run. Replays an arrival curve against a room config with the
//! gateway's own admission logic in simulated time and prints what the launch will look like
//! and what it needs (docs/operations.md, "Sizing a launch with the simulator").

use anyhow::{Context, bail};
use clap::Parser;
use gateway::GatewaySettings;
use gateway::sim::{self, SimInput, arrivals, buyers::BuyerParams, costs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Debug, Parser)]
#[command(
    name = "floodgate-sim",
    about = "Launch dry run: replay an arrival curve against a room config with the gateway's admission logic",
    after_help = "Per-operation defaults were measured on the project's 2-core benchmark box \
(docs/benchmarks.md, section bench:gateway, 2026-12-01); replace them with measurements of \
the production hardware. Outputs (with --out): summary.json, report.html, timeline.csv."
)]
struct Args {
    /// Arrival curve: `ramp[:peak=5000,ramp=30,hold=10,down=30]` (the surge bench),
    /// `seed[:fans=2000000,duration=600,presale=120,presale_share=0.25,tau=90]` (an on-sale:
    /// a quarter of the fans in the two minutes before the start, then a decaying rush),
    /// `flat[:rate=1000,duration=60]`.
    #[arg(long, default_value = "seed", conflicts_with = "arrivals_csv")]
    arrivals: String,
    /// `second,arrivals` CSV instead of a shape (header, blank lines and `#` comments allowed).
    #[arg(long, value_name = "FILE")]
    arrivals_csv: Option<PathBuf>,

    /// Room config JSON as `PUT /admin/events/{event}/config` takes it, validated the same way.
    /// Without it the room is built from the flags below.
    #[arg(long, value_name = "FILE")]
    room: Option<PathBuf>,
    /// Without --room: admitted fans per minute.
    #[arg(long, default_value_t = 6000, conflicts_with = "room")]
    admit_per_minute: i64,
    /// Without --room: cap on fans holding an admission (0 = none).
    #[arg(long, default_value_t = 0, conflicts_with = "room")]
    max_active: i64,
    /// Without --room: queue | paused | passthrough | closed | safety_net.
    #[arg(long, default_value = "queue", conflicts_with = "room")]
    mode: String,
    /// Without --room, with --mode safety_net: the net's arrivals per minute.
    #[arg(long, conflicts_with = "room")]
    safety_net_arrivals_per_minute: Option<i64>,
    /// Without --room: claim deadline (default: the gateway's default_claim_deadline_s).
    #[arg(long, conflicts_with = "room")]
    claim_deadline_s: Option<i64>,
    /// Without --room: admission token TTL (default: the gateway's tokens.default_ttl_s).
    #[arg(long, conflicts_with = "room")]
    token_ttl_s: Option<i64>,
    /// Where the sale starts on the curve's axis, seconds (negative: open before the first
    /// arrival). Default: the shape's (seed: its presale; others 0), or the room's sale_start
    /// placed by --curve-start.
    #[arg(long, allow_hyphen_values = true)]
    sale_start_s: Option<f64>,
    /// Wall-clock time (RFC 3339) of the curve's second 0: places the room's sale_start.
    #[arg(long, requires = "room")]
    curve_start: Option<String>,

    /// Seats on sale (0: no inventory; admitted fans claim and leave).
    #[arg(long, default_value_t = 0)]
    seats: u64,
    /// Seats each fan holds and buys (loadgen surge: 2).
    #[arg(long, default_value_t = 2)]
    seats_per_fan: u64,
    /// Share of fans who vanish after holding (loadgen surge: 0.1).
    #[arg(long, default_value_t = 0.1)]
    vanish: f64,
    /// Share of admitted fans who never claim (closed the tab while waiting).
    #[arg(long, default_value_t = 0.0)]
    no_show: f64,
    /// Upper bound of the uniform pause before each buyer step, ms (loadgen surge: 200).
    #[arg(long, default_value_t = 200)]
    think_ms: u64,
    /// Duration of one booking call (hold, order, pay), ms (surge bench p50: 23/28/47 ms).
    #[arg(long, default_value_t = 30)]
    booking_ms: u64,
    /// The event's hold TTL, s (deploy/demo-event.json: 600; the surge bench: 20).
    #[arg(long, default_value_t = 600)]
    hold_ttl_s: u64,
    /// How often a fan finding no free seat (but seats held) looks again, ms (loadgen surge:
    /// 1000; the storefront, static/shop.js: 4000, 8000 for maps over 20,000 seats).
    #[arg(long, default_value_t = 1000)]
    look_every_ms: u64,
    /// From the last seat sold to the sold-out flag, ms (the surge bench samples booking every
    /// second and then sets it: half a second on average).
    #[arg(long, default_value_t = 500)]
    sold_out_flag_delay_ms: i64,

    /// Admission tick interval (the gateway's default).
    #[arg(long, default_value_t = GatewaySettings::default().tick_ms)]
    tick_ms: u64,
    #[arg(long, default_value_t = GatewaySettings::default().passthrough_batch)]
    passthrough_batch: u64,
    /// Live-config refresh interval (each instance reads the config this often).
    #[arg(long, default_value_t = GatewaySettings::default().refresh_ms)]
    refresh_ms: u64,
    #[arg(long, default_value_t = GatewaySettings::default().session_slack_s)]
    session_slack_s: u64,

    /// Joins/s one gateway process answers (bench:gateway "join through the gateway").
    #[arg(long, default_value_t = costs::GW_JOINS_PER_S)]
    gw_joins_per_s: f64,
    /// Status polls/s from memory one gateway process answers (bench:gateway "Status polls
    /// from memory", gateway-status-mem-1x2).
    #[arg(long, default_value_t = costs::GW_STATUS_MEMORY_PER_S)]
    gw_status_per_s: f64,
    /// Claiming status polls/s one gateway process answers (bench:gateway "status poll
    /// through the gateway").
    #[arg(long, default_value_t = costs::GW_STATUS_PER_S)]
    gw_claims_per_s: f64,
    /// Admitted API requests/s one gateway process proxies (bench:gateway
    /// "gateway-proxy-1x2-1").
    #[arg(long, default_value_t = costs::GW_PROXIED_PER_S)]
    gw_proxied_per_s: f64,
    /// Script calls/s one Redis shard answers (bench:gateway "redis-benchmark: EVALSHA join
    /// script").
    #[arg(long, default_value_t = costs::REDIS_CALLS_PER_S)]
    redis_calls_per_s: f64,
    /// Size machines to run at this share of their measured peak.
    #[arg(long, default_value_t = costs::TARGET_UTILIZATION)]
    target_utilization: f64,
    /// Sub-queues the event's queue is split over (queue_shards).
    #[arg(long, default_value_t = 1)]
    queue_shards: u64,
    /// Gateway instances making per-instance Redis reads (default: the number needed).
    #[arg(long)]
    gateways: Option<u64>,

    /// Random seed (draw order, think times, who vanishes).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop this long after the sell-out (default: when nothing is left to happen).
    #[arg(long)]
    stop_after_sold_out_s: Option<f64>,
    /// Give up after this much simulated time.
    #[arg(long, default_value_t = 6.0 * 3600.0)]
    max_duration_s: f64,
    /// Directory for summary.json, report.html and timeline.csv.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Exit with status 3 when an invariant is broken (admission over rate·W + burst, over
    /// max_active, before the sale start, a negative wait, or no sell-out although demand
    /// exceeds the seats).
    #[arg(long)]
    check: bool,
}

fn ms(s: f64, what: &str) -> anyhow::Result<i64> {
    if !s.is_finite() || s.abs() > 1e9 {
        bail!("{what}: {s} is not a usable number of seconds");
    }
    Ok((s * 1000.0).round() as i64)
}

fn share(v: f64, what: &str) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&v) {
        bail!("{what} must be between 0 and 1, not {v}");
    }
    Ok(v)
}

fn input(a: &Args) -> anyhow::Result<SimInput> {
    let curve = match &a.arrivals_csv {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("failed to read {}", path.display()))?;
            arrivals::csv(&text, &path.display().to_string())?
        }
        None => arrivals::shape(&a.arrivals)?,
    };
    let gw = GatewaySettings::default();
    let default_ttl = shared::config::TokenSettings::default().default_ttl_s;
    let room_json = match &a.room {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("failed to read {}", path.display()))?,
        None => serde_json::json!({
            // Only its place on the curve matters, set below.
            "sale_start": "2030-01-01T00:00:00Z",
            "admit_per_minute": a.admit_per_minute,
            "max_active": a.max_active,
            "mode": a.mode,
            "claim_deadline_s": a.claim_deadline_s,
            "token_ttl_s": a.token_ttl_s,
            "safety_net": a.safety_net_arrivals_per_minute
                .map(|n| serde_json::json!({"arrivals_per_minute": n})),
        })
        .to_string(),
    };
    let room = sim::parse_room(&room_json, default_ttl, gw.default_claim_deadline_s)
        .map_err(anyhow::Error::msg)
        .with_context(|| {
            a.room
                .as_ref()
                .map_or("room flags".into(), |p| p.display().to_string())
        })?;
    let sale_start_ms = match (a.sale_start_s, &a.curve_start) {
        (Some(s), _) => ms(s, "--sale-start-s")?,
        (None, Some(c)) => {
            let origin = chrono::DateTime::parse_from_rfc3339(c)
                .with_context(|| format!("--curve-start {c:?} is not an RFC 3339 time"))?;
            (room.sale_start - origin.with_timezone(&chrono::Utc)).num_milliseconds()
        }
        (None, None) => ms(curve.sale_start_s, "the curve's sale start")?,
    };
    if a.seats_per_fan == 0 {
        bail!("--seats-per-fan must be at least 1");
    }
    if !(a.target_utilization > 0.0 && a.target_utilization <= 1.0) {
        bail!("--target-utilization must be in (0, 1]");
    }
    for (v, what) in [
        (a.gw_joins_per_s, "--gw-joins-per-s"),
        (a.gw_status_per_s, "--gw-status-per-s"),
        (a.gw_claims_per_s, "--gw-claims-per-s"),
        (a.gw_proxied_per_s, "--gw-proxied-per-s"),
        (a.redis_calls_per_s, "--redis-calls-per-s"),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{what} must be a positive number, not {v}");
        }
    }
    let input = SimInput {
        curve,
        sale_start_ms,
        tick_ms: a.tick_ms.max(10),
        passthrough_batch: a.passthrough_batch,
        buyers: BuyerParams {
            seats: a.seats,
            seats_per_fan: a.seats_per_fan,
            vanish: share(a.vanish, "--vanish")?,
            no_show: share(a.no_show, "--no-show")?,
            think_ms: a.think_ms,
            booking_ms: a.booking_ms,
            hold_ttl_s: a.hold_ttl_s,
            look_every_ms: a.look_every_ms.max(1),
            seat_wait_extra_ms: 15_000,
            token_ttl_s: room.token_ttl_s,
            session_slack_s: a.session_slack_s,
            max_session_s: room.max_session_s,
        },
        sold_out_flag_delay_ms: a.sold_out_flag_delay_ms.max(0),
        stop_after_sold_out_ms: a
            .stop_after_sold_out_s
            .map(|s| ms(s, "--stop-after-sold-out-s"))
            .transpose()?,
        max_duration_ms: ms(a.max_duration_s, "--max-duration-s")?,
        seed: a.seed,
        room,
    };
    Ok(input)
}

fn violations(s: &sim::Summary) -> Vec<String> {
    let c = &s.checks.invariants;
    let mut v = Vec::new();
    if !c.admission_within_rate {
        v.push(format!(
            "admitted {:.2} more than rate·W + burst ({:.2}) in some window",
            c.max_window_excess - c.burst,
            c.burst
        ));
    }
    if !c.within_max_active {
        v.push(format!(
            "{} fans held an admission, over max_active",
            c.peak_holding
        ));
    }
    if c.admitted_before_sale_start > 0 {
        v.push(format!(
            "{} admitted before the sale start",
            c.admitted_before_sale_start
        ));
    }
    if c.min_wait_s.is_some_and(|w| w < 0.0) {
        v.push("a negative wait".into());
    }
    let can_sell =
        ["queue", "passthrough", "safety_net"].contains(&s.room["mode"].as_str().unwrap_or(""));
    if can_sell
        && s.checks.seats > 0
        && s.checks.demand_seats > s.checks.seats
        && s.sold_out_at_s.is_none()
    {
        v.push(format!(
            "demand of {} seats for {} but no sell-out",
            s.checks.demand_seats, s.checks.seats
        ));
    }
    v
}

/// Exit status: 0 done, 2 bad input or I/O (one line on stderr), 3 an invariant broken
/// (with `--check`).
fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("floodgate-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let input = input(args)?;
    let c = costs::Costs {
        gw_joins_per_s: args.gw_joins_per_s,
        gw_status_memory_per_s: args.gw_status_per_s,
        gw_claims_per_s: args.gw_claims_per_s,
        gw_proxied_per_s: args.gw_proxied_per_s,
        redis_calls_per_s: args.redis_calls_per_s,
        target_utilization: args.target_utilization,
        queue_shards: args.queue_shards.max(1),
        gateways: args.gateways,
        tick_ms: input.tick_ms,
        refresh_ms: args.refresh_ms,
    };
    let started = Instant::now();
    let (mut summary, timeline) = sim::run(&input, &c);
    summary.wall_ms = started.elapsed().as_millis() as u64;
    print!("{}", sim::report::text(&summary));
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
        let write = |name: &str, body: String| {
            let path = dir.join(name);
            std::fs::write(&path, body)
                .with_context(|| format!("failed to write {}", path.display()))
        };
        write(
            "summary.json",
            serde_json::to_string_pretty(&summary).context("failed to serialise the summary")?,
        )?;
        write("report.html", sim::report::html(&summary, &timeline))?;
        write("timeline.csv", timeline.csv())?;
        println!(
            "  wrote summary.json, report.html and timeline.csv to {}",
            dir.display()
        );
    }
    let broken = violations(&summary);
    for v in &broken {
        eprintln!("floodgate-sim: invariant violated: {v}");
    }
    if args.check && !broken.is_empty() {
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
