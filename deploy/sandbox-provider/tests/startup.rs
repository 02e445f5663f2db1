//! The sandbox binary as an operator starts it: outside dev mode it refuses the API key and
//! webhook secret that are public in this repository (whoever knows the webhook secret can
//! forge payments), and unknown keys, with one line naming the setting (DESIGN.md section 8);
//! in dev mode, or with real secrets, it starts.

use std::process::{Command, ExitStatus};
use testkit::child::Service;
use testkit::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-provider");

fn real_secrets() -> Vec<(&'static str, String)> {
    vec![
        ("FLOODGATE_SANDBOX__API_KEY", "sk_test_startup_real".into()),
        (
            "FLOODGATE_SANDBOX__WEBHOOK_SECRET",
            "whsec_startup_real".into(),
        ),
    ]
}

/// The sandbox with a cleared environment (no FLOODGATE_* of the caller's) plus `env`.
fn command(env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Addresses that keep a binary which wrongly gets past its config away from every real
/// service (the shared Postgres and Redis, a local stack's ports); no secret among them.
fn isolated() -> Vec<(&'static str, String)> {
    vec![
        (
            "FLOODGATE_SANDBOX__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "FLOODGATE_SANDBOX__WEBHOOK_URL",
            "http://127.0.0.1:1/webhooks/payments".into(),
        ),
    ]
}

/// Runs to exit (at most 60 s), with [`isolated`] addresses unless `env` sets them, and returns
/// the status and stderr.
fn run_to_exit(env: &[(&str, String)]) -> (ExitStatus, String) {
    let mut all: Vec<(&str, String)> = isolated()
        .into_iter()
        .filter(|(k, _)| !env.iter().any(|(e, _)| e == k))
        .collect();
    all.extend(env.iter().cloned());
    testkit::child::run_to_exit("sandbox", command(&all))
}

fn assert_refused(env: &[(&str, String)], expected: &[&str]) {
    let (status, stderr) = run_to_exit(env);
    assert!(!status.success(), "sandbox must refuse to start: {stderr}");
    // One line, naming the setting, and nothing else.
    let line = stderr.trim_end();
    assert!(
        line.starts_with("config error: ") && !line.contains('\n'),
        "not one `config error:` line: {stderr:?}"
    );
    for part in expected {
        assert!(line.contains(part), "{line:?} does not name {part:?}");
    }
}

#[test]
fn empty_config_outside_dev_mode_is_refused_naming_the_setting() {
    assert_refused(
        &[],
        &["sandbox.api_key: missing", "FLOODGATE_SANDBOX__API_KEY"],
    );
    assert_refused(&real_secrets()[..1], &["sandbox.webhook_secret: missing"]);
}

#[test]
fn builtin_secrets_outside_dev_mode_are_refused() {
    let env = vec![
        ("FLOODGATE_SANDBOX__API_KEY", "sk_test_startup_real".into()),
        (
            "FLOODGATE_SANDBOX__WEBHOOK_SECRET",
            shared::config::DEV_WEBHOOK_SECRET.into(),
        ),
    ];
    assert_refused(
        &env,
        &["sandbox.webhook_secret: is a built-in development value"],
    );
}

#[test]
fn misspelt_keys_are_refused_in_the_environment_and_the_file() {
    let mut env = real_secrets();
    env.push(("FLOODGATE_DEV", "1".into()));
    env.push(("FLOODGATE_SANDBOX__WEBHOOK_SECRETS", "whsec_x".into()));
    assert_refused(&env, &["sandbox", "webhook_secrets`"]);

    let dir = std::env::temp_dir().join(format!("fg-startup-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("floodgate.toml");
    std::fs::write(&file, "[sandbox]\napikey = \"sk_test_x\"\n").expect("write config");
    let mut env = real_secrets();
    env.push(("FLOODGATE_CONFIG", file.display().to_string()));
    assert_refused(&env, &["sandbox", "apikey`"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the sandbox on a free port and waits for `/healthz`; then stops it.
async fn assert_starts(mut env: Vec<(&'static str, String)>) {
    let port = free_port();
    env.push(("FLOODGATE_SANDBOX__LISTEN", format!("127.0.0.1:{port}")));
    let mut sandbox = Service::spawn("sandbox", command(&env).into());
    sandbox
        .wait_up(
            &reqwest::Client::new(),
            &format!("http://127.0.0.1:{port}/healthz"),
            None,
        )
        .await;
    sandbox.stop().await;
}

#[tokio::test]
async fn dev_mode_starts_without_any_secret() {
    assert_starts(vec![("FLOODGATE_DEV", "1".into())]).await;
}

#[tokio::test]
async fn real_secrets_start_outside_dev_mode() {
    assert_starts(real_secrets()).await;
}

#[test]
fn every_section_the_sandbox_reads_is_known() {
    for field in shared::config::fields_of::<sandbox_provider::config::SandboxConfig>() {
        assert!(
            shared::config::SECTIONS.contains(field),
            "[{field}] not in SECTIONS"
        );
    }
}
