//! The booking binary: load config, set up telemetry, migrate, serve until SIGTERM.

use booking::app::config::BookingConfig;
use booking::app::startup::{Application, shutdown_signal};

// mimalloc, as in the gateway: many small per-request allocations (JSON, rows) on a
// multi-threaded runtime, where glibc malloc's arenas cost measurably more.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A refused config is one line on stderr and exit status 2 (secrets fail closed).
    let config: BookingConfig = shared::config::load_or_exit();
    shared::telemetry::init(&config.log);
    let app = Application::build(config).await?;
    booking::platform::db::migrate(&app.state().pool).await?;
    app.run_until_stopped(shutdown_signal()).await
}
