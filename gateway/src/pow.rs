//! Optional proof-of-work on join (event config `pow_difficulty`, 0 = off): the waiting page
//! fetches a signed challenge bound to the event and account, finds a `solution` such that
//! `SHA-256(challenge ":" solution)` starts with `difficulty` zero bits, and sends both with
//! the join. Cheap for one fan's browser, expensive for a farm of scripted ones.
//!
//! Challenges are stateless (HMAC-signed, two-minute expiry), so checking one costs no Redis
//! round trip. They are tagged with every configured admission key (`signing.rs`), so
//! instances in a rolling key rotation accept each other's challenges.

use crate::signing::Tagger;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;

pub const CHALLENGE_TTL_S: i64 = 120;

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Solution {
    pub challenge: String,
    pub solution: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    #[error("challenge malformed or not signed by this gateway")]
    BadChallenge,
    #[error("challenge was issued for another event or account")]
    WrongSubject,
    #[error("challenge expired")]
    Expired,
    #[error("solution does not meet the difficulty")]
    Insufficient,
}

pub struct Pow {
    tagger: Tagger,
}

impl Pow {
    pub fn new(admission_secret: &[u8]) -> Self {
        Self::with_keys([admission_secret])
    }

    /// `secrets`: every configured admission secret, the current one first.
    pub fn with_keys<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self {
            tagger: Tagger::new(b"floodgate pow challenge v1", secrets),
        }
    }

    /// A challenge for `account` on `event`, valid until `now_s + CHALLENGE_TTL_S`.
    pub fn challenge(&self, event: &str, account: &str, now_s: i64) -> String {
        let mut nonce = [0u8; 12];
        // A failing system RNG only makes challenges predictable, not forgeable.
        let _ = SystemRandom::new().fill(&mut nonce);
        let payload = format!(
            "{event}|{account}|{}|{}",
            now_s + CHALLENGE_TTL_S,
            hex::encode(nonce)
        );
        let tags = self.tagger.tag(payload.as_bytes());
        format!("{}.{tags}", URL_SAFE_NO_PAD.encode(payload))
    }

    pub fn verify(
        &self,
        s: &Solution,
        event: &str,
        account: &str,
        difficulty: u32,
        now_s: i64,
    ) -> Result<(), PowError> {
        if s.challenge.len() > 1024 || s.solution.len() > 128 {
            return Err(PowError::BadChallenge);
        }
        let (p, tags) = s.challenge.split_once('.').ok_or(PowError::BadChallenge)?;
        let payload = URL_SAFE_NO_PAD
            .decode(p)
            .map_err(|_| PowError::BadChallenge)?;
        if !self.tagger.verify(&payload, tags) {
            return Err(PowError::BadChallenge);
        }
        let payload = std::str::from_utf8(&payload).map_err(|_| PowError::BadChallenge)?;
        let mut parts = payload.split('|');
        let (Some(evt), Some(acct), Some(exp)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(PowError::BadChallenge);
        };
        if evt != event || acct != account {
            return Err(PowError::WrongSubject);
        }
        let exp: i64 = exp.parse().map_err(|_| PowError::BadChallenge)?;
        if now_s > exp {
            return Err(PowError::Expired);
        }
        if leading_zero_bits(&s.challenge, &s.solution) < difficulty {
            return Err(PowError::Insufficient);
        }
        Ok(())
    }
}

/// Leading zero bits of `SHA-256(challenge ":" solution)`.
pub fn leading_zero_bits(challenge: &str, solution: &str) -> u32 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(challenge.as_bytes());
    ctx.update(b":");
    ctx.update(solution.as_bytes());
    let d = ctx.finish();
    let mut bits = 0;
    for b in d.as_ref() {
        if *b == 0 {
            bits += 8;
        } else {
            bits += b.leading_zeros();
            break;
        }
    }
    bits
}

/// Brute-force solver (tests and the load generator; the browser has its own in JS).
pub fn solve(challenge: &str, difficulty: u32) -> String {
    (0u64..)
        .map(|n| n.to_string())
        .find(|s| leading_zero_bits(challenge, s) >= difficulty)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solve_and_verify() {
        let pow = Pow::new(b"0123456789abcdef0123456789abcdef");
        let c = pow.challenge("demo", "fan-1", 1000);
        let solution = solve(&c, 8);
        let s = Solution {
            challenge: c.clone(),
            solution,
        };
        assert_eq!(pow.verify(&s, "demo", "fan-1", 8, 1000), Ok(()));
        assert_eq!(
            pow.verify(&s, "demo", "fan-2", 8, 1000),
            Err(PowError::WrongSubject)
        );
        assert_eq!(
            pow.verify(&s, "other", "fan-1", 8, 1000),
            Err(PowError::WrongSubject)
        );
        assert_eq!(
            pow.verify(&s, "demo", "fan-1", 8, 1000 + CHALLENGE_TTL_S + 1),
            Err(PowError::Expired)
        );
        // A solution for difficulty 8 almost never meets 24.
        let unsolved = Solution {
            challenge: c.clone(),
            solution: "definitely-not".into(),
        };
        if leading_zero_bits(&c, "definitely-not") < 24 {
            assert_eq!(
                pow.verify(&unsolved, "demo", "fan-1", 24, 1000),
                Err(PowError::Insufficient)
            );
        }
        let forged =
            Pow::new(b"another-secret-0123456789abcdef0123").challenge("demo", "fan-1", 1000);
        let f = Solution {
            challenge: forged,
            solution: "0".into(),
        };
        assert_eq!(
            pow.verify(&f, "demo", "fan-1", 0, 1000),
            Err(PowError::BadChallenge)
        );
    }
}
