//! One HTTP/1.1 keep-alive connection per virtual client, for the scenarios that compare
//! booking against a raw baseline on the same cores (`holds` against `pgbench`, `auctions`
//! against `redis-benchmark`). `orders` keeps reqwest: see docs/benchmarks.md, session 30.
//!
//! Why not the pooled `reqwest` client the other scenarios use: on this 2-core box the load
//! generator's CPU is taken from the service it measures, and the raw side's client is
//! `pgbench` (C, one prepared statement per round trip). Measured with `deploy/bench/holds.sh`
//! (docs/benchmarks.md, session 27): `reqwest` cost 27 µs of CPU per request against
//! pgbench's 12 µs per statement; its URL parsing, pool lookup and header map per request
//! were a third of the load generator's cost. A client that owns its connection sends a
//! request that is already a URI path and a few headers.
//!
//! A connection that fails is dropped and opened again on the next request; a request that
//! failed is reported as a transport error by the caller, never retried here (the caller
//! counts it).

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use shared::token::AdmissionTokens;
use std::time::Duration;
use tokio::net::TcpStream;

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The answer's status and whole body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

pub struct Conn {
    /// `host:port` to connect to.
    addr: String,
    host: HeaderValue,
    timeout: Duration,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    /// A client of `base` (`http://host:port`, no path); connects on the first request.
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<Self> {
        let addr = base
            .strip_prefix("http://")
            .with_context(|| format!("{base}: only http:// is supported"))?
            .trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') {
            bail!("{base}: expected http://host:port");
        }
        Ok(Self {
            addr: addr.to_owned(),
            host: HeaderValue::from_str(addr).with_context(|| format!("{base}: bad host"))?,
            timeout,
            sender: None,
        })
    }

    /// Sends one request (`path` with its query, a bearer token, an optional
    /// `Idempotency-Key`, an optional JSON body) and reads the whole answer within the timeout.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        bearer: &HeaderValue,
        idempotency_key: Option<HeaderValue>,
        json: Option<Bytes>,
    ) -> anyhow::Result<Answer> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone())
            .header(AUTHORIZATION, bearer.clone());
        if let Some(key) = idempotency_key {
            req = req.header(IDEMPOTENCY_KEY, key);
        }
        if json.is_some() {
            req = req.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let req = req
            .body(Full::new(json.unwrap_or_default()))
            .context("request")?;
        let result = tokio::time::timeout(self.timeout, self.round_trip(req)).await;
        match result {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                bail!("no answer within {:?}", self.timeout)
            }
        }
    }

    async fn round_trip(&mut self, req: Request<Full<Bytes>>) -> anyhow::Result<Answer> {
        let sender = match &mut self.sender {
            Some(s) => s,
            None => self.sender.insert(connect(&self.addr).await?),
        };
        // A kept connection the server has since closed is not ready: nothing was sent on it
        // yet, so a fresh connection takes the request.
        if sender.ready().await.is_err() {
            *sender = connect(&self.addr).await?;
            sender.ready().await.context("connection")?;
        }
        let resp = sender.send_request(req).await.context("send")?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.context("body")?.to_bytes();
        Ok(Answer { status, body })
    }
}

async fn connect(addr: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true).context("nodelay")?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .context("handshake")?;
    // The connection's I/O runs in its own task; it ends when the sender is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// `clients` connections to `base`, each open before this returns: a run's clock then
/// starts with every client connected, not with hundreds of connects at once (a burst of
/// SYNs can overflow the server's listen queue, and a dropped SYN is retried only after a
/// whole second, which a 20 s run would report as its slowest request). A bad `base` or a
/// server that is not there fails here, before the run.
pub async fn open_all(base: &str, clients: usize) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut conn = Conn::new(base, Duration::from_secs(30))?;
        conn.sender = Some(connect(&conn.addr).await?);
        conns.push(conn);
    }
    Ok(conns)
}

/// `Bearer <token>` as a header value.
pub fn bearer(token: &str) -> anyhow::Result<HeaderValue> {
    HeaderValue::try_from(format!("Bearer {token}")).context("token is not a header value")
}

/// A fresh admission of `account` (also its session) for `event`, valid 10 minutes, as a
/// bearer header: what each iteration of the kept-connection scenarios sends as a new fan.
/// `None` when minting fails (the caller counts it).
pub fn fresh_bearer(tokens: &AdmissionTokens, account: &str, event: &str) -> Option<HeaderValue> {
    let now = chrono::Utc::now().timestamp();
    let (token, _) = tokens.mint(account, account, event, now, 600).ok()?;
    bearer(&token).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_bases_are_taken() {
        assert!(Conn::new("http://127.0.0.1:8090", Duration::from_secs(1)).is_ok());
        assert!(Conn::new("http://127.0.0.1:8090/", Duration::from_secs(1)).is_ok());
        assert!(Conn::new("https://127.0.0.1:8090", Duration::from_secs(1)).is_err());
        assert!(Conn::new("http://127.0.0.1:8090/api", Duration::from_secs(1)).is_err());
        assert!(Conn::new("http://", Duration::from_secs(1)).is_err());
    }

    /// Every client is connected before the run starts; a server that is not there fails
    /// the run up front instead of filling its report with transport errors.
    #[tokio::test]
    async fn open_all_connects_every_client_or_fails_up_front() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let conns = open_all(&base, 3).await.expect("open");
        assert_eq!(conns.len(), 3);
        assert!(conns.iter().all(|c| c.sender.is_some()));
        for _ in 0..3 {
            listener.accept().await.expect("each client connected");
        }
        drop(listener);
        assert!(
            open_all(&base, 1).await.is_err(),
            "nothing listens there now"
        );
    }

    /// A real round trip against a one-shot server, and a second one after the server
    /// closed the connection (the client opens a new one).
    #[tokio::test]
    async fn answers_and_reconnects() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (mut s, _) = listener.accept().await.expect("accept");
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.expect("read");
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(head.contains("authorization: Bearer t1"), "{head}");
                assert!(head.contains("idempotency-key: k1"), "{head}");
                s.write_all(
                    b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                )
                .await
                .expect("write");
            }
        });
        let mut conn = Conn::new(&format!("http://{addr}"), Duration::from_secs(5)).expect("conn");
        let auth = bearer("t1").expect("bearer");
        for _ in 0..2 {
            let a = conn
                .send(
                    Method::POST,
                    "/x",
                    &auth,
                    Some(HeaderValue::from_static("k1")),
                    Some(Bytes::from_static(b"{}")),
                )
                .await
                .expect("answer");
            assert_eq!(a.status, 201);
            assert_eq!(&a.body[..], b"ok");
        }
        server.await.expect("server");
    }

    #[test]
    fn fresh_bearer_carries_a_token_booking_would_accept_for_that_fan_and_event() {
        let tokens =
            AdmissionTokens::new(&shared::config::TokenSettings::default()).expect("dev key");
        let auth = fresh_bearer(&tokens, "fan-7", "evt-1").expect("minted");
        let token = auth
            .to_str()
            .expect("ascii")
            .strip_prefix("Bearer ")
            .expect("bearer scheme");
        let claims = tokens.verify(token).expect("verifies");
        assert_eq!(
            (claims.sub.as_str(), claims.evt.as_str()),
            ("fan-7", "evt-1")
        );
        let other = fresh_bearer(&tokens, "fan-8", "evt-1").expect("minted");
        assert_ne!(auth, other, "each fan gets its own token");
    }
}
