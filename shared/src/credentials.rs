//! Operator and scanner credentials (DESIGN section 9, "Credentials"): the secret's format,
//! the roles, and the list booking publishes to Redis for the gateway's admin listener.
//!
//! A credential is a type prefix and 256 random bits in unpadded base64url (`fgop_` + 43
//! characters). Only its SHA-256 is stored: the secret is random, so a fast hash is as good as
//! a password hash and cheap enough to check on every request. Booking owns the credentials
//! (Postgres); after every change, and every second besides, it publishes the live operators
//! as `(hash, role, expiry, name)` to [`operators_key`] so the gateway, which has no Postgres,
//! can check them too. The published list carries a generation so an older snapshot never
//! overwrites a newer one.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Prefix of an operator credential.
pub const OPERATOR_PREFIX: &str = "fgop_";
/// Prefix of a scanner credential (check-in devices; never valid on an admin listener).
pub const SCANNER_PREFIX: &str = "fgsc_";
/// Random bytes in a credential.
const SECRET_BYTES: usize = 32;
/// Length of the base64url part (32 bytes, no padding).
const SECRET_CHARS: usize = 43;
/// The actor recorded for a call made with the bootstrap admin secret.
pub const BOOTSTRAP_ACTOR: &str = "bootstrap";

/// What an operator may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads orders, the audit logs, dashboards and room configs.
    Viewer,
    /// Also refunds, cancels orders, resends tickets, forgets an e-mail, revokes an admission.
    Support,
    /// Also edits and cancels events, seat kills, room config and schedules, registrations,
    /// operators.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Support, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Support => "support",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether this role may do what `required` may.
    pub fn allows(self, required: Role) -> bool {
        self >= required
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a credential, from its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Operator,
    Scanner,
}

impl Kind {
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Operator => OPERATOR_PREFIX,
            Kind::Scanner => SCANNER_PREFIX,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Operator => "operator",
            Kind::Scanner => "scanner",
        }
    }
}

/// A new credential: the secret (shown once, never stored) and its hash (stored).
pub struct Issued {
    pub secret: String,
    pub hash: [u8; 32],
}

/// A fresh random credential of `kind`.
pub fn issue(kind: Kind) -> Result<Issued, ring::error::Unspecified> {
    let mut bytes = [0u8; SECRET_BYTES];
    SystemRandom::new().fill(&mut bytes)?;
    let secret = format!("{}{}", kind.prefix(), URL_SAFE_NO_PAD.encode(bytes));
    let hash = hash(&secret);
    Ok(Issued { secret, hash })
}

/// SHA-256 of the whole credential text (prefix included).
pub fn hash(secret: &str) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lower-case hex of [`hash`], as published to Redis.
pub fn hash_hex(secret: &str) -> String {
    to_hex(&hash(secret))
}

/// Lower-case hex of 32 bytes.
pub fn to_hex(bytes: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

/// What a presented bearer looks like, before any lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `fgop_` and 43 base64url characters.
    Operator,
    /// `fgsc_` and 43 base64url characters.
    Scanner,
    /// A typed prefix with a body of the wrong length or alphabet: never valid.
    Malformed,
    /// Anything else (the bootstrap secret is checked against it).
    Other,
}

/// Classifies a presented bearer by its prefix and body.
pub fn shape(presented: &str) -> Shape {
    let well_formed = |body: &str| {
        body.len() == SECRET_CHARS
            && body
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    };
    if let Some(body) = presented.strip_prefix(OPERATOR_PREFIX) {
        if well_formed(body) {
            Shape::Operator
        } else {
            Shape::Malformed
        }
    } else if let Some(body) = presented.strip_prefix(SCANNER_PREFIX) {
        if well_formed(body) {
            Shape::Scanner
        } else {
            Shape::Malformed
        }
    } else {
        Shape::Other
    }
}

/// The Redis key (after the deployment's `redis.key_prefix`) holding [`Published`] as JSON.
pub fn operators_key(prefix: &str) -> String {
    format!("{prefix}fg:operators")
}

/// The live operators, as booking publishes them for the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Grows with every change in Postgres; a snapshot with a lower one is never written over
    /// a higher one.
    pub generation: i64,
    /// When booking wrote this snapshot (unix ms).
    pub published_ms: i64,
    pub operators: Vec<PublishedOperator>,
}

/// One live (not revoked) operator credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedOperator {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Lower-case hex SHA-256 of the credential.
    pub hash: String,
    /// Expiry (unix ms); refused from then on.
    pub expires_ms: i64,
}

/// An operator as a listener knows it after a successful check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub expires_ms: i64,
}

impl Published {
    /// The lookup table the gateway checks against: hash → operator.
    pub fn index(&self) -> HashMap<String, Known> {
        self.operators
            .iter()
            .map(|o| {
                (
                    o.hash.clone(),
                    Known {
                        id: o.id.clone(),
                        name: o.name.clone(),
                        role: o.role,
                        expires_ms: o.expires_ms,
                    },
                )
            })
            .collect()
    }
}

/// Failed credential checks per client address, in fixed one-minute windows. Once an address
/// has failed `per_min` times in the current window, every credential it presents is refused
/// (`429`) without being checked until the window ends — a brute force learns nothing more,
/// at the cost of locking out a legitimate operator behind the same address for a minute.
/// `per_min = 0` turns the limit off (as `0` does for the other rate limits).
pub struct AuthFailures {
    per_min: u32,
    window: Duration,
    seen: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Addresses remembered at most; older windows are dropped first when full.
const MAX_TRACKED: usize = 10_000;

impl AuthFailures {
    pub fn new(per_min: u32) -> Self {
        Self {
            per_min,
            window: Duration::from_secs(60),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(seconds until the window ends)` while `ip` may not present credentials.
    pub fn blocked(&self, ip: IpAddr) -> Option<u64> {
        if self.per_min == 0 {
            return None;
        }
        let now = Instant::now();
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (start, n) = *seen.get(&ip)?;
        let end = start + self.window;
        (now < end && n >= self.per_min).then(|| (end - now).as_secs().max(1))
    }

    /// Counts one failed check from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        if self.per_min == 0 {
            return;
        }
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_TRACKED && !seen.contains_key(&ip) {
            let window = self.window;
            seen.retain(|_, (start, _)| now < *start + window);
            if seen.len() >= MAX_TRACKED {
                // Still full of live windows: forget the oldest one.
                if let Some(oldest) = seen.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    seen.remove(&oldest);
                }
            }
        }
        let entry = seen.entry(ip).or_insert((now, 0));
        if now >= entry.0 + self.window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_credentials_have_their_shape_and_hash() {
        let op = issue(Kind::Operator).expect("random");
        assert!(op.secret.starts_with("fgop_"));
        assert_eq!(op.secret.len(), 5 + 43);
        assert_eq!(shape(&op.secret), Shape::Operator);
        assert_eq!(op.hash, hash(&op.secret));
        let sc = issue(Kind::Scanner).expect("random");
        assert_eq!(shape(&sc.secret), Shape::Scanner);
        assert_ne!(op.secret, issue(Kind::Operator).expect("random").secret);
    }

    #[test]
    fn shapes() {
        assert_eq!(shape("fgop_short"), Shape::Malformed);
        assert_eq!(
            shape(&format!("fgop_{}", "a".repeat(42) + "=")),
            Shape::Malformed
        );
        assert_eq!(shape(&format!("fgsc_{}", "b".repeat(44))), Shape::Malformed);
        assert_eq!(shape("a-bootstrap-secret"), Shape::Other);
        assert_eq!(shape(""), Shape::Other);
    }

    #[test]
    fn hex_is_sha256() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            hash_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn roles_are_ordered() {
        assert!(Role::Admin.allows(Role::Support));
        assert!(Role::Support.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Support));
        assert!(!Role::Support.allows(Role::Admin));
        for r in Role::ALL {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn failures_block_an_address_for_its_window_only() {
        let f = AuthFailures::new(3);
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        for _ in 0..2 {
            f.failed(a);
        }
        assert_eq!(f.blocked(a), None);
        f.failed(a);
        assert!(f.blocked(a).is_some_and(|s| (1..=60).contains(&s)));
        assert_eq!(f.blocked(b), None);
        let off = AuthFailures::new(0);
        for _ in 0..100 {
            off.failed(a);
        }
        assert_eq!(off.blocked(a), None);
    }
}
