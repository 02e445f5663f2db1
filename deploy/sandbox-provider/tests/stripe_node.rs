//! Stripe's official Node library (npm `stripe` 23.2.0) against a running sandbox, the twin of
//! `stripe_python.rs`: create and confirm, confirm later, retrieve, refund once, partial refunds
//! up to the charge, decline (`StripeCardError` with its decline code), 3-D Secure and
//! processing, idempotent replay and its refusal, bad input, a bad key
//! (`deploy/stripe-compat/stripe_client_check.mjs`).
//!
//! The library comes from the one Node toolchain of the tests (`deploy/node/`), which
//! `deploy/stack test` installs and exports as `FLOODGATE_TEST_NODE_MODULES`. Without it the
//! test fails when `CI` is set and otherwise skips loudly.

use sandbox_provider::Application;
use sandbox_provider::config::{SandboxSettings, WebhookMode};
use secrecy::SecretString;
use std::path::PathBuf;
use std::process::Command;

const KEY: &str = "sk_test_node_suite";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The installed node_modules folder, or `None` (after failing under CI) when it is not set.
fn node_modules() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FLOODGATE_TEST_NODE_MODULES") {
        // Set but wrong is a broken setup, not a reason to skip: the script says what is missing.
        return Some(PathBuf::from(dir));
    }
    let msg = "FLOODGATE_TEST_NODE_MODULES is not set, so Stripe's Node library is not \
               available: run the tests with `deploy/stack test` (or set it to the output of \
               `deploy/node/install.sh`)";
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPED: {msg}\n");
    None
}

#[tokio::test]
async fn stripes_official_node_library_works_against_the_sandbox() {
    let Some(modules) = node_modules() else {
        return;
    };
    let app = Application::build(SandboxSettings {
        listen: "127.0.0.1:0".into(),
        api_key: SecretString::from(KEY),
        webhook_mode: WebhookMode::Manual,
        ..SandboxSettings::default()
    })
    .await
    .expect("build the sandbox");
    let url = format!("http://127.0.0.1:{}", app.port());
    let sandbox = app.sandbox();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let script = root().join("deploy/stripe-compat/stripe_client_check.mjs");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("SANDBOX_URL", url)
            .env("SANDBOX_KEY", KEY)
            .env("FLOODGATE_TEST_NODE_MODULES", modules)
            .output()
    })
    .await
    .expect("join")
    .expect("run node (Node.js >= 20 on the PATH; see deploy/node/install.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Node client's checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    // What the library did is what the sandbox recorded: 4 charges (create+confirm, the
    // partially refunded one, the later confirm, the idempotent pair once), one decline, one
    // full refund and three partial ones (the replays and the refusals refunded nothing).
    let stats = sandbox.0.store.stats();
    assert_eq!(stats["charges"], 4, "{stats}");
    assert_eq!(stats["refunds"], 4, "{stats}");
    assert_eq!(stats["declines"], 1, "{stats}");
}
