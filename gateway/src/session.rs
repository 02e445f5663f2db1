//! Admission lasts through checkout.
//!
//! Booking answers every checkout write (a hold, an order, a payment, a released hold) with
//! `x-floodgate-session-until`: when the fan's last live hold or `PENDING_PAYMENT` order in the
//! token's event ends (unix ms), `0` when none is left. The gateway takes the header off the
//! answer and:
//! - when it is in the future, keeps the admission until then plus `session_slack_s`, never
//!   past `max_session_s` after the admission: a new token of the same admission (same
//!   `sub`/`sid`/`evt`/`adm`, later `exp`) goes back as the cookie and in
//!   `x-floodgate-admission-token`, and the fan's `max_active` slot is kept until the same
//!   time (so a hold that lapses by time frees its slot with it, with no request);
//! - when it is `0`, frees the `max_active` slot at once (the token stays valid until its
//!   `exp`, as after a payment).
//!
//! Guarantee: a token is re-minted only when that moves its expiry by more than half the
//! slack, so a fan with live holds or a pending order always holds a token valid at least
//! half the slack past their end, and a burst of writes mints at most a few tokens. Answers
//! without the header (every read, everything outside checkout) cost one header lookup.

use shared::token::AdmissionClaims;

/// What one booking answer means for the caller's admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do (no header, or the token already lasts long enough).
    Keep,
    /// Re-mint the token with this `exp` (unix s) and keep the slot until then.
    Extend { exp: i64 },
    /// The fan's last hold/order ended: free the `max_active` slot now.
    Release,
}

/// The value of `x-floodgate-session-until`: unix ms, `0` for none.
pub fn parse_until(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v)
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
}

/// Decides what booking's `until_ms` means for a caller holding `claims`, at `now` (unix s).
pub fn decide(
    claims: &AdmissionClaims,
    until_ms: i64,
    now: i64,
    slack_s: i64,
    max_session_s: i64,
) -> Decision {
    if until_ms <= 0 || until_ms <= now.saturating_mul(1000) {
        return Decision::Release;
    }
    // Rounded up (`until_ms` is positive here): the token never ends before the checkout.
    let until_s = until_ms.saturating_add(999) / 1000;
    let bound = claims.admitted_at().saturating_add(max_session_s);
    let exp = until_s.saturating_add(slack_s).min(bound);
    let step = (slack_s / 2).max(1);
    if exp > claims.exp.saturating_add(step) && exp > now {
        Decision::Extend { exp }
    } else {
        Decision::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(adm: i64, iat: i64, exp: i64) -> AdmissionClaims {
        AdmissionClaims {
            sub: "a".into(),
            sid: "s".into(),
            evt: "e".into(),
            iat,
            exp,
            jti: "j".into(),
            iss: "i".into(),
            aud: "a".into(),
            adm: Some(adm),
        }
    }

    #[test]
    fn a_hold_beyond_the_token_extends_it_to_the_hold_plus_slack() {
        // Admitted at 1000 with a 30 s token; a hold until 1600.
        let c = claims(1000, 1000, 1030);
        assert_eq!(
            decide(&c, 1_600_000, 1005, 30, 1800),
            Decision::Extend { exp: 1630 }
        );
        // Milliseconds round up: the token never ends before the hold.
        assert_eq!(
            decide(&c, 1_600_001, 1005, 30, 1800),
            Decision::Extend { exp: 1631 }
        );
    }

    #[test]
    fn small_moves_do_not_re_mint() {
        let c = claims(1000, 1005, 1630);
        // A second hold ending 10 s after the first: within half the slack.
        assert_eq!(decide(&c, 1_610_000, 1010, 30, 1800), Decision::Keep);
        // An order ending well after the hold: re-minted.
        assert_eq!(
            decide(&c, 1_900_000, 1020, 30, 1800),
            Decision::Extend { exp: 1930 }
        );
        // A shorter remaining hold never shortens anything.
        assert_eq!(decide(&c, 1_100_000, 1020, 30, 1800), Decision::Keep);
    }

    #[test]
    fn the_session_bound_counts_from_the_admission() {
        // Refreshed before (iat 1500), admitted at 1000, max session 600 s.
        let c = claims(1000, 1500, 1530);
        assert_eq!(
            decide(&c, 9_000_000, 1510, 30, 600),
            Decision::Extend { exp: 1600 }
        );
        let at_bound = claims(1000, 1510, 1600);
        assert_eq!(decide(&at_bound, 9_000_000, 1590, 30, 600), Decision::Keep);
        // A token without `adm` counts from its `iat`.
        let mut old = claims(0, 1000, 1030);
        old.adm = None;
        assert_eq!(
            decide(&old, 9_000_000, 1010, 30, 600),
            Decision::Extend { exp: 1600 }
        );
    }

    #[test]
    fn nothing_left_releases() {
        let c = claims(1000, 1000, 1030);
        assert_eq!(decide(&c, 0, 1010, 30, 1800), Decision::Release);
        assert_eq!(
            decide(&c, 1_009_000, 1010, 30, 1800),
            Decision::Release,
            "an end already past is nothing left"
        );
    }

    #[test]
    fn header_values() {
        assert_eq!(parse_until(b"1732961234567"), Some(1_732_961_234_567));
        assert_eq!(parse_until(b"0"), Some(0));
        assert_eq!(parse_until(b"-1"), None);
        assert_eq!(parse_until(b"soon"), None);
        assert_eq!(parse_until(b"\xff"), None);
    }
}
