//! Redis, connected lazily: booking starts and serves its Postgres-only paths while Redis is
//! down, and the first caller that needs it connects. Cheap to clone (one `Arc`).

use crate::platform::error::ApiError;
use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use secrecy::ExposeSecret;
use shared::config::RedisSettings;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

#[derive(Clone)]
pub struct Redis(Arc<Inner>);

struct Inner {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    prefix: String,
    timeout: Duration,
}

impl Redis {
    pub fn new(settings: &RedisSettings) -> anyhow::Result<Self> {
        let client =
            redis::Client::open(settings.url.expose_secret()).context("invalid redis url")?;
        Ok(Self(Arc::new(Inner {
            client,
            conn: OnceCell::new(),
            prefix: settings.key_prefix.clone(),
            timeout: Duration::from_millis(settings.response_timeout_ms.max(1)),
        })))
    }

    /// A connection (multiplexed, auto-reconnecting); connects on first use.
    pub async fn conn(&self) -> Result<ConnectionManager, ApiError> {
        let timeout = self.0.timeout;
        let conn = self
            .0
            .conn
            .get_or_try_init(|| async {
                let cfg = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config(self.0.client.clone(), cfg).await
            })
            .await?;
        Ok(conn.clone())
    }

    /// A key with this deployment's prefix.
    pub fn key(&self, suffix: &str) -> String {
        prefixed(&self.0.prefix, suffix)
    }

    /// This deployment's key prefix.
    pub fn prefix(&self) -> &str {
        &self.0.prefix
    }
}

fn prefixed(prefix: &str, suffix: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + suffix.len());
    k.push_str(prefix);
    k.push_str(suffix);
    k
}

#[cfg(test)]
mod tests {
    use super::prefixed;

    #[test]
    fn keys_carry_the_prefix() {
        assert_eq!(prefixed("fg:", "cart:a"), "fg:cart:a");
        assert_eq!(prefixed("", "cart:a"), "cart:a");
    }
}
