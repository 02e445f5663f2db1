//! The hot-path admission-token check: the same rules as `shared::token::AdmissionTokens::verify`
//! (HS256 only, `kid` must name a configured key, signature, `exp` with leeway, `iss`, `aud`,
//! all claims present), done in one pass with `ring`'s HMAC instead of jsonwebtoken's generic
//! path (which decodes the header twice and the claims twice). Measured in
//! docs/benchmarks.md; booking keeps verifying with the shared implementation (defence in
//! depth), and `tests::agrees_with_shared` checks both accept exactly the same tokens.
//!
//! Refusal reasons can differ from the shared verifier's in corner cases (e.g. `alg: "none"`
//! is `bad_algorithm` here); acceptance never does.
//!
//! An admitted fan sends the same token with every call, so `verify_cached` remembers tokens
//! it has verified (a small direct-mapped table per process) and on a repeat only compares the
//! bytes and re-checks `exp`: HMAC, base64 and JSON run once per token, not once per request.
//! Only tokens that passed every check are stored; keys are fixed for the life of the process,
//! so nothing else about a stored token can change (revocation is checked by the caller on
//! every request, cached or not).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use secrecy::ExposeSecret;
use serde::Deserialize;
use shared::config::TokenSettings;
use shared::token::{AdmissionClaims, TokenError};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use subtle::ConstantTimeEq;

/// Slots of the verified-token cache: a token is ~370 bytes, so a full table is ~2.5 MB.
/// Direct-mapped: a new token simply replaces whatever shared its slot.
const CACHE_SLOTS: usize = 4096;

pub struct FastVerifier {
    keys: HashMap<String, hmac::Key>,
    issuer: String,
    audience: String,
    leeway_s: i64,
    cache: Box<[Mutex<Option<Verified>>]>,
    /// Random per process: nobody can aim tokens at one slot to evict a fan's entry.
    slot_hasher: RandomState,
}

/// A token that passed `verify`, with its claims.
struct Verified {
    token: Box<str>,
    claims: Arc<AdmissionClaims>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing can panic while a slot is held; a poisoned slot is still a consistent one.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Equal bytes, compared without stopping at the first difference: how far a guess matches a
/// stored (valid) token must not show in the time taken.
/// (Lengths may differ in time: a token's length is public.)
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
    #[serde(borrow, default)]
    kid: Option<Cow<'a, str>>,
}

impl FastVerifier {
    /// Built from the same settings as `AdmissionTokens` (which validates them first).
    pub fn new(s: &TokenSettings) -> Self {
        Self {
            keys: s
                .keys
                .iter()
                .map(|k| {
                    let key =
                        hmac::Key::new(hmac::HMAC_SHA256, k.secret.expose_secret().as_bytes());
                    (k.kid.clone(), key)
                })
                .collect(),
            issuer: s.issuer.clone(),
            audience: s.audience.clone(),
            leeway_s: i64::try_from(s.leeway_s).unwrap_or(0),
            cache: (0..CACHE_SLOTS).map(|_| Mutex::new(None)).collect(),
            slot_hasher: RandomState::new(),
        }
    }

    /// `verify`, remembering verified tokens: a repeat of a token that passed costs a hash of
    /// its signature, a byte comparison and the `exp` check.
    pub fn verify_cached(&self, token: &str, now: i64) -> Result<Arc<AdmissionClaims>, TokenError> {
        // The signature picks the slot: it is short and, for genuine tokens, already random.
        let sig = token.rsplit('.').next().unwrap_or(token);
        let i = usize::try_from(self.slot_hasher.hash_one(sig)).unwrap_or(0) % self.cache.len();
        let slot = &self.cache[i];
        let hit = lock(slot)
            .as_ref()
            .filter(|v| same_bytes(v.token.as_bytes(), token.as_bytes()))
            .map(|v| Arc::clone(&v.claims));
        if let Some(claims) = hit {
            if claims.exp < now - self.leeway_s {
                return Err(TokenError::Expired);
            }
            return Ok(claims);
        }
        let claims = Arc::new(self.verify(token, now)?);
        *lock(slot) = Some(Verified {
            token: token.into(),
            claims: Arc::clone(&claims),
        });
        Ok(claims)
    }

    /// `verify_cached` and checks that the token opens `event`.
    pub fn verify_cached_for_event(
        &self,
        token: &str,
        event: &str,
        now: i64,
    ) -> Result<Arc<AdmissionClaims>, TokenError> {
        opens(self.verify_cached(token, now)?, event)
    }

    /// Verifies `token` at unix time `now`.
    pub fn verify(&self, token: &str, now: i64) -> Result<AdmissionClaims, TokenError> {
        if token.is_empty() {
            return Err(TokenError::Missing);
        }
        if token.len() > 4096 {
            return Err(TokenError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        // Decode into stack buffers: a token is at most 4 KiB.
        let mut hbuf = [0u8; 1024];
        let hn = URL_SAFE_NO_PAD
            .decode_slice(h, &mut hbuf)
            .map_err(|_| TokenError::Malformed)?;
        let header: Header<'_> =
            serde_json::from_slice(&hbuf[..hn]).map_err(|_| TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::BadAlgorithm);
        }
        let kid = header.kid.ok_or(TokenError::UnknownKey)?;
        let key = self.keys.get(kid.as_ref()).ok_or(TokenError::UnknownKey)?;
        let mut sig = [0u8; 64];
        let sn = URL_SAFE_NO_PAD
            .decode_slice(s, &mut sig)
            .map_err(|_| TokenError::Malformed)?;
        let signed = &token[..h.len() + 1 + p.len()];
        hmac::verify(key, signed.as_bytes(), &sig[..sn]).map_err(|_| TokenError::BadSignature)?;
        let mut pbuf = [0u8; 3072];
        let pn = URL_SAFE_NO_PAD
            .decode_slice(p, &mut pbuf)
            .map_err(|_| TokenError::Malformed)?;
        let claims: AdmissionClaims =
            serde_json::from_slice(&pbuf[..pn]).map_err(|_| TokenError::Malformed)?;
        if claims.exp < now - self.leeway_s {
            return Err(TokenError::Expired);
        }
        if claims.iss != self.issuer || claims.aud != self.audience {
            return Err(TokenError::WrongAudience);
        }
        Ok(claims)
    }

    /// Verifies and checks that the token opens `event`.
    pub fn verify_for_event(
        &self,
        token: &str,
        event: &str,
        now: i64,
    ) -> Result<AdmissionClaims, TokenError> {
        opens(self.verify(token, now)?, event)
    }
}

/// The claims, if their token opens `event`.
fn opens<C: std::borrow::Borrow<AdmissionClaims>>(c: C, event: &str) -> Result<C, TokenError> {
    if c.borrow().evt != event {
        return Err(TokenError::WrongEvent);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::config::KeySettings;
    use shared::token::AdmissionTokens;

    fn settings(kids: &[&str], current: &str) -> TokenSettings {
        TokenSettings {
            current_kid: current.into(),
            keys: kids
                .iter()
                .map(|k| KeySettings {
                    kid: (*k).into(),
                    secret: secrecy::SecretString::from(format!(
                        "{k}-secret-0123456789abcdef0123456789"
                    )),
                })
                .collect(),
            ..TokenSettings::default()
        }
    }

    fn b64(s: &str) -> String {
        URL_SAFE_NO_PAD.encode(s)
    }

    /// A corpus of valid and hostile tokens, plus thousands of single-character mutations of
    /// valid ones: both verifiers must accept exactly the same ones, with the same claims.
    #[test]
    fn agrees_with_shared() {
        let now = chrono::Utc::now().timestamp();
        let s = settings(&["k1", "k2"], "k2");
        let shared_v = AdmissionTokens::new(&s).unwrap();
        let fast = FastVerifier::new(&s);
        let old = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let other = AdmissionTokens::new(&settings(&["k9"], "k9")).unwrap();
        let (good, claims) = shared_v.mint("fan", "sess", "ev", now, 600).unwrap();
        let (old_good, _) = old.mint("fan", "sess", "ev", now, 600).unwrap();
        let (unknown_kid, _) = other.mint("fan", "sess", "ev", now, 600).unwrap();
        let (expired, _) = shared_v.mint("fan", "sess", "ev", now - 3600, 600).unwrap();
        let (edge, _) = shared_v
            .mint("fan", "sess", "ev", now - 600 - 3, 600)
            .unwrap();
        let wrong_aud = shared_v
            .sign(&AdmissionClaims {
                aud: "x".into(),
                ..claims.clone()
            })
            .unwrap();
        let wrong_iss = shared_v
            .sign(&AdmissionClaims {
                iss: "x".into(),
                ..claims.clone()
            })
            .unwrap();
        let parts: Vec<&str> = good.split('.').collect();
        let mut corpus = vec![
            good.clone(),
            old_good,
            unknown_kid,
            expired,
            edge,
            wrong_aud,
            wrong_iss,
            String::new(),
            "garbage".into(),
            "a.b.c".into(),
            format!("{good}."),
            format!("{good}.x"),
            format!("{}.{}", parts[0], parts[1]),
            format!("{}.{}.", b64(r#"{"alg":"none","kid":"k2"}"#), parts[1]),
            format!(
                "{}.{}.{}",
                b64(r#"{"alg":"HS512","kid":"k2"}"#),
                parts[1],
                parts[2]
            ),
            format!("{}.{}.{}", b64(r#"{"alg":"HS256"}"#), parts[1], parts[2]),
            format!("{}=.{}.{}", parts[0], parts[1], parts[2]),
            format!("{}.{}.{}=", parts[0], parts[1], parts[2]),
            format!("{}.{}.{}", parts[0], b64(r#"{"sub":"a"}"#), parts[2]),
            "x".repeat(5000),
        ];
        // Single-character mutations anywhere in a valid token.
        let alphabet = b"AQgw_-0.aZ";
        for i in 0..good.len() {
            for &c in alphabet.iter().step_by(3) {
                let mut b = good.clone().into_bytes();
                if b[i] != c {
                    b[i] = c;
                    corpus.push(String::from_utf8(b).unwrap());
                }
            }
        }
        let mut accepted = 0;
        for t in &corpus {
            let a = shared_v.verify(t);
            let b = fast.verify(t, now);
            assert_eq!(
                a.is_ok(),
                b.is_ok(),
                "disagree on {t:?}: shared {a:?}, fast {b:?}"
            );
            // Through the cache: the first call stores what passed, the second is a hit (or
            // verifies again); both must answer exactly as `verify` does.
            for _ in 0..2 {
                let c = fast.verify_cached(t, now).map(|c| (*c).clone());
                assert_eq!(c, b, "cached verify disagrees on {t:?}");
            }
            if let (Ok(x), Ok(y)) = (a, b) {
                assert_eq!(x, y);
                accepted += 1;
            }
        }
        // The valid token, the old-key token and the within-leeway one; mutations of the
        // signature's last character may also decode to the same bytes (base64 slack bits)
        // — then both accept.
        assert!(accepted >= 3);
        assert_eq!(
            fast.verify_for_event(&good, "other", now),
            Err(TokenError::WrongEvent)
        );
        assert_eq!(fast.verify("", now), Err(TokenError::Missing));
        assert_eq!(fast.verify_cached("", now), Err(TokenError::Missing));
        assert_eq!(
            fast.verify_cached_for_event(&good, "other", now),
            Err(TokenError::WrongEvent)
        );
    }

    /// A cached token still expires, and being cached lends nothing to a different token
    /// that shares its signature (so lands in the same slot).
    #[test]
    fn cache_keeps_every_rule() {
        let now = chrono::Utc::now().timestamp();
        let s = settings(&["k1"], "k1");
        let minter = AdmissionTokens::new(&s).unwrap();
        let fast = FastVerifier::new(&s);
        let (good, claims) = minter.mint("fan", "sess", "ev", now, 600).unwrap();
        assert_eq!(*fast.verify_cached(&good, now).unwrap(), claims);
        assert_eq!(*fast.verify_cached(&good, now + 1).unwrap(), claims);
        let leeway = i64::try_from(s.leeway_s).unwrap();
        assert_eq!(
            fast.verify_cached(&good, now + 600 + leeway + 1),
            Err(TokenError::Expired)
        );
        // Still expired for `verify` itself: the cache answered as the rules do.
        assert_eq!(
            fast.verify(&good, now + 600 + leeway + 1),
            Err(TokenError::Expired)
        );

        let parts: Vec<&str> = good.split('.').collect();
        let forged_claims = AdmissionClaims {
            sub: "someone-else".into(),
            ..claims.clone()
        };
        let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims).unwrap());
        let forged = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
        assert_eq!(
            fast.verify_cached(&forged, now),
            Err(TokenError::BadSignature)
        );
        // The refusal stored nothing: the genuine token still hits, the forgery still fails.
        assert_eq!(*fast.verify_cached(&good, now).unwrap(), claims);
        assert_eq!(
            fast.verify_cached(&forged, now),
            Err(TokenError::BadSignature)
        );
        // A different verifier (other keys) has its own cache.
        let other = FastVerifier::new(&settings(&["k9"], "k9"));
        assert_eq!(other.verify_cached(&good, now), Err(TokenError::UnknownKey));
    }

    #[test]
    fn same_bytes_is_equality() {
        assert!(same_bytes(b"", b""));
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"ab"));
        assert!(!same_bytes(b"ab", b"abc"));
        assert!(!same_bytes(b"", b"a"));
        assert!(!same_bytes(b"xbc", b"abc"));
        // Every single-bit difference, anywhere in a token-sized input, is seen.
        let token = [0x5au8; 300];
        assert!(same_bytes(&token, &token.clone()));
        for i in [0, 1, 150, 298, 299] {
            for bit in 0..8 {
                let mut other = token;
                other[i] ^= 1 << bit;
                assert!(!same_bytes(&token, &other), "byte {i} bit {bit}");
            }
        }
    }
}
