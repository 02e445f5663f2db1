//! The gateway binary as an operator starts it: outside dev mode it refuses to start on
//! missing or built-in secrets, dev-only switches and unknown keys, with one line naming the
//! setting (DESIGN.md section 8, "Secrets fail closed"); in dev mode, or with real secrets,
//! it starts.

use crate::helpers::{free_port, redis_url, unique_prefix};
use std::process::{Command, ExitStatus};
use testkit::child::Service;

const BIN: &str = env!("CARGO_BIN_EXE_gateway");
const REAL_KEYS: &str = r#"[{kid="k1", secret="gateway-startup-test-key-0123456789abcdef"}]"#;

/// Real (non built-in) values for every secret the gateway needs.
fn real_secrets() -> Vec<(&'static str, String)> {
    vec![
        ("FLOODGATE_TOKENS__CURRENT_KID", "k1".into()),
        ("FLOODGATE_TOKENS__KEYS", REAL_KEYS.into()),
        (
            "FLOODGATE_IDENTITY__KEY",
            "gateway-startup-identity-0123456789abcdef".into(),
        ),
        ("FLOODGATE_ADMIN_TOKEN", "startup-test-admin-secret".into()),
    ]
}

/// The gateway with a cleared environment (no FLOODGATE_* of the caller's) plus `env`.
fn command(env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Addresses that keep a binary which wrongly gets past its config away from every real
/// service (the shared Postgres and Redis, a local stack's ports); no secret among them.
fn isolated() -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_URL", "redis://127.0.0.1:1".into()),
        (
            "FLOODGATE_GATEWAY__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "FLOODGATE_GATEWAY__ADMIN_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "FLOODGATE_GATEWAY__UPSTREAMS",
            format!(r#"["127.0.0.1:{}"]"#, free_port()),
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
    testkit::child::run_to_exit("gateway", command(&all))
}

fn assert_refused(env: &[(&str, String)], expected: &[&str]) {
    let (status, stderr) = run_to_exit(env);
    assert!(!status.success(), "gateway must refuse to start: {stderr}");
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

fn without(env: &[(&'static str, String)], key: &str) -> Vec<(&'static str, String)> {
    env.iter().filter(|(k, _)| *k != key).cloned().collect()
}

#[test]
fn empty_config_outside_dev_mode_is_refused_naming_the_setting() {
    assert_refused(&[], &["tokens.keys: missing", "FLOODGATE_TOKENS__KEYS"]);
    let all = real_secrets();
    assert_refused(
        &without(&all, "FLOODGATE_IDENTITY__KEY"),
        &["identity.key: missing", "FLOODGATE_IDENTITY__KEY"],
    );
    assert_refused(
        &without(&all, "FLOODGATE_ADMIN_TOKEN"),
        &["admin_token: missing", "FLOODGATE_ADMIN_TOKEN"],
    );
}

#[test]
fn builtin_secrets_and_dev_switches_outside_dev_mode_are_refused() {
    let all = real_secrets();
    let mut env = without(&all, "FLOODGATE_TOKENS__KEYS");
    env.push((
        "FLOODGATE_TOKENS__KEYS",
        format!(
            r#"[{{kid="k1", secret="{}"}}]"#,
            shared::config::DEV_TOKEN_KEY
        ),
    ));
    assert_refused(&env, &["tokens.keys: is a built-in development value"]);
    let mut env = without(&all, "FLOODGATE_IDENTITY__KEY");
    env.push((
        "FLOODGATE_IDENTITY__KEY",
        shared::config::DEV_IDENTITY_KEY.into(),
    ));
    assert_refused(&env, &["identity.key: is a built-in development value"]);
    // Dev login mints login tokens for anyone: never outside dev mode.
    let mut env = all.clone();
    env.push(("FLOODGATE_IDENTITY__DEV_LOGIN", "true".into()));
    assert_refused(&env, &["identity.dev_login: only allowed in dev mode"]);
    let mut env = all;
    env.push(("FLOODGATE_GATEWAY__DEV_MODE", "true".into()));
    assert_refused(&env, &["gateway.dev_mode: only allowed in dev mode"]);
}

#[test]
fn misspelt_keys_are_refused_in_the_environment_and_the_file() {
    let mut env = without(&real_secrets(), "FLOODGATE_IDENTITY__KEY");
    env.push(("FLOODGATE_IDENTITY__KEYS", "x".repeat(40)));
    assert_refused(&env, &["identity", "keys`"]);
    let mut env = real_secrets();
    env.push(("FLOODGATE_DEV", "1".into()));
    env.push(("FLOODGATE_GATEWAY__LIMITS__JOIN_PER_IP", "5".into()));
    assert_refused(&env, &["gateway.limits", "join_per_ip`"]);
    let mut env = real_secrets();
    env.push((
        "FLOODGATE_GATEWAY__LIMITS__ADMIN_AUTH_FAILURES_PER_IP_PER_MIN",
        "-1".into(),
    ));
    assert_refused(&env, &["admin_auth_failures_per_ip_per_min"]);

    let dir = std::env::temp_dir().join(format!("fg-startup-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("floodgate.toml");
    std::fs::write(&file, "[tokens]\ncurrent_kdi = \"k1\"\n").expect("write config");
    let mut env = real_secrets();
    env.push(("FLOODGATE_CONFIG", file.display().to_string()));
    assert_refused(&env, &["tokens", "current_kdi`"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the gateway on free ports and waits for the admin `/healthz`; then stops it.
async fn assert_starts(mut env: Vec<(&'static str, String)>) {
    let admin_port = free_port();
    env.extend([
        ("REDIS_URL", redis_url()),
        (
            "FLOODGATE_REDIS__MODE",
            if crate::helpers::cluster() {
                "cluster"
            } else {
                "standalone"
            }
            .into(),
        ),
        ("FLOODGATE_REDIS__KEY_PREFIX", unique_prefix()),
        (
            "FLOODGATE_GATEWAY__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "FLOODGATE_GATEWAY__ADMIN_LISTEN",
            format!("127.0.0.1:{admin_port}"),
        ),
        (
            "FLOODGATE_GATEWAY__STATIC_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../static").into(),
        ),
        (
            "FLOODGATE_GATEWAY__UPSTREAMS",
            format!(r#"["127.0.0.1:{}"]"#, free_port()),
        ),
        ("FLOODGATE_GATEWAY__GRACE_PERIOD_S", "0".into()),
    ]);
    let mut gateway = Service::spawn("gateway", command(&env).into());
    gateway
        .wait_up(
            &reqwest::Client::new(),
            &format!("http://127.0.0.1:{admin_port}/healthz"),
            None,
        )
        .await;
    gateway.stop().await;
}

#[tokio::test]
async fn dev_mode_starts_without_any_secret() {
    // Dev login is allowed here, as the local stack has it.
    assert_starts(vec![
        ("FLOODGATE_DEV", "1".into()),
        ("FLOODGATE_GATEWAY__DEV_MODE", "true".into()),
    ])
    .await;
}

#[tokio::test]
async fn real_secrets_start_outside_dev_mode() {
    let mut env = real_secrets();
    // A [gateway.limits] key added with operator credentials (issue 42) is known.
    env.push((
        "FLOODGATE_GATEWAY__LIMITS__ADMIN_AUTH_FAILURES_PER_IP_PER_MIN",
        "50".into(),
    ));
    assert_starts(env).await;
}

#[test]
fn every_section_the_gateway_reads_is_known() {
    for field in shared::config::fields_of::<gateway::config::GatewayConfig>() {
        assert!(
            shared::config::SECTIONS.contains(field),
            "[{field}] is missing from shared::config::SECTIONS: other processes reading \
             the same file would refuse it"
        );
    }
}

/// The configs the project ships (the local stack's and the Kubernetes one) hold only keys
/// the gateway knows: with unknown keys refused, a stale key there would stop every pod.
#[test]
fn shipped_config_files_have_no_unknown_keys() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in ["deploy/local.toml", "deploy/k8s/floodgate.toml"] {
        let path = root.join(file);
        let loaded =
            shared::config::load::<gateway::config::GatewayConfig>(Some(&path), std::iter::empty());
        if let Err(e) = loaded {
            panic!("{file}: {e}");
        }
    }
}
