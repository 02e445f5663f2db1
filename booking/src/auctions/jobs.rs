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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auctions::{AuctionMetrics, AuctionSettings, Clients};
    use crate::platform::auth::Auth;
    use crate::platform::revocation::RevocationList;

    /// A state whose clients connect lazily: enough to build jobs, never used to run them.
    fn state(settings: AuctionSettings) -> AuctionsState {
        let registry = prometheus::Registry::new();
        let tokens = shared::config::TokenSettings::default();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool");
        let redis_settings = shared::config::RedisSettings::default();
        let refusals = prometheus::IntCounterVec::new(prometheus::Opts::new("r", "r"), &["code"])
            .expect("counter");
        let clients = Clients {
            redis: crate::platform::redis::Redis::new(&redis_settings).expect("redis"),
            auth: Auth::new(
                shared::token::AdmissionTokens::new(&tokens).expect("tokens"),
                Arc::new(RevocationList::default()),
                secrecy::SecretString::from(""),
                pool.clone(),
                20,
                &registry,
            )
            .expect("auth"),
            idempotency: crate::platform::idempotency::Idempotency::new(
                pool.clone(),
                Default::default(),
            ),
            metrics: AuctionMetrics::register(&registry, refusals).expect("metrics"),
            pool,
        };
        AuctionsState::new(clients, settings, &redis_settings, &tokens).expect("state")
    }

    #[tokio::test]
    async fn the_domain_runs_the_closer_and_the_consumer_at_their_bounded_periods() {
        let jobs = jobs(&state(AuctionSettings {
            closer_interval_ms: 1,
            consumer_interval_ms: 1,
            ..Default::default()
        }));
        let seen: Vec<_> = jobs.iter().map(|j| (j.name(), j.period())).collect();
        assert_eq!(
            seen,
            [
                ("auction-closer", Duration::from_millis(50)),
                ("hot-bid-consumer", Duration::from_millis(5)),
            ]
        );
        let defaults = jobs_periods(AuctionSettings::default());
        assert_eq!(
            defaults,
            [Duration::from_millis(1000), Duration::from_millis(50)]
        );
    }

    fn jobs_periods(settings: AuctionSettings) -> Vec<Duration> {
        jobs(&state(settings)).iter().map(|j| j.period()).collect()
    }
}
