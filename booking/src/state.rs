//! Shared application state: the pool, a lazily connected Redis, the token verifier, config
//! and metrics. Cheap to clone (one `Arc`).

use crate::config::BookingConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use secrecy::ExposeSecret;
use shared::token::AdmissionTokens;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

pub struct Inner {
    pub config: BookingConfig,
    pub pool: PgPool,
    pub tokens: AdmissionTokens,
    pub metrics: Metrics,
    redis_client: redis::Client,
    redis: OnceCell<ConnectionManager>,
    /// Per-process caches (seat maps etc.), keyed by whatever the owning module needs.
    pub seat_map_cache: crate::seats::SeatMapCache,
    /// SKUs known to exist (cart writes skip the Postgres lookup).
    pub catalog: crate::products::Catalog,
    /// Auction rate limiter, caches and live-price hub.
    pub auctions: crate::auctions::AuctionRuntime,
    /// The payment provider (the Stripe-style HTTP adapter).
    pub payments: Arc<dyn crate::payments::provider::PaymentProvider>,
    /// Revoked admissions, re-read from Redis (`revocation.rs`).
    pub revocations: crate::revocation::RevocationList,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(config: BookingConfig, pool: PgPool) -> anyhow::Result<Self> {
        let tokens =
            AdmissionTokens::new(&config.tokens).context("invalid admission-token keys")?;
        let redis_client =
            redis::Client::open(config.redis.url.expose_secret()).context("invalid redis url")?;
        Ok(Self(Arc::new(Inner {
            tokens,
            metrics: Metrics::new().context("failed to register metrics")?,
            redis_client,
            redis: OnceCell::new(),
            seat_map_cache: Default::default(),
            catalog: Default::default(),
            auctions: crate::auctions::AuctionRuntime::new(&config)
                .context("failed to set up auctions")?,
            payments: Arc::new(
                crate::payments::stripe::HttpProvider::new(&config.payments)
                    .context("failed to set up the payment provider")?,
            ),
            revocations: Default::default(),
            pool,
            config,
        })))
    }

    /// A Redis connection (multiplexed, auto-reconnecting). Connects on first use so booking
    /// starts and serves Postgres-only paths while Redis is down.
    pub async fn redis(&self) -> Result<ConnectionManager, ApiError> {
        let timeout = Duration::from_millis(self.config.redis.response_timeout_ms.max(1));
        let conn = self
            .redis
            .get_or_try_init(|| async {
                let cfg = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config(self.redis_client.clone(), cfg).await
            })
            .await?;
        Ok(conn.clone())
    }

    /// A Redis key with this deployment's prefix.
    pub fn key(&self, suffix: &str) -> String {
        let mut k = String::with_capacity(self.config.redis.key_prefix.len() + suffix.len());
        k.push_str(&self.config.redis.key_prefix);
        k.push_str(suffix);
        k
    }
}
