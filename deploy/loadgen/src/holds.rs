//! The `holds` scenario: many concurrent clients hold seats (or GA units) straight against
//! booking, as fast as they can, for a fixed time.
//!
//! Each client loops: pick `--seats` adjacent seats at random from the event's seat map (or
//! ask for `--quantity` units of `--ga-tier`), as a fresh account (so the per-account limit
//! never interferes), mint that account's admission token locally (booking verifies it with
//! the shared key), `POST` the hold, and by default `DELETE` it again so the event never fills
//! up and every attempt meets the same steady state. Hold latency is what is reported; the
//! release is counted separately. The baseline in `deploy/bench/holds.sh` runs the same SQL
//! (hold + release) through `pgbench`. Each client owns one keep-alive connection
//! ([`crate::conn`]) and sends bodies built before the run, so the load generator takes as
//! little as it can of the CPU the service and Postgres share with it.

use crate::conn::{self, Conn};
use crate::stats::{Recorder, Summary, outcome};
use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use hyper::Method;
use rand::Rng;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Args)]
pub struct HoldsArgs {
    /// Booking base URL (direct, not through the gateway).
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking: String,
    /// Event id.
    #[arg(long)]
    pub event: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Run time in seconds.
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// Adjacent seats per hold.
    #[arg(long, default_value_t = 4)]
    pub seats: usize,
    /// Hold GA units of this tier instead of seats.
    #[arg(long)]
    pub ga_tier: Option<String>,
    /// GA units per hold.
    #[arg(long, default_value_t = 1)]
    pub quantity: u32,
    /// Ask booking for the best `--seats` adjacent seats (`best_available`) instead of
    /// picking them from the map.
    #[arg(long)]
    pub best_available: bool,
    /// Keep holds instead of releasing each one (the event fills up).
    #[arg(long)]
    pub keep: bool,
    /// Admission-token signing key shared with booking (`[tokens]`); defaults to the dev key.
    #[arg(long, env = "LOADGEN_TOKEN_SECRET")]
    pub token_secret: Option<String>,
    #[arg(long, default_value = "dev-1")]
    pub token_kid: String,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct HoldsReport {
    pub event: String,
    pub mode: String,
    pub clients: usize,
    pub duration_s: f64,
    /// Successful holds per second.
    pub holds_per_s: f64,
    pub hold: Summary,
    pub release: Option<Summary>,
}

pub async fn run(args: HoldsArgs) -> anyhow::Result<HoldsReport> {
    let mut settings = TokenSettings::default();
    if let Some(secret) = &args.token_secret {
        settings.keys = vec![KeySettings {
            kid: args.token_kid.clone(),
            secret: SecretString::from(secret.clone()),
        }];
        settings.current_kid = args.token_kid.clone();
    }
    let tokens = Arc::new(AdmissionTokens::new(&settings).context("invalid token key")?);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients * 2)
        .timeout(Duration::from_secs(30))
        .build()
        .context("http client")?;
    let windows = match &args.ga_tier {
        Some(_) => Vec::new(),
        None if args.best_available => Vec::new(),
        None => seat_windows(&http, &tokens, &args).await?,
    };
    let bodies = Arc::new(hold_bodies(&args, &windows));
    let run_id = &shared::ids::new_id()[20..];
    let conns = conn::open_all(&args.booking, args.clients).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);
    let mut tasks = Vec::with_capacity(args.clients);
    for (client, conn) in conns.into_iter().enumerate() {
        let (tokens, bodies, args) = (tokens.clone(), bodies.clone(), args.clone());
        let prefix = format!("lg{run_id}-{client}");
        tasks.push(tokio::spawn(async move {
            client_loop(conn, tokens, bodies, args, prefix, deadline).await
        }));
    }
    let mut hold = Recorder::new();
    let mut release = Recorder::new();
    for t in tasks {
        let (h, r) = t.await.context("client task panicked")?;
        hold.merge(&h);
        release.merge(&r);
    }
    let elapsed = started.elapsed();
    let ok = hold.count("201");
    Ok(HoldsReport {
        event: args.event.clone(),
        mode: match &args.ga_tier {
            Some(t) => format!("ga {t} x{}", args.quantity),
            None if args.best_available => format!("best available, {} together", args.seats),
            None => format!("{} adjacent seats", args.seats),
        },
        clients: args.clients,
        duration_s: elapsed.as_secs_f64(),
        holds_per_s: ok as f64 / elapsed.as_secs_f64(),
        hold: hold.summary(elapsed),
        release: (!args.keep).then(|| release.summary(elapsed)),
    })
}

pub fn print(report: &HoldsReport) {
    println!(
        "holds: event {} ({}), {} clients, {:.1} s: {:.0} successful holds/s",
        report.event, report.mode, report.clients, report.duration_s, report.holds_per_s
    );
    report.hold.print("hold");
    if let Some(r) = &report.release {
        r.print("release");
    }
}

/// All runs of `n` adjacent seats (same section and row, consecutive numbers) in the map.
async fn seat_windows(
    http: &reqwest::Client,
    tokens: &AdmissionTokens,
    args: &HoldsArgs,
) -> anyhow::Result<Vec<Vec<String>>> {
    let now = chrono::Utc::now().timestamp();
    let (token, _) = tokens
        .mint("loadgen-map", "loadgen", &args.event, now, 600)
        .context("mint token")?;
    let url = format!("{}/api/events/{}/seats", args.booking, args.event);
    let resp = http
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    let map: serde_json::Value = resp.json().await.context("seat map JSON")?;
    let mut rows: BTreeMap<(String, i64), Vec<(i64, String)>> = BTreeMap::new();
    for s in map["seats"].as_array().context("no seats in map")? {
        let key = (
            s["section"].as_str().unwrap_or_default().to_owned(),
            s["row"].as_i64().unwrap_or_default(),
        );
        rows.entry(key).or_default().push((
            s["number"].as_i64().unwrap_or_default(),
            s["seat_id"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    let mut windows = Vec::new();
    for seats in rows.values_mut() {
        seats.sort();
        for w in seats.windows(args.seats) {
            if w.windows(2).all(|p| p[1].0 == p[0].0 + 1) {
                windows.push(w.iter().map(|(_, id)| id.clone()).collect());
            }
        }
    }
    if windows.is_empty() {
        bail!("no {} adjacent seats in event {}", args.seats, args.event);
    }
    Ok(windows)
}

/// The hold request's body for each window (or the one body of a GA / best-available hold),
/// built once: the loop sends bytes, it does not build JSON.
fn hold_bodies(args: &HoldsArgs, windows: &[Vec<String>]) -> Vec<Bytes> {
    let one = |v: serde_json::Value| Bytes::from(v.to_string());
    match &args.ga_tier {
        Some(tier) => vec![one(
            serde_json::json!({"tier": tier, "quantity": args.quantity}),
        )],
        None if args.best_available => {
            vec![one(
                serde_json::json!({"best_available": {"quantity": args.seats}}),
            )]
        }
        None => windows
            .iter()
            .map(|w| one(serde_json::json!({ "seats": w })))
            .collect(),
    }
}

#[derive(Deserialize)]
struct Held<'a> {
    #[serde(borrow)]
    hold_id: Cow<'a, str>,
}

async fn client_loop(
    mut conn: Conn,
    tokens: Arc<AdmissionTokens>,
    bodies: Arc<Vec<Bytes>>,
    args: HoldsArgs,
    prefix: String,
    deadline: Instant,
) -> (Recorder, Recorder) {
    let mut hold = Recorder::new();
    let mut release = Recorder::new();
    let hold_path = match &args.ga_tier {
        Some(_) => format!("/api/events/{}/ga-holds", args.event),
        None => format!("/api/events/{}/holds", args.event),
    };
    let mut release_path = String::with_capacity(64);
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        n += 1;
        let account = format!("{prefix}-{n}");
        let Some(auth) = conn::fresh_bearer(&tokens, &account, &args.event) else {
            hold.record(Duration::ZERO, "mint failed");
            continue;
        };
        let body = bodies[rand::rng().random_range(0..bodies.len())].clone();
        let t0 = Instant::now();
        let answer = match conn
            .send(Method::POST, &hold_path, &auth, None, Some(body))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                hold.record(t0.elapsed(), "transport error");
                continue;
            }
        };
        hold.record(t0.elapsed(), &outcome(answer.status, &answer.body));
        if answer.status != 201 || args.keep {
            continue;
        }
        let Ok(held) = serde_json::from_slice::<Held>(&answer.body) else {
            continue;
        };
        release_path.clear();
        release_path.push_str("/api/holds/");
        release_path.push_str(&held.hold_id);
        let t1 = Instant::now();
        match conn
            .send(Method::DELETE, &release_path, &auth, None, None)
            .await
        {
            Ok(a) => release.record(t1.elapsed(), &outcome(a.status, &a.body)),
            Err(_) => release.record(t1.elapsed(), "transport error"),
        }
    }
    (hold, release)
}
