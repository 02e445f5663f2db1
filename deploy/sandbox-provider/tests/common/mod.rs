//! What the sandbox's test crates share: a sandbox of their own on a free port (manual
//! webhooks: nothing is delivered unless a test asks), and for the official-client checks
//! (`stripe_node.rs`, `stripe_python.rs`) running a check script against it and the rule for a
//! missing toolchain (fail under `CI`, else skip loudly).

use sandbox_provider::config::{SandboxSettings, WebhookMode};
use sandbox_provider::{Application, Sandbox};
use secrecy::SecretString;
use std::path::PathBuf;
use std::process::Command;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Starts a sandbox that takes `key`; its base URL and a handle on it.
pub async fn start(key: &str) -> (String, Sandbox) {
    let app = Application::build(SandboxSettings {
        listen: "127.0.0.1:0".into(),
        api_key: SecretString::from(key),
        webhook_mode: WebhookMode::Manual,
        ..SandboxSettings::default()
    })
    .await
    .expect("build the sandbox");
    let url = format!("http://127.0.0.1:{}", app.port());
    let sandbox = app.sandbox();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    (url, sandbox)
}

/// Runs a check script (`SANDBOX_URL` and `SANDBOX_KEY` set) and asserts that every check
/// passed.
pub async fn run_checks(client: &str, mut command: Command, url: &str, key: &str) {
    command.env("SANDBOX_URL", url).env("SANDBOX_KEY", key);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("run the {client} client's checks: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the {client} client's checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

/// A client library that is not installed: a broken setup under `CI`, else a loud skip.
pub fn unavailable(msg: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPED: {msg}\n");
}
