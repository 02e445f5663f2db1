//! The hot-path admission-token check: the same rules as `shared::token::AdmissionTokens::verify`
//! (HS256 only, `kid` must name a configured key, signature, `exp` with leeway, `iss`, `aud`,
//! all claims present), done in one pass with `ring`'s HMAC instead of jsonwebtoken's generic
//! path (which decodes the header twice and the claims twice). Measured in
//! docs/benchmarks.md; booking keeps verifying with the shared implementation (defence in
//! depth), and `tests::agrees_with_shared` checks both accept exactly the same tokens.
//!
//! Refusal reasons can differ from the shared verifier's in corner cases (e.g. `alg: "none"`
//! is `bad_algorithm` here); acceptance never does.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use secrecy::ExposeSecret;
use serde::Deserialize;
use shared::config::TokenSettings;
use shared::token::{AdmissionClaims, TokenError};
use std::borrow::Cow;
use std::collections::HashMap;

pub struct FastVerifier {
    keys: HashMap<String, hmac::Key>,
    issuer: String,
    audience: String,
    leeway_s: i64,
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
        }
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
        let c = self.verify(token, now)?;
        if c.evt != event {
            return Err(TokenError::WrongEvent);
        }
        Ok(c)
    }
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
    }
}
