//! The inventory's vocabulary and its pure rules: hold statuses and kinds exactly as Postgres
//! stores them, and the checks a hold request passes before any statement runs. No I/O here,
//! so every rule is unit-tested below.

use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};

/// A hold's status (`holds.status`, `migrations/0001_core.sql`):
///
/// ```text
/// active  -> released (the fan let go) | expired (TTL passed) | ordered (an order owns it)
/// ordered -> sold (paid) | expired (its order expired) | released (its order was cancelled)
/// ```
///
/// `released`, `expired` and `sold` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum HoldStatus {
    Active,
    Released,
    Expired,
    Ordered,
    Sold,
}

impl HoldStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldStatus::Active => "active",
            HoldStatus::Released => "released",
            HoldStatus::Expired => "expired",
            HoldStatus::Ordered => "ordered",
            HoldStatus::Sold => "sold",
        }
    }

    /// Whether a hold in this status may move to `to` (see the lifecycle above).
    pub fn can_become(self, to: HoldStatus) -> bool {
        use HoldStatus::*;
        matches!(
            (self, to),
            (Active, Released | Expired | Ordered) | (Ordered, Sold | Expired | Released)
        )
    }

    /// No transition leaves this status.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            HoldStatus::Released | HoldStatus::Expired | HoldStatus::Sold
        )
    }

    /// An order owns the hold: the fan cannot release it (they cancel the order instead).
    pub fn is_owned_by_order(self) -> bool {
        matches!(self, HoldStatus::Ordered | HoldStatus::Sold)
    }
}

/// What a hold takes (`holds.kind`): reserved seats, or units of a general-admission tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type, utoipa::ToSchema)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum HoldKind {
    Seats,
    Ga,
}

impl HoldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::Seats => "seats",
            HoldKind::Ga => "ga",
        }
    }
}

/// `kind == "seats"` keeps reading naturally where the kind used to be a string.
impl PartialEq<&str> for HoldKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for HoldKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request refused before anything was written: the message and the detail fields of the
/// error body, in order (`field` first when the request names one).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub message: String,
    pub details: Vec<(&'static str, Value)>,
}

impl Invalid {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// A refusal about one request field.
    pub fn field(field: &'static str, message: impl Into<String>) -> Self {
        Self::new(message).with("field", field)
    }

    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.details.push((key, value.into()));
        self
    }

    /// A detail by key (tests and logs).
    pub fn detail(&self, key: &str) -> Option<&Value> {
        self.details.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// Longest seat id (and hold id) accepted.
pub const MAX_ID_LEN: usize = 64;

/// A well-formed seat id: 1..=64 ASCII letters, digits, `-`, `_`, `.`, `:`.
pub fn is_valid_seat_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A hold id that can exist at all (anything else is answered "no such hold" unread).
pub fn is_plausible_hold_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_ID_LEN
}

/// A seat id as quoted back in an error: at most 80 characters of it.
fn quoted(seat: &str) -> String {
    seat.chars().take(80).collect()
}

/// The seats of one hold request: 1..=`max` well-formed, distinct ids. Returns their number.
pub fn check_seat_list(seats: &[String], max: usize) -> Result<i32, Invalid> {
    if seats.is_empty() {
        return Err(Invalid::field("seats", "seats must not be empty"));
    }
    if seats.len() > max {
        return Err(
            Invalid::field("seats", format!("at most {max} seats per hold")).with("max", max),
        );
    }
    if let Some(bad) = seats.iter().find(|s| !is_valid_seat_id(s)) {
        return Err(Invalid::field("seats", "malformed seat id").with("seat", quoted(bad)));
    }
    let mut seen = HashSet::with_capacity(seats.len());
    let dups: BTreeSet<&str> = seats
        .iter()
        .filter(|s| !seen.insert(s.as_str()))
        .map(String::as_str)
        .collect();
    if !dups.is_empty() {
        return Err(Invalid::field("seats", "duplicate seat ids in one request")
            .with("seats", dups.into_iter().collect::<Vec<_>>()));
    }
    i32::try_from(seats.len()).map_err(|_| Invalid::new("too many seats"))
}

/// No event allows more tickets per account than this (see the `events` CHECK).
pub const MAX_GA_QUANTITY: i64 = 100;

/// A GA hold request: a tier name of 1..=32 bytes and a quantity of 1..=100. Returns the
/// quantity.
pub fn check_ga_request(tier: &str, quantity: i64) -> Result<i32, Invalid> {
    if tier.is_empty() || tier.len() > 32 {
        return Err(Invalid::field("tier", "tier must be 1-32 characters"));
    }
    if !(1..=MAX_GA_QUANTITY).contains(&quantity) {
        return Err(Invalid::field(
            "quantity",
            format!("quantity must be 1..={MAX_GA_QUANTITY}"),
        ));
    }
    i32::try_from(quantity).map_err(|_| Invalid::field("quantity", "quantity out of range"))
}

/// The entries of `requested` that are not in `present`, in request order.
pub fn missing_from<'a>(requested: &'a [String], present: &HashSet<&str>) -> Vec<&'a str> {
    requested
        .iter()
        .map(String::as_str)
        .filter(|s| !present.contains(s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use HoldStatus::*;

    const ALL: [HoldStatus; 5] = [Active, Released, Expired, Ordered, Sold];

    #[test]
    fn hold_statuses_read_and_write_the_stored_strings() {
        let stored: Vec<&str> = ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            stored,
            ["active", "released", "expired", "ordered", "sold"],
            "must match the CHECK in migrations/0001_core.sql"
        );
        for s in ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), Value::from(s.as_str()));
        }
    }

    #[test]
    fn an_active_hold_can_be_released_expired_or_ordered() {
        for to in [Released, Expired, Ordered] {
            assert!(Active.can_become(to), "active -> {to:?}");
        }
        assert!(
            !Active.can_become(Sold),
            "a hold is sold only through an order"
        );
        assert!(!Active.can_become(Active));
    }

    #[test]
    fn an_ordered_hold_is_sold_or_given_back() {
        for to in [Sold, Expired, Released] {
            assert!(Ordered.can_become(to), "ordered -> {to:?}");
        }
        assert!(!Ordered.can_become(Active));
        assert!(!Ordered.can_become(Ordered));
    }

    #[test]
    fn final_statuses_have_no_way_out() {
        for from in ALL {
            let exits = ALL.iter().filter(|&&to| from.can_become(to)).count();
            assert_eq!(from.is_final(), exits == 0, "{from:?}");
        }
        assert!(Released.is_final() && Expired.is_final() && Sold.is_final());
    }

    #[test]
    fn only_ordered_and_sold_holds_belong_to_an_order() {
        let owned: Vec<HoldStatus> = ALL.into_iter().filter(|s| s.is_owned_by_order()).collect();
        assert_eq!(owned, [Ordered, Sold]);
    }

    #[test]
    fn hold_kinds_compare_with_their_stored_strings() {
        assert_eq!(HoldKind::Seats, "seats");
        assert_eq!(HoldKind::Ga, "ga");
        assert!(HoldKind::Ga != "seats");
        assert_eq!(HoldKind::Seats.to_string(), "seats");
    }

    #[test]
    fn seat_ids_are_short_and_plain() {
        for ok in ["A-R1-1", "a_b.c:d", "x", &"9".repeat(64)] {
            assert!(is_valid_seat_id(ok), "{ok}");
        }
        for bad in ["", " A1", "A/1", "é", "A 1", "a;drop", &"9".repeat(65)] {
            assert!(!is_valid_seat_id(bad), "{bad}");
        }
    }

    #[test]
    fn hold_ids_must_have_a_plausible_length() {
        assert!(is_plausible_hold_id("0192f0c1"));
        assert!(!is_plausible_hold_id(""));
        assert!(!is_plausible_hold_id(&"h".repeat(65)));
    }

    fn seats(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_seat_list_is_counted_when_valid() {
        assert_eq!(check_seat_list(&seats(&["A-1", "A-2"]), 10), Ok(2));
        assert_eq!(check_seat_list(&seats(&["A-1"]), 1), Ok(1));
    }

    #[test]
    fn an_empty_or_oversized_seat_list_is_refused() {
        let e = check_seat_list(&[], 10).unwrap_err();
        assert_eq!(e.message, "seats must not be empty");
        assert_eq!(e.detail("field"), Some(&Value::from("seats")));
        let e = check_seat_list(&seats(&["A-1", "A-2", "A-3"]), 2).unwrap_err();
        assert_eq!(e.message, "at most 2 seats per hold");
        assert_eq!(e.detail("max"), Some(&Value::from(2)));
    }

    #[test]
    fn a_malformed_seat_id_is_quoted_back_shortened() {
        let long = format!("bad seat {}", "x".repeat(100));
        let e = check_seat_list(&seats(&["A-1", &long]), 10).unwrap_err();
        assert_eq!(e.message, "malformed seat id");
        let quoted = e.detail("seat").and_then(Value::as_str).unwrap();
        assert_eq!(quoted.chars().count(), 80);
        assert!(long.starts_with(quoted));
    }

    #[test]
    fn duplicate_seats_are_listed_once_each_in_order() {
        let e = check_seat_list(&seats(&["B-2", "A-1", "B-2", "A-1", "B-2"]), 10).unwrap_err();
        assert_eq!(e.message, "duplicate seat ids in one request");
        assert_eq!(e.detail("seats"), Some(&serde_json::json!(["A-1", "B-2"])));
        assert_eq!(e.details[0], ("field", Value::from("seats")));
    }

    #[test]
    fn ga_quantities_run_from_one_to_the_largest_ticket_limit() {
        assert_eq!(check_ga_request("floor", 1), Ok(1));
        assert_eq!(check_ga_request("floor", 100), Ok(100));
        for q in [0, -1, 101, i64::MAX, i64::MIN] {
            let e = check_ga_request("floor", q).unwrap_err();
            assert_eq!(e.message, "quantity must be 1..=100", "{q}");
            assert_eq!(e.detail("field"), Some(&Value::from("quantity")));
        }
    }

    #[test]
    fn a_ga_tier_name_is_checked_before_the_quantity() {
        let e = check_ga_request("", 0).unwrap_err();
        assert_eq!(e.message, "tier must be 1-32 characters");
        assert_eq!(e.detail("field"), Some(&Value::from("tier")));
        assert!(check_ga_request(&"t".repeat(33), 1).is_err());
        assert!(check_ga_request(&"t".repeat(32), 1).is_ok());
    }

    #[test]
    fn missing_seats_keep_the_request_order() {
        let requested = seats(&["C", "A", "B"]);
        let present: HashSet<&str> = ["A"].into_iter().collect();
        assert_eq!(missing_from(&requested, &present), ["C", "B"]);
        assert!(missing_from(&requested, &["A", "B", "C"].into_iter().collect()).is_empty());
    }
}
