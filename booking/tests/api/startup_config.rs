//! The booking binary as an operator starts it: outside dev mode it refuses to start on
//! missing or built-in secrets and on unknown keys, with one line naming the setting
//! (DESIGN.md section 8, "Secrets fail closed"); in dev mode, or with real secrets, it starts.

use crate::helpers::{free_port, fresh_database, redis_url};
use std::process::{Command, ExitStatus};
use testkit::child::Service;

const BIN: &str = env!("CARGO_BIN_EXE_booking");
const REAL_KEYS: &str = r#"[{kid="k1", secret="booking-startup-test-key-0123456789abcdef"}]"#;

/// Real (non built-in) values for every secret booking needs.
fn real_secrets() -> Vec<(&'static str, String)> {
    vec![
        ("FLOODGATE_TOKENS__CURRENT_KID", "k1".into()),
        ("FLOODGATE_TOKENS__KEYS", REAL_KEYS.into()),
        ("FLOODGATE_ADMIN_TOKEN", "startup-test-admin-secret".into()),
        ("FLOODGATE_PAYMENTS__API_KEY", "sk_test_startup_real".into()),
        (
            "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS",
            r#"["whsec_startup_real"]"#.into(),
        ),
        (
            "FLOODGATE_IDENTITY__KEY",
            "booking-startup-identity-key-0123456789".into(),
        ),
        // base64url of 32 bytes: an Ed25519 seed.
        (
            "FLOODGATE_TICKETS__SIGNING_KEYS",
            r#"[{kid="tk1", secret="c3RhcnR1cC10ZXN0LXRpY2tldC1zZWVkLTAxMjM0NTY"}]"#.into(),
        ),
        ("FLOODGATE_TICKETS__CURRENT_KID", "tk1".into()),
        (
            "FLOODGATE_TICKETS__HANDLE_SECRET",
            "startup-test-handle-secret-0123456789".into(),
        ),
        (
            "FLOODGATE_TICKETS__DOOR_SECRET",
            "startup-test-door-secret-0123456789".into(),
        ),
    ]
}

/// Booking with a cleared environment (no FLOODGATE_* of the caller's) plus `env`.
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
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:1/none".into(),
        ),
        ("REDIS_URL", "redis://127.0.0.1:1".into()),
        (
            "FLOODGATE_BOOKING__LISTEN",
            format!("127.0.0.1:{}", free_port()),
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
    testkit::child::run_to_exit("booking", command(&all))
}

fn assert_refused(env: &[(&str, String)], expected: &[&str]) {
    let (status, stderr) = run_to_exit(env);
    assert!(!status.success(), "booking must refuse to start: {stderr}");
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
    assert_refused(&[], &["tokens.keys: missing", "FLOODGATE_TOKENS__KEYS"]);
    // Every secret in turn: left out, it is named.
    let all = real_secrets();
    for (left_out, setting) in [
        ("FLOODGATE_ADMIN_TOKEN", "admin_token: missing"),
        ("FLOODGATE_PAYMENTS__API_KEY", "payments.api_key: missing"),
        (
            "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS",
            "payments.webhook_secrets: missing",
        ),
        ("FLOODGATE_IDENTITY__KEY", "identity.key: missing"),
        (
            "FLOODGATE_TICKETS__SIGNING_KEYS",
            "tickets.signing_keys: missing",
        ),
        (
            "FLOODGATE_TICKETS__HANDLE_SECRET",
            "tickets.handle_secret: missing",
        ),
        (
            "FLOODGATE_TICKETS__DOOR_SECRET",
            "tickets.door_secret: missing",
        ),
    ] {
        let env: Vec<_> = all
            .iter()
            .filter(|(k, _)| *k != left_out)
            .cloned()
            .collect();
        assert_refused(&env, &[setting]);
    }
}

#[test]
fn builtin_secrets_outside_dev_mode_are_refused() {
    for (key, value, setting) in [
        (
            "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS",
            format!(r#"["{}"]"#, shared::config::DEV_WEBHOOK_SECRET),
            "payments.webhook_secrets: is a built-in development value",
        ),
        (
            "FLOODGATE_PAYMENTS__API_KEY",
            shared::config::DEV_PROVIDER_KEY.to_owned(),
            "payments.api_key: is a built-in development value",
        ),
        (
            "FLOODGATE_TOKENS__KEYS",
            format!(
                r#"[{{kid="k1", secret="{}"}}]"#,
                shared::config::DEV_TOKEN_KEY
            ),
            "tokens.keys: is a built-in development value",
        ),
        (
            "FLOODGATE_ADMIN_TOKEN",
            "REPLACE-ME".to_owned(),
            "admin_token: is a built-in development value",
        ),
        (
            "FLOODGATE_TICKETS__SIGNING_KEYS",
            format!(
                r#"[{{kid="tk1", secret="{}"}}]"#,
                shared::config::DEV_TICKET_SIGNING_SEED
            ),
            "tickets.signing_keys: is a built-in development value",
        ),
        (
            "FLOODGATE_TICKETS__HANDLE_SECRET",
            shared::config::DEV_TICKET_HANDLE_SECRET.to_owned(),
            "tickets.handle_secret: is a built-in development value",
        ),
        (
            "FLOODGATE_TICKETS__DOOR_SECRET",
            shared::config::DEV_TICKET_DOOR_SECRET.to_owned(),
            "tickets.door_secret: is a built-in development value",
        ),
        (
            "FLOODGATE_IDENTITY__KEY",
            shared::config::DEV_IDENTITY_KEY.to_owned(),
            "identity.key: is a built-in development value",
        ),
    ] {
        let mut env = real_secrets();
        env.retain(|(k, _)| *k != key);
        env.push((key, value));
        assert_refused(&env, &[setting]);
    }
}

#[test]
fn misspelt_keys_are_refused_in_the_environment_and_the_file() {
    // The misspelling of the issue: without the check, the default secret stays in force.
    for dev in [false, true] {
        let mut env = real_secrets();
        env.retain(|(k, _)| *k != "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS");
        env.push((
            "FLOODGATE_PAYMENTS__WEBHOOK_SECRET",
            "whsec_startup_real".into(),
        ));
        if dev {
            env.push(("FLOODGATE_DEV", "1".into()));
        }
        assert_refused(&env, &["payments", "webhook_secret`"]);
    }
    let mut env = real_secrets();
    env.push(("FLOODGATE_PAYMENT__API_KEY", "sk_live_x".into()));
    assert_refused(&env, &["payment: unknown section"]);

    let dir = std::env::temp_dir().join(format!("fg-startup-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("floodgate.toml");
    std::fs::write(
        &file,
        "[payments]\nwebhook_secret = \"whsec_startup_real\"\n[booking]\nlisten = \"127.0.0.1:0\"\n",
    )
    .expect("write config");
    let mut env = real_secrets();
    env.retain(|(k, _)| *k != "FLOODGATE_PAYMENTS__WEBHOOK_SECRETS");
    env.push(("FLOODGATE_CONFIG", file.display().to_string()));
    assert_refused(&env, &["payments", "webhook_secret`"]);
    std::fs::write(&file, "[booking]\nlisten_addr = \"127.0.0.1:0\"\n").expect("write config");
    assert_refused(&env, &["booking", "listen_addr`"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts booking against a fresh database and waits for `/healthz` (a failure to start
/// panics with booking's stderr); then stops it.
async fn assert_starts(mut env: Vec<(&'static str, String)>) {
    let (db_url, _) = fresh_database().await;
    let port = free_port();
    env.extend([
        ("DATABASE_URL", db_url),
        ("REDIS_URL", redis_url()),
        (
            "FLOODGATE_REDIS__KEY_PREFIX",
            format!("t{}:", shared::ids::new_id()),
        ),
        ("FLOODGATE_BOOKING__LISTEN", format!("127.0.0.1:{port}")),
        ("FLOODGATE_BOOKING__JOBS_ENABLED", "false".into()),
    ]);
    let mut booking = Service::spawn("booking", command(&env).into());
    booking
        .wait_up(
            &reqwest::Client::new(),
            &format!("http://127.0.0.1:{port}/healthz"),
            None,
        )
        .await;
    booking.stop().await;
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
fn every_section_booking_reads_is_known() {
    for field in shared::config::fields_of::<booking::app::config::BookingConfig>() {
        assert!(
            shared::config::SECTIONS.contains(field),
            "[{field}] is missing from shared::config::SECTIONS: other processes reading \
             the same file would refuse it"
        );
    }
}

/// The configs the project ships (the local stack's and the Kubernetes one) hold only keys
/// booking knows: with unknown keys refused, a stale key there would stop every pod.
#[test]
fn shipped_config_files_have_no_unknown_keys() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in ["deploy/local.toml", "deploy/k8s/floodgate.toml"] {
        let path = root.join(file);
        let loaded = shared::config::load::<booking::app::config::BookingConfig>(
            Some(&path),
            std::iter::empty(),
        );
        if let Err(e) = loaded {
            panic!("{file}: {e}");
        }
    }
}
