//! The operator credentials the admin listener accepts: booking's published list
//! (`shared::credentials::Published`, a JSON string at `operators_key`), re-read by the
//! live-config refresher (`live.rs`) every `refresh_ms`, so a revocation is in force here
//! within two seconds of booking committing it (booking publishes at once and every second).
//!
//! Guarantees: the list in force is always one read whole and parsed — a Redis failure or a
//! malformed value keeps the last good one (a malformed value is logged once per streak and
//! counted); a list with a lower generation than the one in force never replaces it (booking
//! never writes one either; an old replica's answer must not bring a revoked operator back);
//! and once no list has been read for [`MAX_STALE`], or none ever was, operator credentials
//! are not checked at all ([`Lookup::Stale`], answered `503`) rather than checked against a
//! list that may still hold a revoked operator.

use shared::credentials::{Known, Published};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long the last good list is used after reads stopped succeeding.
pub const MAX_STALE: Duration = Duration::from_secs(5);

/// The operators in force and when they were last confirmed.
#[derive(Default)]
pub struct Operators {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    index: HashMap<String, Known>,
    generation: i64,
    /// When a list was last read whole (`None`: never).
    read_at: Option<Instant>,
    /// A malformed value was seen and logged since the last good read.
    malformed: bool,
}

/// What a credential's hash finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Known(Known),
    Unknown,
    /// No list confirmed within [`MAX_STALE`]: the answer cannot be trusted either way.
    Stale,
}

/// What a read did to the list in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The read list is now in force (or the same generation again).
    Current,
    /// The read list was older than the one in force, which stays (and counts as confirmed).
    Older,
    /// Nothing published yet; the list in force (if any) keeps ageing.
    Absent,
    /// Not a published list; the last good one stays and keeps ageing.
    Malformed,
}

impl Operators {
    /// The operator whose credential hashes to `hash_hex`, as of `now`.
    pub fn lookup(&self, hash_hex: &str, now: Instant) -> Lookup {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        let fresh = s
            .read_at
            .is_some_and(|at| now.saturating_duration_since(at) <= MAX_STALE);
        if !fresh {
            return Lookup::Stale;
        }
        s.index
            .get(hash_hex)
            .cloned()
            .map_or(Lookup::Unknown, Lookup::Known)
    }

    /// Installs what a read of the published key found (`None`: the key does not exist).
    pub fn install(&self, raw: Option<&str>, now: Instant) -> Installed {
        let Some(raw) = raw else {
            return Installed::Absent;
        };
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        let published: Published = match serde_json::from_str(raw) {
            Ok(p) => p,
            Err(e) => {
                if !s.malformed {
                    // The error's position and category only: never the value, which holds
                    // credential hashes.
                    tracing::error!(
                        line = e.line(),
                        column = e.column(),
                        category = ?e.classify(),
                        "published operator list is malformed; keeping the last good one"
                    );
                }
                s.malformed = true;
                return Installed::Malformed;
            }
        };
        s.malformed = false;
        let first = s.read_at.is_none();
        s.read_at = Some(now);
        if first || published.generation >= s.generation {
            s.generation = published.generation;
            s.index = published.index();
            Installed::Current
        } else {
            Installed::Older
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::credentials::{PublishedOperator, Role, hash_hex};

    fn list(generation: i64, names: &[&str]) -> String {
        serde_json::to_string(&Published {
            generation,
            published_ms: 0,
            operators: names
                .iter()
                .map(|n| PublishedOperator {
                    id: format!("id-{n}"),
                    name: (*n).into(),
                    role: Role::Support,
                    hash: hash_hex(n),
                    expires_ms: i64::MAX,
                })
                .collect(),
        })
        .expect("json")
    }

    #[test]
    fn never_read_is_stale_then_fresh_then_stale_again() {
        let ops = Operators::default();
        let t0 = Instant::now();
        assert_eq!(ops.lookup(&hash_hex("ann"), t0), Lookup::Stale);
        assert_eq!(ops.install(None, t0), Installed::Absent);
        assert_eq!(ops.lookup(&hash_hex("ann"), t0), Lookup::Stale);
        assert_eq!(
            ops.install(Some(&list(1, &["ann"])), t0),
            Installed::Current
        );
        assert!(matches!(ops.lookup(&hash_hex("ann"), t0), Lookup::Known(k) if k.name == "ann"));
        assert_eq!(ops.lookup(&hash_hex("bob"), t0), Lookup::Unknown);
        let later = t0 + MAX_STALE;
        assert_eq!(ops.lookup(&hash_hex("bob"), later), Lookup::Unknown);
        let too_late = later + Duration::from_millis(1);
        assert_eq!(ops.lookup(&hash_hex("ann"), too_late), Lookup::Stale);
    }

    #[test]
    fn a_malformed_or_older_list_keeps_the_last_good_one() {
        let ops = Operators::default();
        let t0 = Instant::now();
        ops.install(Some(&list(5, &["ann", "bob"])), t0);
        assert_eq!(ops.install(Some("{not json"), t0), Installed::Malformed);
        assert_eq!(
            ops.install(Some(r#"{"generation": 9}"#), t0),
            Installed::Malformed
        );
        assert!(matches!(ops.lookup(&hash_hex("bob"), t0), Lookup::Known(_)));
        // Malformed reads do not confirm the list: it ages out.
        let t1 = t0 + MAX_STALE + Duration::from_millis(1);
        assert_eq!(ops.install(Some("[]"), t1), Installed::Malformed);
        assert_eq!(ops.lookup(&hash_hex("bob"), t1), Lookup::Stale);
        // An older generation does not bring bob back after his revocation.
        assert_eq!(
            ops.install(Some(&list(6, &["ann"])), t1),
            Installed::Current
        );
        assert_eq!(
            ops.install(Some(&list(5, &["ann", "bob"])), t1),
            Installed::Older
        );
        assert_eq!(ops.lookup(&hash_hex("bob"), t1), Lookup::Unknown);
        // The same generation again (booking republishes every second) is installed.
        assert_eq!(ops.install(Some(&list(6, &[])), t1), Installed::Current);
        assert_eq!(ops.lookup(&hash_hex("ann"), t1), Lookup::Unknown);
    }
}
