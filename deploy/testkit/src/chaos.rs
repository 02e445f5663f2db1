//! A TCP proxy a test can break (after the registry backend's `chaosproxy.rs`).
//!
//! It listens on `127.0.0.1:0` and forwards every connection to one target. The controls:
//! - [`ChaosProxy::cut`]: closes every forwarded connection (FIN on both sides) and closes
//!   each new one as soon as it is accepted, until [`ChaosProxy::restore`]. It returns once
//!   every connection it forwarded is closed, so the test's next step sees the outage.
//! - [`ChaosProxy::reset`]: the same with `SO_LINGER` 0, so both peers get a TCP reset.
//! - [`ChaosProxy::slow`]: delays every chunk of bytes, in both directions.
//! - [`ChaosProxy::restore`]: forwards new connections again, at full speed (chunks being
//!   delayed go on at once).
//!
//! Dropping the proxy stops it and closes what it forwarded.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Close connections (FIN).
    Cut,
    /// Close connections with a TCP reset (`SO_LINGER` 0).
    Reset,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    fault: Fault,
    /// Added before forwarding each chunk read from either side.
    delay: Duration,
}

/// See the module docs.
pub struct ChaosProxy {
    addr: SocketAddr,
    settings: watch::Sender<Settings>,
    /// Connections accepted and not yet closed by the proxy.
    open: Arc<watch::Sender<usize>>,
    accept: JoinHandle<()>,
}

impl ChaosProxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: impl Into<String>) -> io::Result<ChaosProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (settings, settings_rx) = watch::channel(Settings {
            fault: Fault::None,
            delay: Duration::ZERO,
        });
        let open = Arc::new(watch::channel(0usize).0);
        let accept = tokio::spawn(accept_loop(
            listener,
            target.into(),
            settings_rx,
            open.clone(),
        ));
        Ok(ChaosProxy {
            addr,
            settings,
            open,
            accept,
        })
    }

    /// Starts a proxy in front of the server of `url` (`postgres://…`, `redis://…`) and
    /// returns it with the same URL pointing at the proxy instead.
    pub async fn in_front_of(url: &str) -> io::Result<(ChaosProxy, String)> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_owned());
        let mut parsed = url::Url::parse(url).map_err(|e| invalid(&format!("bad url: {e}")))?;
        let host = parsed
            .host_str()
            .ok_or_else(|| invalid("url has no host"))?
            .to_owned();
        let port = parsed
            .port()
            .or_else(|| default_port(parsed.scheme()))
            .ok_or_else(|| invalid("url has no port"))?;
        let proxy = ChaosProxy::start(format!("{host}:{port}")).await?;
        parsed
            .set_host(Some("127.0.0.1"))
            .map_err(|e| invalid(&format!("cannot point the url at the proxy: {e}")))?;
        parsed
            .set_port(Some(proxy.addr.port()))
            .map_err(|()| invalid("cannot point the url at the proxy"))?;
        Ok((proxy, parsed.into()))
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections the proxy is forwarding now.
    pub fn open_connections(&self) -> usize {
        *self.open.borrow()
    }

    /// Closes every connection and every new one until [`ChaosProxy::restore`]; returns once
    /// all are closed.
    pub async fn cut(&self) {
        self.break_with(Fault::Cut).await;
    }

    /// Like [`ChaosProxy::cut`], with a TCP reset instead of an orderly close.
    pub async fn reset(&self) {
        self.break_with(Fault::Reset).await;
    }

    /// Delays every chunk of bytes by `delay` from now on (connections stay open).
    pub fn slow(&self, delay: Duration) {
        self.settings.send_modify(|s| s.delay = delay);
    }

    /// Forwards new connections again, without delay.
    pub fn restore(&self) {
        self.settings.send_modify(|s| {
            s.fault = Fault::None;
            s.delay = Duration::ZERO;
        });
    }

    async fn break_with(&self, fault: Fault) {
        self.settings.send_modify(|s| s.fault = fault);
        // The accept loop counts a connection before it looks at the fault, so once the
        // count is zero no connection can still be forwarded.
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|n| *n == 0).await;
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        // Forwarding tasks see the settings sender go and close their connections.
        self.accept.abort();
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "postgres" | "postgresql" => Some(5432),
        "redis" => Some(6379),
        _ => None,
    }
}

/// One accepted connection, counted in `open` until dropped.
struct Counted(Arc<watch::Sender<usize>>);

impl Counted {
    fn new(open: &Arc<watch::Sender<usize>>) -> Counted {
        open.send_modify(|n| *n += 1);
        Counted(open.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: String,
    settings: watch::Receiver<Settings>,
    open: Arc<watch::Sender<usize>>,
) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of file descriptors or similar: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let counted = Counted::new(&open);
        let fault = settings.borrow().fault;
        match fault {
            Fault::None => {
                tokio::spawn(forward(client, target.clone(), settings.clone(), counted));
            }
            Fault::Cut => drop(client),
            Fault::Reset => {
                let _ = client.set_zero_linger();
                drop(client);
            }
        }
    }
}

/// Forwards one connection until either side closes it or a fault is set.
async fn forward(
    mut client: TcpStream,
    target: String,
    settings: watch::Receiver<Settings>,
    _counted: Counted,
) {
    let mut faults = settings.clone();
    let broken = async move {
        match faults.wait_for(|s| s.fault != Fault::None).await {
            Ok(s) => s.fault,
            // The proxy was dropped.
            Err(_) => Fault::Cut,
        }
    };
    let mut upstream: Option<TcpStream> = None;
    let fault = tokio::select! {
        fault = broken => fault,
        () = relay(&mut client, &mut upstream, &target, &settings) => Fault::None,
    };
    if fault == Fault::Reset {
        let _ = client.set_zero_linger();
        if let Some(up) = &upstream {
            let _ = up.set_zero_linger();
        }
    }
}

async fn relay(
    client: &mut TcpStream,
    upstream: &mut Option<TcpStream>,
    target: &str,
    settings: &watch::Receiver<Settings>,
) {
    let Ok(up) = TcpStream::connect(target).await else {
        return;
    };
    let up = upstream.insert(up);
    let _ = up.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let (mut client_read, mut client_write) = client.split();
    let (mut up_read, mut up_write) = up.split();
    // An error in one direction ends both: the connection is broken anyway.
    let _ = tokio::try_join!(
        pump(&mut client_read, &mut up_write, settings),
        pump(&mut up_read, &mut client_write, settings),
    );
}

/// Copies one direction chunk by chunk, honouring the delay; passes EOF on as a half close.
async fn pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    settings: &watch::Receiver<Settings>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        let delay = settings.borrow().delay;
        if !delay.is_zero() {
            // `restore` also ends the wait of a chunk already being delayed.
            let mut restored = settings.clone();
            let _ = tokio::time::timeout(delay, restored.wait_for(|s| s.delay.is_zero())).await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An echo server; returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await?;
        Ok(got)
    }

    /// What the client reads on a connection the proxy closed: EOF (cut) or an error (reset).
    async fn closed(s: &mut TcpStream) -> io::Result<usize> {
        let mut buf = [0u8; 16];
        s.read(&mut buf).await
    }

    #[tokio::test]
    async fn forwards_bytes_both_ways() {
        let proxy = ChaosProxy::start(echo().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"hello").await.unwrap(), b"hello");
        let big = vec![7u8; 200_000];
        assert_eq!(round_trip(&mut s, &big).await.unwrap(), big);
        assert_eq!(proxy.open_connections(), 1);
    }

    #[tokio::test]
    async fn cut_closes_open_connections_and_new_ones_until_restore() {
        let proxy = ChaosProxy::start(echo().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"before").await.unwrap(), b"before");

        proxy.cut().await;
        assert_eq!(proxy.open_connections(), 0);
        assert_eq!(closed(&mut s).await.unwrap(), 0);
        // A new connection is accepted by the kernel, then closed without forwarding.
        let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(closed(&mut s2).await.unwrap(), 0);

        proxy.restore();
        let mut s3 = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s3, b"after").await.unwrap(), b"after");
    }

    #[tokio::test]
    async fn reset_sends_a_tcp_reset() {
        let proxy = ChaosProxy::start(echo().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"ping").await.unwrap(), b"ping");

        proxy.reset().await;
        let err = closed(&mut s).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");

        proxy.restore();
        let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s2, b"pong").await.unwrap(), b"pong");
    }

    #[tokio::test]
    async fn slow_delays_every_chunk_and_restore_ends_it() {
        let proxy = ChaosProxy::start(echo().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.slow(Duration::from_millis(150));
        let t0 = Instant::now();
        assert_eq!(round_trip(&mut s, b"slow").await.unwrap(), b"slow");
        // Delayed on the way there and on the way back.
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        proxy.restore();
        assert_eq!(round_trip(&mut s, b"fast").await.unwrap(), b"fast");
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_its_connections() {
        let proxy = ChaosProxy::start(echo().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"hi").await.unwrap(), b"hi");
        drop(proxy);
        assert_eq!(closed(&mut s).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn in_front_of_rewrites_the_url() {
        let (proxy, url) = ChaosProxy::in_front_of("postgres://u:p@localhost/db?sslmode=disable")
            .await
            .unwrap();
        assert_eq!(
            url,
            format!(
                "postgres://u:p@127.0.0.1:{}/db?sslmode=disable",
                proxy.addr().port()
            )
        );
        let (proxy, url) = ChaosProxy::in_front_of("redis://127.0.0.1:6390")
            .await
            .unwrap();
        assert_eq!(url, format!("redis://127.0.0.1:{}", proxy.addr().port()));
    }
}
