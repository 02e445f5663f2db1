//! Bad input at the edge gets a clear answer, never a 502 (issue 14, item 8): body and header
//! size limits, request ids, identity tokens, IPv6 rate-limit keys, Redis-free draw and
//! readiness answers, and signatures that survive a key rotation.

use crate::helpers::*;
use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;
use shared::token::AdmissionTokens;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Booking's default body limit, which the gateway reads from `[booking] body_limit_bytes`.
const BODY_LIMIT: usize = 64 * 1024;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn admission(event: &str) -> String {
    let tokens = AdmissionTokens::new(&token_settings(&["k1"], "k1")).unwrap();
    tokens.mint("fan-edge", "s", event, now(), 60).unwrap().0
}

/// A raw HTTP/1.1 POST whose body is streamed in `chunk`-byte chunks (`Transfer-Encoding:
/// chunked`, as a client that does not know its length sends it), `total` bytes in all. The
/// body keeps being written while the answer is read, as a real uploader does. Returns the
/// status and body of the answer; status 0 when the connection broke without one.
pub(crate) async fn chunked_post(
    addr: SocketAddr,
    path: &str,
    token: &str,
    total: usize,
    chunk: usize,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: edge\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let data = Bytes::from(vec![b' '; chunk]);
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        let mut sent = 0;
        while sent < total {
            let n = chunk.min(total - sent);
            wr.write_all(format!("{n:x}\r\n").as_bytes()).await?;
            wr.write_all(&data[..n]).await?;
            wr.write_all(b"\r\n").await?;
            sent += n;
        }
        wr.write_all(b"0\r\n\r\n").await?;
        Ok::<_, std::io::Error>(wr)
    });
    let answer = read_answer(&mut rd).await;
    // The writer may still be blocked on a connection nobody reads any more.
    writer.abort();
    answer
}

/// Reads one `Content-Length`-framed answer.
async fn read_answer(rd: &mut (impl AsyncReadExt + Unpin)) -> (u16, Value) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let status: u16 = head
                    .split(' ')
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < end + 4 + len {
                    match rd.read(&mut tmp).await {
                        Ok(0) | Err(_) => return (status, Value::Null),
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                let body =
                    serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or(Value::Null);
                return (status, body);
            }
            match rd.read(&mut tmp).await {
                Ok(0) | Err(_) => return (0, Value::Null),
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer within 20 s")
}

/// 8a. A 2 MB body is refused by the gateway with `413 BODY_TOO_LARGE` on both proxy paths
/// (an admitted API POST, which takes the gateway's own upstream leg when small, and the
/// webhook, which goes through pingora-proxy), whether its length is declared or streamed,
/// under concurrency: never a 502, and booking never receives a complete oversized request.
#[tokio::test]
async fn oversized_bodies_are_413_on_both_proxy_paths_never_502() {
    let app = TestApp::spawn().await;
    let tok = admission("ev");
    let big = Bytes::from(vec![b' '; 2 * 1024 * 1024]);
    let paths = ["/api/events/ev/holds", "/webhooks/payments"];
    let hits = app.echo.hits.load(Ordering::SeqCst);
    let bodies = app.echo.bodies.load(Ordering::SeqCst);

    // Declared lengths: refused at once, booking not contacted.
    let calls = (0..60).map(|i| {
        let req = app
            .http
            .post(app.url(paths[i % 2]))
            .bearer_auth(&tok)
            .header("content-type", "application/json")
            .body(big.clone());
        async move {
            let r = req
                .send()
                .await
                .expect("an answer, not a broken connection");
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    });
    for (status, v) in futures::future::join_all(calls).await {
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
        assert_eq!(v["code"], "BODY_TOO_LARGE", "{v}");
        assert_eq!(v["limit_bytes"], BODY_LIMIT, "{v}");
    }
    assert_eq!(
        app.echo.hits.load(Ordering::SeqCst),
        hits,
        "a declared oversized body never reaches booking"
    );

    // Streamed bodies: counted and cut at the limit.
    let addr = app.gw().public;
    let calls = (0..60).map(|i| chunked_post(addr, paths[i % 2], &tok, big.len(), 16 * 1024));
    for (status, v) in futures::future::join_all(calls).await {
        assert_eq!(status, 413, "{v}");
        assert_eq!(v["code"], "BODY_TOO_LARGE", "{v}");
    }
    assert_eq!(
        app.echo.bodies.load(Ordering::SeqCst),
        bodies,
        "booking never received a complete oversized body"
    );

    // Bodies within the limit still pass on both paths, declared or streamed.
    for path in paths {
        let r = app
            .http
            .post(app.url(path))
            .bearer_auth(&tok)
            .header("content-type", "application/json")
            .body(vec![b' '; BODY_LIMIT])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let (status, v) = chunked_post(addr, path, &tok, BODY_LIMIT, 16 * 1024).await;
        assert_eq!(status, 200, "{path}: {v}");
        assert_eq!(v["path"], path);
    }
    assert_eq!(app.echo.bodies.load(Ordering::SeqCst), bodies + 4);

    // A WebSocket's frames are not a request body: more than the limit flows both ways.
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let mut req = format!("ws://{addr}/ws/echo")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {tok}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    for n in 0..3 {
        let msg = format!("{n}").repeat(BODY_LIMIT);
        ws.send(Message::Text(msg.clone().into())).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo within 10 s")
            .expect("socket still open")
            .expect("a frame, not a reset");
        assert_eq!(back.into_text().unwrap().as_str(), msg);
    }
}

/// 8b. A request header block over 16 KiB is answered `431`, on the gateway's own routes and
/// before anything is proxied; one under the limit passes.
#[tokio::test]
async fn header_blocks_over_16_kib_are_431() {
    let app = TestApp::spawn().await;
    let tok = admission("ev");
    let hits = app.echo.hits.load(Ordering::SeqCst);
    let big = "a".repeat(100 * 1024);
    for (method, path) in [
        (reqwest::Method::GET, "/healthz"),
        (reqwest::Method::GET, "/api/events/ev/seats"),
        (reqwest::Method::POST, "/webhooks/payments"),
    ] {
        let r = app
            .http
            .request(method, app.url(path))
            .bearer_auth(&tok)
            .header("x-big", &big)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{path}"
        );
        let v = json(r).await;
        assert_eq!(v["code"], "HEADERS_TOO_LARGE", "{v}");
    }
    assert_eq!(
        app.echo.hits.load(Ordering::SeqCst),
        hits,
        "nothing proxied"
    );
    let r = app
        .http
        .get(app.url("/api/events/ev/seats"))
        .bearer_auth(&tok)
        .header("x-big", "a".repeat(15 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// 8c. A fan's own `x-request-id` never becomes booking's request id: on the gateway's own
/// upstream leg and on pingora-proxy's (the webhook, and everything with `fast_forward` off),
/// booking receives exactly one, the gateway's.
#[tokio::test]
async fn a_fans_request_id_never_reaches_booking() {
    let tok = admission("ev");
    for fast in [true, false] {
        let app = TestApp::spawn_with(|c| c.gateway.fast_forward = fast).await;
        for (method, path) in [
            (reqwest::Method::GET, "/api/events/ev/seats"),
            (reqwest::Method::POST, "/api/orders"),
            (reqwest::Method::POST, "/webhooks/payments"),
        ] {
            let r = app
                .http
                .request(method, app.url(path))
                .bearer_auth(&tok)
                .header("x-request-id", "fan-chosen-id")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let v = json(r).await;
            let ids = v["request_ids"].as_array().unwrap();
            assert_eq!(ids.len(), 1, "fast={fast} {path}: {v}");
            let id = ids[0].as_str().unwrap();
            assert!(
                id.starts_with(&app.gw().instance),
                "fast={fast} {path}: {id}"
            );
        }
    }
}

/// A login token signed with the test gateways' identity key, with exactly these claims.
fn login_token(claims: &Value) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use secrecy::ExposeSecret;
    let key = shared::config::IdentitySettings::default().key;
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.expose_secret().as_bytes());
    let sig = ring::hmac::sign(&k, signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

fn login_claims(account: &str, extra: Value) -> Value {
    let t = now();
    let mut c = serde_json::json!({
        "sub": account, "iss": "floodgate-dev-login", "iat": t, "exp": t + 600,
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// 8d. Login tokens: a future `nbf` is refused, a missing `aud` is refused, and only an
/// explicit `verify_audience = false` accepts a token without one.
#[tokio::test]
async fn identity_tokens_need_their_audience_and_respect_nbf() {
    let app = TestApp::spawn().await;
    app.open_event("idn", 60_000).await;
    let future = login_token(&login_claims(
        "fan-nbf",
        serde_json::json!({"aud": "floodgate", "nbf": now() + 3600}),
    ));
    let no_aud = login_token(&login_claims("fan-noaud", serde_json::json!({})));
    let good = login_token(&login_claims(
        "fan-aud",
        serde_json::json!({"aud": "floodgate"}),
    ));
    for t in [&future, &no_aud] {
        let r = app.join("idn", t).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(json(r).await["code"], "UNAUTHORIZED");
    }
    assert_eq!(app.join("idn", &good).await.status(), StatusCode::CREATED);

    let lax = TestApp::spawn_with(|c| c.identity.verify_audience = false).await;
    lax.open_event("idn", 60_000).await;
    assert_eq!(lax.join("idn", &no_aud).await.status(), StatusCode::CREATED);
    assert_eq!(
        lax.join("idn", &future).await.status(),
        StatusCode::UNAUTHORIZED,
        "nbf is checked whatever the audience setting"
    );
}

/// 8e. Per-IP limits group IPv6 clients by /64: behind a trusted proxy, two addresses of one
/// /64 share one budget, another /64 has its own.
#[tokio::test]
async fn ipv6_clients_share_a_budget_per_64() {
    let app = TestApp::spawn_with(|c| {
        c.gateway.trusted_proxies = vec!["127.0.0.1".into()];
        c.gateway.limits.status_per_ip_per_min = 3;
    })
    .await;
    app.open_event("v6", 60).await;
    let tok = app.login("fan-v6").await;
    let status = |xff: &'static str| {
        app.http
            .get(app.url("/queue/v6/status"))
            .bearer_auth(&tok)
            .header("x-forwarded-for", xff)
            .send()
    };
    for xff in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::abcd"] {
        let r = status(xff).await.unwrap();
        assert_ne!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{xff}");
    }
    let r = status("2001:db8:1:2:ffff::9").await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a fourth address of the same /64 is over the shared budget"
    );
    assert!(r.headers().contains_key("retry-after"));
    let r = status("2001:db8:1:3::1").await.unwrap();
    assert_ne!(r.status(), StatusCode::TOO_MANY_REQUESTS, "another /64");
}

/// Commands a Redis server executes, as `MONITOR` reports them (one line each).
struct Monitor {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
    port: u16,
}

impl Monitor {
    async fn start(port: u16) -> Monitor {
        use tokio::io::AsyncBufReadExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(s).lines();
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "+OK");
        Monitor { lines, port }
    }

    /// The commands executed until now: sends a marker command on another connection and
    /// reads up to it (Redis runs commands one at a time, so everything before it was
    /// already answered).
    async fn drain(&mut self) -> Vec<String> {
        let marker = format!("fg-marker-{}", shared::ids::new_id());
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap();
        c.write_all(format!("ECHO {marker}\r\n").as_bytes())
            .await
            .unwrap();
        let mut seen = Vec::new();
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                if line.contains(&marker) {
                    return;
                }
                seen.push(line);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the marker within 10 s");
        seen
    }
}

/// 8f. A flood of `/queue/{event}/draw` and `/readyz` calls is not a Redis amplifier: 400
/// concurrent calls of each cost a bounded number of Redis commands (counted with `MONITOR`
/// on a private Redis), and a draw for an unknown event costs none.
#[tokio::test]
async fn draw_and_readyz_floods_cost_bounded_redis_commands() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fg-redis-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _redis = crate::redis_outage::PrivateRedis::start(port, &dir);
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(format!("redis://127.0.0.1:{port}"));
        // A private single server, whatever the suite runs on.
        c.redis.mode = shared::config::RedisMode::Standalone;
    })
    .await;
    app.open_event("amp", 60).await;
    let draw = json(
        app.http
            .get(app.url("/queue/amp/draw"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(draw["revealed"], true, "{draw}");
    let mut monitor = Monitor::start(port).await;
    monitor.drain().await;

    let n = 400;
    let calls = (0..n).map(|i| {
        let path = match i % 3 {
            0 => "/queue/amp/draw".to_owned(),
            1 => "/readyz".to_owned(),
            _ => format!("/queue/made-up-{i}/draw"),
        };
        app.http.get(app.url(&path)).send()
    });
    let started = std::time::Instant::now();
    for r in futures::future::join_all(calls).await {
        let r = r.unwrap();
        assert!(
            [
                StatusCode::OK,
                StatusCode::NOT_FOUND,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(&r.status()),
            "{}",
            r.status()
        );
    }
    let seconds = started.elapsed().as_secs() + 1;
    let seen = monitor.drain().await;
    // The draw script reads the seed fields; `PING` is readiness. At most one of each per
    // second of the burst (plus one for a second boundary), against ~133 calls of each.
    let draws = seen.iter().filter(|l| l.contains("\"seed_hash\"")).count() as u64;
    let pings = seen.iter().filter(|l| l.contains("\"PING\"")).count() as u64;
    assert!(draws <= seconds + 1, "{draws} draw reads in {seconds} s");
    assert!(pings <= seconds + 1, "{pings} pings in {seconds} s");
    assert!(
        !seen.iter().any(|l| l.contains("made-up-")),
        "unknown events cost no Redis command"
    );
}

/// 8g. Proof-of-work challenges and place receipts survive a rolling signing-key rotation:
/// an instance with keys `[old, new]` (current `new`) and one still on `[old]` accept each
/// other's challenges and receipts.
#[tokio::test]
async fn challenges_and_receipts_survive_a_rolling_key_rotation() {
    use serde_json::json;
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let mut rotated = config(&prefix, vec![echo.upstream()]);
    rotated.tokens = token_settings(&["old", "new"], "new");
    let mut behind = config(&prefix, vec![echo.upstream()]);
    behind.tokens = token_settings(&["old"], "old");
    let (rotated, behind) = (start(rotated).await, start(behind).await);
    let http = client();
    let url = |g: &gateway::GatewayHandle, path: &str| format!("http://{}{path}", g.public);
    let r = http
        .put(format!("http://{}/admin/events/rot/config", rotated.admin))
        .bearer_auth(ADMIN)
        .json(&json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60, "pow_difficulty": 6}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    for (i, (issuer, checker)) in [(&rotated, &behind), (&behind, &rotated)]
        .into_iter()
        .enumerate()
    {
        let fan = login(&http, &url(issuer, "/dev/login"), &format!("fan-rot-{i}")).await;
        let c = json(
            http.get(url(issuer, "/queue/rot/challenge"))
                .bearer_auth(&fan)
                .send()
                .await
                .unwrap(),
        )
        .await;
        let challenge = c["challenge"].as_str().unwrap().to_owned();
        let solution = gateway::pow::solve(&challenge, 6);
        // The challenge one instance issued is accepted by the other.
        let r = http
            .post(url(checker, "/queue/rot/join"))
            .bearer_auth(&fan)
            .json(&json!({"pow": {"challenge": challenge, "solution": solution}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "join {i}");
        let receipt = json(r).await["receipt"].as_str().unwrap().to_owned();
        // The receipt the checker signed verifies on both instances.
        for g in [issuer, checker] {
            let v = json(
                http.post(url(g, "/queue/rot/receipt"))
                    .json(&json!({"receipt": receipt}))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(v["valid"], true, "receipt {i} on {}", g.instance);
            assert_eq!(v["place"]["sub"], format!("fan-rot-{i}"));
        }
    }
    stop(rotated).await;
    stop(behind).await;
}
