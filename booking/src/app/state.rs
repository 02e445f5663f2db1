//! Shared application state: the one place that knows every domain's runtime. It builds each
//! domain's state; `routes` hands each domain router its own (`with_state`), and the domain
//! states give the platform's [`Auth`] to the extractors through `FromRef`, so a domain never
//! names `AppState`. Cheap to clone (one `Arc`).

use crate::app::config::BookingConfig;
use crate::app::metrics::Metrics;
use crate::platform::auth::Auth;
use crate::platform::redis::Redis;
use crate::platform::revocation::RevocationList;
use anyhow::Context;
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
    /// The waiting room's Redis (revocations): `[redis] queue_url` (one server or a cluster)
    /// when set, else the server `url` names.
    pub queue_redis: Arc<shared::redis_conn::Connector>,
    pub inventory: crate::inventory::InventoryState,

    pub orders: crate::orders::OrdersState,

    pub outbox: crate::outbox::OutboxState,

    /// Payments: pool, provider, settings, metrics, idempotency keys.
    pub payments: crate::payments::PaymentsState,

    pub auctions: crate::auctions::AuctionsState,

    /// Ticket codes and the fan's ticket list.
    pub tickets: crate::tickets::TicketsState,

    /// Ticket e-mail: the sender, retention, the ops endpoints.
    pub mail: crate::tickets::mail::MailState,

    /// The ops API's reads (main pool: custom plans for the search).
    pub ops: crate::ops::OpsState,

    /// The door: scanners and check-in.
    pub checkin: crate::checkin::CheckinState,
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
        let metrics = Metrics::new().context("failed to register metrics")?;
        let auth = Auth::new(
            tokens,
            Arc::new(RevocationList::default()),
            config.admin_token.clone(),
            pool.clone(),
            config.booking.admin_auth_failures_per_ip_per_min,
            &metrics.registry,
        )
        .context("failed to register auth metrics")?;
        let redis = Redis::new(&config.redis)?;
        anyhow::ensure!(
            config.redis.mode == shared::config::RedisMode::Standalone
                || config.redis.queue_url.is_some(),
            "redis: mode = \"cluster\" needs queue_url (the cluster's seed nodes) and url (one \
             server for bids, carts and the outbox)"
        );
        let queue_redis = Arc::new(
            shared::redis_conn::Connector::new(&config.redis.queue())
                .context("invalid waiting-room redis settings")?,
        );
        let idempotency = crate::platform::idempotency::Idempotency::new(
            pool.clone(),
            config.idempotency.clone(),
        );

        let inventory = crate::inventory::InventoryState::new(
            pool.clone(),
            auth.clone(),
            idempotency.clone(),
            crate::inventory::InventorySettings {
                sweeper_interval_ms: config.booking.sweeper_interval_ms,
                sweeper_batch: config.booking.sweeper_batch,
                max_seats_per_hold: config.booking.max_seats_per_hold,
                async_commit_holds: config.booking.async_commit_holds,
                hold_batch_max: config.booking.hold_batch_max,
                hold_batch_concurrency: config.booking.hold_batch_concurrency,
                seat_map_cache_s: config.booking.seat_map_cache_s,
                currency: config.orders.currency.clone(),
            },
            crate::inventory::InventoryMetrics::register(
                &metrics.registry,
                metrics.refusals.clone(),
            )
            .context("failed to register inventory metrics")?,
        );

        // Orders and payments run on the checkout pool (generic plans: see its docs).
        let checkout = crate::platform::db::checkout_pool(&pool);
        let order_settings = Arc::new(config.orders.clone());
        let order_metrics = Arc::new(
            crate::orders::CommerceMetrics::register(&metrics.registry)
                .context("failed to register order metrics")?,
        );
        let statements = crate::platform::db::checkout_statements(&pool);
        let orders = crate::orders::OrdersState::new(crate::orders::Inner {
            pool: checkout.clone(),
            statements: statements.clone(),
            redis: redis.clone(),
            auth: auth.clone(),
            idempotency: idempotency.clone(),
            settings: order_settings.clone(),
            metrics: order_metrics.clone(),
            refusals: metrics.refusals.clone(),
            catalog: Default::default(),
            batcher: crate::orders::batcher::Batcher::new(
                statements,
                order_settings,
                order_metrics,
            ),
        });

        let outbox = crate::outbox::OutboxState {
            pool: pool.clone(),
            redis: redis.clone(),
            settings: Arc::new(config.outbox.clone()),
            metrics: crate::outbox::OutboxMetrics::register(&metrics.registry)
                .context("failed to register outbox metrics")?,
        };

        let payments = crate::payments::PaymentsState {
            pool: checkout,
            redis: redis.clone(),
            auth: auth.clone(),
            idempotency: idempotency.clone(),
            provider: Arc::new(
                crate::payments::stripe::HttpProvider::new(&config.payments)
                    .context("failed to set up the payment provider")?,
            ),
            settings: Arc::new(config.payments.clone()),
            metrics: crate::payments::PaymentMetrics::register(&metrics.registry)
                .context("failed to register payment metrics")?,
            order_ttl_s: u64::from(config.orders.ttl_s),
        };

        let auctions = crate::auctions::AuctionsState::new(
            crate::auctions::Clients {
                pool: pool.clone(),
                redis: redis.clone(),
                auth: auth.clone(),
                idempotency: idempotency.clone(),
                metrics: crate::auctions::AuctionMetrics::register(
                    &metrics.registry,
                    metrics.refusals.clone(),
                )
                .context("failed to register auction metrics")?,
            },
            config.auctions.clone(),
            &config.redis,
            &config.tokens,
        )
        .context("failed to set up auctions")?;

        let ops = crate::ops::OpsState {
            pool: pool.clone(),
            auth: auth.clone(),
            queue_redis: queue_redis.clone(),
            redis_prefix: config.redis.key_prefix.clone(),
        };

        let ticket_keys = Arc::new(config.tickets.keys().context("invalid [tickets] keys")?);
        let mail = crate::tickets::mail::MailState {
            pool: pool.clone(),
            keys: ticket_keys.clone(),
            settings: Arc::new(config.mail.clone()),
            mailer: crate::tickets::mail::sender::Mailer::new(&config.mail, config.dev.enabled)
                .context("invalid [mail] settings")?
                .map(Arc::new),
            retention_days: config.tickets.email_retention_days,
            metrics: crate::tickets::mail::MailMetrics::register(&metrics.registry)
                .context("failed to register mail metrics")?,
            auth: auth.clone(),
        };
        let checkin = crate::checkin::CheckinState {
            pool: pool.clone(),
            auth: auth.clone(),
            keys: ticket_keys.clone(),
            metrics: crate::checkin::CheckinMetrics::register(&metrics.registry)
                .context("failed to register check-in metrics")?,
        };
        let tickets = crate::tickets::TicketsState {
            pool: pool.clone(),
            keys: ticket_keys,
            identity: Arc::new(
                shared::identity::IdentityVerifier::new(&config.identity)
                    .context("invalid [identity] settings")?,
            ),
            jwks_max_age_s: config.tickets.jwks_max_age_s,
            transfer: crate::tickets::TransferConfig {
                offer_ttl_s: config.tickets.transfer_offer_ttl_s,
                mail: mail.settings.clone(),
            },
        };

        Ok(Self(Arc::new(Inner {
            ops,
            checkin,
            tickets,
            mail,
            idempotency,
            inventory,
            orders,
            outbox,
            payments,
            auctions,
            auth,
            metrics,
            redis,
            queue_redis,
            pool,
            config,
        })))
    }

    /// The revocations in force.
    pub fn revocations(&self) -> &Arc<RevocationList> {
        self.auth.revocations()
    }
}
