//! The booking binary: load config, set up telemetry, migrate, serve until SIGTERM.

use anyhow::Context;
use booking::config::BookingConfig;
use booking::startup::{Application, shutdown_signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config: BookingConfig =
        shared::config::load_from_env().context("failed to load configuration")?;
    shared::telemetry::init(&config.log);
    let app = Application::build(config).await?;
    booking::db::migrate(&app.state().pool).await?;
    app.run_until_stopped(shutdown_signal()).await
}
