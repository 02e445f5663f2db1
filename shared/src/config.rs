//! Configuration: one TOML file shared by every process (each reads the sections it needs),
//! plus `FLOODGATE_*` environment overrides. Secrets are wrapped in [`SecretString`] so they
//! never end up in logs, and should come from the environment or files, never the repo.
//!
//! Override rule: `FLOODGATE_SECTION__KEY=value` sets `[section] key = value` (double
//! underscore separates levels, names are lower-cased). Values are parsed as TOML scalars
//! when they look like one (`8080`, `true`, `1.5`), otherwise taken as strings.
//! `FLOODGATE_ADMIN_TOKEN` is the admin secret, `DATABASE_URL`/`REDIS_URL` are accepted as
//! the conventional aliases.

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Loads `T` from an optional TOML file plus the given environment variables.
///
/// Tests should build config structs directly instead; this is for `main`.
pub fn load<T: DeserializeOwned>(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<T> {
    let mut root = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("failed to read config file {}", p.display()))?;
            text.parse::<toml::Table>()
                .with_context(|| format!("failed to parse config file {}", p.display()))?
        }
        None => toml::Table::new(),
    };
    for (key, value) in env {
        let path: Vec<String> = match key.as_str() {
            "FLOODGATE_ADMIN_TOKEN" => vec!["admin_token".into()],
            "DATABASE_URL" => vec!["database".into(), "url".into()],
            "REDIS_URL" => vec!["redis".into(), "url".into()],
            _ => match key.strip_prefix("FLOODGATE_") {
                Some(rest) if !rest.is_empty() => {
                    rest.split("__").map(|s| s.to_ascii_lowercase()).collect()
                }
                _ => continue,
            },
        };
        set_path(&mut root, &path, parse_scalar(&value));
    }
    toml::Value::Table(root)
        .try_into()
        .context("invalid configuration")
}

/// Loads from `FLOODGATE_CONFIG` (if set) and the process environment.
pub fn load_from_env<T: DeserializeOwned>() -> anyhow::Result<T> {
    let path = std::env::var_os("FLOODGATE_CONFIG").map(std::path::PathBuf::from);
    load(path.as_deref(), std::env::vars())
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

/// Postgres connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before answering `503`.
    pub acquire_timeout_ms: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: SecretString::from("postgres://postgres@127.0.0.1:55432/floodgate"),
            max_connections: 32,
            acquire_timeout_ms: 3000,
        }
    }
}

/// Redis connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct RedisSettings {
    pub url: SecretString,
    /// Prepended to every key this deployment writes; lets tests share one Redis.
    pub key_prefix: String,
    /// Per-command timeout: a stalled Redis must fail fast, not hang requests.
    pub response_timeout_ms: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: SecretString::from("redis://127.0.0.1:56379"),
            key_prefix: String::new(),
            response_timeout_ms: 1000,
        }
    }
}

/// One admission-token signing key.
#[derive(Debug, Clone, Deserialize)]
pub struct KeySettings {
    pub kid: String,
    /// HS256 secret; at least 32 bytes.
    pub secret: SecretString,
}

/// Admission-token settings, shared by the gateway (mints and verifies) and booking (verifies).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct TokenSettings {
    /// The `kid` new tokens are signed with. Every other key listed still verifies, so a key
    /// is rotated by adding the new one, switching `current_kid`, and removing the old one
    /// after the longest TTL has passed.
    pub current_kid: String,
    pub keys: Vec<KeySettings>,
    pub issuer: String,
    pub audience: String,
    pub default_ttl_s: u64,
    /// Clock skew tolerated when checking `exp`/`iat`, in seconds.
    pub leeway_s: u64,
}

impl Default for TokenSettings {
    fn default() -> Self {
        Self {
            current_kid: "dev-1".into(),
            keys: vec![KeySettings {
                kid: "dev-1".into(),
                secret: SecretString::from("floodgate-dev-admission-key-change-me-0123456789"),
            }],
            issuer: "floodgate-gateway".into(),
            audience: "floodgate".into(),
            default_ttl_s: 600,
            leeway_s: 5,
        }
    }
}

/// How fans' login (identity) tokens are verified.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct IdentitySettings {
    /// `HS256`, `RS256` or `EdDSA`.
    pub algorithm: String,
    /// HS256: the shared secret. RS256/EdDSA: the PEM public key.
    pub key: SecretString,
    pub issuer: String,
    /// The `aud` login tokens must carry (default `floodgate`). A token without it, or for
    /// another audience, is refused unless `verify_audience = false`.
    pub audience: Option<String>,
    /// Set to `false` only for a login service that cannot put an `aud` in its tokens: then
    /// any token of the issuer is accepted, whatever it was meant for.
    pub verify_audience: bool,
    /// Serve `POST /dev/login` (local stack only). Never enable in production.
    pub dev_login: bool,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            algorithm: "HS256".into(),
            key: SecretString::from("floodgate-dev-identity-key-change-me-0123456789"),
            issuer: "floodgate-dev-login".into(),
            audience: Some("floodgate".into()),
            verify_audience: true,
            dev_login: false,
        }
    }
}

/// Log output settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct LogSettings {
    /// `json` (production) or `pretty` (local).
    pub format: String,
    /// An `EnvFilter` directive, e.g. `info,booking=debug`.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: "pretty".into(),
            level: "info".into(),
        }
    }
}

/// Compares a presented admin bearer secret with the configured one in constant time.
pub fn admin_secret_matches(configured: &SecretString, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    let expected = configured.expose_secret().as_bytes();
    // An empty configured secret never matches: it would mean "admin API open to all".
    !expected.is_empty() && bool::from(expected.ct_eq(presented.as_bytes()))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn admin_secret_compare() {
        let s = SecretString::from("abc");
        assert!(admin_secret_matches(&s, "abc"));
        assert!(!admin_secret_matches(&s, "abd"));
        assert!(!admin_secret_matches(&s, ""));
        assert!(!admin_secret_matches(&SecretString::from(""), ""));
    }
}
