//! Tracing setup, done once per process: JSON logs in production, pretty locally, and the
//! `log` bridge so libraries that log through `log` (pingora, sqlx) are not lost.

use crate::config::LogSettings;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call more than once (later calls are no-ops),
/// which matters for tests that start several services in one process.
pub fn init(settings: &LogSettings) {
    let _ = tracing_log::LogTracer::init();
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .or_else(|_| EnvFilter::try_new(&settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if settings.format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
}

/// For tests: logs only when `TEST_LOG` is set, so test output stays readable by default.
pub fn init_for_tests() {
    if std::env::var_os("TEST_LOG").is_some() {
        init(&LogSettings {
            format: "pretty".into(),
            level: "info,sqlx=warn".into(),
        });
    }
}
