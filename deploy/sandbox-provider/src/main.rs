//! The sandbox payment provider binary: load `[sandbox]` from the shared config, serve until
//! SIGTERM/Ctrl-C.

use sandbox_provider::Application;
use sandbox_provider::config::SandboxConfig;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A refused config is one line on stderr and exit status 2 (secrets fail closed).
    let config: SandboxConfig = shared::config::load_or_exit();
    shared::telemetry::init(&config.log);
    let app = Application::build(config.sandbox).await?;
    app.run_until_stopped(shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
