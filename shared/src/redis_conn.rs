//! A lazily connected Redis for the waiting room's keys: one server or a Redis Cluster
//! (`[redis] mode`), `redis://` or `rediss://` (TLS).
//!
//! Every script and multi-key command of the waiting room touches one event's keys, which
//! share a hash tag and so one cluster slot; a pipeline must stay within one slot in cluster
//! mode ([`Conn::is_cluster`] tells callers to split theirs per event).

use crate::config::{RedisMode, RedisSettings};
use anyhow::Context;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use secrecy::ExposeSecret;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::OnceCell;

/// A connection to the waiting room's Redis (cheap to clone: both kinds are multiplexed).
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

enum Backend {
    Single {
        client: redis::Client,
        conn: OnceLock<ConnectionManager>,
    },
    Cluster {
        // Boxed: a cluster client is several times the size of a single-server one.
        client: Box<ClusterClient>,
        conn: OnceCell<ClusterConnection>,
    },
}

/// Connects on first use, inside the caller's runtime (pingora services each own one; a
/// connection made elsewhere would be driven by a foreign runtime), and reconnects by itself.
pub struct Connector {
    backend: Backend,
    timeout: Duration,
}

impl Connector {
    /// For `settings.url` (booking and the gateway pass [`RedisSettings::queue`] for the
    /// waiting room's server). Cluster mode: `url` lists the seed nodes, comma-separated.
    pub fn new(settings: &RedisSettings) -> anyhow::Result<Self> {
        install_tls_provider();
        let timeout = Duration::from_millis(settings.response_timeout_ms.max(1));
        let url = settings.url.expose_secret();
        let backend = match settings.mode {
            RedisMode::Standalone => Backend::Single {
                client: redis::Client::open(url).context("invalid redis url")?,
                conn: OnceLock::new(),
            },
            RedisMode::Cluster => {
                let seeds: Vec<&str> = url
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                anyhow::ensure!(!seeds.is_empty(), "redis cluster mode needs seed nodes");
                let client = ClusterClientBuilder::new(seeds)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(2)
                    .build()
                    .context("invalid redis cluster seed nodes")?;
                Backend::Cluster {
                    client: Box::new(client),
                    conn: OnceCell::new(),
                }
            }
        };
        Ok(Self { backend, timeout })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A connection; the first call connects (a cluster reads its slot map then).
    pub async fn conn(&self) -> redis::RedisResult<Conn> {
        match &self.backend {
            Backend::Single { client, conn } => {
                if let Some(c) = conn.get() {
                    return Ok(Conn::Single(c.clone()));
                }
                let cfg = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(self.timeout))
                    .set_connection_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let c = ConnectionManager::new_lazy_with_config(client.clone(), cfg)?;
                // Two tasks may race here; the loser's (unconnected) manager is dropped.
                Ok(Conn::Single(conn.get_or_init(|| c).clone()))
            }
            Backend::Cluster { client, conn } => conn
                .get_or_try_init(|| client.get_async_connection())
                .await
                .map(|c| Conn::Cluster(c.clone())),
        }
    }
}

/// `rediss://` needs a rustls crypto provider for the process; ring is the one the rest of
/// the workspace uses. Installing twice is harmless (the second attempt is refused).
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs pipelines that each stay within one slot (one event's keys): as one pipeline on a
/// single server, one after another on a cluster (a cluster pipeline cannot span slots).
/// Returns every reply in order.
pub async fn query_per_slot(conn: &mut Conn, pipes: &[Pipeline]) -> redis::RedisResult<Vec<Value>> {
    if !conn.is_cluster() {
        let mut all = redis::pipe();
        for p in pipes {
            for c in p.cmd_iter() {
                all.add_command(c.clone());
            }
        }
        return all.query_async(conn).await;
    }
    let mut out = Vec::new();
    for p in pipes {
        let part: Vec<Value> = p.query_async(conn).await?;
        out.extend(part);
    }
    Ok(out)
}

/// A Lua script called by hash (`EVALSHA`), falling back to `EVAL` with the source when the
/// node answers `NOSCRIPT`.
///
/// Why not `redis::Script`: on `NOSCRIPT` it sends `SCRIPT LOAD`, which carries no key, so a
/// cluster client routes it to some node — not necessarily the one that owns the keys (after a
/// failover, the promoted replica starts with an empty script cache). `EVAL` is routed by its
/// keys like `EVALSHA`, and loads the script into that node's cache for the next call.
pub struct LuaScript {
    code: &'static str,
    hash: String,
}

impl LuaScript {
    pub fn new(code: &'static str) -> Self {
        Self {
            code,
            hash: redis::Script::new(code).get_hash().to_owned(),
        }
    }

    pub fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`LuaScript`]: keys first, then arguments.
pub struct Invocation<'a> {
    script: &'a LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub fn key<T: redis::ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    fn cmd(&self, name: &str, script: &[u8]) -> Cmd {
        let mut c = redis::cmd(name);
        c.arg(script).arg(self.keys.len());
        for k in &self.keys {
            c.arg(k.as_slice());
        }
        for a in &self.args {
            c.arg(a.as_slice());
        }
        c
    }

    pub async fn invoke_async<T: redis::FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self
            .cmd("EVALSHA", self.script.hash.as_bytes())
            .query_async(con)
            .await
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.cmd("EVAL", self.script.code.as_bytes())
                    .query_async(con)
                    .await
            }
            r => r,
        }
    }
}
