//! `max_active` slots after checkout: which requests are checkout writes, and which fans must
//! take a slot again before their next one.
//!
//! A fan's slot is freed when booking says their checkout is over (`x-floodgate-session-until:
//! 0`) or they paid, while their token stays valid (order pages, receipts). The release writes
//! a *freed mark* (`fg:{event}:freed`, account → Redis time, ms) in the same script that frees
//! the slot; every instance learns the marks as it learns revocations (the refresher, reading
//! only marks newer than the last it saw) and the releasing instance at once. A checkout write
//! that reserves inventory ([`Checkout::takes_slot`]) by a fan with an open mark that postdates
//! their admission must first take a slot again, atomically under the cap (`store/fans.rs`),
//! or is answered `409 ROOM_FULL` without reaching booking. Every other request pays one
//! lookup in memory for slot-taking writes and nothing else: no Redis call, no allocation.
//!
//! Guarantee: a fan whose slot was freed never gets a hold, GA hold, order or payment through
//! this instance without a slot, once this instance knows the mark (at once on the releasing
//! instance, within `refresh_ms` on the others, like a revocation).

use http::Method;
use shared::token::AdmissionClaims;
use std::collections::HashMap;
use std::sync::RwLock;

/// A checkout write, by route. An explicit list, not a path pattern; booking's twin is
/// `booking/src/app/session.rs::checkout_write` (which writes answer
/// `x-floodgate-session-until`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    /// `POST /api/events/{event}/holds`
    Hold,
    /// `POST /api/events/{event}/ga-holds`
    GaHold,
    /// `DELETE /api/holds/{hold}`
    ReleaseHold,
    /// `POST /api/orders`
    Order,
    /// `POST /api/orders/{id}/cancel`
    CancelOrder,
    /// `POST /api/orders/{id}/pay`
    Pay,
}

impl Checkout {
    /// Writes that reserve inventory or pay for it: a fan whose slot was freed takes one
    /// again first. Releasing a hold or cancelling an order only gives back.
    pub fn takes_slot(self) -> bool {
        matches!(self, Self::Hold | Self::GaHold | Self::Order | Self::Pay)
    }
}

/// The checkout write a request is, if any (method and path, no query; pure, no allocation).
pub fn checkout(method: &Method, path: &str) -> Option<Checkout> {
    let rest = path.strip_prefix("/api/")?;
    let mut it = rest.split('/');
    let seg = [it.next(), it.next(), it.next(), it.next()];
    if it.next().is_some() {
        return None;
    }
    let id = |s: Option<&str>| s.is_some_and(|s| !s.is_empty());
    let post = method == Method::POST;
    match seg {
        [Some("events"), e, Some("holds"), None] if post && id(e) => Some(Checkout::Hold),
        [Some("events"), e, Some("ga-holds"), None] if post && id(e) => Some(Checkout::GaHold),
        [Some("holds"), h, None, None] if method == Method::DELETE && id(h) => {
            Some(Checkout::ReleaseHold)
        }
        [Some("orders"), None, None, None] if post => Some(Checkout::Order),
        [Some("orders"), o, Some("pay"), None] if post && id(o) => Some(Checkout::Pay),
        [Some("orders"), o, Some("cancel"), None] if post && id(o) => Some(Checkout::CancelOrder),
        _ => None,
    }
}

/// One fan's freed mark as this instance knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// When the slot was freed (open) or taken again (closed), unix ms.
    at_ms: i64,
    open: bool,
}

/// Per event: account → mark, and the newest mark time read from Redis.
#[derive(Debug, Default)]
struct EventMarks {
    marks: HashMap<String, Mark>,
    read_ms: i64,
}

/// How far back each incremental read reaches before the newest mark seen: a mark written
/// while the previous read ran (or across a Redis failover's clock step) is not missed.
pub const READ_OVERLAP_MS: i64 = 5_000;

/// The freed marks this instance knows, by event.
#[derive(Debug, Default)]
pub struct Freed {
    events: RwLock<HashMap<String, EventMarks>>,
}

impl Freed {
    /// Whether `c`'s fan must take a slot again: their slot was freed after this admission
    /// began (a re-admission through the queue starts a new one) and not taken since.
    pub fn must_retake(&self, c: &AdmissionClaims) -> bool {
        let events = self.events.read().unwrap_or_else(|p| p.into_inner());
        events
            .get(&c.evt)
            .and_then(|e| e.marks.get(&c.sub))
            .is_some_and(|m| m.open && c.admitted_at().saturating_mul(1000) <= m.at_ms)
    }

    /// This instance freed the fan's slot (at `at_ms`, its own clock): known here at once,
    /// before the answer that freed it reaches the fan.
    pub fn freed(&self, event: &str, account: &str, at_ms: i64) {
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        events
            .entry(event.to_owned())
            .or_default()
            .marks
            .insert(account.to_owned(), Mark { at_ms, open: true });
    }

    /// The fan took a slot again at `at_ms` (Redis time): older marks no longer apply.
    pub fn taken(&self, event: &str, account: &str, at_ms: i64) {
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        events
            .entry(event.to_owned())
            .or_default()
            .marks
            .insert(account.to_owned(), Mark { at_ms, open: false });
    }

    /// Where the next read of `event`'s marks starts (unix ms; 0 the first time).
    pub fn read_from(&self, event: &str) -> i64 {
        let events = self.events.read().unwrap_or_else(|p| p.into_inner());
        events
            .get(event)
            .map_or(0, |e| (e.read_ms - READ_OVERLAP_MS).max(0))
    }

    /// Merges marks read from Redis (account, time): a mark newer than what is known opens it;
    /// one at or before a take (or an already known mark) changes nothing.
    pub fn merge(&self, event: &str, read: Vec<(String, i64)>) {
        if read.is_empty() {
            return;
        }
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        let e = events.entry(event.to_owned()).or_default();
        for (account, at_ms) in read {
            e.read_ms = e.read_ms.max(at_ms);
            let m = e.marks.entry(account).or_insert(Mark { at_ms, open: true });
            if at_ms > m.at_ms {
                *m = Mark { at_ms, open: true };
            }
        }
    }

    /// Forgets marks older than `keep_ms` before `now_ms` (every token they could apply to
    /// has expired), and events no longer configured.
    pub fn prune(&self, now_ms: i64, keep_ms: impl Fn(&str) -> Option<i64>) {
        let mut events = self.events.write().unwrap_or_else(|p| p.into_inner());
        events.retain(|event, e| match keep_ms(event) {
            Some(keep) => {
                e.marks.retain(|_, m| m.at_ms >= now_ms - keep);
                true
            }
            None => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkout_writes_are_an_explicit_list() {
        use Checkout::*;
        for (m, p, want) in [
            (Method::POST, "/api/events/e1/holds", Hold),
            (Method::POST, "/api/events/e1/ga-holds", GaHold),
            (Method::DELETE, "/api/holds/h1", ReleaseHold),
            (Method::POST, "/api/orders", Order),
            (Method::POST, "/api/orders/o1/pay", Pay),
            (Method::POST, "/api/orders/o1/cancel", CancelOrder),
        ] {
            assert_eq!(checkout(&m, p), Some(want), "{m} {p}");
        }
        for (m, p) in [
            // Reads and other writes, and paths that merely contain a checkout word.
            (Method::GET, "/api/orders"),
            (Method::GET, "/api/orders/o1"),
            (Method::GET, "/api/events/e1/holds"),
            (Method::PUT, "/api/cart/items/sku"),
            (Method::POST, "/api/auctions/a1/bids"),
            (Method::POST, "/api/events/e1/orders"),
            (Method::POST, "/api/orders/o1/pay/extra"),
            (Method::POST, "/api/orders//pay"),
            (Method::POST, "/api/orders/"),
            (Method::POST, "/api/events//holds"),
            (Method::POST, "/api/holdsx"),
            (Method::POST, "/api/ordersx"),
            (Method::DELETE, "/api/holds/"),
            (Method::POST, "/api/holds/h1"),
            (Method::POST, "/admin/orders"),
            (Method::POST, "/api/x/orders"),
        ] {
            assert_eq!(checkout(&m, p), None, "{m} {p}");
        }
        assert!(Hold.takes_slot() && GaHold.takes_slot() && Order.takes_slot() && Pay.takes_slot());
        assert!(!ReleaseHold.takes_slot() && !CancelOrder.takes_slot());
    }

    fn claims(sub: &str, adm: i64) -> AdmissionClaims {
        AdmissionClaims {
            sub: sub.into(),
            sid: "s".into(),
            evt: "e".into(),
            iat: adm,
            exp: adm + 60,
            jti: "j".into(),
            iss: "i".into(),
            aud: "a".into(),
            adm: Some(adm),
        }
    }

    #[test]
    fn a_freed_fan_retakes_until_taken_or_readmitted() {
        let f = Freed::default();
        let a = claims("a", 1_000);
        assert!(!f.must_retake(&a));
        f.freed("e", "a", 1_010_000);
        assert!(f.must_retake(&a));
        assert!(!f.must_retake(&claims("b", 1_000)), "only that fan");
        // Admitted again after the mark: a new admission with its own slot.
        assert!(!f.must_retake(&claims("a", 1_011)));
        f.taken("e", "a", 1_012_000);
        assert!(!f.must_retake(&a));
        // The mark read back from Redis later (its own time is before the take): still taken.
        f.merge("e", vec![("a".into(), 1_010_005)]);
        assert!(!f.must_retake(&a));
        // A later release (from another instance) opens it again.
        f.merge("e", vec![("a".into(), 1_020_000)]);
        assert!(f.must_retake(&a));
        assert_eq!(f.read_from("e"), 1_020_000 - READ_OVERLAP_MS);
    }

    #[test]
    fn old_marks_and_gone_events_are_pruned() {
        let f = Freed::default();
        f.freed("e", "a", 1_000);
        f.freed("e", "b", 9_000);
        f.freed("gone", "c", 9_000);
        f.prune(10_000, |e| (e == "e").then_some(5_000));
        assert!(!f.must_retake(&claims("a", 0)));
        assert!(f.must_retake(&claims("b", 0)));
        let mut c = claims("c", 0);
        c.evt = "gone".into();
        assert!(!f.must_retake(&c));
    }
}
