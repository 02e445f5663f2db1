//! The gateway's upstream leg (`forward.rs`, `upstream.rs`): dead and stalled upstreams,
//! requests never sent twice, every framing an upstream may use, pooled connections,
//! concurrency.

use crate::helpers::*;
use reqwest::StatusCode;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[tokio::test]
async fn upstream_down_is_a_clear_503_and_healthy_peers_take_over() {
    let dead = format!("127.0.0.1:{}", free_port());
    let app = TestApp::spawn_with(|c| c.gateway.upstreams = vec![dead.clone()]).await;
    let tok = fan_token();
    let t0 = Instant::now();
    let r = api(&app, &tok, "/api/orders").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(json(r).await["code"], "UPSTREAM_UNAVAILABLE");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // One dead and one live upstream: every request is served (connect failures move on).
    let live = TestApp::spawn_with(|c| {
        let echo_addr = c.gateway.upstreams[0].clone();
        c.gateway.upstreams = vec![dead.clone(), echo_addr];
    })
    .await;
    for _ in 0..20 {
        let r = live
            .http
            .post(live.url("/api/orders"))
            .bearer_auth(&tok)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn non_idempotent_request_is_not_retried_after_it_was_sent() {
    // An upstream that reads the request and hangs up without answering.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s2 = seen.clone();
    let task = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let seen = s2.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                if req.starts_with("GET /healthz") {
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                } else if n > 0 {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    let app =
        TestApp::spawn_with(|c| c.gateway.upstreams = vec![addr.to_string(), addr.to_string()])
            .await;
    let tok = fan_token();
    let r = api_post(&app, &tok, "/api/orders", "{}".into()).await;
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(json(r).await["code"], "UPSTREAM_UNAVAILABLE");
    // No waiting needed: the upstream counts a request before it hangs up, and the gateway
    // answers only once its last attempt saw that hang-up, so a retry is already counted.
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the POST was sent more than once"
    );
    task.abort();
}

/// A booking stand-in that speaks HTTP/1.1 by hand, to drive the gateway's own upstream leg
/// (`forward.rs`) through every framing an upstream may use. Counts API connections (health
/// checks aside) and the POST bodies it received.
struct Scripted {
    addr: std::net::SocketAddr,
    api_connections: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Health checks answered.
    health_checks: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Connections closed by `/api/then-close`.
    closed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    posts: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// `false` stops taking connections off the accept queue (a stalled or swamped upstream).
    accepting: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn scripted_upstream() -> Scripted {
    // A deep accept queue: the concurrency test opens hundreds of upstream connections at once.
    scripted_upstream_with(4096).await
}

async fn scripted_upstream_with(backlog: u32) -> Scripted {
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(backlog).unwrap();
    let addr = listener.local_addr().unwrap();
    let api_connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let health_checks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let closed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let posts = Arc::new(Mutex::new(Vec::new()));
    let (conns, bodies) = (api_connections.clone(), posts.clone());
    let (checks, closes) = (health_checks.clone(), closed.clone());
    let (accepting, mut open) = tokio::sync::watch::channel(true);
    let task = tokio::spawn(async move {
        loop {
            if open.wait_for(|open| *open).await.is_err() {
                return;
            }
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (conns, bodies) = (conns.clone(), bodies.clone());
            let (checks, closes) = (checks.clone(), closes.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut counted = false;
                loop {
                    // One request: header block, then Content-Length bytes of body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 4096];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
                    buf.drain(..head_end + len);
                    let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    if target != "/healthz" && !counted {
                        counted = true;
                        conns.fetch_add(1, Ordering::SeqCst);
                    }
                    let answer: Vec<u8> = match target.as_str() {
                        "/api/chunked" => b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nx-trailer: t\r\n\r\n".to_vec(),
                        "/api/until-close" => {
                            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\nx-framing: close\r\n\r\nuntil the end").await;
                            return;
                        }
                        "/api/nothing" => b"HTTP/1.1 204 No Content\r\nx-ok: 1\r\n\r\n".to_vec(),
                        "/api/continue" => b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok".to_vec(),
                        "/api/garbage" => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello".to_vec(),
                        "/api/echo" => {
                            bodies.lock().unwrap().push(body.clone());
                            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
                        }
                        "/api/then-close" => {
                            // Answers, stays quiet, then closes the idle keep-alive connection.
                            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbye!").await;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            drop(sock);
                            closes.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        _ => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{target}", target.len()).into_bytes(),
                    };
                    if sock.write_all(&answer).await.is_err() {
                        return;
                    }
                    if target == "/healthz" {
                        checks.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    Scripted {
        addr,
        api_connections,
        health_checks,
        closed,
        posts,
        accepting,
        task,
    }
}

/// A gateway in front of a fresh scripted upstream, and an admission token for event `ev`.
async fn gateway_before_scripted() -> (Scripted, TestApp, String) {
    let up = scripted_upstream().await;
    let app = TestApp::spawn_with(|c| c.gateway.upstreams = vec![up.addr.to_string()]).await;
    (up, app, fan_token())
}

#[tokio::test]
async fn the_gateways_upstream_leg_handles_every_framing() {
    let (up, app, tok) = gateway_before_scripted().await;

    let r = api(&app, &tok, "/api/chunked").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "hello world");
    let r = api(&app, &tok, "/api/until-close").await;
    assert_eq!(r.headers()["x-framing"], "close");
    assert_eq!(r.text().await.unwrap(), "until the end");
    let r = api(&app, &tok, "/api/nothing").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["x-ok"], "1");
    let r = api(&app, &tok, "/api/continue").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.text().await.unwrap(), "ok");
    let r = api(&app, &tok, "/api/garbage").await;
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(json(r).await["code"], "UPSTREAM_UNAVAILABLE");
    let r = app
        .http
        .head(app.url("/api/sized"))
        .bearer_auth(&tok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-length"], "10");
    assert_eq!(r.bytes().await.unwrap().len(), 0);

    // Bodies go through byte for byte.
    let body = json!({"seats": ["A-1", "A-2"], "note": "日本語 ✓"}).to_string();
    let r = app
        .http
        .post(app.url("/api/echo"))
        .bearer_auth(&tok)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), body);

    // Keep-alive: a run of sequential calls reuses upstream connections.
    let before = up.api_connections.load(Ordering::SeqCst);
    for i in 0..50 {
        let r = api(&app, &tok, &format!("/api/n{i}")).await;
        assert_eq!(r.text().await.unwrap(), format!("/api/n{i}"));
    }
    let opened = up.api_connections.load(Ordering::SeqCst) - before;
    assert!(opened <= 2, "50 calls opened {opened} upstream connections");
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_never_used() {
    let (up, app, tok) = gateway_before_scripted().await;
    for round in 0..5 {
        // The answer leaves a keep-alive connection in the pool that the upstream then closes.
        let r = api(&app, &tok, "/api/then-close").await;
        assert_eq!(r.text().await.unwrap(), "bye!");
        let deadline = Instant::now() + Duration::from_secs(5);
        while up.closed.load(Ordering::SeqCst) <= round {
            assert!(Instant::now() < deadline, "the upstream never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Closed a little while ago, as by an idle keep-alive timeout (the gateway learns of
        // it from its event loop; a request racing the close itself is HTTP's own race).
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A POST (never retried once sent) must not be sent on the dead connection.
        let body = format!("{{\"round\":{round}}}");
        let r = api_post(&app, &tok, "/api/echo", body.clone()).await;
        assert_eq!(r.status(), StatusCode::OK, "round {round}");
        assert_eq!(r.text().await.unwrap(), body);
    }
    assert_eq!(
        up.posts.lock().unwrap().len(),
        5,
        "each POST arrived exactly once"
    );
}

/// Hundreds of fans at once through the gateway's upstream leg: every answer is the one to its
/// own request (a pooled connection never carries someone else's answer), and every POST
/// reaches booking exactly once — or, when the burst of new upstream connections overflows
/// the upstream's accept queue and the gateway answers 503, not at all.
#[tokio::test]
async fn concurrent_calls_each_get_their_own_answer_once() {
    let (up, app, tok) = gateway_before_scripted().await;
    let calls = (0..300).map(|i| {
        let (app, tok) = (&app, &tok);
        async move {
            let (r, expected, body) = if i % 3 == 0 {
                let path = format!("/api/get-{i}");
                (api(app, tok, &path).await, path, None)
            } else {
                let body = format!("{{\"fan\":{i},\"pad\":\"{}\"}}", "x".repeat(i * 7));
                let r = api_post(app, tok, "/api/echo", body.clone()).await;
                (r, body.clone(), Some(body))
            };
            match r.status() {
                StatusCode::OK => {
                    assert_eq!(r.text().await.unwrap(), expected, "someone else's answer");
                    body
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(json(r).await["code"], "UPSTREAM_UNAVAILABLE");
                    None
                }
                other => panic!("call {i}: unexpected {other}"),
            }
        }
    });
    let mut answered: Vec<String> = futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect();
    let mut received = up.posts.lock().unwrap().clone();
    answered.sort();
    received.sort();
    assert!(!answered.is_empty());
    assert_eq!(
        received, answered,
        "booking got exactly the POSTs that were answered, each once"
    );
}

/// A launch burst can overflow booking's accept queue; the kernel then drops SYNs and the
/// gateway's connect times out. When that upstream is the only healthy one, the call that
/// timed out gets 503 — but the upstream stays in rotation, so the next call is served at once
/// instead of every fan getting 503 until the next health check. Both proxy paths.
#[tokio::test]
async fn a_connect_timeout_does_not_take_out_the_only_upstream() {
    let tok = fan_token();
    for fast_forward in [true, false] {
        let up = scripted_upstream_with(1).await;
        let app = TestApp::spawn_with(|c| {
            c.gateway.upstreams = vec![up.addr.to_string()];
            c.gateway.fast_forward = fast_forward;
            c.gateway.upstream_connect_timeout_ms = 300;
            // Only the check at start-up runs during the test: whatever comes back, it is not
            // the health checker's doing.
            c.gateway.health_check_ms = 600_000;
        })
        .await;
        // The start-up health check has run (it saw a healthy upstream) before we stall it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while up.health_checks.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "no health check reached the upstream"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Stall the upstream and fill its accept queue until a connect times out.
        up.accepting.send_replace(false);
        let mut held = Vec::new();
        let mut full = false;
        for _ in 0..20 {
            let connect = tokio::net::TcpStream::connect(up.addr);
            match tokio::time::timeout(Duration::from_millis(300), connect).await {
                Ok(Ok(s)) => held.push(s),
                Ok(Err(e)) => panic!("connect to the stalled upstream failed: {e}"),
                Err(_) => {
                    full = true;
                    break;
                }
            }
        }
        assert!(full, "the accept queue never filled");

        let r = api(&app, &tok, "/api/first").await;
        assert_eq!(
            r.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "fast_forward={fast_forward}"
        );
        assert_eq!(json(r).await["code"], "UPSTREAM_UNAVAILABLE");

        // The upstream catches up: once its queue has room again (a probe connects; a SYN
        // dropped before that is only retried after a second), the very next call is served.
        up.accepting.send_replace(true);
        drop(held);
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(up.addr),
        )
        .await
        .expect("the upstream accepts again")
        .unwrap();
        let r = api(&app, &tok, "/api/second").await;
        assert_eq!(r.status(), StatusCode::OK, "fast_forward={fast_forward}");
        assert_eq!(r.text().await.unwrap(), "/api/second");
    }
}
