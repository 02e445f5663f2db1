//! Shared application state: the one place that knows every domain's runtime. Handlers take
//! what they need through axum's `FromRef` (the platform's [`Auth`] and [`Redis`], a domain's
//! own state), so a domain never names `AppState`. Cheap to clone (one `Arc`).

use crate::app::config::BookingConfig;
use crate::app::metrics::Metrics;
use crate::platform::auth::Auth;
use crate::platform::error::ApiError;
use crate::platform::redis::Redis;
use crate::platform::revocation::RevocationList;
use anyhow::Context;
use axum::extract::FromRef;
use redis::aio::ConnectionManager;
use shared::token::AdmissionTokens;
use sqlx::PgPool;
use std::sync::Arc;

#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

pub struct Inner {
    pub config: BookingConfig,
    pub pool: PgPool,
    pub metrics: Metrics,
    /// Admission tokens, revocations and the admin secret.
    pub auth: Auth,
    /// Idempotency keys (pool and retention settings).
    pub idempotency: crate::platform::idempotency::Idempotency,
    /// Redis, connected on first use.
    pub redis: Redis,
    pub inventory: crate::inventory::InventoryState,

    pub orders: crate::orders::OrdersState,

    pub outbox: crate::outbox::OutboxState,

    pub payments_domain: crate::payments::PaymentsState,

    pub auctions_domain: crate::auctions::AuctionsState,

    /// Per-process caches (seat maps etc.), keyed by whatever the owning module needs.
    pub seat_map_cache: crate::inventory::seats::SeatMapCache,
    /// Auction rate limiter, caches and live-price hub.
    pub auctions: crate::auctions::AuctionRuntime,
    /// The payment provider (the Stripe-style HTTP adapter).
    pub payments: Arc<dyn crate::payments::provider::PaymentProvider>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl FromRef<AppState> for Auth {
    fn from_ref(state: &AppState) -> Auth {
        state.auth.clone()
    }
}

impl FromRef<AppState> for Redis {
    fn from_ref(state: &AppState) -> Redis {
        state.redis.clone()
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(state: &AppState) -> PgPool {
        state.pool.clone()
    }
}

impl AppState {
    pub fn new(config: BookingConfig, pool: PgPool) -> anyhow::Result<Self> {
        let tokens =
            AdmissionTokens::new(&config.tokens).context("invalid admission-token keys")?;
        let metrics = Metrics::new().context("failed to register metrics")?;
        let auth = Auth::new(
            tokens,
            Arc::new(RevocationList::default()),
            config.admin_token.clone(),
            &metrics.registry,
        )
        .context("failed to register auth metrics")?;
        let redis = Redis::new(&config.redis)?;
        let inventory = crate::inventory::InventoryState {
            pool: pool.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
        };

        let orders = crate::orders::OrdersState {
            pool: pool.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
            idempotency: crate::platform::idempotency::Idempotency::new(
                pool.clone(),
                config.idempotency.clone(),
            ),
            settings: Arc::new(config.orders.clone()),
            metrics: Arc::new(
                crate::orders::CommerceMetrics::register(&metrics.registry)
                    .context("failed to register order metrics")?,
            ),
            refusals: metrics.refusals.clone(),
            catalog: Default::default(),
        };

        let outbox = crate::outbox::OutboxState {
            pool: pool.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
        };

        let payments_domain = crate::payments::PaymentsState {
            pool: pool.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
        };

        let auctions_domain = crate::auctions::AuctionsState {
            pool: pool.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
        };

        Ok(Self(Arc::new(Inner {
            idempotency: crate::platform::idempotency::Idempotency::new(
                pool.clone(),
                config.idempotency.clone(),
            ),
            inventory,
            orders,
            outbox,
            payments_domain,
            auctions_domain,
            auth,
            metrics,
            redis,
            seat_map_cache: Default::default(),
            auctions: crate::auctions::AuctionRuntime::new(&config)
                .context("failed to set up auctions")?,
            payments: Arc::new(
                crate::payments::stripe::HttpProvider::new(&config.payments)
                    .context("failed to set up the payment provider")?,
            ),
            pool,
            config,
        })))
    }

    /// A Redis connection (see [`Redis::conn`]).
    pub async fn redis(&self) -> Result<ConnectionManager, ApiError> {
        self.redis.conn().await
    }

    /// A Redis key with this deployment's prefix.
    pub fn key(&self, suffix: &str) -> String {
        self.redis.key(suffix)
    }

    /// The revocations in force.
    pub fn revocations(&self) -> &Arc<RevocationList> {
        self.auth.revocations()
    }
}

impl FromRef<AppState> for crate::inventory::InventoryState {
    fn from_ref(state: &AppState) -> Self {
        state.inventory.clone()
    }
}

impl FromRef<AppState> for crate::orders::OrdersState {
    fn from_ref(state: &AppState) -> Self {
        state.orders.clone()
    }
}

impl FromRef<AppState> for crate::outbox::OutboxState {
    fn from_ref(state: &AppState) -> Self {
        state.outbox.clone()
    }
}

impl FromRef<AppState> for crate::payments::PaymentsState {
    fn from_ref(state: &AppState) -> Self {
        state.payments_domain.clone()
    }
}

impl FromRef<AppState> for crate::auctions::AuctionsState {
    fn from_ref(state: &AppState) -> Self {
        state.auctions_domain.clone()
    }
}
