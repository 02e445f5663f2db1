//! Floodgate gateway: the virtual waiting room at the edge, on pingora.
//!
//! A library with a thin `main`: [`Gateway::build`] checks the configuration and prepares
//! everything that does not need a runtime; [`Gateway::run`] starts pingora (blocking, like
//! `run_forever`, stopping on SIGTERM/SIGINT); [`Gateway::spawn`] runs it on its own thread
//! with a programmatic shutdown, which is how the tests start real instances.
//!
//! Services of one instance: the public listener ([`proxy::PublicProxy`]), the admin
//! listener ([`admin::AdminApp`]), and four background services — the admission ticker
//! ([`admission::Ticker`]), the live-config refresher ([`live::Refresher`]), the scheduler of
//! config changes ([`schedule::Scheduler`]) and the upstream health checker
//! ([`upstream::HealthChecker`]). Each service that talks to Redis owns its connection,
//! created lazily inside its own runtime.

pub mod admin;
pub mod admission;
pub mod answers;
pub mod auto;
pub mod clientip;
pub mod config;
pub mod draw;
pub mod event_config;
pub mod fasttoken;
pub mod forward;
pub mod idcache;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod openapi;
pub mod pages;
pub mod pow;
pub mod progress;
pub mod proxy;
pub mod queue;
pub mod registration;
pub mod respond;
pub mod routes;
pub mod schedule;
pub mod session;
pub mod signing;
pub mod sim;
pub mod size;
pub mod slots;
pub mod state;
pub mod store;
pub mod upstream;

use anyhow::Context;
use async_trait::async_trait;
use config::GatewayConfig;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora_core::services::background::background_service;
use secrecy::ExposeSecret;
use shared::identity::IdentityVerifier;
use shared::token::AdmissionTokens;
use state::Shared;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::Store;

pub use config::{GatewaySettings, RateLimits};

/// A configured, not yet running gateway.
pub struct Gateway {
    shared: Arc<Shared>,
    public: SocketAddr,
    admin: SocketAddr,
}

fn resolve(addr: &str, what: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("invalid {what} address {addr:?}"))?
        .next()
        .with_context(|| format!("{what} address {addr:?} resolves to nothing"))
}

impl Gateway {
    /// Validates the configuration (keys, addresses, upstreams) and loads static pages.
    pub fn build(config: GatewayConfig) -> anyhow::Result<Gateway> {
        let g = &config.gateway;
        let public = resolve(&g.listen, "gateway.listen")?;
        let admin = resolve(&g.admin_listen, "gateway.admin_listen")?;
        anyhow::ensure!(
            public != admin,
            "gateway.listen and gateway.admin_listen must differ"
        );
        anyhow::ensure!(g.tick_ms >= 10, "gateway.tick_ms must be at least 10");
        anyhow::ensure!(
            g.lease_ttl_ms > 2 * g.tick_ms,
            "gateway.lease_ttl_ms must exceed two ticks, or the lease lapses between renewals"
        );
        anyhow::ensure!(
            (10..=1000).contains(&g.refresh_ms),
            "gateway.refresh_ms must be 10..=1000 so changes reach every instance within a second"
        );
        let tokens = AdmissionTokens::new(&config.tokens).context("invalid [tokens] keys")?;
        let fast_tokens = fasttoken::FastVerifier::new(&config.tokens);
        let mut identity_settings = config.identity.clone();
        identity_settings.dev_login = config.dev_login_enabled();
        let identity =
            IdentityVerifier::new(&identity_settings).context("invalid [identity] settings")?;
        // Challenges and receipts are tagged with every admission key, the current one first
        // (`signing.rs`), so instances in a rolling rotation accept each other's.
        let current = config
            .tokens
            .keys
            .iter()
            .find(|k| k.kid == config.tokens.current_kid)
            .context("tokens.current_kid not among tokens.keys")?;
        let secrets: Vec<&[u8]> = std::iter::once(current)
            .chain(
                config
                    .tokens
                    .keys
                    .iter()
                    .filter(|k| k.kid != config.tokens.current_kid),
            )
            .map(|k| k.secret.expose_secret().as_bytes())
            .collect();
        let receipts = draw::Receipts::with_keys(secrets.iter().copied());
        let pow = pow::Pow::with_keys(secrets.iter().copied());
        let upstreams = upstream::Upstreams::new(
            &g.upstreams,
            Duration::from_millis(g.upstream_connect_timeout_ms),
            Duration::from_millis(g.upstream_read_timeout_ms),
        )?;
        // Fail at start-up on a bad Redis URL rather than on the first request.
        Store::new(&config.redis)?;
        let mut pages = pages::Pages::load(std::path::Path::new(&g.static_dir));
        pages
            .set_tickets_api(&g.tickets_api_url)
            .context("invalid [gateway] tickets_api_url")?;
        let shared = Shared {
            tokens,
            fast_tokens,
            identity,
            identities: idcache::IdentityCache::new(g.identity_cache_entries),
            live: Default::default(),
            limits: Arc::new(limits::Limits::new(&g.limits)),
            metrics: Arc::new(metrics::Metrics::new().context("failed to register metrics")?),
            upstreams: Arc::new(upstreams),
            window: Default::default(),
            pages,
            receipts,
            pow,
            answers: Default::default(),
            dev_login: config.dev_login_enabled(),
            trusted_proxies: clientip::TrustedProxies::parse(&g.trusted_proxies)?,
            instance: format!("gw-{}", shared::ids::new_id()),
            config,
        };
        Ok(Gateway {
            shared: Arc::new(shared),
            public,
            admin,
        })
    }

    pub fn public_addr(&self) -> SocketAddr {
        self.public
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn instance(&self) -> &str {
        &self.shared.instance
    }

    fn server_with(self, force_work_stealing: bool) -> anyhow::Result<Server> {
        let s = &self.shared;
        let g = &s.config.gateway;
        let conf = ServerConf {
            threads: g.threads.max(1),
            // One thread: a current-thread runtime per service is cheaper (measured ~25 %
            // more proxied requests/s than a one-worker work-stealing runtime).
            work_stealing: (g.work_stealing && g.threads > 1) || force_work_stealing,
            grace_period_seconds: Some(g.grace_period_s),
            graceful_shutdown_timeout_seconds: Some(1),
            // Per-instance paths, so several gateways (tests) never share them.
            pid_file: format!("/tmp/floodgate-{}.pid", s.instance),
            upgrade_sock: format!("/tmp/floodgate-{}.sock", s.instance),
            ..ServerConf::default()
        };
        let mut server = Server::new_with_opt_and_conf(None, conf);
        server.bootstrap();

        let mut public = pingora_proxy::http_proxy_service_with_name(
            &server.configuration,
            proxy::PublicProxy {
                shared: self.shared.clone(),
                store: Arc::new(Store::new(&s.config.redis)?),
                request_seq: Default::default(),
                fast: g.fast_forward,
            },
            "floodgate public",
        );
        if g.reuse_port {
            let mut opts = pingora_core::listeners::TcpSocketOptions::default();
            opts.so_reuseport = Some(true);
            public.add_tcp_with_settings(&self.public.to_string(), opts);
        } else {
            public.add_tcp(&self.public.to_string());
        }
        public.threads = Some(g.threads.max(1));

        let mut admin = pingora_proxy::http_proxy_service_with_name(
            &server.configuration,
            admin::AdminApp {
                shared: self.shared.clone(),
                store: Store::new(&s.config.redis)?,
                failures: match g.limits.admin_auth_failures_per_ip_per_min {
                    0 => None,
                    n => Some(shared::credentials::AuthFailures::new(n)),
                },
            },
            "floodgate admin",
        );
        admin.add_tcp(&self.admin.to_string());
        admin.threads = Some(1);

        let ticker = background_service(
            "admission ticker",
            admission::Ticker {
                store: Store::new(&s.config.redis)?,
                live: s.live.clone(),
                metrics: s.metrics.clone(),
                instance: s.instance.clone(),
                tick: Duration::from_millis(g.tick_ms),
                lease_ttl_ms: g.lease_ttl_ms,
                passthrough_batch: g.passthrough_batch,
                window_s: g.auto_window_s,
            },
        );
        let refresher = background_service(
            "live config",
            live::Refresher {
                store: Store::new(&s.config.redis)?,
                live: s.live.clone(),
                limits: s.limits.clone(),
                window: s.window.clone(),
                metrics: s.metrics.clone(),
                instance: s.instance.clone(),
                every: Duration::from_millis(g.refresh_ms),
                window_s: g.auto_window_s,
            },
        );
        let scheduler = background_service(
            "config schedule",
            schedule::Scheduler {
                store: Store::new(&s.config.redis)?,
                live: s.live.clone(),
                metrics: s.metrics.clone(),
                instance: s.instance.clone(),
                every: Duration::from_millis(g.refresh_ms),
                defaults: (s.tokens.default_ttl_s(), g.default_claim_deadline_s),
            },
        );
        let health = background_service(
            "upstream health",
            upstream::HealthChecker {
                upstreams: s.upstreams.clone(),
                every: Duration::from_millis(g.health_check_ms.max(100)),
            },
        );
        server.add_service(public);
        server.add_service(admin);
        server.add_service(ticker);
        server.add_service(refresher);
        server.add_service(scheduler);
        server.add_service(health);
        Ok(server)
    }

    /// Runs until SIGTERM (graceful) or SIGINT (fast). Blocks; must not be called inside a
    /// tokio runtime.
    pub fn run(self) -> anyhow::Result<()> {
        let (public, admin, instance) = (self.public, self.admin, self.shared.instance.clone());
        let server = self.server_with(false)?;
        tracing::info!(%public, %admin, instance, "gateway starting");
        server.run(RunArgs::default());
        Ok(())
    }

    /// Starts the gateway on its own thread and waits until both listeners accept
    /// connections. Dropping or [`GatewayHandle::stop`]ping the handle shuts it down.
    ///
    /// In-process instances always use work-stealing runtimes: pingora's one-runtime-per-
    /// thread mode keeps its runtime handles in a `thread_local::ThreadLocal`, whose entries
    /// outlive their threads and are handed to new threads that reuse a thread id, so a
    /// second server in the same process would spawn its listeners onto a dead runtime.
    pub fn spawn(self) -> anyhow::Result<GatewayHandle> {
        let (public, admin, instance) = (self.public, self.admin, self.shared.instance.clone());
        let shared = self.shared.clone();
        let server = self.server_with(true)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("gateway-{public}"))
            .spawn(move || {
                server.run(RunArgs {
                    shutdown_signal: Box::new(ChannelSignal(Mutex::new(Some(rx)))),
                });
            })
            .context("failed to start the gateway thread")?;
        let mut handle = GatewayHandle {
            public,
            admin,
            instance,
            shared,
            stop: Some(tx),
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        for addr in [public, admin] {
            while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                if Instant::now() > deadline
                    || handle.thread.as_ref().is_some_and(|t| t.is_finished())
                {
                    handle.shutdown();
                    anyhow::bail!("gateway did not start listening on {addr}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(handle)
    }
}

/// Shutdown trigger for [`Gateway::spawn`]: a fast shutdown (like SIGINT, or a crash as far
/// as the lease is concerned: nothing is released, the lease simply lapses).
struct ChannelSignal(Mutex<Option<tokio::sync::oneshot::Receiver<()>>>);

#[async_trait]
impl ShutdownSignalWatch for ChannelSignal {
    async fn recv(&self) -> ShutdownSignal {
        let rx = self.0.lock().ok().and_then(|mut g| g.take());
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        ShutdownSignal::FastShutdown
    }
}

/// A running gateway started by [`Gateway::spawn`].
pub struct GatewayHandle {
    pub public: SocketAddr,
    pub admin: SocketAddr,
    pub instance: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GatewayHandle {
    /// Prometheus text of this instance (tests read counters from it).
    pub fn metrics_text(&self) -> String {
        String::from_utf8_lossy(&self.shared.metrics.render()).into_owned()
    }

    /// Stops the instance and waits for its threads to finish.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
