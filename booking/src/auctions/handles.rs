//! Pseudonymous handles: what fans see of other fans in an auction instead of their account
//! id (which can be an e-mail address).
//!
//! A handle is `bidder-` (or `seller-`) followed by 8 base32 characters of
//! HMAC-SHA256(secret, auction id, account id): the same fan has the same handle everywhere in
//! one auction (views, live prices, refusals, replays), handles of one fan in two auctions
//! cannot be linked without the secret, and no handle leads back to an account. Whether the
//! viewer is the fan named is decided by comparing account ids (`you_lead`), never handles,
//! which are short enough to collide.

use anyhow::Context;
use ring::hmac;
use secrecy::ExposeSecret;

#[derive(Clone)]
pub struct Handles {
    key: hmac::Key,
}

impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handles(..)")
    }
}

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

impl Handles {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// `[auctions] handle_secret`, or when it is empty a key derived from the current
    /// admission-token signing key (a separate purpose, so the two never share a MAC).
    pub fn from_settings(
        settings: &super::AuctionSettings,
        tokens: &shared::config::TokenSettings,
    ) -> anyhow::Result<Self> {
        let own = settings.handle_secret.expose_secret();
        if !own.is_empty() {
            return Ok(Self::new(own.as_bytes()));
        }
        let base = tokens
            .keys
            .iter()
            .find(|k| k.kid == tokens.current_kid)
            .context(
                "[auctions] handle_secret is empty and [tokens] has no current key to derive it from",
            )?;
        let derive = hmac::Key::new(hmac::HMAC_SHA256, base.secret.expose_secret().as_bytes());
        let derived = hmac::sign(&derive, b"floodgate auction bidder handles v1");
        Ok(Self::new(derived.as_ref()))
    }

    fn handle(&self, prefix: &str, auction: &str, account: &str) -> String {
        // Length-prefixed, so no (auction, account) pair can imitate another.
        let msg = format!("{}:{auction}:{account}", auction.len());
        let tag = hmac::sign(&self.key, msg.as_bytes());
        let b = tag.as_ref();
        // 40 bits as 8 base32 characters.
        let bits = b
            .iter()
            .take(5)
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
        let mut out = String::with_capacity(prefix.len() + 8);
        out.push_str(prefix);
        for i in (0..8).rev() {
            out.push(char::from(BASE32[((bits >> (i * 5)) & 31) as usize]));
        }
        out
    }

    /// The handle of a bidder (or leader, or winner) in one auction.
    pub fn bidder(&self, auction: &str, account: &str) -> String {
        self.handle("bidder-", auction, account)
    }

    /// The handle of an auction's seller.
    pub fn seller(&self, auction: &str, account: &str) -> String {
        self.handle("seller-", auction, account)
    }

    /// The leader as `viewer` may see them: its handle, and whether it is the viewer.
    pub fn leader(
        &self,
        auction: &str,
        leader: Option<&str>,
        viewer: &str,
    ) -> (Option<String>, bool) {
        (
            leader.map(|l| self.bidder(auction, l)),
            leader == Some(viewer),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_stable_per_auction_and_differ_across_auctions_and_secrets() {
        let h = Handles::new(b"secret-one");
        let a = h.bidder("auc-1", "fan@example.com");
        assert_eq!(a, h.bidder("auc-1", "fan@example.com"));
        assert!(a.starts_with("bidder-") && a.len() == 15, "{a}");
        assert!(a[7..].bytes().all(|c| BASE32.contains(&c)), "{a}");
        assert!(!a.contains("fan"));
        assert_ne!(a, h.bidder("auc-2", "fan@example.com"));
        assert_ne!(a, h.bidder("auc-1", "other@example.com"));
        assert_ne!(
            a,
            Handles::new(b"secret-two").bidder("auc-1", "fan@example.com")
        );
        // Length-prefixed: moving characters between the two parts changes the handle.
        assert_ne!(h.bidder("ab", "c:d"), h.bidder("ab:c", "d"));
        assert_eq!(
            h.leader("auc-1", Some("fan@example.com"), "fan@example.com"),
            (Some(a.clone()), true)
        );
        assert_eq!(
            h.leader("auc-1", Some("fan@example.com"), "rival"),
            (Some(a), false)
        );
        assert_eq!(h.leader("auc-1", None, "rival"), (None, false));
    }

    #[test]
    fn the_key_is_the_own_secret_or_derived_from_the_current_token_key() {
        let tokens = shared::config::TokenSettings::default();
        let mut settings = crate::auctions::AuctionSettings::default();
        let derived = Handles::from_settings(&settings, &tokens).expect("derived");
        // Derived for its own purpose: not the token key itself.
        let token_key = tokens.keys[0].secret.expose_secret().as_bytes().to_vec();
        assert_ne!(
            derived.bidder("a", "fan"),
            Handles::new(&token_key).bidder("a", "fan")
        );
        settings.handle_secret = secrecy::SecretString::from("own-secret");
        let own = Handles::from_settings(&settings, &tokens).expect("own");
        assert_eq!(
            own.bidder("a", "fan"),
            Handles::new(b"own-secret").bidder("a", "fan")
        );
        let no_key = shared::config::TokenSettings {
            current_kid: "missing".into(),
            ..tokens
        };
        settings.handle_secret = secrecy::SecretString::from("");
        assert!(Handles::from_settings(&settings, &no_key).is_err());
    }
}
