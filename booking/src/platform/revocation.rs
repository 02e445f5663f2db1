//! Revoked admissions, enforced by booking as well as the gateway.
//!
//! Booking verifies admission tokens itself (defence in depth), so a fan revoked by ops
//! (`POST /admin/events/{event}/revoke` on the gateway) must not keep using booking directly.
//! Every instance re-reads the gateway's revocation entries from Redis every 250 ms (the same
//! layout and rule, `shared::revocation`: an entry refuses every token of an admission made
//! up to its time, refreshed ones included) and keeps the last known list while Redis is
//! unreachable. Each change bumps a version that open auction WebSockets watch, so a revoked
//! fan's sockets close within a refresh (well under a second).

use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use redis::Value;
use shared::redis_conn::{Connector, query_per_slot};
use shared::revocation::{EventRevocations, Revocations, event_key, events_key};
use shared::token::AdmissionClaims;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// How often the list is re-read (the gateway's default `refresh_ms`).
pub const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// The revocations in force on this instance.
pub struct RevocationList {
    current: RwLock<Arc<Revocations>>,
    version: watch::Sender<u64>,
}

impl Default for RevocationList {
    fn default() -> Self {
        Self {
            current: RwLock::default(),
            version: watch::channel(0).0,
        }
    }
}

impl RevocationList {
    /// True when ops revoked this token's account or session after its admission.
    pub fn refuses(&self, c: &AdmissionClaims) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .refuses(c)
    }

    /// Changes whenever the list does (open connections re-check their caller on it).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Puts `next` in force; wakes the watchers only when something changed.
    pub fn replace(&self, next: Revocations) {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if **cur == next {
            return;
        }
        *cur = Arc::new(next);
        drop(cur);
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// Reads every configured event's revocations from the waiting room's Redis: one `SMEMBERS`
/// and one pipelined round trip (one per event on a cluster).
pub async fn load(redis: &Connector, prefix: &str) -> anyhow::Result<Revocations> {
    let mut conn = redis.conn().await.context("failed to connect to redis")?;
    let events: Vec<String> = redis::cmd("SMEMBERS")
        .arg(events_key(prefix))
        .query_async(&mut conn)
        .await
        .context("failed to list events")?;
    if events.is_empty() {
        return Ok(Revocations::default());
    }
    let pipes: Vec<redis::Pipeline> = events
        .iter()
        .map(|e| {
            let mut p = redis::pipe();
            p.cmd("HGETALL").arg(event_key(prefix, e, "revoked"));
            p
        })
        .collect();
    let rows: Vec<Value> = query_per_slot(&mut conn, &pipes)
        .await
        .context("failed to read revocations")?;
    let mut all = Revocations::default();
    for (event, row) in events.into_iter().zip(rows) {
        let fields: HashMap<String, i64> =
            redis::from_redis_value(row).context("malformed revocation entry")?;
        let entries = EventRevocations::from_fields(fields);
        if !entries.is_empty() {
            all.events.insert(event, entries);
        }
    }
    Ok(all)
}

/// Keeps the revocation list current (every instance runs it, jobs or not). While Redis is
/// unreachable the last known list stays in force (logged once, not every 250 ms).
pub struct RefreshRevocations {
    pub redis: Arc<Connector>,
    pub prefix: String,
    pub list: Arc<RevocationList>,
    failing: AtomicBool,
}

impl RefreshRevocations {
    pub fn new(redis: Arc<Connector>, prefix: String, list: Arc<RevocationList>) -> Self {
        Self {
            redis,
            prefix,
            list,
            failing: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl Job for RefreshRevocations {
    fn name(&self) -> &'static str {
        "revocations"
    }

    fn period(&self) -> Duration {
        REFRESH_EVERY
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        match load(&self.redis, &self.prefix).await {
            Ok(next) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("revocations readable again");
                }
                self.list.replace(next);
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = ?e, "reading revocations failed; keeping the last known list");
                }
            }
        }
        Ok(())
    }
}
