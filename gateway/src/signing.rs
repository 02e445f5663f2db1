//! HMAC tags for the gateway's own stateless tokens (proof-of-work challenges, place
//! receipts), derived from the admission-token keys so no extra secret is distributed.
//!
//! Guarantee: gateway instances in a rolling key rotation accept each other's tokens. A tag
//! is made with **every** configured key (the current one first, `.`-separated), and a token
//! is accepted when any of its tags verifies under any configured key. So an instance with
//! keys `[old, new]` (current `new`) and one still on `[old]` accept what the other issued;
//! once `old` is removed everywhere, tokens tagged only with it stop verifying, which is what
//! removing a key means.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

/// Tags beyond this are ignored (a rotation has two or three keys configured).
const MAX_TAGS: usize = 4;

pub struct Tagger {
    /// Derived keys, the current key's first.
    keys: Vec<hmac::Key>,
}

impl Tagger {
    /// `secrets`: the admission-token secrets, the current one first. `label` separates the
    /// uses of one secret (a receipt tag is never a valid challenge tag).
    pub fn new<'a>(label: &[u8], secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let keys = secrets
            .into_iter()
            .map(|secret| {
                let derive = hmac::Key::new(hmac::HMAC_SHA256, secret);
                let k = hmac::sign(&derive, label);
                hmac::Key::new(hmac::HMAC_SHA256, k.as_ref())
            })
            .collect();
        Self { keys }
    }

    /// The tags of `payload`: one base64url HMAC per key, `.`-separated.
    pub fn tag(&self, payload: &[u8]) -> String {
        let mut out = String::with_capacity(44 * self.keys.len());
        for (i, k) in self.keys.iter().take(MAX_TAGS).enumerate() {
            if i > 0 {
                out.push('.');
            }
            out.push_str(&URL_SAFE_NO_PAD.encode(hmac::sign(k, payload).as_ref()));
        }
        out
    }

    /// True when one of `tags` (as made by [`Tagger::tag`], possibly by another instance with
    /// other keys) verifies `payload` under one of this instance's keys.
    pub fn verify(&self, payload: &[u8], tags: &str) -> bool {
        tags.split('.').take(MAX_TAGS).any(|t| {
            URL_SAFE_NO_PAD.decode(t).is_ok_and(|sig| {
                self.keys
                    .iter()
                    .any(|k| hmac::verify(k, payload, &sig).is_ok())
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &[u8] = b"old-secret-0123456789abcdef0123456789";
    const NEW: &[u8] = b"new-secret-0123456789abcdef0123456789";

    #[test]
    fn instances_in_a_rotation_accept_each_other() {
        let rotated = Tagger::new(b"t", [NEW, OLD]);
        let behind = Tagger::new(b"t", [OLD]);
        let only_new = Tagger::new(b"t", [NEW]);
        let by_rotated = rotated.tag(b"p");
        let by_behind = behind.tag(b"p");
        assert!(behind.verify(b"p", &by_rotated));
        assert!(rotated.verify(b"p", &by_behind));
        assert!(only_new.verify(b"p", &by_rotated));
        assert!(
            !only_new.verify(b"p", &by_behind),
            "a removed key no longer verifies"
        );
        assert!(!rotated.verify(b"q", &by_rotated), "bound to the payload");
        assert!(
            !Tagger::new(b"other use", [NEW, OLD]).verify(b"p", &by_rotated),
            "bound to its use"
        );
        assert!(!rotated.verify(b"p", "garbage.!!"));
        assert!(!rotated.verify(b"p", ""));
    }
}
