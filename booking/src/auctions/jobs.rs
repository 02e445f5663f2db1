//! The auctions domain's background jobs, run by the platform's job runner under the
//! process's stop signal: the closer and the hot-bid consumer. Both are safe on any number of
//! instances (`FOR UPDATE SKIP LOCKED`, a stream consumer group).

use super::{AuctionsState, closer, hot};
use crate::platform::jobs::Job;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// Every auctions job, for the app's runner.
pub fn jobs(state: &AuctionsState) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(CloseAuctions(state.clone())),
        Arc::new(ConsumeHotBids(state.clone())),
    ]
}

/// Closes due auctions ([`closer::close_due`]) and tidies the bid rate limiter.
pub struct CloseAuctions(pub AuctionsState);

#[async_trait]
impl Job for CloseAuctions {
    fn name(&self) -> &'static str {
        "auction-closer"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.closer_interval_ms.max(50))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        closer::close_due(&self.0).await?;
        self.0.runtime.tidy();
        Ok(())
    }
}

/// Copies accepted hot bids from the Redis streams to Postgres ([`hot::consume_all`]).
pub struct ConsumeHotBids(pub AuctionsState);

#[async_trait]
impl Job for ConsumeHotBids {
    fn name(&self) -> &'static str {
        "hot-bid-consumer"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.consumer_interval_ms.max(5))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        hot::consume_all(&self.0).await?;
        Ok(())
    }
}
