//! The expiry job: ends due `PENDING_PAYMENT` orders in `FOR UPDATE SKIP LOCKED` batches (safe
//! on many instances) through the same conditional transition a payment uses, so of a late
//! payment and the expiry exactly one wins. Afterwards it resets the flash gates of the SKUs
//! whose stock came back.

use crate::orders::model::OrderEnd;
use crate::orders::repo::{During, OrderError};
use crate::orders::transitions::end_orders_tx;
use crate::orders::{CommerceMetrics, OrderSettings, flash};
use crate::platform::db;
use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use anyhow::Context;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Ends due orders; see the module doc. Holds only the clients it uses.
pub struct ExpireOrders {
    pool: PgPool,
    redis: Redis,
    metrics: Arc<CommerceMetrics>,
    /// Orders ended per transaction.
    batch: i64,
    period: Duration,
}

/// Claims up to `$1` due orders, oldest expiry first. `statement_timestamp()`, not the volatile
/// `clock_timestamp()`: only a stable bound is an index condition, so the scan starts and stops
/// at the due end of `orders_pending_expiry`. With `clock_timestamp()` it filtered its way
/// through every pending order on each run (every second) whenever none was due yet.
/// `jobs::the_background_claims_read_only_what_is_due` checks the plan.
pub const CLAIM_DUE: &str = "SELECT id FROM orders
      WHERE status = 'PENDING_PAYMENT' AND expires_at <= statement_timestamp()
      ORDER BY expires_at
      LIMIT $1
      FOR UPDATE SKIP LOCKED";

impl ExpireOrders {
    pub fn new(
        pool: PgPool,
        redis: Redis,
        metrics: Arc<CommerceMetrics>,
        settings: &OrderSettings,
    ) -> Self {
        Self {
            pool,
            redis,
            metrics,
            batch: settings.expiry_batch.max(1),
            period: Duration::from_millis(settings.expiry_interval_ms.max(100)),
        }
    }

    /// Ends every order due now, batch by batch. Returns the number of orders expired.
    pub async fn expire_due(&self) -> anyhow::Result<u64> {
        let mut total = 0u64;
        loop {
            let (n, skus) = db::retry(3, || self.expire_batch())
                .await
                .context("order expiry transaction failed")?;
            total += n as u64;
            if n > 0 {
                self.metrics
                    .orders
                    .with_label_values(&["expired"])
                    .inc_by(n as u64);
            }
            // Returned units of hot SKUs: let the gate admit them again (outside the
            // transaction).
            for sku in &skus {
                if let Err(e) = flash::reconcile(&self.pool, &self.redis, sku).await {
                    tracing::warn!(error = ?e, sku, "flash gate reconcile after expiry failed");
                }
            }
            if (n as i64) < self.batch {
                return Ok(total);
            }
        }
    }

    /// One transaction: claims up to `batch` due orders and ends them. Returns how many ended
    /// and the SKUs whose stock came back.
    async fn expire_batch(&self) -> Result<(usize, Vec<String>), OrderError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .during("begin the expiry transaction")?;
        let ids: Vec<String> = sqlx::query_scalar(CLAIM_DUE)
            .bind(self.batch)
            .fetch_all(&mut *tx)
            .await
            .during("claim due orders")?;
        if ids.is_empty() {
            return Ok((0, Vec::new()));
        }
        let (ended, skus) = end_orders_tx(&mut tx, &ids, OrderEnd::Expired).await?;
        tx.commit().await.during("commit the expiry transaction")?;
        Ok((ended.len(), skus))
    }
}

#[async_trait::async_trait]
impl Job for ExpireOrders {
    fn name(&self) -> &'static str {
        "order-expiry"
    }

    fn period(&self) -> Duration {
        self.period
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        self.expire_due().await.map(|_| ())
    }
}
