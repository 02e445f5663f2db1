use super::*;
use serde_json::{Value, json};

fn event(extra: Value) -> CreateEvent {
    let mut body = json!({
        "name": "Finals",
        "sale_start": "2030-01-01T00:00:00Z",
        "price_tiers": [{"tier": "A", "price": 5000}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

fn refused(extra: Value) -> Invalid {
    validate(&event(extra)).unwrap_err()
}

#[test]
fn an_event_counts_its_generated_and_explicit_seats() {
    let req = event(json!({
        "seat_map": {
            "sections": [{"name": "A", "rows": 3, "seats_per_row": 4, "price_tier": "A"}],
            "seats": [{"seat_id": "VIP-1", "section": "VIP", "row": 1, "number": 1,
                       "price_tier": "A"}],
        },
    }));
    assert_eq!(validate(&req), Ok(13));
    assert_eq!((req.hold_ttl_s, req.max_tickets_per_account), (600, 4));
    assert_eq!(req.refund_stock, RefundStock::Release);
}

#[test]
fn an_event_without_seats_is_fine() {
    assert_eq!(validate(&event(json!({}))), Ok(0));
}

#[test]
fn the_ttl_and_ticket_limit_stay_within_the_database_checks() {
    let e = refused(json!({"hold_ttl_s": 9}));
    assert_eq!(e.detail("field"), Some(&Value::from("hold_ttl_s")));
    let e = refused(json!({"max_tickets_per_account": 101}));
    assert_eq!(e.message, "max_tickets_per_account must be 1..=100");
}

#[test]
fn a_section_must_use_a_known_tier() {
    let e = refused(json!({"seat_map": {"sections": [
        {"name": "B", "rows": 1, "seats_per_row": 1, "price_tier": "nope"}]}}));
    assert_eq!(e.message, "unknown price tier");
    assert_eq!(e.detail("section"), Some(&Value::from("B")));
    assert_eq!(e.detail("tier"), Some(&Value::from("nope")));
}

#[test]
fn an_event_is_capped_at_max_seats() {
    let e = refused(json!({"seat_map": {"sections": [
        {"name": "A", "rows": 10000, "seats_per_row": 20, "price_tier": "A"},
        {"name": "B", "rows": 1, "seats_per_row": 1, "price_tier": "A"}]}}));
    assert_eq!(e.message, format!("an event has at most {MAX_SEATS} seats"));
    assert_eq!(e.detail("field"), Some(&Value::from("seat_map")));
}

#[test]
fn duplicate_explicit_seats_are_refused() {
    let seat = json!({"seat_id": "X-1", "section": "X", "row": 1, "number": 1,
                      "price_tier": "A"});
    let e = refused(json!({"seat_map": {"seats": [seat.clone(), seat]}}));
    assert_eq!(e.message, "duplicate seat id");
    assert_eq!(e.detail("seat"), Some(&Value::from("X-1")));
}

#[test]
fn ga_shards_never_outnumber_the_capacity() {
    let e = refused(json!({"ga_tiers": [
        {"tier": "floor", "price": 100, "capacity": 2, "shards": 3}]}));
    assert_eq!(e.detail("tier"), Some(&Value::from("floor")));
    let ok = event(json!({"ga_tiers": [
        {"tier": "floor", "price": 100, "capacity": 0}]}));
    assert_eq!(validate(&ok), Ok(0), "an empty tier has one shard");
}

#[test]
fn ranks_must_be_in_range_and_name_well_formed_seats() {
    let e = refused(json!({"seat_map": {"ranks": {"A-R1-1": -1}}}));
    assert_eq!(e.detail("field"), Some(&Value::from("seat_map.ranks")));
    let e = refused(json!({"seat_map": {"ranks": {"bad seat": 1}}}));
    assert_eq!(e.message, "malformed seat id");
    let e = refused(
        json!({"seat_map": {"seats": [{"seat_id": "X-1", "section": "X",
        "row": 1, "number": 1, "price_tier": "A", "rank": MAX_RANK + 1}]}}),
    );
    assert_eq!(e.detail("seat"), Some(&Value::from("X-1")));
    let ok = event(json!({"no_orphans": true, "seat_map": {"ranks": {"A-R1-1": 0}}}));
    assert_eq!(validate(&ok), Ok(0));
    assert!(ok.no_orphans);
    assert!(!event(json!({})).no_orphans);
}

#[test]
fn refund_stock_reads_and_writes_the_stored_strings() {
    for (v, s) in [
        (RefundStock::Release, "release"),
        (RefundStock::HoldBack, "hold_back"),
    ] {
        assert_eq!(v.as_str(), s);
        assert_eq!(serde_json::to_value(v).unwrap(), Value::from(s));
    }
}
