//! The booking upstreams: round-robin over healthy ones, with active health checks
//! (`GET /healthz` every `health_check_ms`) and passive marking: a refused connection takes
//! an upstream out until its next good check; a connect *timeout* does too, unless it is the
//! last healthy one (see [`Upstreams::connect_failed`]).
//!
//! Each upstream's [`HttpPeer`] is built once and cloned per request: pingora pools upstream
//! connections by the peer's hash, so an identical peer is what makes keep-alive reuse work.

use anyhow::Context;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::upstreams::peer::HttpPeer;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Pushing and popping a Vec cannot leave it half-changed.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct Upstream {
    pub addr: SocketAddr,
    peer: HttpPeer,
    healthy: AtomicBool,
    /// Keep-alive connections of the admitted-API fast path (`forward.rs`), newest last.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    stream: TcpStream,
    since: Instant,
}

pub struct Upstreams {
    list: Vec<Upstream>,
    next: AtomicUsize,
    /// Second (since `born`, plus one) of the last "kept in rotation" warning.
    timeout_logged: AtomicU64,
    born: Instant,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

/// Idle fast-path connections kept per upstream (as pingora's pool: 128).
const IDLE_MAX: usize = 128;
/// An idle connection older than this is closed rather than reused: well inside the usual
/// keep-alive timeouts of HTTP servers, so we never race an upstream closing it.
const IDLE_FOR: Duration = Duration::from_secs(50);

impl Upstreams {
    pub fn new(
        addrs: &[String],
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!addrs.is_empty(), "gateway.upstreams is empty");
        anyhow::ensure!(addrs.len() <= 64, "at most 64 upstreams are supported");
        let mut list = Vec::new();
        for a in addrs {
            let addr = a
                .to_socket_addrs()
                .with_context(|| format!("invalid upstream address {a:?}"))?
                .next()
                .with_context(|| format!("upstream {a:?} resolves to nothing"))?;
            let mut peer = HttpPeer::new(addr, false, String::new());
            peer.options.connection_timeout = Some(connect_timeout);
            peer.options.read_timeout = Some(read_timeout);
            peer.options.write_timeout = Some(read_timeout);
            peer.options.idle_timeout = Some(Duration::from_secs(60));
            list.push(Upstream {
                addr,
                peer,
                // Optimistic until the first check, so a fresh gateway serves at once.
                healthy: AtomicBool::new(true),
                idle: Mutex::new(Vec::new()),
            });
        }
        Ok(Self {
            list,
            next: AtomicUsize::new(0),
            timeout_logged: AtomicU64::new(0),
            born: Instant::now(),
            connect_timeout,
            read_timeout,
        })
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Next healthy upstream not in `tried` (a bit mask of indexes already attempted).
    pub fn pick(&self, tried: u64) -> Option<usize> {
        let n = self.list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| tried & (1 << i) == 0 && self.list[i].healthy.load(Ordering::Relaxed))
    }

    pub fn peer(&self, i: usize) -> Option<Box<HttpPeer>> {
        self.list.get(i).map(|u| Box::new(u.peer.clone()))
    }

    pub fn mark(&self, i: usize, healthy: bool) {
        if let Some(u) = self.list.get(i) {
            let was = u.healthy.swap(healthy, Ordering::Relaxed);
            if was != healthy {
                if healthy {
                    tracing::info!(upstream = %u.addr, "upstream healthy again");
                } else {
                    tracing::warn!(upstream = %u.addr, "upstream marked down");
                }
            }
        }
    }

    /// A connection to upstream `i` could not be made. Refused (or any other error): nothing
    /// listens there, so it is out until its next good health check. Timed out: that is also
    /// what a live upstream whose accept queue overflowed in a burst looks like (the kernel
    /// drops the SYN), so the last healthy upstream stays in — marking it down would turn a
    /// few slow connects into `503` for every fan until the next check, and a dead one still
    /// fails fast by refusal or is caught by the health checker.
    pub fn connect_failed(&self, i: usize, failure: ConnectFailure) {
        if failure == ConnectFailure::TimedOut && !self.any_healthy_except(i) {
            // A burst can time out hundreds of connects at once: one line a second is enough.
            let now = self.born.elapsed().as_secs() + 1;
            if self.timeout_logged.swap(now, Ordering::Relaxed) != now {
                tracing::warn!(
                    upstream = ?self.addr(i),
                    "connect to the last healthy upstream timed out; kept in rotation"
                );
            }
            return;
        }
        self.mark(i, false);
    }

    fn any_healthy_except(&self, i: usize) -> bool {
        self.list
            .iter()
            .enumerate()
            .any(|(k, u)| k != i && u.healthy.load(Ordering::Relaxed))
    }

    /// Applies one health check's result: the same rule as for the proxy's own connects, so a
    /// check that cannot get through a full accept queue does not take out the last healthy
    /// upstream either.
    fn checked(&self, i: usize, seen: Check) {
        match seen {
            Check::Healthy => self.mark(i, true),
            Check::ConnectTimedOut => self.connect_failed(i, ConnectFailure::TimedOut),
            Check::Failed => self.mark(i, false),
        }
    }

    pub fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.list.get(i).map(|u| u.addr)
    }

    /// The newest idle connection to upstream `i` that is still open and quiet. One that has
    /// seen the upstream's FIN (read gives 0), has bytes nobody asked for, or is too old is
    /// closed here instead of being used.
    pub fn take_idle(&self, i: usize) -> Option<TcpStream> {
        let u = self.list.get(i)?;
        loop {
            let Idle { stream, since } = lock(&u.idle).pop()?;
            if since.elapsed() > IDLE_FOR {
                continue;
            }
            let mut probe = [0u8; 1];
            match stream.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(stream),
                _ => continue,
            }
        }
    }

    /// Keeps `stream` for reuse (dropped, so closed, when the pool is full).
    pub fn put_idle(&self, i: usize, stream: TcpStream) {
        if let Some(u) = self.list.get(i) {
            let mut idle = lock(&u.idle);
            if idle.len() < IDLE_MAX {
                idle.push(Idle {
                    stream,
                    since: Instant::now(),
                });
            }
        }
    }

    pub fn any_healthy(&self) -> bool {
        self.list.iter().any(|u| u.healthy.load(Ordering::Relaxed))
    }
}

/// Why a new upstream connection could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// No answer to the SYN in time: a dead host, or a live one whose accept queue is full.
    TimedOut,
    /// Refused, unreachable, or any other error: nothing usable listens there.
    Refused,
}

/// A new upstream connection within `within` (Nagle off), for the gateway's upstream leg
/// and the health checks alike.
pub async fn connect(addr: SocketAddr, within: Duration) -> Result<TcpStream, ConnectFailure> {
    let s = match tokio::time::timeout(within, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectFailure::TimedOut),
        Ok(r) => r.map_err(|_| ConnectFailure::Refused)?,
    };
    s.set_nodelay(true).map_err(|_| ConnectFailure::Refused)?;
    Ok(s)
}

/// What one health check saw.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    Healthy,
    /// The connect itself timed out: dead host, or a live one whose accept queue is full.
    ConnectTimedOut,
    /// Refused, reset, no answer in time, or not a 2xx.
    Failed,
}

/// One `GET /healthz` over a fresh connection, all within `timeout`; healthy on a 2xx status
/// line.
async fn check(addr: SocketAddr, timeout: Duration) -> Check {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut s = match connect(addr, timeout).await {
        Ok(s) => s,
        Err(ConnectFailure::TimedOut) => return Check::ConnectTimedOut,
        Err(ConnectFailure::Refused) => return Check::Failed,
    };
    let probe = async {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: upstream\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buf = [0u8; 16];
        let mut got = 0;
        while got < 12 {
            let n = s.read(&mut buf[got..]).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<bool, std::io::Error>(got >= 12 && buf.starts_with(b"HTTP/1.") && buf[9] == b'2')
    };
    match tokio::time::timeout_at(deadline, probe).await {
        Ok(Ok(true)) => Check::Healthy,
        _ => Check::Failed,
    }
}

/// Background service running the active health checks.
pub struct HealthChecker {
    pub upstreams: Arc<Upstreams>,
    pub every: Duration,
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let timeout = self.every.min(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let mut set = tokio::task::JoinSet::new();
            for (i, u) in self.upstreams.list.iter().enumerate() {
                let addr = u.addr;
                set.spawn(async move { (i, check(addr, timeout).await) });
            }
            while let Some(joined) = set.join_next().await {
                if let Ok((i, seen)) = joined {
                    self.upstreams.checked(i, seen);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_round_robin_over_healthy() {
        let u = Upstreams::new(
            &[
                "127.0.0.1:1".into(),
                "127.0.0.1:2".into(),
                "127.0.0.1:3".into(),
            ],
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        let a = u.pick(0).unwrap();
        let b = u.pick(0).unwrap();
        assert_ne!(a, b);
        u.mark(1, false);
        for _ in 0..10 {
            assert_ne!(u.pick(0), Some(1));
        }
        assert_eq!(u.pick(0b101), None);
        u.mark(0, false);
        u.mark(2, false);
        assert!(!u.any_healthy());
        assert_eq!(u.pick(0), None);
        assert!(Upstreams::new(&[], Duration::ZERO, Duration::ZERO).is_err());
        assert!(Upstreams::new(&["nonsense".into()], Duration::ZERO, Duration::ZERO).is_err());
    }

    #[test]
    fn a_connect_timeout_never_takes_out_the_last_healthy_upstream() {
        let u = Upstreams::new(
            &["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        // With another healthy upstream, a timeout moves traffic there.
        u.connect_failed(0, ConnectFailure::TimedOut);
        assert_eq!(u.pick(0), Some(1));
        assert_eq!(u.pick(0), Some(1));
        // The last one stays in on a timeout...
        u.connect_failed(1, ConnectFailure::TimedOut);
        assert_eq!(u.pick(0), Some(1));
        // ...but not on a refusal.
        u.connect_failed(1, ConnectFailure::Refused);
        assert_eq!(u.pick(0), None);
        // The health checker brings them back.
        u.mark(0, true);
        assert_eq!(u.pick(0), Some(0));
    }

    /// A listener that has stopped accepting, with its accept queue full: connects to it time
    /// out (the kernel drops the SYN), as to a live upstream swamped by a burst.
    async fn swamped() -> (tokio::net::TcpListener, Vec<TcpStream>) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..20 {
            match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => held.push(s),
                Ok(Err(e)) => panic!("connect failed: {e}"),
                Err(_) => return (listener, held),
            }
        }
        panic!("the accept queue never filled");
    }

    #[tokio::test]
    async fn health_checks_tell_a_swamped_upstream_from_a_dead_or_broken_one() {
        let t = Duration::from_millis(300);
        // Answers 200.
        let ok = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ok_addr = ok.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = ok.accept().await {
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        assert_eq!(check(ok_addr, t).await, Check::Healthy);
        // Accepts and never answers: broken, not swamped.
        let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mute_addr = mute.local_addr().unwrap();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((s, _)) = mute.accept().await {
                open.push(s);
            }
        });
        assert_eq!(check(mute_addr, t).await, Check::Failed);
        // Nothing listens.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone_addr = gone.local_addr().unwrap();
        drop(gone);
        assert_eq!(check(gone_addr, t).await, Check::Failed);
        // Swamped.
        let (listener, _held) = swamped().await;
        let swamped_addr = listener.local_addr().unwrap();
        assert_eq!(check(swamped_addr, t).await, Check::ConnectTimedOut);

        // Applied: a swamped last upstream stays in; a broken one goes.
        let u = Upstreams::new(&[swamped_addr.to_string()], t, t).unwrap();
        u.checked(0, check(swamped_addr, t).await);
        assert_eq!(u.pick(0), Some(0));
        u.checked(0, Check::Failed);
        assert_eq!(u.pick(0), None);
        u.checked(0, Check::Healthy);
        assert_eq!(u.pick(0), Some(0));
    }
}
