//! Test harness: real gateway instances (pingora listeners on free ports, real Redis with a
//! unique key prefix per test), a tiny echo upstream standing in for booking, and HTTP
//! helpers. `TEST_LOG=1` turns logs on.

#![allow(dead_code)]

use axum::extract::Request;
use axum::routing::any;
use gateway::config::GatewayConfig;
use gateway::{Gateway, GatewayHandle};
use reqwest::StatusCode;
use secrecy::SecretString;
use serde_json::{Value, json};
use shared::config::{KeySettings, RedisMode, RedisSettings, TokenSettings};
pub use shared::redis_conn::{Conn, Connector};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "test-admin-secret-0123456789";

/// The test Redis: one server, or with `FLOODGATE_TEST_REDIS_CLUSTER=1` a Redis Cluster's
/// seed nodes, comma-separated (`FLOODGATE_REDIS_CLUSTER=1 deploy/stack test`).
pub fn redis_url() -> String {
    std::env::var("FLOODGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:56379".into())
}

pub fn cluster() -> bool {
    std::env::var("FLOODGATE_TEST_REDIS_CLUSTER").is_ok_and(|v| v == "1")
}

/// A single Redis server, for tests that put a proxy in front of it.
pub fn standalone_redis_url() -> String {
    std::env::var("FLOODGATE_TEST_STANDALONE_REDIS_URL").unwrap_or_else(|_| redis_url())
}

/// A port for a gateway listener: pingora binds an address, not a socket we hand it, so
/// the port is drawn below the ephemeral range where no `bind(:0)` or outgoing connection
/// can take it before the gateway binds.
pub use testkit::free_port;

pub fn key(kid: &str) -> KeySettings {
    KeySettings {
        kid: kid.into(),
        secret: SecretString::from(format!("{kid}-test-secret-0123456789abcdef0123456789")),
    }
}

pub fn token_settings(kids: &[&str], current: &str) -> TokenSettings {
    TokenSettings {
        current_kid: current.into(),
        keys: kids.iter().map(|k| key(k)).collect(),
        ..TokenSettings::default()
    }
}

/// A config for one test instance: free ports, fast ticks, the given prefix and upstreams.
pub fn config(prefix: &str, upstreams: Vec<String>) -> GatewayConfig {
    let mut c = GatewayConfig::default();
    // Two draws may land on the same free port (1 in ~22,000; seen once in a cluster run):
    // the admin port is drawn until it differs.
    let public = free_port();
    let admin = std::iter::repeat_with(free_port)
        .find(|p| *p != public)
        .expect("a second free port");
    c.gateway.listen = format!("127.0.0.1:{public}");
    c.gateway.admin_listen = format!("127.0.0.1:{admin}");
    c.gateway.upstreams = upstreams;
    c.gateway.static_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../static").into();
    c.gateway.dev_mode = true;
    c.gateway.threads = 2;
    c.gateway.tick_ms = 100;
    c.gateway.lease_ttl_ms = 1000;
    c.gateway.refresh_ms = 100;
    c.gateway.health_check_ms = 200;
    c.gateway.upstream_read_timeout_ms = 5000;
    // Tests fire hundreds of requests from one IP and one account: limits off unless a test
    // turns them on.
    c.gateway.limits = gateway::RateLimits {
        join_per_account_per_min: 0,
        join_per_ip_per_min: 0,
        status_per_account_per_min: 0,
        status_per_ip_per_min: 0,
        api_per_account_per_s: 0,
        api_per_ip_per_s: 0,
        // The provider's webhook budget keeps its default: sized for bursts of tens of
        // thousands, far beyond what any test sends.
        ..gateway::RateLimits::default()
    };
    c.tokens = token_settings(&["k1"], "k1");
    c.redis = redis_settings(prefix);
    c.admin_token = Some(SecretString::from(ADMIN));
    c
}

/// The gateway's Redis bound in the tests that check it (a cut, slowed or failing Redis).
pub const FAIL_FAST_REDIS_TIMEOUT_MS: u64 = 500;

/// The shared test Redis under `prefix`. Its replies wait for `appendfsync always`, and on a
/// shared CI disk an fsync can stall for over a second (Redis logs "Asynchronous AOF fsync is
/// taking too long"): with the production bound of 500 ms, four admission and edge tests failed
/// on a timeout that had nothing to do with what they check. Tests assert counts, not speed;
/// the tests of the bound set [`FAIL_FAST_REDIS_TIMEOUT_MS`].
pub fn redis_settings(prefix: &str) -> RedisSettings {
    RedisSettings {
        url: SecretString::from(redis_url()),
        key_prefix: prefix.into(),
        response_timeout_ms: 5_000,
        mode: if cluster() {
            RedisMode::Cluster
        } else {
            RedisMode::Standalone
        },
        ..Default::default()
    }
}

pub fn unique_prefix() -> String {
    format!("fgt:{}:", shared::ids::new_id())
}

/// Starts a gateway from `config` (off the async runtime: pingora builds its own).
pub async fn start(config: GatewayConfig) -> GatewayHandle {
    shared::telemetry::init_for_tests();
    tokio::task::spawn_blocking(move || Gateway::build(config).unwrap().spawn().unwrap())
        .await
        .unwrap()
}

/// Stops a gateway off the async runtime.
pub async fn stop(g: GatewayHandle) {
    tokio::task::spawn_blocking(move || g.stop()).await.unwrap();
}

/// The upstream stand-in: answers every path with what it received, and counts requests.
/// Like booking, it reads the whole body first and refuses one over booking's default limit
/// (64 KiB) with `413`, closing the connection on the rest.
pub struct Echo {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicU64>,
    /// Requests whose whole body was received (within the limit).
    pub bodies: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Echo {
    pub async fn start() -> Echo {
        let hits = Arc::new(AtomicU64::new(0));
        let bodies = Arc::new(AtomicU64::new(0));
        let h = hits.clone();
        let b = bodies.clone();
        let app = axum::Router::new()
            .route("/healthz", any(|| async { "ok" }))
            .route(
                "/ws/echo",
                any(|ws: axum::extract::ws::WebSocketUpgrade| async move {
                    ws.on_upgrade(|mut socket| async move {
                        while let Some(Ok(m)) = socket.recv().await {
                            if socket.send(m).await.is_err() {
                                break;
                            }
                        }
                    })
                }),
            )
            .fallback(any(move |req: Request| {
                let h = h.clone();
                let b = b.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let (parts, body) = req.into_parts();
                    if axum::body::to_bytes(body, 64 * 1024).await.is_err() {
                        return (
                            StatusCode::PAYLOAD_TOO_LARGE,
                            axum::Json(json!({"code": "PAYLOAD_TOO_LARGE"})),
                        );
                    }
                    b.fetch_add(1, Ordering::SeqCst);
                    let req = Request::from_parts(parts, axum::body::Body::empty());
                    let hdr = |n: &str| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    };
                    let internal: Vec<String> = req
                        .headers()
                        .keys()
                        .map(|k| k.as_str().to_owned())
                        .filter(|k| k.starts_with("x-floodgate-"))
                        .collect();
                    let answer = axum::Json(json!({
                        "method": req.method().as_str(),
                        "path": req.uri().path(),
                        "account": hdr("x-floodgate-account"),
                        "event": hdr("x-floodgate-event"),
                        "request_id": hdr("x-request-id"),
                        "request_ids": req
                            .headers()
                            .get_all("x-request-id")
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .collect::<Vec<_>>(),
                        "internal_headers": internal,
                    }));
                    (StatusCode::OK, answer)
                }
            }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Echo {
            addr,
            hits,
            bodies,
            task,
        }
    }

    pub fn upstream(&self) -> String {
        self.addr.to_string()
    }
}

/// One test's world: an echo upstream and one gateway on a private key prefix.
pub struct TestApp {
    pub gw: Option<GatewayHandle>,
    pub echo: Echo,
    pub prefix: String,
    pub http: reqwest::Client,
    pub redis: Conn,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(tweak: impl FnOnce(&mut GatewayConfig)) -> TestApp {
        let echo = Echo::start().await;
        let prefix = unique_prefix();
        let mut c = config(&prefix, vec![echo.upstream()]);
        tweak(&mut c);
        let gw = start(c).await;
        TestApp {
            gw: Some(gw),
            echo,
            prefix,
            http: client(),
            redis: redis_conn().await,
        }
    }

    pub fn gw(&self) -> &GatewayHandle {
        self.gw.as_ref().unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gw().public)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gw().admin)
    }

    pub fn key(&self, event: &str, suffix: &str) -> String {
        format!("{}fg:{{{event}}}:{suffix}", self.prefix)
    }

    pub async fn login(&self, account: &str) -> String {
        login(&self.http, &self.url("/dev/login"), account).await
    }

    pub async fn put_config(&self, event: &str, cfg: Value) -> reqwest::Response {
        self.http
            .put(self.admin_url(&format!("/admin/events/{event}/config")))
            .bearer_auth(ADMIN)
            .json(&cfg)
            .send()
            .await
            .unwrap()
    }

    /// Creates an event whose sale started in the past, with the given admit rate.
    pub async fn open_event(&self, event: &str, rate: u64) {
        let r = self
            .put_config(
                event,
                json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": rate}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }

    pub async fn join(&self, event: &str, token: &str) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/queue/{event}/join")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    pub async fn status(&self, event: &str, token: &str) -> reqwest::Response {
        self.http
            .get(self.url(&format!("/queue/{event}/status")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    /// Polls status until admitted (or panics after `within`); returns the status body.
    pub async fn wait_admitted(&self, event: &str, token: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let r = self.status(event, token).await;
            assert_eq!(r.status(), StatusCode::OK);
            let v: Value = r.json().await.unwrap();
            if v["state"] == "admitted" {
                return v;
            }
            assert!(Instant::now() < deadline, "not admitted in time: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Accounts admitted so far, in admission order, with the instance that admitted them.
    /// Ops revoke `account`'s place or admission in `event` (must answer 200).
    pub async fn revoke(&self, event: &str, account: &str) {
        let r = self
            .http
            .post(self.admin_url(&format!("/admin/events/{event}/revoke")))
            .bearer_auth(ADMIN)
            .json(&json!({ "account": account }))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{}",
            r.text().await.unwrap_or_default()
        );
    }

    pub async fn admissions(&self, event: &str) -> Vec<(String, String, u64)> {
        admissions(&mut self.redis.clone(), &self.key(event, "admissions")).await
    }
}

pub async fn admissions<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    key: &str,
) -> Vec<(String, String, u64)> {
    let v: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    v.ids
        .into_iter()
        .map(|e| {
            let ms: u64 = e.id.split('-').next().unwrap().parse().unwrap();
            let a: String = e.get("a").unwrap();
            let by: String = e.get("by").unwrap();
            (a, by, ms)
        })
        .collect()
}

/// A fan who joined, with their identity token and signed place receipt.
pub struct Fan {
    pub account: String,
    pub token: String,
    pub receipt: String,
}

/// `n` fans (`prefix-0000`…) join `event` at once (32 in flight); each gets a new place and
/// its receipt, as a body field and as a cookie scoped to this event's queue paths.
pub async fn join_fans(app: &TestApp, event: &str, prefix: &str, n: usize) -> Vec<Fan> {
    use futures::StreamExt;
    futures::stream::iter(0..n)
        .map(|i| async move {
            let account = format!("{prefix}-{i:04}");
            let token = app.login(&account).await;
            let r = app.join(event, &token).await;
            assert_eq!(r.status(), StatusCode::CREATED);
            let cookie = r
                .headers()
                .get("set-cookie")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let v = json(r).await;
            let receipt = v["receipt"].as_str().unwrap().to_owned();
            assert!(
                cookie.starts_with(&format!("fg_place={receipt};"))
                    && cookie.contains(&format!("Path=/queue/{event}/;")),
                "{cookie}"
            );
            Fan {
                account,
                token,
                receipt,
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// A fan's status poll, showing their place receipt or not.
pub async fn poll_place(
    app: &TestApp,
    event: &str,
    fan: &Fan,
    receipt: bool,
) -> (StatusCode, Value) {
    let mut req = app
        .http
        .get(app.url(&format!("/queue/{event}/status")))
        .bearer_auth(&fan.token);
    if receipt {
        req = req.header("x-floodgate-place", &fan.receipt);
    }
    let r = req.send().await.unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// A connection to the test Redis (cluster-aware).
pub async fn redis_conn() -> Conn {
    Connector::new(&redis_settings(""))
        .unwrap()
        .conn()
        .await
        .unwrap()
}

pub async fn login(http: &reqwest::Client, url: &str, account: &str) -> String {
    let r = http
        .post(url)
        .json(&json!({"account": account}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    v["token"].as_str().unwrap().to_owned()
}

pub async fn json(r: reqwest::Response) -> Value {
    r.json().await.unwrap()
}

/// Joins `n` fans (`{prefix}-0000`, ...) to `event` in order; returns their login tokens.
pub async fn join_many(app: &TestApp, event: &str, n: usize, prefix: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    for i in 0..n {
        let t = app.login(&format!("{prefix}-{i:04}")).await;
        assert!(app.join(event, &t).await.status().is_success());
        tokens.push(t);
    }
    tokens
}

/// An admission token for account `fan` on event `ev`, valid for a minute.
pub fn fan_token() -> String {
    let tokens = shared::token::AdmissionTokens::new(&token_settings(&["k1"], "k1")).unwrap();
    tokens
        .mint("fan", "s", "ev", chrono::Utc::now().timestamp(), 60)
        .unwrap()
        .0
}

/// `GET path` with `token`.
pub async fn api(app: &TestApp, token: &str, path: &str) -> reqwest::Response {
    app.http
        .get(app.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

/// `POST path` with `token` and `body`.
pub async fn api_post(app: &TestApp, token: &str, path: &str, body: String) -> reqwest::Response {
    app.http
        .post(app.url(path))
        .bearer_auth(token)
        .body(body)
        .send()
        .await
        .unwrap()
}

/// A gauge or counter from a gateway's admin `/metrics` (`admin`: its admin address).
pub async fn metric(http: &reqwest::Client, admin: &str, name: &str) -> Option<i64> {
    let text = http
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    testkit::promtext::value(&text, name, None).map(|v| v as i64)
}
