//! Revoked admissions, as the gateway's ops API records them in Redis and as both the gateway
//! and booking enforce them.
//!
//! Layout (after the deployment's `redis.key_prefix`, which the gateway and booking share):
//! `fg:events` is the set of configured events, and `fg:{event}:revoked` a hash of
//! `a:<account>` / `s:<session>` → revocation time (unix s). An entry refuses every token of
//! an admission made at or before that time ([`AdmissionClaims::revoked_by`]), including
//! tokens re-minted later during checkout; a fan admitted again through the queue afterwards
//! is not affected.

use crate::token::AdmissionClaims;
use std::collections::HashMap;

/// `fg:{event}:<suffix>` with the deployment prefix (the event is a Redis Cluster hash tag).
pub fn event_key(prefix: &str, event: &str, suffix: &str) -> String {
    format!("{prefix}fg:{{{event}}}:{suffix}")
}

/// Sub-queue `k` of an event's split queue: `fg:{event}:<suffix>` for 0 (the event's home,
/// where everything that is not per fan lives) and `fg:{event:k}:<suffix>` for the others, each
/// its own hash tag and so its own Redis Cluster slot (`:` is not allowed in event ids).
pub fn shard_key(prefix: &str, event: &str, k: u32, suffix: &str) -> String {
    if k == 0 {
        event_key(prefix, event, suffix)
    } else {
        format!("{prefix}fg:{{{event}:{k}}}:{suffix}")
    }
}

/// The set of configured events.
pub fn events_key(prefix: &str) -> String {
    format!("{prefix}fg:events")
}

/// One event's revocations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventRevocations {
    /// Account → revocation time (unix s).
    pub accounts: HashMap<String, i64>,
    /// Session → revocation time (unix s).
    pub sessions: HashMap<String, i64>,
}

impl EventRevocations {
    /// From the fields of `fg:{event}:revoked` (unknown fields are ignored).
    pub fn from_fields(fields: impl IntoIterator<Item = (String, i64)>) -> Self {
        let mut r = Self::default();
        for (k, at) in fields {
            if let Some(a) = k.strip_prefix("a:") {
                r.accounts.insert(a.to_owned(), at);
            } else if let Some(s) = k.strip_prefix("s:") {
                r.sessions.insert(s.to_owned(), at);
            }
        }
        r
    }

    /// True when ops revoked this token's account or session after its admission.
    pub fn refuses(&self, c: &AdmissionClaims) -> bool {
        let hit = |at: Option<&i64>| at.is_some_and(|at| c.revoked_by(*at));
        hit(self.accounts.get(&c.sub)) || hit(self.sessions.get(&c.sid))
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.sessions.is_empty()
    }
}

/// Every event's revocations (event → entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    pub events: HashMap<String, EventRevocations>,
}

impl Revocations {
    pub fn refuses(&self, c: &AdmissionClaims) -> bool {
        self.events.get(&c.evt).is_some_and(|e| e.refuses(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(sub: &str, sid: &str, iat: i64, adm: Option<i64>) -> AdmissionClaims {
        AdmissionClaims {
            sub: sub.into(),
            sid: sid.into(),
            evt: "e".into(),
            iat,
            exp: iat + 60,
            jti: "j".into(),
            iss: "i".into(),
            aud: "a".into(),
            adm,
        }
    }

    #[test]
    fn a_revocation_reaches_refreshed_tokens_of_the_same_admission_only() {
        let r = Revocations {
            events: [(
                "e".to_owned(),
                EventRevocations::from_fields([
                    ("a:alice".to_owned(), 100),
                    ("s:s2".to_owned(), 100),
                    ("x:junk".to_owned(), 100),
                ]),
            )]
            .into(),
        };
        // Admitted before the revocation: refused, even when re-minted after it.
        assert!(r.refuses(&claims("alice", "s1", 90, None)));
        assert!(r.refuses(&claims("alice", "s1", 150, Some(90))));
        assert!(r.refuses(&claims("bob", "s2", 150, Some(100))));
        // Admitted again after the revocation: fine.
        assert!(!r.refuses(&claims("alice", "s3", 150, Some(101))));
        assert!(!r.refuses(&claims("bob", "s1", 50, None)));
        let mut other = claims("alice", "s1", 90, None);
        other.evt = "f".into();
        assert!(!r.refuses(&other), "another event's entries do not apply");
    }

    #[test]
    fn keys_match_the_gateway_layout() {
        assert_eq!(event_key("p:", "ev1", "revoked"), "p:fg:{ev1}:revoked");
        assert_eq!(shard_key("p:", "ev1", 0, "q"), "p:fg:{ev1}:q");
        assert_eq!(shard_key("p:", "ev1", 3, "q"), "p:fg:{ev1:3}:q");
        assert_eq!(events_key("p:"), "p:fg:events");
    }
}
