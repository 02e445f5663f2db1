//! `loadgen surge`: a launch-day surge from one machine. Thousands of virtual fans (one tokio
//! task each, sharing one pooled HTTP client) arrive at a ramping rate, wait in the gateway's
//! waiting room polling as told by `poll_after_ms`, and once admitted pick seats, hold, order
//! and pay; some vanish after holding (their holds must expire and the seats sell again).
//!
//! What it reports: throughput and HDR latency quantiles per endpoint, fan-level times
//! (time in queue, time to ticket), and a per-second timeline of queue length, admit rate,
//! active admitted, holds/s, sold seats and errors/s, read from the gateway's own `/metrics`
//! and booking's admin API. After the run it checks the invariants ([`crate::verify`]) and
//! fails (non-zero exit) on any violation.
//!
//! Latency is measured from the moment a fan *wants* to send (before waiting for a free
//! connection slot), so a saturated client or server shows up as latency rather than as a
//! silently lower request rate (no coordinated omission).

use crate::svg::{Axis, BarChart, LineChart, Series};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HeaderValue, RETRY_AFTER};
use hyper::{Request, Uri};
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use reqwest::{Client, Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::promtext;
use tokio::sync::Semaphore;

#[derive(Debug, Clone, clap::Args)]
pub struct SurgeArgs {
    /// The gateways' public listeners, comma-separated. Each fan is pinned to one (round
    /// robin, as a load balancer would) and moves to the next when its gateway stops
    /// answering (the process-kill profile of `deploy/bench/surge-scale.sh`).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    pub base_url: Vec<String>,
    /// The gateways' admin listeners, comma-separated: the timeline sums and merges their
    /// `/metrics`.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8081")]
    pub gateway_admin_url: Vec<String>,
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking_admin_url: String,
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: String,
    /// HS256 identity key: fans' login tokens are minted locally (the site's login is not
    /// what is being measured). Without it every fan calls `POST /dev/login`.
    #[arg(long, env = "FLOODGATE_IDENTITY__KEY", hide_env_values = true)]
    pub identity_key: Option<String>,
    #[arg(long, default_value = "floodgate-dev-login")]
    pub identity_issuer: String,
    /// Event slug; default `surge-<unix time>` (a fresh event per run).
    #[arg(long)]
    pub event: Option<String>,
    /// Seats of the event created for the run.
    #[arg(long, default_value_t = 20_000)]
    pub seats: u32,
    #[arg(long, default_value_t = 2)]
    pub seats_per_fan: usize,
    /// Arrivals per second at the peak, and the shape: up over `ramp_s`, flat for
    /// `hold_s`, down to zero over `ramp_down_s`.
    #[arg(long, default_value_t = 5_000.0)]
    pub peak_rate: f64,
    #[arg(long, default_value_t = 20.0)]
    pub ramp_s: f64,
    #[arg(long, default_value_t = 30.0)]
    pub hold_s: f64,
    #[arg(long, default_value_t = 10.0)]
    pub ramp_down_s: f64,
    /// The waiting room's configured admit rate (fixed mode).
    #[arg(long, default_value_t = 12_000)]
    pub admit_per_minute: u64,
    /// Cap on concurrently admitted fans (0 = none).
    #[arg(long, default_value_t = 0)]
    pub max_active: u64,
    /// Sub-queues the event's waiting room is split over (`queue_shards`; 1 = one queue).
    #[arg(long, default_value_t = 1)]
    pub queue_shards: u32,
    /// Hold TTL of the event (short, so vanished fans' seats come back during the run).
    #[arg(long, default_value_t = 20)]
    pub hold_ttl_s: u32,
    /// Share of fans who vanish after holding (never order): their holds must expire.
    #[arg(long, default_value_t = 0.1)]
    pub vanish: f64,
    /// Upper bound of the random pause between a fan's steps once admitted.
    #[arg(long, default_value_t = 200)]
    pub think_ms: u64,
    /// Requests in flight at once (sockets); fans beyond it wait, and that wait counts as
    /// latency.
    #[arg(long, default_value_t = 4_000)]
    pub max_in_flight: usize,
    /// Give up (and report) after this long.
    #[arg(long, default_value_t = 540)]
    pub max_duration_s: u64,
    /// After the event sells out, keep running this long so the queue drains on the
    /// sold-out flag (shown in the timeline).
    #[arg(long, default_value_t = 35)]
    pub drain_s: u64,
    /// Where results go (JSON summary, timeline CSV, SVG plots).
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Skip the invariant check (not recommended; `deploy/bench/run` never does).
    #[arg(long)]
    pub no_verify: bool,
    #[command(flatten)]
    pub verify: crate::verify::VerifyConn,
}

/// Endpoints whose latency is recorded, in report order.
pub const ENDPOINTS: [&str; 7] = ["login", "join", "status", "seats", "hold", "order", "pay"];
const JOIN: usize = 1;
const STATUS: usize = 2;

/// One HDR histogram per endpoint (microseconds), plus fan-level times (milliseconds).
pub struct Latencies {
    by_endpoint: Vec<Mutex<Histogram<u64>>>,
    /// Status and join latency of the current second (the timeline's p99 columns); swapped
    /// out each tick.
    status_window: Mutex<Histogram<u64>>,
    join_window: Mutex<Histogram<u64>>,
    pub time_in_queue_ms: Mutex<Histogram<u64>>,
    pub time_to_ticket_ms: Mutex<Histogram<u64>>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 10 min at 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Latencies {
    fn new() -> Self {
        Self {
            by_endpoint: ENDPOINTS.iter().map(|_| Mutex::new(hist())).collect(),
            status_window: Mutex::new(hist()),
            join_window: Mutex::new(hist()),
            time_in_queue_ms: Mutex::new(hist()),
            time_to_ticket_ms: Mutex::new(hist()),
        }
    }

    fn record(&self, endpoint: usize, d: Duration) {
        let us = (d.as_micros() as u64).max(1);
        let _ = lock(&self.by_endpoint[endpoint]).record(us);
        let window = match endpoint {
            STATUS => &self.status_window,
            JOIN => &self.join_window,
            _ => return,
        };
        let _ = lock(window).record(us);
    }

    /// This second's (status, join) latencies; the next second starts empty.
    fn take_windows(&self) -> (Histogram<u64>, Histogram<u64>) {
        (
            std::mem::replace(&mut *lock(&self.status_window), hist()),
            std::mem::replace(&mut *lock(&self.join_window), hist()),
        )
    }

    pub fn endpoint(&self, name: &str) -> Option<Histogram<u64>> {
        let i = ENDPOINTS.iter().position(|e| *e == name)?;
        Some(lock(&self.by_endpoint[i]).clone())
    }
}

/// JSON has no NaN: serde_json writes it as `null`. Reading a report back maps `null` to NaN
/// again ("no sample"), so a second that lacked a booking answer does not break the report.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// A missing column in an older report: no sample.
fn nan() -> f64 {
    f64::NAN
}

/// A window's p99 in milliseconds, `empty` when it holds no sample.
fn p99_ms(h: &Histogram<u64>, empty: f64) -> f64 {
    if h.is_empty() {
        empty
    } else {
        h.value_at_quantile(0.99) as f64 / 1000.0
    }
}

/// Quantile summary of one histogram (in the histogram's unit converted by `scale`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Quantiles {
    pub count: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p90: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p999: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
}

impl Quantiles {
    pub fn of(h: &Histogram<u64>, scale: f64) -> Self {
        let q = |x: f64| h.value_at_quantile(x) as f64 / scale;
        Self {
            count: h.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64 / scale,
            mean: h.mean() / scale,
        }
    }
}

/// Fan outcomes and per-step counters (monotonic; the timeline takes deltas).
#[derive(Default)]
pub struct Counters {
    pub arrivals: AtomicU64,
    pub joined: AtomicU64,
    pub admitted: AtomicU64,
    pub holds: AtomicU64,
    pub seat_taken: AtomicU64,
    pub orders: AtomicU64,
    pub paid: AtomicU64,
    pub tickets: AtomicU64,
    pub vanished: AtomicU64,
    pub sold_out_queue: AtomicU64,
    pub sold_out_hold: AtomicU64,
    pub gave_up: AtomicU64,
    pub rate_limited: AtomicU64,
    pub errors: AtomicU64,
    /// Fans moved to another gateway after theirs stopped answering.
    pub failovers: AtomicU64,
    pub requests: AtomicU64,
    pub active_fans: AtomicU64,
}

/// The waiting-room client: plain hyper with URIs parsed once per run and replies parsed
/// into the four fields a fan acts on. Join and status are 99 % of a surge's requests, and
/// reqwest's per-request URL parsing and a `serde_json::Value` per reply made the load
/// generator the machine's largest CPU user after Postgres (perf, docs/benchmarks.md) —
/// load the client spends is load the measured services do not get.
type QueueClient = PooledClient<HttpConnector, Empty<Bytes>>;

tokio::task_local! {
    /// The gateway (index into `--base-url`) the current fan talks to.
    static GATEWAY: Cell<usize>;
}

/// The current fan's gateway (0 outside a fan).
fn gateway() -> usize {
    GATEWAY.try_with(Cell::get).unwrap_or(0)
}

struct Run {
    args: SurgeArgs,
    event: String,
    client: Client,
    queue_client: QueueClient,
    /// Per gateway, in `--base-url` order.
    uris: Vec<QueueUris>,
    /// Per gateway: until when (ms since `epoch`) a fan saw it fail. New fans are not pinned
    /// to it meanwhile, as a load balancer's health check would take it out of rotation.
    down_until_ms: Vec<AtomicU64>,
    epoch: Instant,
    slots: Semaphore,
    lat: Latencies,
    c: Counters,
    errors_by_kind: Mutex<BTreeMap<String, u64>>,
    seats: SeatCache,
    identity: Option<shared::identity::IdentityVerifier>,
    stop: AtomicBool,
    sold_out: AtomicBool,
}

/// The seat map as fans see it: fetched at most once a second (the endpoint is cacheable
/// for a second, as a CDN would serve it) and shared by all fans. A pick is removed from
/// the local copy so fans in the same second do not all race for the same seats.
struct SeatCache {
    inner: tokio::sync::Mutex<SeatView>,
}

#[derive(Default)]
struct SeatView {
    fetched: Option<Instant>,
    free: Vec<String>,
    held: usize,
    /// The map as fetched had nothing free and nothing held: nothing can come back.
    sold_out: bool,
}

/// `GET /api/events/{event}/seats`, only what a fan picks by.
#[derive(Deserialize)]
struct SeatMap {
    seats: Vec<SeatRow>,
}

#[derive(Deserialize)]
struct SeatRow {
    seat_id: String,
    status: String,
}

/// What a fan found when looking for seats.
enum Pick {
    Seats(Vec<String>),
    /// Nothing free, but seats are held: some may come back when holds expire.
    NoneFreeYet,
    SoldOut,
    Error,
}

struct Reply {
    status: StatusCode,
    body: Value,
}

/// The event's join and status addresses, parsed once.
struct QueueUris {
    join: Uri,
    status: Uri,
}

impl QueueUris {
    fn new(base_url: &str, event: &str) -> anyhow::Result<Self> {
        let parse = |what: &str| -> anyhow::Result<Uri> {
            format!("{}/queue/{event}/{what}", base_url.trim_end_matches('/'))
                .parse()
                .with_context(|| format!("the {what} URL of {base_url}"))
        };
        Ok(Self {
            join: parse("join")?,
            status: parse("status")?,
        })
    }
}

/// The header carrying a fan's place receipt on status polls (the gateway's `PLACE_HEADER`).
const PLACE_HEADER: &str = "x-floodgate-place";

/// A join or status answer: only what decides the fan's next step.
struct QueueReply {
    status: StatusCode,
    body: QueueBody,
    retry_after: Option<u64>,
}

/// The fields of a join/status body (or error body) the fan reads; the rest is skipped
/// unparsed.
#[derive(Debug, Default, Deserialize)]
struct QueueBody {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    poll_after_ms: Option<u64>,
    #[serde(default)]
    token: Option<String>,
    /// The join's signed place receipt: sent on status polls so the gateway answers a
    /// waiting fan from memory, as the waiting page's cookie does.
    #[serde(default)]
    receipt: Option<String>,
}

impl QueueReply {
    fn code(&self) -> &str {
        self.body.code.as_deref().unwrap_or("")
    }
}

/// Arrivals expected by `t` seconds into the run (integral of the piecewise-linear rate).
pub fn arrivals_by(t: f64, peak: f64, ramp: f64, hold: f64, down: f64) -> f64 {
    let t = t.max(0.0);
    let up = |x: f64| {
        if ramp > 0.0 {
            0.5 * peak * x * x / ramp
        } else {
            peak * x
        }
    };
    if t <= ramp {
        return up(t);
    }
    let a_ramp = up(ramp);
    if t <= ramp + hold {
        return a_ramp + peak * (t - ramp);
    }
    let a_hold = a_ramp + peak * hold;
    let x = (t - ramp - hold).min(down);
    let a_down = if down > 0.0 {
        peak * x - 0.5 * peak * x * x / down
    } else {
        0.0
    };
    a_hold + a_down
}

impl Run {
    fn endpoint_index(name: &str) -> usize {
        ENDPOINTS.iter().position(|e| *e == name).unwrap_or(0)
    }

    fn error(&self, step: &str, status: Option<StatusCode>, code: &str) {
        self.c.errors.fetch_add(1, Relaxed);
        let key = format!(
            "{step} {} {code}",
            status.map_or_else(|| "transport".to_owned(), |s| s.as_u16().to_string())
        );
        *lock(&self.errors_by_kind).entry(key).or_default() += 1;
    }

    /// One request, timed from intent (including the wait for a connection slot).
    async fn call(
        &self,
        endpoint: &str,
        method: Method,
        url: String,
        bearer: Option<&str>,
        idem_key: Option<&str>,
        body: Option<Value>,
    ) -> Result<Reply, reqwest::Error> {
        let (status, bytes) = self
            .call_raw(endpoint, method, url, bearer, idem_key, body)
            .await?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Reply { status, body })
    }

    /// [`Run::call`] without parsing the body.
    async fn call_raw(
        &self,
        endpoint: &str,
        method: Method,
        url: String,
        bearer: Option<&str>,
        idem_key: Option<&str>,
        body: Option<Value>,
    ) -> Result<(StatusCode, Bytes), reqwest::Error> {
        self.timed(Self::endpoint_index(endpoint), async {
            let mut req = self.client.request(method, url);
            if let Some(t) = bearer {
                req = req.bearer_auth(t);
            }
            if let Some(k) = idem_key {
                req = req.header("Idempotency-Key", k);
            }
            if let Some(b) = body {
                req = req.json(&b);
            }
            let resp = req.send().await?;
            let status = resp.status();
            Ok((status, resp.bytes().await?))
        })
        .await
    }

    /// Runs one request exchange timed from intent: the clock starts before the wait for a
    /// connection slot, so a saturated client or server shows as latency (no coordinated
    /// omission). Only answered requests are recorded.
    async fn timed<T, E>(
        &self,
        endpoint: usize,
        exchange: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let _slot = self.slots.acquire().await;
        self.c.requests.fetch_add(1, Relaxed);
        let out = exchange.await?;
        self.lat.record(endpoint, start.elapsed());
        Ok(out)
    }

    fn url(&self, path: &str) -> String {
        let bases = &self.args.base_url;
        format!("{}{path}", bases[gateway() % bases.len().max(1)])
    }

    fn uris(&self) -> &QueueUris {
        &self.uris[gateway() % self.uris.len().max(1)]
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The gateway a new fan is pinned to: round robin over those not seen failing lately.
    fn pin(&self, n: u64) -> usize {
        let len = self.uris.len().max(1);
        let first = usize::try_from(n).unwrap_or(0) % len;
        let now = self.now_ms();
        (0..len)
            .map(|i| (first + i) % len)
            .find(|&g| {
                self.down_until_ms
                    .get(g)
                    .is_none_or(|d| d.load(Relaxed) <= now)
            })
            .unwrap_or(first)
    }

    /// Moves the current fan to the next gateway, as a load balancer does when a backend
    /// stops answering, and keeps new fans off the failed one for a few seconds. `false`
    /// when there is no other gateway.
    fn fail_over(&self) -> bool {
        let n = self.uris.len();
        if n < 2 {
            return false;
        }
        let failed = gateway();
        if let Some(d) = self.down_until_ms.get(failed) {
            d.store(self.now_ms() + 5_000, Relaxed);
        }
        let moved = GATEWAY.try_with(|g| g.set((g.get() + 1) % n)).is_ok();
        if moved {
            self.c.failovers.fetch_add(1, Relaxed);
        }
        moved
    }

    async fn think(&self) {
        if self.args.think_ms > 0 {
            let ms = rand::rng().random_range(0..=self.args.think_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    async fn login(&self, account: &str) -> Option<String> {
        if let Some(v) = &self.identity {
            let now = chrono::Utc::now().timestamp();
            return v.dev_mint(account, now);
        }
        match self
            .call(
                "login",
                Method::POST,
                self.url("/dev/login"),
                None,
                None,
                Some(json!({"account": account})),
            )
            .await
        {
            Ok(r) if r.status == StatusCode::OK => r.body["token"].as_str().map(str::to_owned),
            Ok(r) => {
                self.error(
                    "login",
                    Some(r.status),
                    r.body["code"].as_str().unwrap_or(""),
                );
                None
            }
            Err(_) => {
                self.error("login", None, "");
                None
            }
        }
    }

    /// One waiting-room request (join or status), timed like [`Run::call`] from intent.
    async fn queue_call(
        &self,
        endpoint: usize,
        method: &Method,
        uri: &Uri,
        auth: &HeaderValue,
        place: Option<&HeaderValue>,
    ) -> anyhow::Result<QueueReply> {
        let (parts, bytes) = self
            .timed(endpoint, async {
                let mut req = Request::builder()
                    .method(method)
                    .uri(uri.clone())
                    .header(AUTHORIZATION, auth.clone());
                if let Some(p) = place {
                    req = req.header(PLACE_HEADER, p.clone());
                }
                let req = req.body(Empty::new()).context("building the request")?;
                let exchange = async {
                    let resp = self.queue_client.request(req).await?;
                    let (parts, body) = resp.into_parts();
                    anyhow::Ok((parts, body.collect().await?.to_bytes()))
                };
                tokio::time::timeout(Duration::from_secs(30), exchange)
                    .await
                    .context("timed out")?
            })
            .await?;
        let retry_after = parts
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok(QueueReply {
            status: parts.status,
            body: serde_json::from_slice(&bytes).unwrap_or_default(),
            retry_after,
        })
    }

    /// `POST /queue/{event}/join`. A transport failure is counted; it ends the fan unless
    /// another gateway is configured, which the fan then joins through (the same account
    /// gets the same place from any gateway).
    async fn join(&self, auth: &HeaderValue) -> Option<QueueReply> {
        for _ in 0..self.uris.len().max(1) {
            match self
                .queue_call(JOIN, &Method::POST, &self.uris().join, auth, None)
                .await
            {
                Ok(r) => return Some(r),
                Err(_) => {
                    self.error("join", None, "");
                    if !self.fail_over() {
                        return None;
                    }
                }
            }
        }
        None
    }

    /// Join and poll until admitted. Returns the admission token.
    async fn queue(&self, identity: &str) -> Option<String> {
        let Ok(auth) = HeaderValue::from_str(&format!("Bearer {identity}")) else {
            self.error("join", None, "bad identity token");
            return None;
        };
        let mut r = self.join(&auth).await?;
        let mut rejoined = false;
        let mut place: Option<HeaderValue> = None;
        loop {
            if self.stop.load(Relaxed) {
                return None;
            }
            if let Some(receipt) = r.body.receipt.take() {
                place = HeaderValue::from_str(&receipt).ok();
            }
            match r.status.as_u16() {
                200 | 201 => {}
                409 if r.code() == "SOLD_OUT" => {
                    self.c.sold_out_queue.fetch_add(1, Relaxed);
                    return None;
                }
                404 if r.code() == "NOT_IN_QUEUE" && !rejoined => {
                    // The join itself failed (e.g. a 503): join again, as the waiting page does.
                    rejoined = true;
                    r = self.join(&auth).await?;
                    continue;
                }
                429 | 503 => {
                    if r.status == StatusCode::TOO_MANY_REQUESTS {
                        self.c.rate_limited.fetch_add(1, Relaxed);
                    }
                    self.error("queue", Some(r.status), r.code());
                    tokio::time::sleep(Duration::from_secs(r.retry_after.unwrap_or(1))).await;
                    r = QueueReply {
                        status: StatusCode::OK,
                        body: QueueBody {
                            state: Some("waiting".into()),
                            poll_after_ms: Some(0),
                            ..QueueBody::default()
                        },
                        retry_after: None,
                    };
                    continue;
                }
                _ => {
                    self.error("queue", Some(r.status), r.code());
                    return None;
                }
            }
            match r.body.state.as_deref().unwrap_or("") {
                "admitted" => {
                    if let Some(t) = r.body.token.take() {
                        return Some(t);
                    }
                }
                "sold_out" | "closed" => {
                    self.c.sold_out_queue.fetch_add(1, Relaxed);
                    return None;
                }
                "expired" if !rejoined => {
                    rejoined = true;
                    r = self.join(&auth).await?;
                    continue;
                }
                "expired" => {
                    self.c.gave_up.fetch_add(1, Relaxed);
                    return None;
                }
                _ => {}
            }
            let wait = r.body.poll_after_ms.unwrap_or(1000);
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            if self.stop.load(Relaxed) {
                return None;
            }
            r = match self
                .queue_call(
                    STATUS,
                    &Method::GET,
                    &self.uris().status,
                    &auth,
                    place.as_ref(),
                )
                .await
            {
                Ok(r) => r,
                Err(_) => {
                    self.error("status", None, "");
                    // The receipt is signed with the key every gateway shares: the next
                    // gateway answers the same place.
                    if self.fail_over() {
                        continue;
                    }
                    return None;
                }
            };
        }
    }

    async fn pick(&self, token: &str) -> Pick {
        let n = self.args.seats_per_fan;
        let mut view = self.seats.inner.lock().await;
        let fetch = loop {
            let Some(age) = view.fetched.map(|t| t.elapsed()) else {
                break true;
            };
            if age >= Duration::from_secs(1) {
                break true;
            }
            if view.free.len() >= n {
                break false;
            }
            if view.sold_out {
                return Pick::SoldOut;
            }
            if view.free.is_empty() && view.held > 0 {
                return Pick::NoneFreeYet;
            }
            // This second's fans picked the shared copy clean: fetch again, but at most every
            // 100 ms. Refetching on every such pick (and on every pick after the sell-out)
            // parsed the whole map per fan and made the load generator the busiest process
            // of the drain phase.
            let wait = Duration::from_millis(100).saturating_sub(age);
            if wait.is_zero() {
                break true;
            }
            drop(view);
            tokio::time::sleep(wait).await;
            view = self.seats.inner.lock().await;
        };
        if fetch {
            let url = self.url(&format!("/api/events/{}/seats", self.event));
            match self
                .call_raw("seats", Method::GET, url, Some(token), None, None)
                .await
            {
                Ok((StatusCode::OK, bytes)) => {
                    let Ok(map) = serde_json::from_slice::<SeatMap>(&bytes) else {
                        self.error("seats", Some(StatusCode::OK), "unreadable seat map");
                        return Pick::Error;
                    };
                    let mut free = Vec::new();
                    let mut held = 0;
                    for seat in map.seats {
                        match seat.status.as_str() {
                            "available" => free.push(seat.seat_id),
                            "held" => held += 1,
                            _ => {}
                        }
                    }
                    *view = SeatView {
                        fetched: Some(Instant::now()),
                        sold_out: free.is_empty() && held == 0,
                        free,
                        held,
                    };
                }
                Ok((status, bytes)) => {
                    let code = serde_json::from_slice::<QueueBody>(&bytes)
                        .ok()
                        .and_then(|b| b.code)
                        .unwrap_or_default();
                    self.error("seats", Some(status), &code);
                    return Pick::Error;
                }
                Err(_) => {
                    self.error("seats", None, "");
                    return Pick::Error;
                }
            }
        }
        if view.free.len() < n {
            return if view.held > 0 || !view.free.is_empty() {
                Pick::NoneFreeYet
            } else {
                Pick::SoldOut
            };
        }
        // Side by side where the map allows, from a random start.
        let start = rand::rng().random_range(0..=view.free.len() - n);
        Pick::Seats(view.free.drain(start..start + n).collect())
    }

    /// Holds seats, retrying other seats on SEAT_TAKEN; waits for expiring holds when
    /// nothing is free but seats are held.
    async fn hold(&self, token: &str) -> Option<(String, usize)> {
        let url = self.url(&format!("/api/events/{}/holds", self.event));
        let deadline = Instant::now() + Duration::from_secs(u64::from(self.args.hold_ttl_s) + 15);
        let mut taken = 0;
        while !self.stop.load(Relaxed) {
            let seats = match self.pick(token).await {
                Pick::Seats(s) => s,
                Pick::NoneFreeYet if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1000)).await;
                    continue;
                }
                Pick::SoldOut | Pick::NoneFreeYet => {
                    self.c.sold_out_hold.fetch_add(1, Relaxed);
                    return None;
                }
                Pick::Error => return None,
            };
            let n = seats.len();
            match self
                .call(
                    "hold",
                    Method::POST,
                    url.clone(),
                    Some(token),
                    None,
                    Some(json!({"seats": seats})),
                )
                .await
            {
                Ok(r) if r.status == StatusCode::CREATED => {
                    self.c.holds.fetch_add(1, Relaxed);
                    return r.body["hold_id"].as_str().map(|h| (h.to_owned(), n));
                }
                Ok(r) if r.status == StatusCode::CONFLICT && r.body["code"] == "SEAT_TAKEN" => {
                    self.c.seat_taken.fetch_add(1, Relaxed);
                    taken += 1;
                    if taken > 3 {
                        self.c.gave_up.fetch_add(1, Relaxed);
                        return None;
                    }
                }
                Ok(r) if r.status == StatusCode::CONFLICT && r.body["code"] == "SOLD_OUT" => {
                    self.c.sold_out_hold.fetch_add(1, Relaxed);
                    return None;
                }
                Ok(r) => {
                    self.error(
                        "hold",
                        Some(r.status),
                        r.body["code"].as_str().unwrap_or(""),
                    );
                    return None;
                }
                Err(_) => {
                    self.error("hold", None, "");
                    return None;
                }
            }
        }
        None
    }

    /// POST with an Idempotency-Key; a lost answer is retried with the same key, as a fan's
    /// page does. A transport failure moves the fan to the next gateway first (as a load
    /// balancer would), so a pay in flight through a gateway that was killed is finished
    /// through another one instead of leaving its order pending until it expires. Each lost
    /// answer is counted.
    async fn idempotent_post(
        &self,
        endpoint: &str,
        path: &str,
        token: &str,
        body: Value,
    ) -> Option<Reply> {
        let key = uuid::Uuid::new_v4().to_string();
        let attempts = 2 + self.uris.len();
        for attempt in 1..=attempts {
            match self
                .call(
                    endpoint,
                    Method::POST,
                    self.url(path),
                    Some(token),
                    Some(&key),
                    Some(body.clone()),
                )
                .await
            {
                Ok(r) => return Some(r),
                Err(_) => {
                    self.error(endpoint, None, "");
                    if attempt < attempts && !self.fail_over() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        None
    }

    async fn buy(&self, token: &str) -> Option<usize> {
        let (hold_id, n) = self.hold(token).await?;
        if rand::rng().random_bool(self.args.vanish.clamp(0.0, 1.0)) {
            // Closes the tab: the hold stays until it expires.
            self.c.vanished.fetch_add(1, Relaxed);
            return None;
        }
        self.think().await;
        let r = self
            .idempotent_post("order", "/api/orders", token, json!({"hold_id": hold_id}))
            .await?;
        if r.status != StatusCode::CREATED && r.status != StatusCode::OK {
            self.error(
                "order",
                Some(r.status),
                r.body["code"].as_str().unwrap_or(""),
            );
            return None;
        }
        self.c.orders.fetch_add(1, Relaxed);
        let order = r.body["id"].as_str()?.to_owned();
        self.think().await;
        let path = format!("/api/orders/{order}/pay");
        let r = self
            .idempotent_post(
                "pay",
                &path,
                token,
                json!({"payment_method": "pm_card_visa"}),
            )
            .await?;
        if r.status != StatusCode::OK || r.body["status"] != "PAID" {
            self.error("pay", Some(r.status), r.body["code"].as_str().unwrap_or(""));
            return None;
        }
        self.c.paid.fetch_add(1, Relaxed);
        self.c.tickets.fetch_add(n as u64, Relaxed);
        Some(n)
    }

    async fn fan(self: Arc<Self>, n: u64) {
        let pinned = self.pin(n);
        GATEWAY.scope(Cell::new(pinned), self.fan_steps(n)).await;
    }

    async fn fan_steps(self: Arc<Self>, n: u64) {
        self.c.active_fans.fetch_add(1, Relaxed);
        let started = Instant::now();
        let account = format!("{}-fan-{n}", self.event);
        if let Some(identity) = self.login(&account).await {
            self.c.joined.fetch_add(1, Relaxed);
            if let Some(token) = self.queue(&identity).await {
                self.c.admitted.fetch_add(1, Relaxed);
                let _ =
                    lock(&self.lat.time_in_queue_ms).record(started.elapsed().as_millis() as u64);
                self.think().await;
                if self.buy(&token).await.is_some() {
                    let _ = lock(&self.lat.time_to_ticket_ms)
                        .record(started.elapsed().as_millis() as u64);
                }
            }
        }
        self.c.active_fans.fetch_sub(1, Relaxed);
    }
}

/// One second of the timeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tick {
    #[serde(deserialize_with = "nan_if_null")]
    pub t: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub arrivals_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub queue_length: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub admitted_per_s: f64,
    /// The gateway's cumulative admissions for the event (`fg_admitted_total`).
    #[serde(deserialize_with = "nan_if_null")]
    pub admitted_total: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub admit_rate_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub active_admitted: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub holds_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub sold: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub held: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub available: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub tickets: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub errors_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub requests_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub status_p99_ms: f64,
    /// p99 of the joins answered in this second (NaN: none; reports older than the column).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub join_p99_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub fans_in_flight: f64,
}

async fn admin(
    client: &Client,
    method: Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> anyhow::Result<(StatusCode, Value)> {
    let mut req = client.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.with_context(|| format!("calling {url}"))?;
    let status = resp.status();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Ok((status, body))
}

fn seat_map(seats: u32) -> Value {
    let per_row = 50;
    let mut rows = seats.div_ceil(per_row);
    let mut sections = Vec::new();
    let mut i = 1;
    while rows > 0 {
        let r = rows.min(50);
        sections.push(
            json!({"name": format!("S{i}"), "rows": r, "seats_per_row": per_row,
                             "price_tier": if i % 2 == 1 { "A" } else { "B" }}),
        );
        rows -= r;
        i += 1;
    }
    json!({"sections": sections})
}

async fn set_up(client: &Client, a: &SurgeArgs, event: &str) -> anyhow::Result<u64> {
    let start = (chrono::Utc::now() - chrono::Duration::minutes(1)).to_rfc3339();
    let (s, b) = admin(
        client,
        Method::POST,
        &format!("{}/admin/events", a.booking_admin_url),
        &a.admin_token,
        Some(json!({
            "id": event, "name": format!("Surge {event}"), "venue": "loadgen", "sale_start": start,
            "hold_ttl_s": a.hold_ttl_s, "max_tickets_per_account": 4.max(a.seats_per_fan),
            "price_tiers": [{"tier": "A", "price": 12000}, {"tier": "B", "price": 8000}],
            "seat_map": seat_map(a.seats), "ga_tiers": [],
        })),
    )
    .await?;
    if s != StatusCode::CREATED {
        bail!("creating event {event}: {s} {b}");
    }
    let seats = b["seats"]
        .as_u64()
        .unwrap_or(u64::from(a.seats.div_ceil(50) * 50));
    let mut room = json!({
        "sale_start": start, "admit_per_minute": a.admit_per_minute, "mode": "queue", "max_active": a.max_active,
    });
    if a.queue_shards > 1 {
        room["queue_shards"] = json!(a.queue_shards);
    }
    let (s, b) = gateway_admin(
        client,
        a,
        Method::PUT,
        &format!("/admin/events/{event}/config"),
        Some(room),
    )
    .await?;
    if s != StatusCode::OK {
        bail!("gateway config for {event}: {s} {b}");
    }
    Ok(seats)
}

/// Gateway numbers for the event from the gateways' admin `/metrics`.
struct GatewaySample {
    queue_length: f64,
    admitted_total: f64,
    active: f64,
    rate_per_min: f64,
    /// Gateways that answered this second.
    answering: usize,
}

/// Reads every gateway's `/metrics` once a second. Queue length, active fans and the rate
/// come from Redis, so every gateway reports the same: the largest answer is taken.
/// Admissions are counted by whichever instance admitted them, so the total is the sum of
/// each gateway's last known count: a killed gateway's admissions still count.
struct GatewaySampler {
    last_admitted: Vec<f64>,
}

impl GatewaySampler {
    fn new(gateways: usize) -> Self {
        Self {
            last_admitted: vec![0.0; gateways],
        }
    }

    async fn sample(
        &mut self,
        client: &Client,
        a: &SurgeArgs,
        event: &str,
    ) -> Option<GatewaySample> {
        let l = format!("event=\"{event}\"");
        let mut out = GatewaySample {
            queue_length: 0.0,
            admitted_total: 0.0,
            active: 0.0,
            rate_per_min: 0.0,
            answering: 0,
        };
        for (i, url) in a.gateway_admin_url.iter().enumerate() {
            let text = async {
                client
                    .get(format!("{url}/metrics"))
                    .send()
                    .await?
                    .text()
                    .await
            };
            let Ok(text) = text.await else { continue };
            let v = |n: &str| promtext::value(&text, n, Some(&l)).unwrap_or(0.0);
            out.answering += 1;
            out.queue_length = out.queue_length.max(v("fg_queue_length"));
            out.active = out.active.max(v("fg_active_admitted"));
            out.rate_per_min = out.rate_per_min.max(v("fg_admit_rate_per_minute"));
            if let Some(last) = self.last_admitted.get_mut(i) {
                *last = last.max(v("fg_admitted_total"));
            }
        }
        out.admitted_total = self.last_admitted.iter().sum();
        (out.answering > 0).then_some(out)
    }
}

/// Sends one admin call to the first gateway that answers (the state is shared in Redis).
async fn gateway_admin(
    client: &Client,
    a: &SurgeArgs,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(StatusCode, Value)> {
    let mut last = None;
    for base in &a.gateway_admin_url {
        match admin(
            client,
            method.clone(),
            &format!("{base}{path}"),
            &a.admin_token,
            body.clone(),
        )
        .await
        {
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no gateway admin URL given")))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SurgeReport {
    pub event: String,
    pub seats: u64,
    pub config: Value,
    #[serde(deserialize_with = "nan_if_null")]
    pub duration_s: f64,
    /// Wall-clock start of the timeline (Unix ms), to place outside events on it.
    #[serde(default)]
    pub started_at_ms: i64,
    pub fans: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub peak_arrival_rate_measured: f64,
    pub counters: BTreeMap<String, u64>,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub requests: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub requests_per_s: f64,
    pub latency_ms: BTreeMap<String, Quantiles>,
    pub time_in_queue_s: Quantiles,
    pub time_to_ticket_s: Quantiles,
    #[serde(deserialize_with = "nan_if_null")]
    pub admit_rate_configured_per_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub admit_rate_measured_per_s: f64,
    pub admit_rate_window_s: (f64, f64),
    pub sold_out_at_s: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub final_sold: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub final_held: f64,
    pub timeline: Vec<Tick>,
    pub verify: Option<crate::verify::VerifyReport>,
}

pub async fn run(args: SurgeArgs) -> anyhow::Result<SurgeReport> {
    let event = args
        .event
        .clone()
        .unwrap_or_else(|| format!("surge-{}", chrono::Utc::now().timestamp()));
    let client = Client::builder()
        .pool_max_idle_per_host(args.max_in_flight)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let queue_client = {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        PooledClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(args.max_in_flight)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector)
    };
    let admin_client = Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .context("building the admin client")?;
    let seats = set_up(&admin_client, &args, &event).await?;
    let identity = match &args.identity_key {
        Some(k) => Some(
            shared::identity::IdentityVerifier::new(&shared::config::IdentitySettings {
                algorithm: "HS256".into(),
                key: secrecy::SecretString::from(k.clone()),
                issuer: args.identity_issuer.clone(),
                dev_login: true,
                // The gateway's default audience, which minted tokens must carry.
                ..shared::config::IdentitySettings::default()
            })
            .context("identity key")?,
        ),
        None => None,
    };
    let run = Arc::new(Run {
        slots: Semaphore::new(args.max_in_flight),
        queue_client,
        uris: args
            .base_url
            .iter()
            .map(|b| QueueUris::new(b, &event))
            .collect::<anyhow::Result<_>>()?,
        down_until_ms: args.base_url.iter().map(|_| AtomicU64::new(0)).collect(),
        epoch: Instant::now(),
        client,
        event: event.clone(),
        lat: Latencies::new(),
        c: Counters::default(),
        errors_by_kind: Mutex::new(BTreeMap::new()),
        seats: SeatCache {
            inner: tokio::sync::Mutex::new(SeatView::default()),
        },
        identity,
        stop: AtomicBool::new(false),
        sold_out: AtomicBool::new(false),
        args: args.clone(),
    });
    eprintln!(
        "surge: event {event}, {seats} seats, peak {}/s, admit {}/min, hold ttl {} s",
        args.peak_rate, args.admit_per_minute, args.hold_ttl_s
    );

    let t0 = Instant::now();
    let started_at_ms = chrono::Utc::now().timestamp_millis();
    let arrive_s = args.ramp_s + args.hold_s + args.ramp_down_s;
    let total = arrivals_by(
        arrive_s,
        args.peak_rate,
        args.ramp_s,
        args.hold_s,
        args.ramp_down_s,
    )
    .round() as u64;

    // Arrivals: every 5 ms, spawn the fans due by now. When the machine stalls this task,
    // the fans it owes are caught up at no more than 1.25 × the peak rate, so a stall shows
    // as a late, stretched arrival curve (reported) rather than a burst far above the peak.
    let spawner = {
        let run = run.clone();
        let a = args.clone();
        tokio::spawn(async move {
            let mut spawned = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut last = Instant::now();
            let mut allowance = 0.0f64;
            while spawned < total && !run.stop.load(Relaxed) {
                tick.tick().await;
                let now = Instant::now();
                allowance = (allowance
                    + now.duration_since(last).as_secs_f64() * a.peak_rate * 1.25)
                    .min(a.peak_rate * 1.25 * 0.05);
                last = now;
                let due = arrivals_by(
                    t0.elapsed().as_secs_f64(),
                    a.peak_rate,
                    a.ramp_s,
                    a.hold_s,
                    a.ramp_down_s,
                )
                .round() as u64;
                while spawned < due.min(total) && allowance >= 1.0 {
                    allowance -= 1.0;
                    run.c.arrivals.fetch_add(1, Relaxed);
                    tokio::spawn(run.clone().fan(spawned));
                    spawned += 1;
                }
            }
        })
    };

    // Timeline: once a second.
    let mut timeline: Vec<Tick> = Vec::new();
    let mut last = (0u64, 0u64, 0u64, None::<f64>);
    // When the arrivals counter was last read: a row's arrivals are a rate over the time
    // between two reads, not a count per tick (a tick can be late on a saturated box).
    let mut arrivals_read = (0u64, Instant::now());
    let mut sold_out_at: Option<f64> = None;
    let mut final_counts = (0.0, 0.0);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ev_url = format!("{}/admin/events/{event}", args.booking_admin_url);
    let mut sampler = GatewaySampler::new(args.gateway_admin_url.len());
    loop {
        tick.tick().await;
        let t = t0.elapsed().as_secs_f64();
        // Read before the admin calls below, whose time varies with the load.
        let arrivals_now = (run.c.arrivals.load(Relaxed), Instant::now());
        let arrivals_per_s = (arrivals_now.0 - arrivals_read.0) as f64
            / arrivals_now
                .1
                .duration_since(arrivals_read.1)
                .as_secs_f64()
                .max(1e-3);
        arrivals_read = arrivals_now;
        let g = sampler.sample(&admin_client, &args, &event).await;
        let (sold, held, available) =
            match admin(&admin_client, Method::GET, &ev_url, &args.admin_token, None).await {
                Ok((StatusCode::OK, b)) => (
                    b["sold"].as_f64().unwrap_or(0.0),
                    b["held"].as_f64().unwrap_or(0.0),
                    b["available"].as_f64().unwrap_or(0.0),
                ),
                _ => (f64::NAN, f64::NAN, f64::NAN),
            };
        let holds = run.c.holds.load(Relaxed);
        let errors = run.c.errors.load(Relaxed);
        let requests = run.c.requests.load(Relaxed);
        let admitted_total = g.as_ref().map(|g| g.admitted_total);
        let admitted_per_s = match (admitted_total, last.3) {
            (Some(a), Some(b)) => a - b,
            _ => 0.0,
        };
        let (window, joins) = run.lat.take_windows();
        let row = Tick {
            t: (t * 1000.0).round() / 1000.0,
            arrivals_per_s: (arrivals_per_s * 10.0).round() / 10.0,
            queue_length: g.as_ref().map_or(0.0, |g| g.queue_length),
            admitted_per_s,
            admitted_total: admitted_total.or(last.3).unwrap_or(0.0),
            admit_rate_per_s: g.as_ref().map_or(0.0, |g| g.rate_per_min / 60.0),
            active_admitted: g.as_ref().map_or(0.0, |g| g.active),
            holds_per_s: (holds - last.0) as f64,
            sold,
            held,
            available,
            tickets: run.c.tickets.load(Relaxed) as f64,
            errors_per_s: (errors - last.1) as f64,
            requests_per_s: (requests - last.2) as f64,
            status_p99_ms: p99_ms(&window, 0.0),
            join_p99_ms: p99_ms(&joins, f64::NAN),
            fans_in_flight: run.c.active_fans.load(Relaxed) as f64,
        };
        last = (holds, errors, requests, admitted_total.or(last.3));
        eprintln!(
            "t={:>5.0}s arrivals/s={:>5} queue={:>7} admitted/s={:>5} active={:>6} holds/s={:>4} sold={:>6} held={:>5} errors/s={:>3} status p99={:.1}ms join p99={:.1}ms fans={}",
            row.t,
            row.arrivals_per_s,
            row.queue_length,
            row.admitted_per_s,
            row.active_admitted,
            row.holds_per_s,
            row.sold,
            row.held,
            row.errors_per_s,
            row.status_p99_ms,
            row.join_p99_ms,
            row.fans_in_flight
        );
        if sold.is_finite() {
            final_counts = (sold, held);
        }
        timeline.push(row);
        if sold_out_at.is_none() && sold.is_finite() && sold >= seats as f64 {
            sold_out_at = Some(t);
            run.sold_out.store(true, Relaxed);
            // As ops (or booking's sold-out hook) would: tell the waiting room, so everyone
            // still queued learns it on their next poll instead of waiting for nothing.
            match gateway_admin(
                &admin_client,
                &args,
                Method::PUT,
                &format!("/admin/events/{event}/sold_out"),
                Some(json!({"sold_out": true})),
            )
            .await
            {
                Ok((StatusCode::OK, _)) => {
                    eprintln!("surge: sold out at {t:.0}s; waiting room told")
                }
                other => eprintln!(
                    "surge: sold out at {t:.0}s; setting the sold-out flag failed: {other:?}"
                ),
            }
        }
        let arrivals_done = arrivals_now.0 >= total;
        let drained = sold_out_at
            .is_some_and(|s| t - s >= args.drain_s as f64 || run.c.active_fans.load(Relaxed) == 0);
        if (arrivals_done && drained) || t >= args.max_duration_s as f64 {
            break;
        }
    }
    run.stop.store(true, Relaxed);
    spawner.abort();
    let duration = t0.elapsed().as_secs_f64();

    // Admit rate: from the first second with a queue to the last before sold out / empty,
    // skipping the first and last second (partial ticks).
    let busy: Vec<&Tick> = timeline
        .iter()
        .filter(|r| r.queue_length > 0.0 && sold_out_at.is_none_or(|s| r.t < s))
        .collect();
    let (measured, window) = if busy.len() >= 4 {
        // Counter difference over wall-clock time between two samples: exact whatever the
        // sampler's own drift.
        let (first, last) = (busy[1], busy[busy.len() - 2]);
        let span = last.t - first.t;
        let admitted = last.admitted_total - first.admitted_total;
        (
            if span > 0.0 { admitted / span } else { 0.0 },
            (first.t, last.t),
        )
    } else {
        (0.0, (0.0, 0.0))
    };

    let counters: BTreeMap<String, u64> = [
        ("arrivals", &run.c.arrivals),
        ("joined", &run.c.joined),
        ("admitted", &run.c.admitted),
        ("holds", &run.c.holds),
        ("seat_taken", &run.c.seat_taken),
        ("orders", &run.c.orders),
        ("paid", &run.c.paid),
        ("tickets", &run.c.tickets),
        ("vanished", &run.c.vanished),
        ("sold_out_queue", &run.c.sold_out_queue),
        ("sold_out_hold", &run.c.sold_out_hold),
        ("gave_up", &run.c.gave_up),
        ("rate_limited", &run.c.rate_limited),
        ("errors", &run.c.errors),
        ("failovers", &run.c.failovers),
        ("still_waiting_at_end", &run.c.active_fans),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.load(Relaxed)))
    .collect();
    let latency_ms = ENDPOINTS
        .iter()
        .filter_map(|e| {
            run.lat
                .endpoint(e)
                .filter(|h| !h.is_empty())
                .map(|h| (e.to_string(), Quantiles::of(&h, 1000.0)))
        })
        .collect();
    let requests = run.c.requests.load(Relaxed);
    let report = SurgeReport {
        event: event.clone(),
        seats,
        config: json!({
            "peak_rate": args.peak_rate, "ramp_s": args.ramp_s, "hold_s": args.hold_s, "ramp_down_s": args.ramp_down_s,
            "admit_per_minute": args.admit_per_minute, "max_active": args.max_active, "queue_shards": args.queue_shards, "hold_ttl_s": args.hold_ttl_s,
            "vanish": args.vanish, "seats_per_fan": args.seats_per_fan, "think_ms": args.think_ms,
            "max_in_flight": args.max_in_flight, "gateways": args.base_url.len(), "identity": if args.identity_key.is_some() { "minted locally" } else { "POST /dev/login" },
        }),
        duration_s: duration,
        started_at_ms,
        fans: run.c.arrivals.load(Relaxed),
        peak_arrival_rate_measured: timeline
            .iter()
            .map(|r| r.arrivals_per_s)
            .fold(0.0, f64::max),
        counters,
        errors_by_kind: lock(&run.errors_by_kind).clone(),
        requests,
        requests_per_s: requests as f64 / duration.max(1.0),
        latency_ms,
        time_in_queue_s: Quantiles::of(&lock(&run.lat.time_in_queue_ms), 1000.0),
        time_to_ticket_s: Quantiles::of(&lock(&run.lat.time_to_ticket_ms), 1000.0),
        admit_rate_configured_per_s: args.admit_per_minute as f64 / 60.0,
        admit_rate_measured_per_s: measured,
        admit_rate_window_s: window,
        sold_out_at_s: sold_out_at,
        final_sold: final_counts.0,
        final_held: final_counts.1,
        timeline,
        verify: None,
    };
    Ok(report)
}

/// A human summary on stderr (the JSON has everything).
pub fn print_summary(r: &SurgeReport) {
    eprintln!(
        "\nsurge {}: {} fans in {:.0} s (peak {:.0}/s measured), {} requests ({:.0}/s)",
        r.event, r.fans, r.duration_s, r.peak_arrival_rate_measured, r.requests, r.requests_per_s
    );
    eprintln!(
        "  {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "endpoint", "count", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for (e, q) in &r.latency_ms {
        eprintln!(
            "  {e:<8} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.1}",
            q.count, q.p50, q.p90, q.p99, q.p999, q.max
        );
    }
    eprintln!(
        "  time in queue p50 {:.1} s p99 {:.1} s; time to ticket p50 {:.1} s p99 {:.1} s",
        r.time_in_queue_s.p50,
        r.time_in_queue_s.p99,
        r.time_to_ticket_s.p50,
        r.time_to_ticket_s.p99
    );
    let dev = if r.admit_rate_configured_per_s > 0.0 {
        (r.admit_rate_measured_per_s / r.admit_rate_configured_per_s - 1.0) * 100.0
    } else {
        0.0
    };
    eprintln!(
        "  admit rate: configured {:.1}/s, measured {:.1}/s ({dev:+.1} %) over t={:.0}..{:.0} s",
        r.admit_rate_configured_per_s,
        r.admit_rate_measured_per_s,
        r.admit_rate_window_s.0,
        r.admit_rate_window_s.1
    );
    match r.sold_out_at_s {
        Some(t) => eprintln!(
            "  sold out at {t:.0} s: {} sold, {} held at the end",
            r.final_sold, r.final_held
        ),
        None => eprintln!(
            "  NOT sold out: {} of {} sold, {} held at the end",
            r.final_sold, r.seats, r.final_held
        ),
    }
    eprintln!("  counters: {:?}", r.counters);
    if !r.errors_by_kind.is_empty() {
        eprintln!("  errors: {:?}", r.errors_by_kind);
    }
}

/// Writes `surge.json`, `surge-timeline.csv` and the two plots into `dir`.
pub fn write_outputs(r: &SurgeReport, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(r).context("serialising the surge report")?;
    std::fs::write(dir.join("surge.json"), json).context("writing surge.json")?;
    let mut csv = String::from(
        "t,arrivals_per_s,queue_length,admitted_per_s,admit_rate_per_s,active_admitted,holds_per_s,sold,held,available,tickets,errors_per_s,requests_per_s,status_p99_ms,join_p99_ms,fans_in_flight\n",
    );
    for x in &r.timeline {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            x.t,
            x.arrivals_per_s,
            x.queue_length,
            x.admitted_per_s,
            x.admit_rate_per_s,
            x.active_admitted,
            x.holds_per_s,
            x.sold,
            x.held,
            x.available,
            x.tickets,
            x.errors_per_s,
            x.requests_per_s,
            x.status_p99_ms,
            x.join_p99_ms,
            x.fans_in_flight
        ));
    }
    std::fs::write(dir.join("surge-timeline.csv"), csv).context("writing the timeline")?;
    std::fs::write(dir.join("surge-queue.svg"), queue_chart(r).render())
        .context("writing surge-queue.svg")?;
    std::fs::write(dir.join("surge-latency.svg"), latency_chart(r).render())
        .context("writing surge-latency.svg")?;
    Ok(())
}

pub fn queue_chart(r: &SurgeReport) -> LineChart {
    let pts = |f: fn(&Tick) -> f64| r.timeline.iter().map(|x| (x.t, f(x))).collect::<Vec<_>>();
    let mut markers = Vec::new();
    let arrive = r.config["ramp_s"].as_f64().unwrap_or(0.0)
        + r.config["hold_s"].as_f64().unwrap_or(0.0)
        + r.config["ramp_down_s"].as_f64().unwrap_or(0.0);
    markers.push((arrive, "arrivals end".to_owned()));
    if let Some(s) = r.sold_out_at_s {
        markers.push((s, "sold out".to_owned()));
    }
    LineChart {
        title: format!(
            "Launch surge: {} fans, {} seats — queue and admission",
            r.fans, r.seats
        ),
        x_label: "seconds since the first arrival".into(),
        left_label: "fans".into(),
        right_label: "fans per second".into(),
        series: vec![
            Series::new("queue length", Axis::Left, pts(|x| x.queue_length)),
            Series::new(
                "seats sold",
                Axis::Left,
                pts(|x| if x.sold.is_finite() { x.sold } else { 0.0 }),
            ),
            Series::new("arrivals/s", Axis::Right, pts(|x| x.arrivals_per_s)),
            Series::new("admitted/s", Axis::Right, pts(|x| x.admitted_per_s)),
            Series::new(
                "configured admit/s",
                Axis::Right,
                pts(|x| x.admit_rate_per_s),
            ),
        ],
        markers,
    }
}

pub fn latency_chart(r: &SurgeReport) -> BarChart {
    let cats: Vec<String> = ENDPOINTS
        .iter()
        .filter(|e| r.latency_ms.contains_key(**e))
        .map(|e| e.to_string())
        .collect();
    let q = |f: fn(&Quantiles) -> f64| {
        cats.iter()
            .map(|c| r.latency_ms.get(c).map_or(0.0, f))
            .collect::<Vec<_>>()
    };
    BarChart {
        title: "Launch surge: latency per endpoint (client side, ms, log scale)".into(),
        y_label: "milliseconds".into(),
        series: vec![
            ("p50".into(), q(|x| x.p50)),
            ("p90".into(), q(|x| x.p90)),
            ("p99".into(), q(|x| x.p99)),
            ("p99.9".into(), q(|x| x.p999)),
        ],
        categories: cats,
        log: true,
    }
}

#[cfg(test)]
mod tests {
    use super::{ENDPOINTS, JOIN, QueueBody, STATUS, Tick, arrivals_by};

    #[test]
    fn queue_endpoint_indices_name_their_endpoints() {
        assert_eq!(ENDPOINTS[JOIN], "join");
        assert_eq!(ENDPOINTS[STATUS], "status");
    }

    #[test]
    fn queue_bodies_parse_to_the_fields_a_fan_reads() -> anyhow::Result<()> {
        let waiting: QueueBody = serde_json::from_str(
            r#"{"event":"e","state":"waiting","position":7,"ahead":6,"eta_seconds":null,
                "poll_after_ms":1200,"admit_per_minute":600,"receipt":"x.y.z"}"#,
        )?;
        assert_eq!(waiting.state.as_deref(), Some("waiting"));
        assert_eq!(waiting.poll_after_ms, Some(1200));
        assert!(waiting.token.is_none() && waiting.code.is_none());
        let admitted: QueueBody = serde_json::from_str(
            r#"{"state":"admitted","token":"t.o.k","poll_after_ms":0,"next":"/e/x/shop"}"#,
        )?;
        assert_eq!(admitted.token.as_deref(), Some("t.o.k"));
        let error: QueueBody = serde_json::from_str(r#"{"code":"SOLD_OUT","message":"sold out"}"#)?;
        assert_eq!(error.code.as_deref(), Some("SOLD_OUT"));
        Ok(())
    }

    #[test]
    fn a_tick_with_nan_survives_a_json_round_trip() {
        let t = Tick {
            t: 1.0,
            arrivals_per_s: 5.0,
            queue_length: 1.0,
            admitted_per_s: 1.0,
            admitted_total: 1.0,
            admit_rate_per_s: 1.0,
            active_admitted: 1.0,
            holds_per_s: 0.0,
            sold: f64::NAN,
            held: f64::NAN,
            available: f64::NAN,
            tickets: 0.0,
            errors_per_s: 0.0,
            requests_per_s: 0.0,
            status_p99_ms: 0.0,
            join_p99_ms: f64::NAN,
            fans_in_flight: 0.0,
        };
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"sold\":null"));
        let back: Tick = serde_json::from_str(&json).unwrap();
        assert!(back.sold.is_nan() && back.arrivals_per_s == 5.0);
    }

    #[test]
    fn arrival_curve_integrates_the_rate() {
        // 20 s up to 5000/s, 30 s flat, 10 s down: 50k + 150k + 25k.
        let total = arrivals_by(60.0, 5000.0, 20.0, 30.0, 10.0);
        assert!((total - 225_000.0).abs() < 1e-6, "{total}");
        assert!((arrivals_by(10.0, 5000.0, 20.0, 30.0, 10.0) - 12_500.0).abs() < 1e-6);
        assert!((arrivals_by(1000.0, 5000.0, 20.0, 30.0, 10.0) - 225_000.0).abs() < 1e-6);
        assert_eq!(arrivals_by(-1.0, 5000.0, 20.0, 30.0, 10.0), 0.0);
        // No ramps: a flat rate.
        assert!((arrivals_by(5.0, 100.0, 0.0, 10.0, 0.0) - 500.0).abs() < 1e-6);
    }
}
