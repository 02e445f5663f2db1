//! Ticket codes (DESIGN section 9, "Ticket codes"): a compact JWS signed with Ed25519,
//! header `{"alg":"EdDSA","typ":"fg-ticket+jwt","kid"}`, claims `tid`, `evt`, `seat` or `tier`,
//! `hnd`, `ver`, `iat` and `rot: true` on rotating events. Any JOSE library verifies one with
//! the event's JWKS; [`TicketKeys::verify`] is the door's own check.
//!
//! Guarantees: a code names its holder only through the holder handle (an HMAC of the account
//! under `[tickets] handle_secret`, truncated to 16 bytes), never the account; signing is
//! deterministic (Ed25519), so one ticket version has one code; the event door key and the
//! per-ticket rotation secrets derive from `[tickets] door_secret`, and only the per-ticket
//! secret ever reaches a fan.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;
// Ed25519 by ed25519-dalek: its verifying key keeps the decompressed point, and its verify
// measured 1.6x faster than ring's here, which the door's ≤ 50 µs per scan needs
// (docs/decisions.md, docs/benchmarks.md). Signatures are deterministic (RFC 8032): the same
// bytes as before.
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// The `typ` of a ticket code's header.
pub const TYP: &str = "fg-ticket+jwt";
/// The only `alg`.
pub const ALG: &str = "EdDSA";
/// Longest text [`TicketKeys::verify`] looks at (a code is about 300 bytes).
pub const MAX_CODE_LEN: usize = 2048;
/// Bytes of the holder handle (of HMAC-SHA256's 32).
pub const HANDLE_BYTES: usize = 16;

/// A ticket code's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketClaims {
    /// Ticket id.
    pub tid: String,
    /// Event id.
    pub evt: String,
    /// Seat id (reserved seating).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    /// General-admission tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Holder handle: base64url of the first 16 bytes of HMAC-SHA256(handle_secret, account).
    pub hnd: String,
    /// Ticket version: changes on every void and transfer.
    pub ver: i32,
    /// When the ticket was issued (unix seconds).
    pub iat: i64,
    /// `true` on rotating events (the door then wants the `~` TOTP part too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rot: Option<bool>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
    kid: String,
}

/// Why a code is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    #[error("not a ticket code (not three base64url JSON parts, or too long)")]
    Malformed,
    #[error("the header's alg is not EdDSA")]
    WrongAlgorithm,
    #[error("the header's typ is not fg-ticket+jwt")]
    WrongType,
    #[error("signed with a key this deployment does not know (or has revoked)")]
    UnknownKey,
    #[error("the signature does not match")]
    BadSignature,
}

/// One configured signing key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKeySetting {
    pub kid: String,
    /// base64url (padding optional) of a 32-byte Ed25519 seed.
    pub secret: SecretString,
}

/// Why the `[tickets]` keys are unusable.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("tickets.signing_keys: empty")]
    NoKeys,
    #[error("tickets.signing_keys: kid {0:?} is empty, too long or not printable ASCII")]
    BadKid(String),
    #[error("tickets.signing_keys: kid {0:?} appears twice")]
    DuplicateKid(String),
    #[error("tickets.signing_keys: the secret of kid {0:?} is not base64url of 32 bytes")]
    BadSeed(String),
    #[error("tickets.current_kid: {0:?} is not among tickets.signing_keys")]
    UnknownCurrent(String),
    #[error("tickets.{0}: empty")]
    EmptySecret(&'static str),
}

struct Key {
    kid: String,
    signing: SigningKey,
    verifying: VerifyingKey,
}

/// Signs and verifies ticket codes and derives the handle, door key and per-ticket secrets.
pub struct TicketKeys {
    keys: Vec<Key>,
    current: usize,
    handle: hmac::Key,
    door: hmac::Key,
}

impl std::fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKeys")
            .field(
                "kids",
                &self.keys.iter().map(|k| &k.kid).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A JSON Web Key Set of the signing keys' public halves.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One Ed25519 public key (RFC 8037).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Jwk {
    /// `OKP`
    pub kty: String,
    /// `Ed25519`
    pub crv: String,
    /// The public key, base64url.
    pub x: String,
    pub kid: String,
    /// `EdDSA`
    pub alg: String,
    /// `sig`
    #[serde(rename = "use")]
    pub use_: String,
}

fn valid_kid(kid: &str) -> bool {
    !kid.is_empty() && kid.len() <= 64 && kid.bytes().all(|b| b.is_ascii_graphic())
}

impl TicketKeys {
    pub fn new(
        signing: &[SigningKeySetting],
        current_kid: &str,
        handle_secret: &SecretString,
        door_secret: &SecretString,
    ) -> Result<Self, KeyError> {
        if signing.is_empty() {
            return Err(KeyError::NoKeys);
        }
        let mut keys: Vec<Key> = Vec::with_capacity(signing.len());
        for k in signing {
            if !valid_kid(&k.kid) {
                return Err(KeyError::BadKid(k.kid.clone()));
            }
            if keys.iter().any(|e| e.kid == k.kid) {
                return Err(KeyError::DuplicateKid(k.kid.clone()));
            }
            let text = k.secret.expose_secret().trim().trim_end_matches('=');
            let seed = B64
                .decode(text)
                .ok()
                .filter(|s| s.len() == 32)
                .ok_or_else(|| KeyError::BadSeed(k.kid.clone()))?;
            let seed: [u8; 32] = seed
                .try_into()
                .map_err(|_| KeyError::BadSeed(k.kid.clone()))?;
            let signing = SigningKey::from_bytes(&seed);
            keys.push(Key {
                kid: k.kid.clone(),
                verifying: signing.verifying_key(),
                signing,
            });
        }
        let current = keys
            .iter()
            .position(|k| k.kid == current_kid)
            .ok_or_else(|| KeyError::UnknownCurrent(current_kid.to_owned()))?;
        for (name, s) in [
            ("handle_secret", handle_secret),
            ("door_secret", door_secret),
        ] {
            if s.expose_secret().is_empty() {
                return Err(KeyError::EmptySecret(name));
            }
        }
        Ok(Self {
            keys,
            current,
            handle: hmac::Key::new(hmac::HMAC_SHA256, handle_secret.expose_secret().as_bytes()),
            door: hmac::Key::new(hmac::HMAC_SHA256, door_secret.expose_secret().as_bytes()),
        })
    }

    /// The kid new codes are signed with.
    pub fn current_kid(&self) -> &str {
        &self.keys[self.current].kid
    }

    /// Every configured key's public half (retired keys stay until their events are over).
    pub fn jwks(&self) -> Jwks {
        Jwks {
            keys: self
                .keys
                .iter()
                .map(|k| Jwk {
                    kty: "OKP".into(),
                    crv: "Ed25519".into(),
                    x: B64.encode(k.verifying.as_bytes()),
                    kid: k.kid.clone(),
                    alg: ALG.into(),
                    use_: "sig".into(),
                })
                .collect(),
        }
    }

    /// The holder handle of `account`: base64url of the first 16 bytes of
    /// HMAC-SHA256(handle_secret, account). Stable per account; reveals nothing of it.
    pub fn handle(&self, account: &str) -> String {
        let mac = hmac::sign(&self.handle, account.as_bytes());
        B64.encode(&mac.as_ref()[..HANDLE_BYTES])
    }

    /// The event's door key, HMAC-SHA256(door_secret, event id). Scanners only, never fans.
    pub fn door_key(&self, event: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(hmac::sign(&self.door, event.as_bytes()).as_ref());
        out
    }

    /// A rotating ticket's secret, HMAC-SHA256(door key, tid ‖ 0x00 ‖ ver as decimal ASCII).
    pub fn ticket_secret(&self, event: &str, tid: &str, ver: i32) -> [u8; 32] {
        ticket_secret(&self.door_key(event), tid, ver)
    }

    /// The compact JWS of `claims`, signed with the current key.
    pub fn sign(&self, claims: &TicketClaims) -> String {
        let key = &self.keys[self.current];
        let header = Header {
            alg: ALG.into(),
            typ: TYP.into(),
            kid: key.kid.clone(),
        };
        // Serialising these plain structs cannot fail; an empty part would fail verification.
        let h = B64.encode(serde_json::to_vec(&header).unwrap_or_default());
        let p = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let input = format!("{h}.{p}");
        let sig = key.signing.sign(input.as_bytes());
        format!("{input}.{}", B64.encode(sig.to_bytes()))
    }

    /// The claims of a code this deployment signed. The static part only: split a rotating
    /// code with [`split_rotating`] first. Version, holder and event are the caller's to check.
    pub fn verify(&self, code: &str) -> Result<TicketClaims, CodeError> {
        if code.len() > MAX_CODE_LEN {
            return Err(CodeError::Malformed);
        }
        let mut parts = code.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(CodeError::Malformed);
        };
        let header: Header = B64
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(CodeError::Malformed)?;
        if header.alg != ALG {
            return Err(CodeError::WrongAlgorithm);
        }
        if header.typ != TYP {
            return Err(CodeError::WrongType);
        }
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == header.kid)
            .ok_or(CodeError::UnknownKey)?;
        let sig = B64.decode(s).map_err(|_| CodeError::Malformed)?;
        let signed = &code[..h.len() + 1 + p.len()];
        let sig = Signature::from_slice(&sig).map_err(|_| CodeError::BadSignature)?;
        // Strict: no small-order keys or non-canonical signatures, so one ticket version has
        // exactly one valid code text.
        key.verifying
            .verify_strict(signed.as_bytes(), &sig)
            .map_err(|_| CodeError::BadSignature)?;
        B64.decode(p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(CodeError::Malformed)
    }
}

/// HMAC-SHA256(door key, tid ‖ 0x00 ‖ ver as decimal ASCII): the secret a rotating ticket's
/// holder gets, and what a scanner holding the door key recomputes.
pub fn ticket_secret(door_key: &[u8], tid: &str, ver: i32) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, door_key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(tid.as_bytes());
    ctx.update(&[0]);
    ctx.update(ver.to_string().as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// Splits a rotating code `STATIC~DIGITS` into its static code and TOTP; a code without `~`
/// comes back whole with `None`.
pub fn split_rotating(text: &str) -> (&str, Option<&str>) {
    match text.split_once('~') {
        Some((code, totp)) => (code, Some(totp)),
        None => (text, None),
    }
}

/// The text a fan's device shows for a rotating ticket at `unix_s`.
pub fn rotating_text(code: &str, secret: &[u8], unix_s: u64) -> String {
    format!(
        "{code}~{}",
        crate::tickets::totp::code(secret, unix_s, crate::tickets::totp::TICKET_STEP_S)
    )
}

/// base64url without padding (how `rotating_secret` is sent).
pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[cfg(test)]
mod tests;
