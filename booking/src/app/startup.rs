//! Builds and runs the booking service. `main` and the tests both go through
//! [`Application::build`], so tests exercise exactly what production runs.

use crate::app::config::BookingConfig;
use crate::app::state::AppState;
use crate::platform::credentials::PublishOperators;
use crate::platform::revocation::RefreshRevocations;
use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub struct Application {
    listener: TcpListener,
    port: u16,
    state: AppState,
}

impl Application {
    /// Binds the listener (port 0 picks a free one) and prepares state. Does not migrate:
    /// call [`crate::platform::db::migrate`] first where wanted (main does, tests use fresh databases).
    pub async fn build(config: BookingConfig) -> anyhow::Result<Self> {
        let pool = crate::platform::db::pool(&config.database)?;
        Self::build_with_pool(config, pool).await
    }

    pub async fn build_with_pool(
        config: BookingConfig,
        pool: sqlx::PgPool,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(&config.booking.listen)
            .await
            .with_context(|| format!("failed to bind {}", config.booking.listen))?;
        let port = listener.local_addr().context("no local address")?.port();
        let state = AppState::new(config, pool)?;
        Ok(Self {
            listener,
            port,
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves, then stops accepting, finishes in-flight requests
    /// and stops background jobs.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut jobs = if self.state.config.booking.jobs_enabled {
            crate::app::jobs::spawn_all(self.state.clone(), stop_rx.clone())
        } else {
            Vec::new()
        };
        // Not a batch job: every instance enforces revocations.
        jobs.push(crate::platform::jobs::spawn(
            Arc::new(RefreshRevocations::new(
                self.state.queue_redis.clone(),
                self.state.config.redis.key_prefix.clone(),
                self.state.revocations().clone(),
            )),
            stop_rx.clone(),
        ));
        // Every instance, too: the gateway's copy of the live operators.
        jobs.push(crate::platform::jobs::spawn(
            Arc::new(PublishOperators::new(
                self.state.pool.clone(),
                self.state.queue_redis.clone(),
                self.state.config.redis.key_prefix.clone(),
            )),
            stop_rx.clone(),
        ));
        let app = crate::app::routes::router(self.state.clone())
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        tracing::info!(port = self.port, "booking listening");
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                tracing::info!("shutdown requested; draining in-flight requests");
            })
            .await
            .context("server error")?;
        let _ = stop_tx.send(true);
        let grace = Duration::from_millis(self.state.config.booking.jobs_stop_grace_ms);
        let aborted = crate::platform::jobs::stop_within(jobs, grace).await;
        if aborted > 0 {
            tracing::warn!(
                aborted,
                grace_ms = self.state.config.booking.jobs_stop_grace_ms,
                "background jobs still running after the grace were cut off"
            );
        }
        Ok(())
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
