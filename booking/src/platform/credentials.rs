//! Operator and scanner credentials in Postgres, and the copy of the live operators
//! booking publishes to Redis for the gateway's admin listener (`shared::credentials`).
//!
//! Booking checks a presented credential against Postgres on every admin call (a primary-key
//! lookup on the hash; admin calls are few), so a revocation is in force here as soon as it
//! commits. The gateway has no Postgres: [`publish`] writes the live operators to Redis right
//! after each change and [`PublishOperators`] again every second on every instance, so a
//! missed write (Redis restarting, a crash between commit and publish) heals within a second.

use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use shared::credentials::{Published, PublishedOperator, Role, operators_key, to_hex};
use shared::redis_conn::Connector;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// An operator credential row, as a check finds it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Found {
    pub id: String,
    pub name: String,
    pub role: String,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The operator whose credential hashes to `hash`, revoked or expired or not.
pub async fn find_operator(pool: &PgPool, hash: &[u8; 32]) -> Result<Option<Found>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, name, role, expires_at, revoked_at FROM credentials
         WHERE hash = $1 AND kind = 'operator'",
    )
    .bind(&hash[..])
    .fetch_optional(pool)
    .await
}

/// A scanner credential row, as a check finds it (`checkin`'s scanners).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FoundScanner {
    pub id: String,
    pub event_id: String,
    pub gate: String,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The scanner whose credential hashes to `hash`, revoked or expired or not.
pub async fn find_scanner(
    pool: &PgPool,
    hash: &[u8; 32],
) -> Result<Option<FoundScanner>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, event_id, gate, expires_at, revoked_at FROM credentials
         WHERE hash = $1 AND kind = 'scanner' AND event_id IS NOT NULL AND gate IS NOT NULL",
    )
    .bind(&hash[..])
    .fetch_optional(pool)
    .await
}

/// The live operators and the newest generation (revoked rows count: a revocation must
/// out-date the snapshot that still listed it), read in one statement so they agree.
pub async fn snapshot(pool: &PgPool) -> anyhow::Result<Published> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Option<String>,
        name: Option<String>,
        role: Option<String>,
        hash: Option<Vec<u8>>,
        expires_at: Option<DateTime<Utc>>,
        generation: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "WITH g AS (SELECT coalesce(max(generation), 0) AS generation FROM credentials)
         SELECT c.id, c.name, c.role, c.hash, c.expires_at, g.generation
         FROM g LEFT JOIN credentials c
           ON c.kind = 'operator' AND c.revoked_at IS NULL AND c.expires_at > now()
         ORDER BY c.id",
    )
    .fetch_all(pool)
    .await
    .context("failed to read the live operators")?;
    let generation = rows.first().map_or(0, |r| r.generation);
    let mut operators = Vec::with_capacity(rows.len());
    for r in rows {
        let (Some(id), Some(name), Some(role), Some(hash), Some(expires_at)) =
            (r.id, r.name, r.role, r.hash, r.expires_at)
        else {
            continue;
        };
        let role = Role::parse(&role).with_context(|| format!("operator {id} has role {role}"))?;
        let hash: [u8; 32] = hash
            .try_into()
            .map_err(|_| anyhow::anyhow!("operator {id} has a malformed hash"))?;
        operators.push(PublishedOperator {
            id,
            name,
            role,
            hash: to_hex(&hash),
            expires_ms: expires_at.timestamp_millis(),
        });
    }
    Ok(Published {
        generation,
        published_ms: Utc::now().timestamp_millis(),
        operators,
    })
}

/// Writes `published` unless Redis already holds a newer generation (one script, atomic).
const PUBLISH: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, old = pcall(cjson.decode, cur)
  if ok and type(old) == 'table' and tonumber(old.generation)
     and tonumber(old.generation) > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

/// Publishes the live operators to the waiting room's Redis. Answers whether it was written
/// (false: a newer snapshot was already there).
pub async fn publish(pool: &PgPool, redis: &Connector, prefix: &str) -> anyhow::Result<bool> {
    let snap = snapshot(pool).await?;
    let json = serde_json::to_string(&snap).context("failed to encode the operators")?;
    let mut conn = redis.conn().await.context("failed to connect to redis")?;
    let written: i64 = redis::Script::new(PUBLISH)
        .key(operators_key(prefix))
        .arg(snap.generation)
        .arg(json)
        .invoke_async(&mut conn)
        .await
        .context("failed to publish the operators")?;
    Ok(written == 1)
}

/// How often every instance republishes.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Keeps the gateway's copy of the live operators current (every instance runs it; it also
/// drops an operator from the copy once their credential expires).
pub struct PublishOperators {
    pool: PgPool,
    redis: Arc<Connector>,
    prefix: String,
    failing: AtomicBool,
}

impl PublishOperators {
    pub fn new(pool: PgPool, redis: Arc<Connector>, prefix: String) -> Self {
        Self {
            pool,
            redis,
            prefix,
            failing: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl Job for PublishOperators {
    fn name(&self) -> &'static str {
        "operators"
    }

    fn period(&self) -> Duration {
        PUBLISH_EVERY
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        match publish(&self.pool, &self.redis, &self.prefix).await {
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("operators published again");
                }
                Ok(())
            }
            // Logged once per outage, not every second.
            Err(e) if self.failing.swap(true, Ordering::Relaxed) => {
                tracing::debug!(error = %e, "still cannot publish the operators");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
