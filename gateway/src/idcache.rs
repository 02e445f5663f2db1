//! Login tokens already verified by this instance.
//!
//! A waiting fan presents the same login token on every status poll, and production login
//! tokens are RS256/EdDSA, whose signature check costs tens of microseconds. This cache maps
//! the SHA-256 of the whole token to its account until the token's `exp`, so a repeat poll
//! costs one hash and a lookup. Keyed by a hash of the *entire* token, so a cache hit means
//! exactly these bytes passed verification before; a token that never verified is never in
//! it. Bounded: a full shard first drops expired entries, then is cleared (the next polls
//! simply verify again).

use ring::digest;
use std::collections::HashMap;
use std::sync::Mutex;

const SHARDS: usize = 16;

/// SHA-256 of a token → (account, `exp`).
type Shard = Mutex<HashMap<[u8; 32], (Box<str>, i64)>>;

pub struct IdentityCache {
    shards: Vec<Shard>,
    per_shard: usize,
}

impl IdentityCache {
    /// Room for about `capacity` tokens (0 disables the cache).
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
        }
    }

    fn key(token: &str) -> [u8; 32] {
        let d = digest::digest(&digest::SHA256, token.as_bytes());
        let mut k = [0u8; 32];
        k.copy_from_slice(d.as_ref());
        k
    }

    fn shard(&self, key: &[u8; 32]) -> Option<&Shard> {
        self.shards.get(usize::from(key[0]) % SHARDS)
    }

    /// The account of `token` when it was verified before and has not expired at `now`, or
    /// the result of `verify` (cached when it succeeds).
    pub fn account<E>(
        &self,
        token: &str,
        now: i64,
        verify: impl FnOnce(&str) -> Result<(String, i64), E>,
    ) -> Result<String, E> {
        if self.per_shard == 0 {
            return verify(token).map(|(a, _)| a);
        }
        let key = Self::key(token);
        let Some(shard) = self.shard(&key) else {
            return verify(token).map(|(a, _)| a);
        };
        {
            let map = shard.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((account, exp)) = map.get(&key)
                && *exp > now
            {
                return Ok(account.to_string());
            }
        }
        let (account, exp) = verify(token)?;
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= self.per_shard {
            map.retain(|_, (_, e)| *e > now);
            if map.len() >= self.per_shard {
                map.clear();
            }
        }
        map.insert(key, (account.clone().into_boxed_str(), exp));
        Ok(account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn verified_tokens_are_remembered_until_they_expire() {
        let cache = IdentityCache::new(1000);
        let calls = Cell::new(0);
        let verify = |t: &str| -> Result<(String, i64), ()> {
            calls.set(calls.get() + 1);
            if t.starts_with("good") {
                Ok((format!("acct-{t}"), 100))
            } else {
                Err(())
            }
        };
        assert_eq!(
            cache.account("good-1", 10, verify),
            Ok("acct-good-1".into())
        );
        assert_eq!(
            cache.account("good-1", 50, verify),
            Ok("acct-good-1".into())
        );
        assert_eq!(calls.get(), 1, "second use came from the cache");
        // Expired: verified again (and the verifier decides).
        assert_eq!(
            cache.account("good-1", 100, verify),
            Ok("acct-good-1".into())
        );
        assert_eq!(calls.get(), 2);
        // Failures are never cached.
        assert_eq!(cache.account("bad", 10, verify), Err(()));
        assert_eq!(cache.account("bad", 10, verify), Err(()));
        assert_eq!(calls.get(), 4);
        // A token differing in one byte is a different token.
        assert_eq!(
            cache.account("good-2", 10, verify),
            Ok("acct-good-2".into())
        );
        assert_eq!(calls.get(), 5);
    }

    #[test]
    fn stays_bounded() {
        let cache = IdentityCache::new(32);
        for i in 0..10_000 {
            let t = format!("good-{i}");
            let r: Result<String, ()> = cache.account(&t, 0, |t| Ok((t.to_owned(), 100)));
            assert_eq!(r, Ok(t));
        }
        let total: usize = cache
            .shards
            .iter()
            .map(|s| s.lock().map(|m| m.len()).unwrap_or(0))
            .sum();
        assert!(total <= 32 + SHARDS, "{total}");
        // Disabled: always verifies.
        let off = IdentityCache::new(0);
        let calls = Cell::new(0);
        for _ in 0..3 {
            let _: Result<String, ()> = off.account("t", 0, |_| {
                calls.set(calls.get() + 1);
                Ok(("a".into(), 100))
            });
        }
        assert_eq!(calls.get(), 3);
    }
}
