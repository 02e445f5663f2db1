//! Configuration: one TOML file shared by every process (each reads the sections it needs),
//! plus `FLOODGATE_*` environment overrides. Secrets are wrapped in [`SecretString`] so they
//! never end up in logs, and should come from the environment or files, never the repo.
//!
//! Override rule: `FLOODGATE_SECTION__KEY=value` sets `[section] key = value` (double
//! underscore separates levels, names are lower-cased). Values are parsed as TOML scalars
//! when they look like one (`8080`, `true`, `1.5`), otherwise taken as strings.
//! `FLOODGATE_ADMIN_TOKEN` is the admin secret, `FLOODGATE_DEV=1` turns dev mode on,
//! `DATABASE_URL`/`REDIS_URL` are accepted as the conventional aliases. Other `FLOODGATE_X`
//! names without `__` (`FLOODGATE_CONFIG`, the scripts' `FLOODGATE_PG_PORT`, ...) are not
//! configuration and are left alone.
//!
//! Fail closed (DESIGN.md section 8): a key no process knows — in the file or from an
//! override — is an error, never silently ignored (a misspelt secret must not fall back to a
//! default), and [`load_checked`] refuses a process whose secrets are missing or equal to a
//! built-in development value unless dev mode (`[dev] enabled = true`) is on.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::Path;

mod sections;
pub use sections::*;

/// Every top-level key some Floodgate process reads. Each process checks the keys inside its
/// own sections; a top-level key outside this list is an error everywhere (a misspelt
/// section). A new section must be added here (each service has a test that checks it).
pub const SECTIONS: &[&str] = &[
    "admin_token",
    "dev",
    "log",
    "database",
    "redis",
    "tokens",
    "identity",
    "gateway",
    "booking",
    "auctions",
    "idempotency",
    "orders",
    "payments",
    "outbox",
    "tickets",
    "mail",
    "sandbox",
];

/// The admission-token signing key the defaults carry (dev mode only).
pub const DEV_TOKEN_KEY: &str = "floodgate-dev-admission-key-change-me-0123456789";
/// The identity (login token) key the defaults carry (dev mode only).
pub const DEV_IDENTITY_KEY: &str = "floodgate-dev-identity-key-change-me-0123456789";
/// The ticket-code signing seed the defaults carry (booking; dev mode only): base64url of 32
/// bytes, an Ed25519 seed.
pub const DEV_TICKET_SIGNING_SEED: &str = "Zmxvb2RnYXRlLWRldi10aWNrZXQtc2lnbmluZy0wMDA";
/// The holder-handle HMAC key the defaults carry (booking; dev mode only).
pub const DEV_TICKET_HANDLE_SECRET: &str = "floodgate-dev-ticket-handle-key-change-me-0123";
/// The door-key HMAC key the defaults carry (booking; dev mode only).
pub const DEV_TICKET_DOOR_SECRET: &str = "floodgate-dev-ticket-door-key-change-me-01234";
/// The payment provider API key the defaults carry (booking and the sandbox; dev mode only).
pub const DEV_PROVIDER_KEY: &str = "sk_test_floodgate_dev";
/// The webhook signing secret the defaults carry (booking and the sandbox; dev mode only).
pub const DEV_WEBHOOK_SECRET: &str = "whsec_floodgate_dev";

/// Values that are public in this repository and so never protect a real deployment: the
/// defaults above. A value containing [`PLACEHOLDER`] (deploy/k8s/secret.yaml) counts too.
pub const BUILTIN_SECRETS: &[&str] = &[
    DEV_TOKEN_KEY,
    DEV_IDENTITY_KEY,
    DEV_PROVIDER_KEY,
    DEV_WEBHOOK_SECRET,
    DEV_TICKET_SIGNING_SEED,
    DEV_TICKET_HANDLE_SECRET,
    DEV_TICKET_DOOR_SECRET,
];
/// The marker of the Kubernetes secret template's placeholders.
pub const PLACEHOLDER: &str = "REPLACE-ME";

/// `[dev]`: development mode (the local stack and the tests). Only here may a process run on
/// the built-in secrets above, or serve dev login. Also `FLOODGATE_DEV=1`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DevSettings {
    pub enabled: bool,
}

/// Why a configuration was refused. Displayed as one line naming the setting, e.g.
/// `tokens.keys: missing (set FLOODGATE_TOKENS__KEYS, ...)`; `main` prefixes `config error: `.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed, or an override is malformed.
    #[error("{0}")]
    Source(String),
    #[error("{key}: unknown section (known: {known})")]
    UnknownSection { key: String, known: String },
    /// A value of the wrong type, an unknown key inside a section, ...
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    #[error("{key}: missing (set {env}; dev mode with FLOODGATE_DEV=1 allows built-in values)")]
    Missing { key: String, env: String },
    #[error(
        "{key}: is a built-in development value, public in the repository (set {env} to a secret of your own)"
    )]
    BuiltIn { key: String, env: String },
    #[error("{key}: only allowed in dev mode ([dev] enabled = true or FLOODGATE_DEV=1)")]
    DevOnly { key: String },
}

/// One secret a process needs, by setting name (`tokens.keys`, `admin_token`). `values` holds
/// every secret configured under it (several signing keys, several webhook secrets).
pub struct Secret<'a> {
    pub key: &'static str,
    pub values: Vec<&'a SecretString>,
}

/// A process's whole configuration, as its `main` loads it.
pub trait ProcessConfig: DeserializeOwned {
    fn dev(&self) -> &DevSettings;
    /// The secrets this process cannot run safely without.
    fn secrets(&self) -> Vec<Secret<'_>>;
    /// Switches that may be on only in dev mode (e.g. `identity.dev_login`), with their value.
    fn dev_only(&self) -> Vec<(&'static str, bool)> {
        Vec::new()
    }
}

/// Loads `T` from an optional TOML file plus the given environment variables, refusing
/// unknown keys. Does not check secrets (see [`load_checked`]).
///
/// Tests should build config structs directly instead; this is for `main`.
pub fn load<T: DeserializeOwned>(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let root = merged_table(path, env)?;
    parse(&root)
}

/// [`load`], then [`check`]: what every binary starts with.
pub fn load_checked<T: ProcessConfig>(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let root = merged_table(path, env)?;
    let config: T = parse(&root)?;
    check(&config, &root)?;
    Ok(config)
}

/// Loads from `FLOODGATE_CONFIG` (if set) and the process environment, checked.
pub fn load_from_env<T: ProcessConfig>() -> Result<T, ConfigError> {
    let path = std::env::var_os("FLOODGATE_CONFIG").map(std::path::PathBuf::from);
    load_checked(path.as_deref(), std::env::vars())
}

/// For `main`: [`load_from_env`], or print `config error: <one line>` and exit with status 2.
pub fn load_or_exit<T: ProcessConfig>() -> T {
    match load_from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("config error: {e}");
            std::process::exit(2);
        }
    }
}

/// Refuses `config` outside dev mode when a secret is missing or built-in, or a dev-only
/// switch is on. `root` is the merged file + overrides, to tell "left out" (the struct holds
/// the default) from "set to the built-in value".
pub fn check<T: ProcessConfig>(config: &T, root: &toml::Table) -> Result<(), ConfigError> {
    if config.dev().enabled {
        return Ok(());
    }
    for secret in config.secrets() {
        let env = env_name(secret.key);
        let present = lookup(root, secret.key).is_some();
        let values: Vec<&str> = secret.values.iter().map(|v| v.expose_secret()).collect();
        if !present || values.is_empty() || values.iter().any(|v| v.trim().is_empty()) {
            return Err(ConfigError::Missing {
                key: secret.key.into(),
                env,
            });
        }
        if values.iter().any(|v| is_builtin(v)) {
            return Err(ConfigError::BuiltIn {
                key: secret.key.into(),
                env,
            });
        }
    }
    if let Some((key, _)) = config.dev_only().into_iter().find(|(_, on)| *on) {
        return Err(ConfigError::DevOnly { key: key.into() });
    }
    Ok(())
}

/// A value that is public in this repository (or a template placeholder).
pub fn is_builtin(value: &str) -> bool {
    BUILTIN_SECRETS.contains(&value) || value.contains(PLACEHOLDER)
}

/// The environment variable that sets `key` (`tokens.keys` → `FLOODGATE_TOKENS__KEYS`).
pub fn env_name(key: &str) -> String {
    format!(
        "FLOODGATE_{}",
        key.split('.')
            .map(str::to_ascii_uppercase)
            .collect::<Vec<_>>()
            .join("__")
    )
}

fn lookup<'a>(root: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = root.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// The file's table with the environment overrides applied.
fn merged_table(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<toml::Table, ConfigError> {
    let mut root = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigError::Source(format!("failed to read config file {}: {e}", p.display()))
            })?;
            text.parse::<toml::Table>().map_err(|e| {
                // toml's message spans several lines (it quotes the offending line).
                let msg = e
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                ConfigError::Source(format!(
                    "failed to parse config file {}: {msg}",
                    p.display()
                ))
            })?
        }
        None => toml::Table::new(),
    };
    for (key, value) in env {
        let (path, value): (Vec<String>, toml::Value) = match key.as_str() {
            "FLOODGATE_ADMIN_TOKEN" => (vec!["admin_token".into()], toml::Value::String(value)),
            "FLOODGATE_DEV" => (vec!["dev".into(), "enabled".into()], dev_flag(&value)?),
            "DATABASE_URL" => (vec!["database".into(), "url".into()], parse_scalar(&value)),
            "REDIS_URL" => (vec!["redis".into(), "url".into()], parse_scalar(&value)),
            _ => match key.strip_prefix("FLOODGATE_") {
                // Only SECTION__KEY names are overrides: single names are the scripts' own.
                Some(rest) if rest.contains("__") => (
                    rest.split("__").map(|s| s.to_ascii_lowercase()).collect(),
                    parse_scalar(&value),
                ),
                _ => continue,
            },
        };
        set_path(&mut root, &path, value);
    }
    if let Some(key) = root.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
        return Err(ConfigError::UnknownSection {
            key: key.clone(),
            known: SECTIONS.join(", "),
        });
    }
    Ok(root)
}

fn dev_flag(value: &str) -> Result<toml::Value, ConfigError> {
    match value.trim() {
        "1" | "true" => Ok(toml::Value::Boolean(true)),
        "0" | "false" | "" => Ok(toml::Value::Boolean(false)),
        other => Err(ConfigError::Invalid {
            key: "FLOODGATE_DEV".into(),
            message: format!("expected 1 or 0, got {other:?}"),
        }),
    }
}

/// Deserializes, naming the setting (`payments.webhook_secrets`) on failure.
fn parse<T: DeserializeOwned>(root: &toml::Table) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(root.clone())).map_err(|e| {
        let key = e.path().to_string();
        // toml adds "\nin `section`" to its messages; the path above already says where.
        let message = e.into_inner().to_string();
        ConfigError::Invalid {
            key: if key == "." { "config".into() } else { key },
            message: message.lines().next().unwrap_or_default().trim().to_owned(),
        }
    })
}

/// The top-level keys `T` reads (its field names), so each service can test that its sections
/// are all in [`SECTIONS`].
pub fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(introspect::Fields) {
        Err(introspect::Found(Some(fields))) => fields,
        _ => &[],
    }
}

/// A deserializer that only records the field list a struct asks for.
mod introspect {
    use serde::de::{Deserializer, Visitor};

    pub struct Fields;

    #[derive(Debug)]
    pub struct Found(pub Option<&'static [&'static str]>);

    impl std::fmt::Display for Found {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }

    impl std::error::Error for Found {}

    impl serde::de::Error for Found {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Found(None)
        }
    }

    impl<'de> Deserializer<'de> for Fields {
        type Error = Found;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Found> {
            Err(Found(None))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Found> {
            Err(Found(Some(fields)))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
}

fn parse_scalar(value: &str) -> toml::Value {
    if let Ok(i) = value.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    if let Ok(b) = value.parse::<bool>() {
        return toml::Value::Boolean(b);
    }
    if value.contains('.')
        && let Ok(f) = value.parse::<f64>()
        && !value.contains(':')
    {
        return toml::Value::Float(f);
    }
    if value.starts_with('[') {
        // Arrays such as `["127.0.0.1:8090","127.0.0.1:8091"]`.
        if let Ok(t) = format!("v = {value}").parse::<toml::Table>()
            && let Some(v) = t.get("v")
        {
            return v.clone();
        }
    }
    toml::Value::String(value.to_owned())
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = table;
    for p in parents {
        let entry = cur
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(t) = entry else { return };
        cur = t;
    }
    cur.insert(last.clone(), value);
}

/// Compares a presented admin bearer secret with the configured one in constant time.
pub fn admin_secret_matches(configured: &SecretString, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    let expected = configured.expose_secret().as_bytes();
    // An empty configured secret never matches: it would mean "admin API open to all".
    !expected.is_empty() && bool::from(expected.ct_eq(presented.as_bytes()))
}

#[cfg(test)]
mod tests;
