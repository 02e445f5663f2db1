//! A pingora reverse proxy with nothing of Floodgate in it: one upstream, no filters, no token
//! check, no metrics, built and tuned exactly as the gateway is (release profile, mimalloc,
//! one thread per process, SO_REUSEPORT, the same pingora with the same patch). The gateway
//! benchmark (deploy/bench/gateway.sh) runs it beside nginx and the gateway, so the report can
//! say how much of the distance to nginx is pingora's and how much is the gateway's own work.
//!
//!   bare_pingora LISTEN_ADDR UPSTREAM_ADDR
//!
//! Not a product: no configuration, no health checks, no error pages.

use async_trait::async_trait;
use gateway::upstream::Upstreams;
use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    /// Built once and cloned per request: the same peer every time keeps upstream keep-alive
    /// working (pingora pools by the peer's hash), as the gateway does.
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_core::Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

/// The peer exactly as the gateway builds it (gateway/src/upstream.rs, default timeouts from
/// the gateway's config): pingora's timeout wrappers are part of what a real proxy pays.
fn bare_peer(upstream: &str) -> anyhow::Result<HttpPeer> {
    let g = gateway::config::GatewaySettings::default();
    let ups = Upstreams::new(
        &[upstream.to_owned()],
        Duration::from_millis(g.upstream_connect_timeout_ms),
        Duration::from_millis(g.upstream_read_timeout_ms),
    )?;
    ups.peer(0)
        .map(|p| *p)
        .ok_or_else(|| anyhow::anyhow!("no peer for {upstream}"))
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: bare_pingora LISTEN_ADDR UPSTREAM_ADDR");
    };
    let conf = ServerConf {
        threads: 1,
        work_stealing: false,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: format!("/tmp/bare-pingora-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/bare-pingora-{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = pingora_proxy::http_proxy_service(
        &server.configuration,
        Bare {
            peer: bare_peer(&upstream)?,
        },
    );
    let mut opts = pingora_core::listeners::TcpSocketOptions::default();
    opts.so_reuseport = Some(true);
    svc.add_tcp_with_settings(&listen, opts);
    svc.threads = Some(1);
    server.add_service(svc);
    server.run_forever()
}
