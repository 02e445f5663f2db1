//! Postgres plumbing: the pool, the migrator, and bounded retry of transactions that lost a
//! deadlock or serialization race (retried from the top, never partially).

use crate::platform::error::ApiError;
use anyhow::Context;
use secrecy::ExposeSecret;
use shared::config::DatabaseSettings;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::future::Future;
use std::time::Duration;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Builds the pool. Connections are opened lazily so the process starts (and `/readyz`
/// reports the problem) even when Postgres is briefly unreachable.
///
/// Every connection (the derived pools' too) runs with `jit = off`: booking's statements are
/// short, and Postgres compiles a plan whose ESTIMATED cost passes `jit_above_cost`, which a
/// launch's stale statistics make happen for queries that then read nothing. The cancelled
/// events' job (every second) spent 120–280 ms per run compiling an empty query in the orders
/// bench (docs/decisions.md, "No JIT").
///
/// They also run with `[database] statement_timeout_ms` and `idle_in_transaction_timeout_ms`
/// (docs/decisions.md, "Every statement has a deadline"), set at connect time so that no
/// statement of the process, the derived pools' included, runs without them.
pub fn pool(settings: &DatabaseSettings) -> anyhow::Result<PgPool> {
    let connect: PgConnectOptions = settings
        .url
        .expose_secret()
        .parse()
        .context("invalid database url")?;
    let statement_timeout = settings.statement_timeout_ms.to_string();
    let idle_timeout = settings.idle_in_transaction_timeout_ms.to_string();
    Ok(PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
        .connect_lazy_with(connect.options([
            ("jit", "off"),
            ("statement_timeout", statement_timeout.as_str()),
            ("idle_in_transaction_session_timeout", idle_timeout.as_str()),
        ])))
}

/// A second pool on the same database, the same size (opened lazily), whose connections start
/// with `settings` (`SET`s that would be wrong for every other statement of the process).
pub fn derived_pool(pool: &PgPool, settings: &[(&str, &str)]) -> PgPool {
    derived_pool_of(pool, settings, pool.options().get_max_connections())
}

/// [`derived_pool`] of `size` connections at most.
pub fn derived_pool_of(pool: &PgPool, settings: &[(&str, &str)], size: u32) -> PgPool {
    let connect = (*pool.connect_options())
        .clone()
        .options(settings.iter().copied());
    let opts = pool.options();
    PgPoolOptions::new()
        .max_connections(size.max(1))
        .acquire_timeout(opts.get_acquire_timeout())
        .connect_lazy_with(connect)
}

/// The checkout pool: the orders and payments domains' connections (an order, the pay request,
/// the provider's webhooks, reconciliation), whose statements are point lookups by key:
/// - `plan_cache_mode = force_generic_plan`: with the default (`auto`) Postgres plans the
///   purchase's large CTE statements anew on every execution (their generic plan never looks
///   cheap enough to adopt), 0.2–0.9 ms of CPU per statement, ~2 ms per purchase (issue 16,
///   `deploy/bench/statements.sh`'s purchase rate: 7.5 → 5.2 ms of Postgres CPU per purchase);
/// - `enable_seqscan = off`: the guard of a generic plan, which cannot see a parameter's value,
///   against scanning a whole table where an index finds the rows (a seq scan is still used
///   where no index can serve).
///
/// Commits stay durable (money). The inventory's hold statements have their own pool
/// (`holds::take::hold_pool`), everything else stays on the main pool.
pub fn checkout_pool(pool: &PgPool) -> PgPool {
    derived_pool(pool, CHECKOUT_SETTINGS)
}

const CHECKOUT_SETTINGS: &[(&str, &str)] = &[
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
];

/// The checkout's one-statement orders (a cart order): the checkout pool's settings on a
/// [`KeptPool`](crate::platform::kept::KeptPool), one round trip per order. Its transactions'
/// pool is never used (the order's fallback is a transaction on the checkout pool), so it
/// never opens a connection.
pub fn checkout_statements(pool: &PgPool) -> crate::platform::kept::KeptPool {
    crate::platform::kept::KeptPool::new(
        derived_pool(pool, CHECKOUT_SETTINGS),
        derived_pool_of(pool, CHECKOUT_SETTINGS, 1),
    )
}

/// Applies pending migrations, on a connection of their own without the pool's statement
/// deadlines: a migration (an index on a large table) and the migrator's lock, which a second
/// process starting at the same time waits for, may take longer than any request should. The
/// connection is closed afterwards rather than returned to the pool with its limits lifted.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    let mut conn = pool
        .acquire()
        .await
        .context("connect to apply migrations")?
        .detach();
    sqlx::raw_sql("SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0")
        .execute(&mut conn)
        .await
        .context("lift the statement deadlines for the migrations")?;
    let applied = MIGRATOR
        .run(&mut conn)
        .await
        .context("failed to apply migrations");
    if let Err(e) = sqlx::Connection::close(conn).await {
        tracing::debug!(error = ?e, "closing the migrations' connection");
    }
    applied
}

/// True for errors that mean "run the whole transaction again": deadlock detected (40P01)
/// and serialization failure (40001).
pub fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40P01") | Some("40001")
    )
}

/// An error that may carry a retryable database error.
pub trait MaybeRetryable {
    fn retryable(&self) -> bool;
}

impl MaybeRetryable for sqlx::Error {
    fn retryable(&self) -> bool {
        is_retryable(self)
    }
}

/// Handlers return `ApiError`; this lets [`retry`] see a database error inside it.
#[derive(Debug)]
pub enum TxError {
    Db(sqlx::Error),
    Api(ApiError),
}

impl From<sqlx::Error> for TxError {
    fn from(e: sqlx::Error) -> Self {
        TxError::Db(e)
    }
}

impl From<ApiError> for TxError {
    fn from(e: ApiError) -> Self {
        TxError::Api(e)
    }
}

impl From<TxError> for ApiError {
    fn from(e: TxError) -> Self {
        match e {
            TxError::Db(e) => e.into(),
            TxError::Api(e) => e,
        }
    }
}

impl MaybeRetryable for TxError {
    fn retryable(&self) -> bool {
        matches!(self, TxError::Db(e) if is_retryable(e))
    }
}

/// Runs `f` (one whole transaction) up to `1 + retries` times while it fails with a deadlock
/// or serialization error. Nothing outside the database may happen inside `f`.
pub async fn retry<T, E, F, Fut>(retries: u32, mut f: F) -> Result<T, E>
where
    E: MaybeRetryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(e) if e.retryable() && attempt < retries => {
                attempt += 1;
                tracing::debug!(
                    attempt,
                    "transaction retried after deadlock/serialization failure"
                );
                // A little jitter so the two losers of a deadlock do not collide again.
                let ms = rand::random::<u64>() % (5 * u64::from(attempt)) + 1;
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            other => return other,
        }
    }
}
