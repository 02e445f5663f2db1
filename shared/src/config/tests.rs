use super::*;

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct Demo {
    admin_token: Option<String>,
    database: DatabaseSettings,
    gateway: DemoGateway,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct DemoGateway {
    listen: String,
    threads: u32,
    upstreams: Vec<String>,
}

#[test]
fn env_overrides_file_values() {
    let dir = std::env::temp_dir().join(format!("fg-cfg-{}", crate::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(&file, "[gateway]\nlisten = \"127.0.0.1:1\"\nthreads = 1\n").unwrap();
    let env = vec![
        ("FLOODGATE_GATEWAY__THREADS".to_string(), "4".to_string()),
        (
            "FLOODGATE_GATEWAY__UPSTREAMS".to_string(),
            r#"["127.0.0.1:1","127.0.0.1:2"]"#.to_string(),
        ),
        ("FLOODGATE_ADMIN_TOKEN".to_string(), "s3cret".to_string()),
        (
            "DATABASE_URL".to_string(),
            "postgres://x@127.0.0.1:1/db".to_string(),
        ),
        ("UNRELATED".to_string(), "x".to_string()),
    ];
    let d: Demo = load(Some(&file), env).unwrap();
    assert_eq!(d.gateway.listen, "127.0.0.1:1");
    assert_eq!(d.gateway.threads, 4);
    assert_eq!(d.gateway.upstreams.len(), 2);
    assert_eq!(d.admin_token.as_deref(), Some("s3cret"));
    assert_eq!(
        d.database.url.expose_secret(),
        "postgres://x@127.0.0.1:1/db"
    );
}

/// A process with one secret of each shape: a list (`tokens.keys`) and an optional one.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct DemoProcess {
    dev: DevSettings,
    tokens: TokenSettings,
    identity: IdentitySettings,
    admin_token: Option<SecretString>,
}

impl ProcessConfig for DemoProcess {
    fn dev(&self) -> &DevSettings {
        &self.dev
    }
    fn secrets(&self) -> Vec<Secret<'_>> {
        vec![
            Secret {
                key: "tokens.keys",
                values: self.tokens.keys.iter().map(|k| &k.secret).collect(),
            },
            Secret {
                key: "admin_token",
                values: self.admin_token.iter().collect(),
            },
        ]
    }
    fn dev_only(&self) -> Vec<(&'static str, bool)> {
        vec![("identity.dev_login", self.identity.dev_login)]
    }
}

const REAL_KEYS: &str = r#"[{kid="k1", secret="0123456789abcdef0123456789abcdef-real"}]"#;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn refused(pairs: &[(&str, &str)]) -> String {
    load_checked::<DemoProcess>(None, env(pairs))
        .expect_err("config must be refused")
        .to_string()
}

#[test]
fn missing_secrets_are_refused_outside_dev_mode() {
    let e = refused(&[]);
    assert!(
        e.starts_with("tokens.keys: missing (set FLOODGATE_TOKENS__KEYS"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    let e = refused(&[("FLOODGATE_TOKENS__KEYS", "[]")]);
    assert!(e.starts_with("tokens.keys: missing"), "{e}");
    let e = refused(&[("FLOODGATE_TOKENS__KEYS", REAL_KEYS)]);
    assert!(
        e.starts_with("admin_token: missing (set FLOODGATE_ADMIN_TOKEN"),
        "{e}"
    );
    let e = refused(&[
        ("FLOODGATE_TOKENS__KEYS", REAL_KEYS),
        ("FLOODGATE_ADMIN_TOKEN", "  "),
    ]);
    assert!(e.starts_with("admin_token: missing"), "{e}");
}

#[test]
fn builtin_and_placeholder_secrets_are_refused_outside_dev_mode() {
    let dev_key = format!(r#"[{{kid="dev-1", secret="{DEV_TOKEN_KEY}"}}]"#);
    let e = refused(&[("FLOODGATE_TOKENS__KEYS", &dev_key)]);
    assert!(
        e.starts_with("tokens.keys: is a built-in development value"),
        "{e}"
    );
    // One built-in key among real ones is as bad: it still verifies.
    let mixed = format!(
        r#"[{{kid="k1", secret="0123456789abcdef0123456789abcdef-real"}}, {{kid="dev-1", secret="{DEV_TOKEN_KEY}"}}]"#
    );
    let e = refused(&[("FLOODGATE_TOKENS__KEYS", &mixed)]);
    assert!(e.starts_with("tokens.keys: is a built-in"), "{e}");
    let e = refused(&[
        ("FLOODGATE_TOKENS__KEYS", REAL_KEYS),
        ("FLOODGATE_ADMIN_TOKEN", "REPLACE-ME"),
    ]);
    assert!(e.starts_with("admin_token: is a built-in"), "{e}");
}

#[test]
fn real_secrets_load_and_dev_only_switches_are_refused() {
    let ok = [
        ("FLOODGATE_TOKENS__KEYS", REAL_KEYS),
        ("FLOODGATE_TOKENS__CURRENT_KID", "k1"),
        ("FLOODGATE_ADMIN_TOKEN", "an-admin-secret"),
    ];
    let c: DemoProcess = load_checked(None, env(&ok)).expect("real secrets load");
    assert_eq!(c.tokens.current_kid, "k1");
    let mut with_login = ok.to_vec();
    with_login.push(("FLOODGATE_IDENTITY__DEV_LOGIN", "true"));
    let e = refused(&with_login);
    assert!(
        e.starts_with("identity.dev_login: only allowed in dev mode"),
        "{e}"
    );
}

#[test]
fn dev_mode_allows_builtin_values() {
    for on in [
        vec![("FLOODGATE_DEV", "1")],
        vec![
            ("FLOODGATE_DEV", "true"),
            ("FLOODGATE_IDENTITY__DEV_LOGIN", "true"),
        ],
        vec![("FLOODGATE_DEV__ENABLED", "true")],
    ] {
        let c: DemoProcess = load_checked(None, env(&on)).expect("dev mode starts");
        assert!(c.dev.enabled);
        assert_eq!(c.tokens.keys[0].secret.expose_secret(), DEV_TOKEN_KEY);
    }
    let e = refused(&[("FLOODGATE_DEV", "0")]);
    assert!(e.starts_with("tokens.keys: missing"), "{e}");
    let e = refused(&[("FLOODGATE_DEV", "yes")]);
    assert!(e.starts_with("FLOODGATE_DEV: expected 1 or 0"), "{e}");
}

#[test]
fn unknown_keys_are_errors_in_file_and_environment() {
    // A misspelt secret must not fall back to the default.
    let e = refused(&[("FLOODGATE_DEV", "1"), ("FLOODGATE_TOKENS__KEY", REAL_KEYS)]);
    assert!(e.starts_with("tokens.key: unknown field `key`"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    let e = refused(&[("FLOODGATE_DEV", "1"), ("FLOODGATE_TOKEN__KEYS", REAL_KEYS)]);
    assert!(e.starts_with("token: unknown section"), "{e}");
    let e = refused(&[("FLOODGATE_DEV__ENABLE", "true")]);
    assert!(e.contains("unknown field `enable`"), "{e}");

    let dir = std::env::temp_dir().join(format!("fg-cfg-{}", crate::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[dev]\nenabled = true\n[tokens]\ncurrent_kid = \"k1\"\nkeys = [{kid = \"k1\", sekret = \"x\"}]\n",
    )
    .unwrap();
    let e = load_checked::<DemoProcess>(Some(&file), Vec::new())
        .expect_err("misspelt key in file")
        .to_string();
    assert!(e.starts_with("tokens.keys"), "{e}");
    assert!(e.contains("unknown field `sekret`"), "{e}");
    std::fs::write(&file, "[paymnets]\napi_key = \"x\"\n").unwrap();
    let e = load::<DemoProcess>(Some(&file), Vec::new())
        .expect_err("misspelt section in file")
        .to_string();
    assert!(e.starts_with("paymnets: unknown section"), "{e}");
}

#[test]
fn scripts_own_variables_are_not_configuration() {
    let c: DemoProcess = load_checked(
        None,
        env(&[
            ("FLOODGATE_DEV", "1"),
            ("FLOODGATE_CONFIG", "/nowhere.toml"),
            ("FLOODGATE_PG_PORT", "55433"),
            ("FLOODGATE_BOOKING_ADDR", "127.0.0.1:1"),
        ]),
    )
    .expect("FLOODGATE_X without __ is not a config key");
    assert!(c.dev.enabled);
}

#[test]
fn field_names_are_introspected() {
    assert_eq!(
        fields_of::<DemoProcess>(),
        ["dev", "tokens", "identity", "admin_token"]
    );
    for f in fields_of::<DemoProcess>() {
        assert!(SECTIONS.contains(f), "{f} missing from SECTIONS");
    }
}

#[test]
fn admin_secret_compare() {
    let s = SecretString::from("abc");
    assert!(admin_secret_matches(&s, "abc"));
    assert!(!admin_secret_matches(&s, "abd"));
    assert!(!admin_secret_matches(&s, ""));
    assert!(!admin_secret_matches(&SecretString::from(""), ""));
}
