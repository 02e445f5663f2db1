//! The cart's prices, cached per process so `GET /api/events/{event}/cart` costs one Redis
//! round trip and no Postgres query while prices stay unchanged.
//!
//! Invalidation across processes (booking runs as several): every product change writes a
//! fresh random token to one Redis key (`catalog:version`) after its commit, and every cart
//! read fetches that key in the same pipeline as the cart itself. A token that differs from the
//! one the cache was filled under empties the cache, so a price change shows on the next cart
//! read of every process. The token is random, not a counter, so a Redis that lost the key
//! (restart without persistence) can never bring back an old token: a missing key is its own
//! version and also empties a cache filled under a token. Entries are also dropped after
//! `[orders] cart_price_max_age_ms`, bounding how long a change whose version write failed (Redis down at that
//! moment) can stay unseen.
//!
//! A fill is tagged with the version read *before* the Postgres read, and kept only if the
//! cache is still at that version: a change committed before the version write is then either
//! seen by the read or makes the tag stale, never cached under the new version.
//!
//! Prices are shown only: checkout recomputes them in its transaction.

use crate::orders::repo::{During, OrderError};
use crate::platform::redis::Redis;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Entries kept before the cache is emptied (it only saves work).
const MAX_ENTRIES: usize = 200_000;

/// The version key of the catalogue (under the deployment's prefix).
pub fn version_key(redis: &Redis) -> String {
    redis.key("catalog:version")
}

/// One product as the cart shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Priced {
    pub sku: String,
    pub name: String,
    pub price: i64,
    /// `None` for a product created before events were required (shown in no cart).
    pub event: Option<String>,
}

struct State {
    version: Option<String>,
    filled: Instant,
    items: HashMap<String, Arc<Priced>>,
}

/// SKU -> current name, price and event, valid for one catalogue version.
pub struct Prices {
    state: RwLock<State>,
}

impl Default for Prices {
    fn default() -> Self {
        Self {
            state: RwLock::new(State {
                version: None,
                filled: Instant::now(),
                items: HashMap::new(),
            }),
        }
    }
}

impl Prices {
    /// The cached products among `skus` at catalogue `version`, and the SKUs to read. A cache
    /// at another version, or too old, is emptied first.
    pub fn lookup<'a>(
        &self,
        version: Option<&str>,
        max_age: Duration,
        skus: impl Iterator<Item = &'a str>,
    ) -> (HashMap<String, Arc<Priced>>, Vec<String>) {
        let mut found = HashMap::new();
        let mut missing = Vec::new();
        let current = self
            .state
            .read()
            .ok()
            .filter(|s| is_current(s, version) && s.filled.elapsed() < max_age);
        match current {
            Some(s) => {
                for sku in skus {
                    match s.items.get(sku) {
                        Some(p) => {
                            found.insert(sku.to_owned(), p.clone());
                        }
                        None => missing.push(sku.to_owned()),
                    }
                }
            }
            None => {
                self.reset(version, max_age);
                missing.extend(skus.map(str::to_owned));
            }
        }
        (found, missing)
    }

    /// Caches `rows`, read after `version` was, unless the cache has moved to another version
    /// since.
    pub fn fill(&self, version: Option<&str>, rows: &[Arc<Priced>]) {
        if let Ok(mut s) = self.state.write()
            && is_current(&s, version)
        {
            if s.items.len() + rows.len() > MAX_ENTRIES {
                s.items.clear();
            }
            for p in rows {
                s.items.insert(p.sku.clone(), p.clone());
            }
        }
    }

    /// Empties the cache and moves it to `version` (unless another request just did).
    fn reset(&self, version: Option<&str>, max_age: Duration) {
        if let Ok(mut s) = self.state.write()
            && !(is_current(&s, version) && s.filled.elapsed() < max_age)
        {
            s.version = version.map(str::to_owned);
            s.filled = Instant::now();
            s.items.clear();
        }
    }

    /// Forgets everything (this process changed a product).
    pub fn clear(&self) {
        if let Ok(mut s) = self.state.write() {
            s.items.clear();
        }
    }
}

fn is_current(s: &State, version: Option<&str>) -> bool {
    s.version.as_deref() == version
}

/// Current name, price and event of each of `skus` (any event; the caller filters).
pub async fn read(pool: &PgPool, skus: &[String]) -> Result<Vec<Arc<Priced>>, OrderError> {
    if skus.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<Priced> = sqlx::query_as(
        "SELECT sku, name, price, event_id AS event FROM products WHERE sku = ANY($1)",
    )
    .bind(skus)
    .fetch_all(pool)
    .await
    .during("read the cart's prices")?;
    Ok(rows.into_iter().map(Arc::new).collect())
}

/// Announces a product change to every process (after its commit). Best effort: without it
/// other processes see the change within `[orders] cart_price_max_age_ms`.
pub async fn changed(redis: &Redis, prices: &Prices) {
    prices.clear();
    let res = async {
        let mut conn = redis.conn().await?;
        redis::cmd("SET")
            .arg(version_key(redis))
            .arg(shared::ids::new_id())
            .query_async::<()>(&mut conn)
            .await
            .map_err(crate::platform::error::ApiError::from)
    }
    .await;
    if let Err(e) = res {
        tracing::warn!(error = ?e, "failed to announce a catalogue change; other processes see it within [orders] cart_price_max_age_ms");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGE: Duration = Duration::from_secs(3600);

    fn p(sku: &str, price: i64) -> Arc<Priced> {
        Arc::new(Priced {
            sku: sku.into(),
            name: sku.into(),
            price,
            event: Some("e".into()),
        })
    }

    #[test]
    fn a_new_version_empties_the_cache() {
        let c = Prices::default();
        let (found, missing) = c.lookup(Some("v1"), AGE, ["A", "B"].into_iter());
        assert!(found.is_empty());
        assert_eq!(missing, ["A", "B"]);
        c.fill(Some("v1"), &[p("A", 1), p("B", 2)]);
        let (found, missing) = c.lookup(Some("v1"), AGE, ["A", "B", "C"].into_iter());
        assert_eq!((found.len(), missing), (2, vec!["C".to_owned()]));
        assert_eq!(found["B"].price, 2);

        let (found, missing) = c.lookup(Some("v2"), AGE, ["A"].into_iter());
        assert!(found.is_empty(), "another version: nothing cached counts");
        assert_eq!(missing, ["A"]);
        let (found, _) = c.lookup(None, AGE, ["A"].into_iter());
        assert!(
            found.is_empty(),
            "a lost version key is a version of its own"
        );
    }

    #[test]
    fn a_fill_under_an_older_version_is_dropped() {
        let c = Prices::default();
        c.lookup(Some("v1"), AGE, ["A"].into_iter());
        // Another request saw v2 meanwhile.
        c.lookup(Some("v2"), AGE, ["A"].into_iter());
        c.fill(Some("v1"), &[p("A", 1)]);
        let (found, _) = c.lookup(Some("v2"), AGE, ["A"].into_iter());
        assert!(found.is_empty(), "a price read under v1 never serves v2");
        c.fill(Some("v2"), &[p("A", 3)]);
        assert_eq!(c.lookup(Some("v2"), AGE, ["A"].into_iter()).0["A"].price, 3);
        c.clear();
        assert!(c.lookup(Some("v2"), AGE, ["A"].into_iter()).0.is_empty());
    }

    #[test]
    fn entries_older_than_the_max_age_are_read_again() {
        let c = Prices::default();
        c.lookup(Some("v1"), AGE, ["A"].into_iter());
        c.fill(Some("v1"), &[p("A", 1)]);
        let (found, missing) = c.lookup(Some("v1"), Duration::ZERO, ["A"].into_iter());
        assert!(found.is_empty());
        assert_eq!(missing, ["A"]);
    }
}
