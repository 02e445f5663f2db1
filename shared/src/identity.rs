//! Fans' identity (login) tokens: JWTs issued by the site's login, verified with a configured
//! algorithm (HS256, RS256 or EdDSA) and key. The dev login mints HS256 ones for local use.
//!
//! Checked: signature and algorithm, `iss`, `exp`, `nbf` when present (a token not yet valid
//! is refused), and `aud`, which must be present and match `[identity] audience` unless
//! `verify_audience = false` — a login token minted for another service of the same issuer
//! must not open the waiting room.

use crate::config::IdentitySettings;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdentityClaims {
    pub sub: String,
    pub iss: String,
    pub iat: i64,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("identity key configuration invalid: {0}")]
    Config(String),
    #[error("identity token invalid")]
    Invalid,
}

/// Verifies login tokens and, in dev mode, mints them.
pub struct IdentityVerifier {
    decoding: DecodingKey,
    validation: Validation,
    dev_encoding: Option<EncodingKey>,
    issuer: String,
    audience: Option<String>,
}

impl std::fmt::Debug for IdentityVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityVerifier")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl IdentityVerifier {
    pub fn new(s: &IdentitySettings) -> Result<Self, IdentityError> {
        let key = s.key.expose_secret().as_bytes();
        let (alg, decoding) = match s.algorithm.as_str() {
            "HS256" => (
                Algorithm::HS256,
                DecodingKey::from_secret(key).map_err(|e| IdentityError::Config(e.to_string()))?,
            ),
            "RS256" => (
                Algorithm::RS256,
                DecodingKey::from_rsa_pem(key).map_err(|e| IdentityError::Config(e.to_string()))?,
            ),
            "EdDSA" => (
                Algorithm::EdDSA,
                DecodingKey::from_ed_pem(key).map_err(|e| IdentityError::Config(e.to_string()))?,
            ),
            other => {
                return Err(IdentityError::Config(format!(
                    "unsupported algorithm {other}"
                )));
            }
        };
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[s.issuer.as_str()]);
        validation.validate_nbf = true;
        if s.verify_audience {
            let aud = s
                .audience
                .as_deref()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    IdentityError::Config(
                        "identity.audience must be set (or identity.verify_audience = false)"
                            .into(),
                    )
                })?;
            validation.set_audience(&[aud]);
            validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        } else {
            validation.validate_aud = false;
            validation.set_required_spec_claims(&["exp", "sub", "iss"]);
        }
        let dev_encoding = if s.dev_login && alg == Algorithm::HS256 {
            Some(EncodingKey::from_secret(key).map_err(|e| IdentityError::Config(e.to_string()))?)
        } else {
            None
        };
        Ok(Self {
            decoding,
            validation,
            dev_encoding,
            issuer: s.issuer.clone(),
            audience: s.audience.clone(),
        })
    }

    /// Returns the account id (`sub`) of a valid login token.
    pub fn verify(&self, token: &str) -> Result<String, IdentityError> {
        self.verify_until(token).map(|(sub, _)| sub)
    }

    /// Returns the account id (`sub`) of a valid login token and its expiry (`exp`, unix s).
    pub fn verify_until(&self, token: &str) -> Result<(String, i64), IdentityError> {
        if token.len() > 8192 {
            return Err(IdentityError::Invalid);
        }
        let data = jsonwebtoken::decode::<IdentityClaims>(token, &self.decoding, &self.validation)
            .map_err(|_| IdentityError::Invalid)?;
        if !is_valid_account(&data.claims.sub) {
            return Err(IdentityError::Invalid);
        }
        Ok((data.claims.sub, data.claims.exp))
    }

    /// Dev login: mints a 24 h login token for `account`. `None` unless dev login is enabled.
    pub fn dev_mint(&self, account: &str, now: i64) -> Option<String> {
        let key = self.dev_encoding.as_ref()?;
        let claims = IdentityClaims {
            sub: account.to_owned(),
            iss: self.issuer.clone(),
            iat: now,
            exp: now + 24 * 3600,
            aud: self.audience.clone(),
            nbf: None,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, key).ok()
    }
}

/// Account ids appear in Redis keys and headers: printable, no separators, bounded.
pub fn is_valid_account(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_login_round_trip() {
        let s = IdentitySettings {
            dev_login: true,
            ..IdentitySettings::default()
        };
        let v = IdentityVerifier::new(&s).unwrap();
        let tok = v.dev_mint("fan-1", chrono::Utc::now().timestamp()).unwrap();
        assert_eq!(v.verify(&tok).unwrap(), "fan-1");
        assert!(v.verify("x.y.z").is_err());
        let no_dev = IdentityVerifier::new(&IdentitySettings::default()).unwrap();
        assert!(no_dev.dev_mint("fan-1", 0).is_none());
        assert!(no_dev.verify(&tok).is_ok());
    }

    fn hs256(claims: &serde_json::Value) -> String {
        let key = IdentitySettings::default().key;
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(key.expose_secret().as_bytes()).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn nbf_is_checked_and_aud_required_unless_disabled() {
        let now = chrono::Utc::now().timestamp();
        let v = IdentityVerifier::new(&IdentitySettings::default()).unwrap();
        let claims = |extra: serde_json::Value| {
            let mut c = serde_json::json!({
                "sub": "fan-1", "iss": "floodgate-dev-login", "iat": now, "exp": now + 600,
            });
            for (k, val) in extra.as_object().unwrap() {
                c[k] = val.clone();
            }
            c
        };
        let good = hs256(&claims(serde_json::json!({"aud": "floodgate"})));
        assert_eq!(v.verify(&good).unwrap(), "fan-1");
        // Not valid before an hour from now (well past the leeway).
        let future = hs256(&claims(
            serde_json::json!({"aud": "floodgate", "nbf": now + 3600}),
        ));
        assert!(v.verify(&future).is_err(), "a future nbf is refused");
        let past = hs256(&claims(
            serde_json::json!({"aud": "floodgate", "nbf": now - 10}),
        ));
        assert!(v.verify(&past).is_ok());
        let no_aud = hs256(&claims(serde_json::json!({})));
        assert!(v.verify(&no_aud).is_err(), "a token without aud is refused");
        let other_aud = hs256(&claims(serde_json::json!({"aud": "billing"})));
        assert!(v.verify(&other_aud).is_err());
        // Only an explicit switch turns the audience check off.
        let off = IdentityVerifier::new(&IdentitySettings {
            verify_audience: false,
            ..IdentitySettings::default()
        })
        .unwrap();
        assert_eq!(off.verify(&no_aud).unwrap(), "fan-1");
        assert_eq!(off.verify(&other_aud).unwrap(), "fan-1");
        assert!(off.verify(&future).is_err(), "nbf still applies");
        // Checking an audience that is not configured is a configuration error.
        assert!(
            IdentityVerifier::new(&IdentitySettings {
                audience: None,
                ..IdentitySettings::default()
            })
            .is_err()
        );
    }

    #[test]
    fn account_rules() {
        assert!(is_valid_account("fan-1@example.com"));
        assert!(!is_valid_account("a b"));
        assert!(!is_valid_account("{x}"));
        assert!(!is_valid_account(""));
    }
}
