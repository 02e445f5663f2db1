//! The `seatmap` scenario: many fans refreshing one event's seat map, as the storefront
//! does, while a few writers hold and release seats so the map keeps changing.
//!
//! Each fan refreshes every `--every-ms` (first refresh at a random phase): `--form json`
//! fetches `GET /api/events/{event}/seats`; `--form compact` fetches the layout once, then
//! `GET .../seats/availability` with `If-None-Match` of the last answer (a `304` when
//! nothing changed). `--gzip` sends `Accept-Encoding: gzip` (bytes are counted as received,
//! compressed). Reported: fetch latency p50/p99, bytes per fetch, `200`/`304` counts. The
//! writers (`--writers`, each hold + release in a loop) only keep the map moving; their
//! numbers are reported for information.

use crate::stats::{Recorder, Summary, outcome};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use rand::Rng;
use secrecy::SecretString;
use serde::Serialize;
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    Json,
    Compact,
}

#[derive(Debug, Clone, Args)]
pub struct SeatMapArgs {
    /// Booking base URL (direct, not through the gateway).
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking: String,
    #[arg(long)]
    pub event: String,
    #[arg(long, value_enum, default_value_t = Form::Compact)]
    pub form: Form,
    /// Ask for gzip.
    #[arg(long)]
    pub gzip: bool,
    /// Concurrent fans.
    #[arg(long, default_value_t = 1000)]
    pub fans: usize,
    /// Each fan's refresh period.
    #[arg(long, default_value_t = 1000)]
    pub every_ms: u64,
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// Clients holding and releasing one random seat in a loop (0 = a still map).
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Seat ids the writers pick from (`S{1..sections}-R{1..rows}-{1..per_row}`).
    #[arg(long, default_value = "30x40x50")]
    pub shape: String,
    #[arg(long, env = "LOADGEN_TOKEN_SECRET")]
    pub token_secret: Option<String>,
    #[arg(long, default_value = "dev-1")]
    pub token_kid: String,
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct SeatMapReport {
    pub event: String,
    pub form: Form,
    pub gzip: bool,
    pub fans: usize,
    pub every_ms: u64,
    pub duration_s: f64,
    /// Bytes of body received per fetch (a `304` counts 0), and the `200`s' average.
    pub bytes_per_fetch: f64,
    pub bytes_per_200: f64,
    /// Bytes of the layout (read once per fan; compact form only).
    pub layout_bytes: u64,
    pub fetch: Summary,
    pub writes: Summary,
}

pub async fn run(args: SeatMapArgs) -> anyhow::Result<SeatMapReport> {
    let mut settings = TokenSettings::default();
    if let Some(secret) = &args.token_secret {
        settings.keys = vec![KeySettings {
            kid: args.token_kid.clone(),
            secret: SecretString::from(secret.clone()),
        }];
        settings.current_kid = args.token_kid.clone();
    }
    let tokens = Arc::new(AdmissionTokens::new(&settings).context("invalid token key")?);
    let shape: Vec<u32> = args
        .shape
        .split('x')
        .map(|n| n.parse().context("--shape is SECTIONSxROWSxPER_ROW"))
        .collect::<anyhow::Result<_>>()?;
    if shape.len() != 3 || shape.contains(&0) {
        bail!("--shape is SECTIONSxROWSxPER_ROW");
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.fans + args.writers)
        .timeout(Duration::from_secs(30))
        .build()
        .context("http client")?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);
    let mut fans = Vec::with_capacity(args.fans);
    for fan in 0..args.fans {
        let (http, tokens, args) = (http.clone(), tokens.clone(), args.clone());
        fans.push(tokio::spawn(async move {
            fan_loop(http, tokens, args, fan, deadline).await
        }));
    }
    let mut writers = Vec::with_capacity(args.writers);
    for w in 0..args.writers {
        let (http, tokens, args, shape) =
            (http.clone(), tokens.clone(), args.clone(), shape.clone());
        writers.push(tokio::spawn(async move {
            writer_loop(http, tokens, args, shape, w, deadline).await
        }));
    }
    let mut fetch = Recorder::new();
    let (mut bytes, mut ok_bytes, mut oks, mut layout_bytes) = (0u64, 0u64, 0u64, 0u64);
    for t in fans {
        let f = t.await.context("fan task panicked")?;
        fetch.merge(&f.rec);
        bytes += f.bytes;
        ok_bytes += f.ok_bytes;
        oks += f.oks;
        layout_bytes = layout_bytes.max(f.layout_bytes);
    }
    let mut writes = Recorder::new();
    for t in writers {
        writes.merge(&t.await.context("writer task panicked")?);
    }
    let elapsed = started.elapsed();
    let fetch = fetch.summary(elapsed);
    Ok(SeatMapReport {
        event: args.event.clone(),
        form: args.form,
        gzip: args.gzip,
        fans: args.fans,
        every_ms: args.every_ms,
        duration_s: elapsed.as_secs_f64(),
        bytes_per_fetch: bytes as f64 / (fetch.requests.max(1) as f64),
        bytes_per_200: ok_bytes as f64 / (oks.max(1) as f64),
        layout_bytes,
        fetch,
        writes: writes.summary(elapsed),
    })
}

pub fn print(r: &SeatMapReport) {
    println!(
        "seatmap: event {} ({:?}{}), {} fans every {} ms, {:.1} s: {:.0} bytes/fetch \
         ({:.0} per 200), layout {} bytes",
        r.event,
        r.form,
        if r.gzip { ", gzip" } else { "" },
        r.fans,
        r.every_ms,
        r.duration_s,
        r.bytes_per_fetch,
        r.bytes_per_200,
        r.layout_bytes
    );
    r.fetch.print("fetch");
    r.writes.print("writes");
}

struct FanResult {
    rec: Recorder,
    bytes: u64,
    ok_bytes: u64,
    oks: u64,
    layout_bytes: u64,
}

async fn get(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    gzip: bool,
    etag: Option<&str>,
) -> Result<(u16, Option<String>, axum::body::Bytes), ()> {
    let mut req = http.get(url).bearer_auth(token);
    if gzip {
        req = req.header("Accept-Encoding", "gzip");
    }
    if let Some(tag) = etag {
        req = req.header("If-None-Match", tag);
    }
    let resp = req.send().await.map_err(drop)?;
    let status = resp.status().as_u16();
    let tag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.bytes().await.map_err(drop)?;
    Ok((status, tag, body))
}

async fn fan_loop(
    http: reqwest::Client,
    tokens: Arc<AdmissionTokens>,
    args: SeatMapArgs,
    fan: usize,
    deadline: Instant,
) -> FanResult {
    let mut out = FanResult {
        rec: Recorder::new(),
        bytes: 0,
        ok_bytes: 0,
        oks: 0,
        layout_bytes: 0,
    };
    let account = format!("fan-{fan}");
    let now = chrono::Utc::now().timestamp();
    let Ok((token, _)) = tokens.mint(&account, &account, &args.event, now, 3600) else {
        out.rec.record(Duration::ZERO, "mint failed");
        return out;
    };
    let base = format!("{}/api/events/{}/seats", args.booking, args.event);
    let url = match args.form {
        Form::Json => base.clone(),
        Form::Compact => format!("{base}/availability"),
    };
    let every = Duration::from_millis(args.every_ms.max(1));
    let phase = rand::rng().random_range(0..args.every_ms.max(1));
    let mut next = Instant::now() + Duration::from_millis(phase);
    if args.form == Form::Compact {
        if let Ok((200, _, body)) =
            get(&http, &format!("{base}/layout"), &token, args.gzip, None).await
        {
            out.layout_bytes = body.len() as u64;
        } else {
            out.rec.record(Duration::ZERO, "layout failed");
            return out;
        }
    }
    let mut etag: Option<String> = None;
    while next < deadline {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let t0 = Instant::now();
        let cond = if args.form == Form::Compact {
            etag.as_deref()
        } else {
            None
        };
        match get(&http, &url, &token, args.gzip, cond).await {
            Ok((status, tag, body)) => {
                out.rec.record(t0.elapsed(), &outcome(status, &body));
                out.bytes += body.len() as u64;
                if status == 200 {
                    out.oks += 1;
                    out.ok_bytes += body.len() as u64;
                    etag = tag;
                }
            }
            Err(()) => out.rec.record(t0.elapsed(), "transport error"),
        }
    }
    out
}

async fn writer_loop(
    http: reqwest::Client,
    tokens: Arc<AdmissionTokens>,
    args: SeatMapArgs,
    shape: Vec<u32>,
    w: usize,
    deadline: Instant,
) -> Recorder {
    let mut rec = Recorder::new();
    let url = format!("{}/api/events/{}/holds", args.booking, args.event);
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let account = format!("writer-{w}-{n}");
        let now = chrono::Utc::now().timestamp();
        let Ok((token, _)) = tokens.mint(&account, &account, &args.event, now, 600) else {
            rec.record(Duration::ZERO, "mint failed");
            continue;
        };
        let seat = {
            let mut r = rand::rng();
            format!(
                "S{}-R{}-{}",
                r.random_range(1..=shape[0]),
                r.random_range(1..=shape[1]),
                r.random_range(1..=shape[2])
            )
        };
        let t0 = Instant::now();
        let resp = http
            .post(&url)
            .bearer_auth(&token)
            .json(&serde_json::json!({ "seats": [seat] }))
            .send()
            .await;
        let Ok(resp) = resp else {
            rec.record(t0.elapsed(), "transport error");
            continue;
        };
        let status = resp.status().as_u16();
        let body = resp.bytes().await.unwrap_or_default();
        rec.record(t0.elapsed(), &outcome(status, &body));
        let hold = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["hold_id"].as_str().map(str::to_owned));
        if let Some(hold) = hold {
            let _ = http
                .delete(format!("{}/api/holds/{hold}", args.booking))
                .bearer_auth(&token)
                .send()
                .await;
        }
        // A slow writer: the map changes a few times a second, as in a busy sale.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rec
}
