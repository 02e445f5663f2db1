//! The verifiable pre-sale draw and the signed place receipts.
//!
//! Fans who join before the sale start get a random place ahead of everyone who arrives
//! later. The randomness comes from a per-event secret seed whose SHA-256 is published (the
//! commitment, `GET /queue/{event}/draw`) before the sale and the seed itself after it, so
//! anyone can recompute every pre-sale score:
//!
//! `score = (first 8 bytes of HMAC-SHA256(key = seed, msg = account), big-endian) >> 12, − 2^52`
//!
//! That is a 52-bit number shifted below zero: exactly representable as a Redis sorted-set
//! score (a double), and below every post-start score (Redis `TIME` in ms, positive). Ties
//! (vanishingly rare) are broken by account id, as Redis does.

use crate::signing::Tagger;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// The pre-sale score of `account` under `seed`.
pub fn presale_score(seed: &[u8], account: &str) -> i64 {
    let key = hmac::Key::new(hmac::HMAC_SHA256, seed);
    let tag = hmac::sign(&key, account.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&tag.as_ref()[..8]);
    let h = u64::from_be_bytes(b) >> 12;
    // h < 2^52, so the conversion is exact and the result lies in [-2^52, 0).
    i64::try_from(h).unwrap_or(0) - (1i64 << 52)
}

/// A fresh seed (hex) and its commitment (hex SHA-256 of the seed bytes).
pub fn new_seed() -> Result<(String, String), ring::error::Unspecified> {
    let mut seed = [0u8; 32];
    SystemRandom::new().fill(&mut seed)?;
    Ok((hex::encode(seed), seed_hash(&seed)))
}

pub fn seed_hash(seed: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, seed))
}

/// What a receipt proves: this account held this place in this event's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReceiptClaims {
    pub evt: String,
    pub sub: String,
    pub sid: String,
    /// The queue score exactly as stored.
    pub score: String,
    /// `draw` or `fifo`.
    pub kind: String,
    /// When the place was taken (Redis time, ms).
    pub joined_ms: i64,
    /// FIFO places: fans ever queued ahead (fixed for the place's life), so any gateway can
    /// compute the rank from its in-memory queue progress (`progress.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<u64>,
}

/// Signs and checks receipts: `base64url(json).tags`, one base64url HMAC-SHA256 tag per
/// configured admission key (`signing.rs`: no extra secret to distribute, and instances in a
/// rolling key rotation accept each other's receipts).
pub struct Receipts {
    tagger: Tagger,
}

impl Receipts {
    pub fn new(admission_secret: &[u8]) -> Self {
        Self::with_keys([admission_secret])
    }

    /// `secrets`: every configured admission secret, the current one first.
    pub fn with_keys<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self {
            tagger: Tagger::new(b"floodgate place receipt v1", secrets),
        }
    }

    pub fn sign(&self, c: &ReceiptClaims) -> String {
        // A struct of strings and integers always serialises.
        let json = serde_json::to_vec(c).unwrap_or_default();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&json),
            self.tagger.tag(&json)
        )
    }

    pub fn verify(&self, receipt: &str) -> Option<ReceiptClaims> {
        if receipt.len() > 4096 {
            return None;
        }
        let (p, tags) = receipt.split_once('.')?;
        let json = URL_SAFE_NO_PAD.decode(p).ok()?;
        if !self.tagger.verify(&json, tags) {
            return None;
        }
        serde_json::from_slice(&json).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_negative_exact_and_stable() {
        let seed = [7u8; 32];
        let a = presale_score(&seed, "fan-1");
        assert_eq!(a, presale_score(&seed, "fan-1"));
        assert_ne!(a, presale_score(&seed, "fan-2"));
        assert_ne!(a, presale_score(&[8u8; 32], "fan-1"));
        for i in 0..1000 {
            let s = presale_score(&seed, &format!("fan-{i}"));
            assert!((-(1i64 << 52)..0).contains(&s));
            // Exactly representable as a double (Redis scores).
            assert_eq!(s as f64 as i64, s);
        }
    }

    #[test]
    fn seed_commitment() {
        let (seed, hash) = new_seed().unwrap();
        assert_eq!(seed_hash(&hex::decode(&seed).unwrap()), hash);
        assert_eq!(hash.len(), 64);
    }

    #[test]
    fn receipts_sign_and_verify() {
        let r = Receipts::new(b"0123456789abcdef0123456789abcdef");
        let c = ReceiptClaims {
            evt: "e".into(),
            sub: "a".into(),
            sid: "s".into(),
            score: "-12".into(),
            kind: "draw".into(),
            joined_ms: 5,
            before: None,
        };
        let t = r.sign(&c);
        assert_eq!(r.verify(&t), Some(c.clone()));
        let other = Receipts::new(b"another-key-0123456789abcdef01234");
        assert_eq!(other.verify(&t), None);
        let tampered = Receipts::new(b"0123456789abcdef0123456789abcdef").sign(&ReceiptClaims {
            score: "-99".into(),
            ..c
        });
        let (_, good_sig) = t.split_once('.').unwrap();
        let (bad_payload, _) = tampered.split_once('.').unwrap();
        assert_eq!(r.verify(&format!("{bad_payload}.{good_sig}")), None);
        assert_eq!(r.verify("garbage"), None);
    }
}
