//! The `auctions` scenario: hundreds of concurrent bidders on ONE auction (cold or hot),
//! straight against booking, for a fixed time.
//!
//! The scenario creates the auction itself (seller `loadgen-seller`, in `--event`, which
//! booking must know: `deploy/bench/auctions.sh` creates it), then every client
//! loops: take the highest price any client has seen (from the answers: a `201` means the
//! amount was accepted, a `409 BID_TOO_LOW` carries the minimum next bid), bid the
//! minimum next amount plus a small random step, as a fresh bidder account per bid (so the
//! per-bidder rate limit never throttles the measurement) with a fresh Idempotency-Key.
//! Most bids race and lose; that is the point: every request is a real decision on one
//! contended auction. Reported: accepted bids/s, decided requests/s (201 + 409), latency
//! quantiles over all bid requests, and the final price for the invariant check that
//! `deploy/bench/auctions.sh` runs in Postgres.

use crate::conn::{self, Conn};
use crate::stats::{Recorder, Summary, outcome};
use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use hyper::Method;
use hyper::header::HeaderValue;
use rand::Rng;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Args)]
pub struct AuctionsArgs {
    /// Booking base URL (direct, not through the gateway).
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking: String,
    /// Make the auction hot (decided in Redis).
    #[arg(long)]
    pub hot: bool,
    /// Concurrent bidders.
    #[arg(long, default_value_t = 256)]
    pub clients: usize,
    /// Run time in seconds.
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// Start price and increment (minor units).
    #[arg(long, default_value_t = 1000)]
    pub start_price: i64,
    #[arg(long, default_value_t = 10)]
    pub min_increment: i64,
    /// The auction's event (it must exist in booking), and the `evt` claim of every minted
    /// admission token: booking takes bids only with an admission of the auction's event.
    #[arg(long, default_value = "auction-day")]
    pub event: String,
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
pub struct AuctionsReport {
    pub auction: String,
    pub hot: bool,
    pub clients: usize,
    pub duration_s: f64,
    /// Accepted bids per second.
    pub accepted_per_s: f64,
    pub accepted: u64,
    /// Requests answered with a decision (201 or 409) per second.
    pub decided_per_s: f64,
    /// The highest amount any client saw accepted.
    pub highest_accepted: i64,
    pub bid: Summary,
}

pub async fn run(args: AuctionsArgs) -> anyhow::Result<AuctionsReport> {
    let mut settings = TokenSettings::default();
    if let Some(secret) = &args.token_secret {
        settings.keys = vec![KeySettings {
            kid: args.token_kid.clone(),
            secret: SecretString::from(secret.clone()),
        }];
        settings.current_kid = args.token_kid.clone();
    }
    let tokens = Arc::new(AdmissionTokens::new(&settings).context("invalid token key")?);
    // reqwest only for creating the auction; the bids go over one kept connection per
    // bidder (crate::conn), whose CPU per request is a fraction of reqwest's on these cores.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("http client")?;
    let auction = create_auction(&http, &tokens, &args).await?;
    let floor = Arc::new(AtomicI64::new(args.start_price));
    let highest = Arc::new(AtomicI64::new(0));
    let run_id = &shared::ids::new_id()[20..];
    let conns = conn::open_all(&args.booking, args.clients).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);
    let mut tasks = Vec::with_capacity(args.clients);
    for (client, conn) in conns.into_iter().enumerate() {
        let (tokens, args, auction) = (tokens.clone(), args.clone(), auction.clone());
        let (floor, highest) = (floor.clone(), highest.clone());
        let prefix = format!("lg{run_id}-{client}");
        tasks.push(tokio::spawn(async move {
            client_loop(
                conn, tokens, args, auction, prefix, floor, highest, deadline,
            )
            .await
        }));
    }
    let mut rec = Recorder::new();
    for t in tasks {
        rec.merge(&t.await.context("client task panicked")?);
    }
    let elapsed = started.elapsed();
    let accepted = rec.count("201");
    let decided = accepted + rec.count("409 BID_TOO_LOW");
    Ok(AuctionsReport {
        auction,
        hot: args.hot,
        clients: args.clients,
        duration_s: elapsed.as_secs_f64(),
        accepted_per_s: accepted as f64 / elapsed.as_secs_f64(),
        accepted,
        decided_per_s: decided as f64 / elapsed.as_secs_f64(),
        highest_accepted: highest.load(Ordering::Relaxed),
        bid: rec.summary(elapsed),
    })
}

pub fn print(r: &AuctionsReport) {
    println!(
        "auctions: {} auction {}, {} bidders, {:.1} s: {:.0} accepted bids/s ({} accepted), {:.0} decided bids/s, highest {}",
        if r.hot { "hot" } else { "cold" },
        r.auction,
        r.clients,
        r.duration_s,
        r.accepted_per_s,
        r.accepted,
        r.decided_per_s,
        r.highest_accepted
    );
    r.bid.print("bid");
}

async fn create_auction(
    http: &reqwest::Client,
    tokens: &AdmissionTokens,
    args: &AuctionsArgs,
) -> anyhow::Result<String> {
    let now = chrono::Utc::now();
    let (token, _) = tokens
        .mint(
            "loadgen-seller",
            "loadgen",
            &args.event,
            now.timestamp(),
            600,
        )
        .context("mint token")?;
    let end = now + chrono::Duration::seconds(args.duration_s as i64 + 3600);
    let body = serde_json::json!({
        "event": args.event,
        "title": format!("loadgen {} auction", if args.hot { "hot" } else { "cold" }),
        "start_price": args.start_price,
        "min_increment": args.min_increment,
        "end_time": end.to_rfc3339(),
        "hot": args.hot,
    });
    let url = format!("{}/api/auctions", args.booking);
    let resp = http
        .post(&url)
        .bearer_auth(token)
        .header("Idempotency-Key", shared::ids::new_id())
        .json(&body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let v: serde_json::Value = resp.json().await.context("auction JSON")?;
    if status.as_u16() != 201 {
        bail!("creating the auction: {status} {v}");
    }
    v["id"]
        .as_str()
        .map(str::to_owned)
        .context("no id in created auction")
}

/// The one field of a `409 BID_TOO_LOW` answer a bidder acts on.
#[derive(Deserialize)]
struct TooLow {
    min_next_bid: Option<i64>,
}

#[expect(
    clippy::too_many_arguments,
    reason = "one task's whole context, passed once at spawn"
)]
async fn client_loop(
    mut conn: Conn,
    tokens: Arc<AdmissionTokens>,
    args: AuctionsArgs,
    auction: String,
    prefix: String,
    floor: Arc<AtomicI64>,
    highest: Arc<AtomicI64>,
    deadline: Instant,
) -> Recorder {
    let mut rec = Recorder::new();
    let path = format!("/api/auctions/{auction}/bids");
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        n += 1;
        let bidder = format!("{prefix}-{n}");
        let Some(auth) = conn::fresh_bearer(&tokens, &bidder, &args.event) else {
            rec.record(Duration::ZERO, "mint failed");
            continue;
        };
        let step = rand::rng().random_range(0..4) * args.min_increment;
        let amount = floor.load(Ordering::Relaxed) + step;
        let body = Bytes::from(format!("{{\"amount\":{amount}}}"));
        let key = HeaderValue::from(n);
        let t0 = Instant::now();
        let answer = match conn
            .send(Method::POST, &path, &auth, Some(key), Some(body))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                rec.record(t0.elapsed(), "transport error");
                continue;
            }
        };
        rec.record(t0.elapsed(), &outcome(answer.status, &answer.body));
        let next = match answer.status {
            201 => {
                highest.fetch_max(amount, Ordering::Relaxed);
                Some(amount + args.min_increment)
            }
            409 => serde_json::from_slice::<TooLow>(&answer.body)
                .ok()
                .and_then(|t| t.min_next_bid),
            _ => None,
        };
        if let Some(next) = next {
            floor.fetch_max(next, Ordering::Relaxed);
        }
    }
    rec
}
