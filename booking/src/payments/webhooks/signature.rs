//! Verifying a provider webhook's `Stripe-Signature` header: pure functions over the header,
//! the raw body, the configured secrets and the clock, so every rule is unit-tested here.
//!
//! The header (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`) is checked against
//! HMAC-SHA256(secret, `"<t>.<raw body>"`) for every configured secret (rotation) and every
//! `v1` signature, in constant time (`subtle`), before the body is even parsed. A missing,
//! malformed, wrong or stale (more than the tolerance from now) signature is refused.

use ring::hmac;
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

/// Longest signature header looked at, and most `v1` entries compared.
const MAX_HEADER_LEN: usize = 4096;
const MAX_SIGNATURES: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature header is missing")]
    Missing,
    #[error("the signature header is malformed")]
    Malformed,
    #[error("no signature matches")]
    Mismatch,
    #[error("the signature timestamp is outside the tolerance")]
    Stale,
}

impl SignatureError {
    /// The `reason` detail of the refusal.
    pub fn reason(self) -> &'static str {
        match self {
            SignatureError::Missing => "missing",
            SignatureError::Malformed => "malformed",
            SignatureError::Mismatch => "mismatch",
            SignatureError::Stale => "stale",
        }
    }
}

/// Verifies a `Stripe-Signature` header over `body` (see the module docs). `now` is unix
/// seconds. Every secret is compared with every signature (no early exit), so timing does
/// not reveal which one matched.
pub fn verify_signature(
    header: Option<&str>,
    body: &[u8],
    secrets: &[SecretString],
    now: i64,
    tolerance_s: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    if header.len() > MAX_HEADER_LEN {
        return Err(SignatureError::Malformed);
    }
    let mut timestamp: Option<i64> = None;
    let mut signatures: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match k {
            "t" => {
                if timestamp.is_some() {
                    return Err(SignatureError::Malformed);
                }
                timestamp = Some(v.parse().map_err(|_| SignatureError::Malformed)?);
            }
            "v1" => {
                // An undecodable entry cannot match; others may (rotation).
                if let Ok(sig) = hex::decode(v)
                    && sig.len() == 32
                    && signatures.len() < MAX_SIGNATURES
                {
                    signatures.push(sig);
                }
            }
            // Other schemes (v0 test signatures...) are ignored, as Stripe does.
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Mismatch);
    }
    let mut matched = 0u8;
    for secret in secrets {
        let secret = secret.expose_secret();
        if secret.is_empty() {
            continue;
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(timestamp.to_string().as_bytes());
        ctx.update(b".");
        ctx.update(body);
        let expected = ctx.sign();
        for sig in &signatures {
            matched |= expected.as_ref().ct_eq(sig).unwrap_u8();
        }
    }
    if matched == 0 {
        return Err(SignatureError::Mismatch);
    }
    // The tolerance bounds replays of a captured, validly signed request.
    if now.abs_diff(timestamp) > tolerance_s {
        return Err(SignatureError::Stale);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let msg = [t.to_string().as_bytes(), b".", body].concat();
        hex::encode(hmac::sign(&key, &msg).as_ref())
    }

    fn secrets(s: &[&str]) -> Vec<SecretString> {
        s.iter()
            .map(|x| SecretString::from(x.to_string()))
            .collect()
    }

    #[test]
    fn accepts_a_good_signature() {
        let body = br#"{"id":"evt_1"}"#;
        let h = format!("t=1000,v1={}", sign("whsec_a", 1000, body));
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&["whsec_a"]), 1010, 300),
            Ok(())
        );
    }

    #[test]
    fn rotation_any_secret_any_signature() {
        let body = b"{}";
        let h = format!(
            "t=1000,v1={},v1={}",
            "00".repeat(32),
            sign("whsec_new", 1000, body)
        );
        assert_eq!(
            verify_signature(
                Some(&h),
                body,
                &secrets(&["whsec_old", "whsec_new"]),
                1000,
                300
            ),
            Ok(())
        );
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&["whsec_old"]), 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn refuses_tampering_staleness_and_garbage() {
        let body = b"{\"amount\":100}";
        let good = sign("whsec_a", 1000, body);
        let s = secrets(&["whsec_a"]);
        let h = format!("t=1000,v1={good}");
        assert_eq!(
            verify_signature(Some(&h), b"{\"amount\":999}", &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
        // Same signature, another timestamp: the timestamp is signed too.
        let h2 = format!("t=1001,v1={good}");
        assert_eq!(
            verify_signature(Some(&h2), body, &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(Some(&h), body, &s, 1301, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify_signature(Some(&h), body, &s, 699, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify_signature(None, body, &s, 1000, 300),
            Err(SignatureError::Missing)
        );
        for bad in ["", "garbage", "t=abc,v1=00", "v1=00", "t=1,t=2,v1=00"] {
            assert!(
                verify_signature(Some(bad), body, &s, 1000, 300).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            verify_signature(Some(&h), body, &secrets(&[""]), 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn the_tolerance_is_inclusive_both_ways() {
        let body = b"{}";
        let s = secrets(&["whsec_a"]);
        let h = format!("t=1000,v1={}", sign("whsec_a", 1000, body));
        assert_eq!(verify_signature(Some(&h), body, &s, 1300, 300), Ok(()));
        assert_eq!(verify_signature(Some(&h), body, &s, 700, 300), Ok(()));
        assert_eq!(
            verify_signature(Some(&h), body, &s, 1000, 0),
            Ok(()),
            "a zero tolerance still accepts the same second"
        );
    }

    #[test]
    fn other_schemes_and_spaces_are_tolerated() {
        let body = b"{}";
        let s = secrets(&["whsec_a"]);
        let h = format!("t=1000, v0=abc, v1={}, x=y", sign("whsec_a", 1000, body));
        assert_eq!(verify_signature(Some(&h), body, &s, 1000, 300), Ok(()));
        // Only a v0 (test-mode) signature: nothing to compare.
        assert_eq!(
            verify_signature(Some("t=1000,v0=abc"), body, &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
        // A v1 that is not 32 bytes of hex cannot match.
        assert_eq!(
            verify_signature(Some("t=1000,v1=zz,v1=0011"), body, &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn oversized_headers_and_signature_floods_are_bounded() {
        let body = b"{}";
        let s = secrets(&["whsec_a"]);
        let good = sign("whsec_a", 1000, body);
        let huge = format!("t=1000,v1={good},{}", "x=y,".repeat(MAX_HEADER_LEN));
        assert_eq!(
            verify_signature(Some(&huge), body, &s, 1000, 300),
            Err(SignatureError::Malformed)
        );
        // The good signature after MAX_SIGNATURES others is not looked at.
        let flood = format!(
            "t=1000,{}v1={good}",
            format!("v1={},", "00".repeat(32)).repeat(MAX_SIGNATURES)
        );
        assert!(flood.len() <= MAX_HEADER_LEN);
        assert_eq!(
            verify_signature(Some(&flood), body, &s, 1000, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn refusal_reasons_are_stable() {
        let reasons: Vec<&str> = [
            SignatureError::Missing,
            SignatureError::Malformed,
            SignatureError::Mismatch,
            SignatureError::Stale,
        ]
        .iter()
        .map(|e| e.reason())
        .collect();
        assert_eq!(reasons, ["missing", "malformed", "mismatch", "stale"]);
    }
}
