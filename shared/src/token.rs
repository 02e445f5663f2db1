//! The admission token: a short-lived HS256 JWT minted by the gateway when a fan is admitted
//! and verified on every request by the gateway and again by booking (defence in depth).
//!
//! Claims: `sub` (account), `sid` (session), `evt` (event), `iat`, `exp`, `jti`, plus `iss`
//! and `aud`. The header carries `kid`, so keys rotate without downtime: every configured key
//! verifies, only `current_kid` signs. HS256 is chosen because verification is a single HMAC
//! (a couple of microseconds); an asymmetric check per request is too slow at the edge.
//! `alg=none` and every algorithm other than HS256 are refused.

use crate::config::TokenSettings;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Claims of an admission token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AdmissionClaims {
    /// Account id.
    pub sub: String,
    /// Waiting-room session id (one per account per event join).
    pub sid: String,
    /// Event id; a token opens exactly this event.
    pub evt: String,
    pub iat: i64,
    pub exp: i64,
    /// Unique token id.
    pub jti: String,
    pub iss: String,
    pub aud: String,
    /// When the fan was admitted (unix s). A token re-minted during checkout keeps it, so the
    /// session bound (`max_session_s`) and revocation count from the admission, not from the
    /// refresh. Absent in tokens minted before it existed: then `iat` is the admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adm: Option<i64>,
}

impl AdmissionClaims {
    /// When the fan was admitted (unix s).
    pub fn admitted_at(&self) -> i64 {
        self.adm.unwrap_or(self.iat)
    }

    /// Whether a revocation recorded at `revoked_at` (unix s) refuses this token: it does for
    /// every token of an admission made up to that time, refreshed ones included.
    pub fn revoked_by(&self, revoked_at: i64) -> bool {
        self.admitted_at() <= revoked_at
    }
}

/// Why a token was refused. `reason()` is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token missing")]
    Missing,
    #[error("token malformed")]
    Malformed,
    #[error("token signed with an unknown key")]
    UnknownKey,
    #[error("token algorithm not accepted")]
    BadAlgorithm,
    #[error("token signature invalid")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token not valid for this audience or issuer")]
    WrongAudience,
    #[error("token is for another event")]
    WrongEvent,
    #[error("token revoked")]
    Revoked,
}

impl TokenError {
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::Missing => "missing",
            TokenError::Malformed => "malformed",
            TokenError::UnknownKey => "unknown_key",
            TokenError::BadAlgorithm => "bad_algorithm",
            TokenError::BadSignature => "bad_signature",
            TokenError::Expired => "expired",
            TokenError::WrongAudience => "wrong_audience",
            TokenError::WrongEvent => "wrong_event",
            TokenError::Revoked => "revoked",
        }
    }
}

/// Problems with the key configuration (found at start-up, never per request).
#[derive(Debug, thiserror::Error)]
pub enum KeyConfigError {
    #[error("no admission-token keys configured")]
    NoKeys,
    #[error("current_kid {0:?} is not among the configured keys")]
    CurrentKidMissing(String),
    #[error("key {0:?} is shorter than 32 bytes")]
    KeyTooShort(String),
    #[error("duplicate kid {0:?}")]
    DuplicateKid(String),
}

struct Key {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

/// Mints and verifies admission tokens. Cheap to share behind an `Arc`.
pub struct AdmissionTokens {
    current_kid: String,
    keys: HashMap<String, Key>,
    validation: Validation,
    issuer: String,
    audience: String,
    default_ttl_s: u64,
}

impl std::fmt::Debug for AdmissionTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionTokens")
            .field("current_kid", &self.current_kid)
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AdmissionTokens {
    pub fn new(settings: &TokenSettings) -> Result<Self, KeyConfigError> {
        if settings.keys.is_empty() {
            return Err(KeyConfigError::NoKeys);
        }
        let mut keys = HashMap::new();
        for k in &settings.keys {
            let secret = k.secret.expose_secret().as_bytes();
            if secret.len() < 32 {
                return Err(KeyConfigError::KeyTooShort(k.kid.clone()));
            }
            let key = Key {
                encoding: EncodingKey::from_secret(secret)
                    .map_err(|_| KeyConfigError::KeyTooShort(k.kid.clone()))?,
                decoding: DecodingKey::from_secret(secret)
                    .map_err(|_| KeyConfigError::KeyTooShort(k.kid.clone()))?,
            };
            if keys.insert(k.kid.clone(), key).is_some() {
                return Err(KeyConfigError::DuplicateKid(k.kid.clone()));
            }
        }
        if !keys.contains_key(&settings.current_kid) {
            return Err(KeyConfigError::CurrentKidMissing(
                settings.current_kid.clone(),
            ));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[settings.audience.as_str()]);
        validation.set_issuer(&[settings.issuer.as_str()]);
        validation.set_required_spec_claims(&["exp", "iat", "aud", "iss", "sub"]);
        validation.leeway = settings.leeway_s;
        validation.validate_exp = true;
        Ok(Self {
            current_kid: settings.current_kid.clone(),
            keys,
            validation,
            issuer: settings.issuer.clone(),
            audience: settings.audience.clone(),
            default_ttl_s: settings.default_ttl_s,
        })
    }

    pub fn default_ttl_s(&self) -> u64 {
        self.default_ttl_s
    }

    /// Mints a token for `account`/`session` on `event`, valid `ttl_s` seconds from `now`
    /// (unix seconds; the caller passes the data store's clock where it has one).
    pub fn mint(
        &self,
        account: &str,
        session: &str,
        event: &str,
        now: i64,
        ttl_s: u64,
    ) -> Result<(String, AdmissionClaims), jsonwebtoken::errors::Error> {
        let exp = now.saturating_add(i64::try_from(ttl_s).unwrap_or(i64::MAX));
        self.mint_session(account, session, event, now, now, exp)
    }

    /// Mints a token of an admission made at `admitted_at`, issued at `now` and valid until
    /// `exp` (all unix seconds): a later token of the same admission (checkout refresh, a
    /// repeat status poll).
    pub fn mint_session(
        &self,
        account: &str,
        session: &str,
        event: &str,
        admitted_at: i64,
        now: i64,
        exp: i64,
    ) -> Result<(String, AdmissionClaims), jsonwebtoken::errors::Error> {
        let claims = AdmissionClaims {
            sub: account.to_owned(),
            sid: session.to_owned(),
            evt: event.to_owned(),
            iat: now,
            exp,
            jti: crate::ids::new_id(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            adm: Some(admitted_at),
        };
        let token = self.sign(&claims)?;
        Ok((token, claims))
    }

    /// Signs arbitrary admission claims with the current key (tests use this to craft
    /// tampered or expired tokens).
    pub fn sign(&self, claims: &AdmissionClaims) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(self.current_kid.clone());
        let key = self
            .keys
            .get(&self.current_kid)
            .map(|k| &k.encoding)
            .ok_or_else(|| jsonwebtoken::errors::Error::from(ErrorKind::InvalidKeyFormat))?;
        jsonwebtoken::encode(&header, claims, key)
    }

    /// Verifies signature, algorithm, key id, expiry, issuer and audience.
    pub fn verify(&self, token: &str) -> Result<AdmissionClaims, TokenError> {
        if token.is_empty() {
            return Err(TokenError::Missing);
        }
        if token.len() > 4096 {
            return Err(TokenError::Malformed);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                TokenError::BadAlgorithm
            }
            _ => TokenError::Malformed,
        })?;
        if header.alg != Algorithm::HS256 {
            return Err(TokenError::BadAlgorithm);
        }
        let kid = header.kid.as_deref().ok_or(TokenError::UnknownKey)?;
        let key = self.keys.get(kid).ok_or(TokenError::UnknownKey)?;
        jsonwebtoken::decode::<AdmissionClaims>(token, &key.decoding, &self.validation)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature | ErrorKind::ImmatureSignature => TokenError::Expired,
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                ErrorKind::InvalidAudience | ErrorKind::InvalidIssuer => TokenError::WrongAudience,
                ErrorKind::InvalidAlgorithm => TokenError::BadAlgorithm,
                _ => TokenError::Malformed,
            })
    }

    /// Verifies and checks that the token opens `event`.
    pub fn verify_for_event(
        &self,
        token: &str,
        event: &str,
    ) -> Result<AdmissionClaims, TokenError> {
        let claims = self.verify(token)?;
        if claims.evt != event {
            return Err(TokenError::WrongEvent);
        }
        Ok(claims)
    }
}

/// Extracts a bearer token from an `Authorization` header value.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}

/// Finds cookie `name` in a `Cookie` header value.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|part| {
        let (k, v) = part.trim().split_once('=')?;
        (k == name).then_some(v).filter(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeySettings;
    use base64::Engine;
    use secrecy::SecretString;

    fn settings(kids: &[&str], current: &str) -> TokenSettings {
        TokenSettings {
            current_kid: current.into(),
            keys: kids
                .iter()
                .map(|k| KeySettings {
                    kid: (*k).into(),
                    secret: SecretString::from(format!("{k}-secret-0123456789abcdef0123456789")),
                })
                .collect(),
            ..TokenSettings::default()
        }
    }

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    #[test]
    fn mint_then_verify() {
        let t = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let (tok, claims) = t.mint("acct", "sess", "evt", now(), 60).unwrap();
        assert_eq!(t.verify(&tok).unwrap(), claims);
        assert_eq!(t.verify_for_event(&tok, "evt").unwrap(), claims);
        assert_eq!(
            t.verify_for_event(&tok, "other"),
            Err(TokenError::WrongEvent)
        );
    }

    #[test]
    fn expired_refused() {
        let t = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let (tok, _) = t.mint("a", "s", "e", now() - 3600, 60).unwrap();
        assert_eq!(t.verify(&tok), Err(TokenError::Expired));
    }

    #[test]
    fn forged_and_tampered_refused() {
        let t = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let other = AdmissionTokens::new(&TokenSettings {
            keys: vec![KeySettings {
                kid: "k1".into(),
                secret: SecretString::from("an-attacker-secret-0123456789abcdef0123"),
            }],
            ..settings(&["k1"], "k1")
        })
        .unwrap();
        let (forged, _) = other.mint("a", "s", "e", now(), 60).unwrap();
        assert_eq!(t.verify(&forged), Err(TokenError::BadSignature));

        let (tok, _) = t.mint("a", "s", "e", now(), 60).unwrap();
        let parts: Vec<&str> = tok.split('.').collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut payload: serde_json::Value =
            serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
        payload["evt"] = "other-event".into();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            b64.encode(serde_json::to_vec(&payload).unwrap()),
            parts[2]
        );
        assert_eq!(t.verify(&tampered), Err(TokenError::BadSignature));
        assert_eq!(t.verify("garbage"), Err(TokenError::Malformed));
        assert_eq!(t.verify(""), Err(TokenError::Missing));
    }

    #[test]
    fn alg_none_refused() {
        let t = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(r#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
        let (tok, _) = t.mint("a", "s", "e", now(), 60).unwrap();
        let payload = tok.split('.').nth(1).unwrap();
        for candidate in [
            format!("{header}.{payload}."),
            format!("{header}.{payload}"),
        ] {
            assert!(t.verify(&candidate).is_err(), "alg=none accepted");
        }
    }

    #[test]
    fn key_rotation() {
        let old = AdmissionTokens::new(&settings(&["k1"], "k1")).unwrap();
        let (old_tok, _) = old.mint("a", "s", "e", now(), 60).unwrap();
        // New key added and made current: old tokens still verify.
        let rotated = AdmissionTokens::new(&settings(&["k1", "k2"], "k2")).unwrap();
        assert!(rotated.verify(&old_tok).is_ok());
        let (new_tok, _) = rotated.mint("a", "s", "e", now(), 60).unwrap();
        assert!(rotated.verify(&new_tok).is_ok());
        // Old key removed: its tokens no longer verify.
        let removed = AdmissionTokens::new(&settings(&["k2"], "k2")).unwrap();
        assert_eq!(removed.verify(&old_tok), Err(TokenError::UnknownKey));
        assert!(removed.verify(&new_tok).is_ok());
    }

    #[test]
    fn config_errors() {
        assert!(AdmissionTokens::new(&settings(&["k1"], "k9")).is_err());
        let mut s = settings(&["k1"], "k1");
        s.keys[0].secret = SecretString::from("short");
        assert!(AdmissionTokens::new(&s).is_err());
    }

    #[test]
    fn header_helpers() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(
            cookie("a=1; fg_admission=tok; b=2", "fg_admission"),
            Some("tok")
        );
        assert_eq!(cookie("a=1", "fg_admission"), None);
    }
}
