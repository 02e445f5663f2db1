//! Unit tests of the auctions model: the rules without a database.

use super::*;
use chrono::TimeZone;

fn at(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_900_000_000 + s, 0)
        .single()
        .expect("valid time")
}

fn req() -> CreateAuction {
    CreateAuction {
        event: "ev-1".into(),
        title: "  Signed guitar ".into(),
        start_price: 1000,
        min_increment: 50,
        end_time: "2030-01-01T12:00:00Z".into(),
        hot: false,
        max_extensions: None,
    }
}

fn field_of(e: AuctionError) -> &'static str {
    match e {
        AuctionError::Invalid { field, .. } => field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn minimum_next_bid() {
    assert_eq!(min_next_bid(1000, 10, false), 1000);
    assert_eq!(min_next_bid(1000, 10, true), 1010);
    assert_eq!(min_next_bid(MAX_MONEY, MAX_MONEY, true), 2 * MAX_MONEY);
    assert_eq!(min_next_bid(i64::MAX, 1, true), i64::MAX, "saturates");
}

#[test]
fn a_bid_inside_the_window_extends_the_end_to_a_full_window_from_now() {
    let end = at(100);
    assert_eq!(
        extended_end(end, at(100 - SNIPING_WINDOW_S + 1), 0, 3),
        Some(at(101))
    );
    assert_eq!(
        extended_end(end, at(99), 2, 3),
        Some(at(99 + SNIPING_WINDOW_S))
    );
}

#[test]
fn a_bid_outside_the_window_or_past_the_cap_does_not_extend() {
    let end = at(1000);
    // Exactly a window before the end: not "less than" the window.
    assert_eq!(extended_end(end, at(1000 - SNIPING_WINDOW_S), 0, 3), None);
    assert_eq!(extended_end(end, at(0), 0, 3), None);
    assert_eq!(extended_end(end, at(999), 3, 3), None, "no extension left");
    assert_eq!(
        extended_end(end, at(999), 0, 0),
        None,
        "extensions disabled"
    );
}

#[test]
fn refusals_come_in_the_order_the_statement_checks_them() {
    let open = BidCheck {
        open: true,
        seller: "sam",
        current_price: 1000,
        min_increment: 100,
        has_leader: true,
    };
    assert_eq!(open.refusal("sam", 1_000_000), Some(Refusal::Seller));
    assert_eq!(
        open.refusal("ann", 1099),
        Some(Refusal::TooLow { min_next: 1100 })
    );
    assert_eq!(open.refusal("ann", 1100), None);
    let closed = BidCheck {
        open: false,
        ..open
    };
    assert_eq!(closed.refusal("ann", 5000), Some(Refusal::Closed));
    assert_eq!(closed.refusal("sam", 5000), Some(Refusal::Seller));
    let first = BidCheck {
        has_leader: false,
        ..open
    };
    assert_eq!(
        first.refusal("ann", 1000),
        None,
        "the start price is enough"
    );
    assert_eq!(
        first.refusal("ann", 999),
        Some(Refusal::TooLow { min_next: 1000 })
    );
}

#[test]
fn bid_amounts_are_bounded() {
    assert!(validate_amount(1).is_ok());
    assert!(validate_amount(MAX_MONEY).is_ok());
    for bad in [0, -1, MAX_MONEY + 1] {
        assert_eq!(
            field_of(validate_amount(bad).expect_err("refused")),
            "amount"
        );
    }
}

#[test]
fn creation_input_is_trimmed_and_defaulted() {
    let new = validate(req(), 30).expect("valid");
    assert_eq!(new.title, "Signed guitar");
    assert_eq!(new.max_extensions, 30);
    assert_eq!(
        new.end_time,
        Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0)
            .single()
            .expect("valid")
    );
    let new = validate(
        CreateAuction {
            max_extensions: Some(0),
            ..req()
        },
        30,
    )
    .expect("valid");
    assert_eq!(new.max_extensions, 0);
}

#[test]
fn creation_input_names_the_bad_field() {
    let cases: [(CreateAuction, &str); 7] = [
        (
            CreateAuction {
                title: "   ".into(),
                ..req()
            },
            "title",
        ),
        (
            CreateAuction {
                title: "x".repeat(201),
                ..req()
            },
            "title",
        ),
        (
            CreateAuction {
                start_price: 0,
                ..req()
            },
            "start_price",
        ),
        (
            CreateAuction {
                min_increment: MAX_MONEY + 1,
                ..req()
            },
            "min_increment",
        ),
        (
            CreateAuction {
                end_time: "tomorrow".into(),
                ..req()
            },
            "end_time",
        ),
        (
            CreateAuction {
                max_extensions: Some(-1),
                ..req()
            },
            "max_extensions",
        ),
        (
            CreateAuction {
                max_extensions: Some(MAX_EXTENSIONS_LIMIT + 1),
                ..req()
            },
            "max_extensions",
        ),
    ];
    for (input, field) in cases {
        assert_eq!(field_of(validate(input, 30).expect_err("refused")), field);
    }
    // 200 characters (not bytes) is the limit.
    assert!(
        validate(
            CreateAuction {
                title: "é".repeat(200),
                ..req()
            },
            30
        )
        .is_ok()
    );
}

#[test]
fn statuses_and_paths_use_the_stored_spellings() {
    assert_eq!(AuctionStatus::Open.as_str(), "OPEN");
    assert_eq!(AuctionStatus::Closed.as_str(), "CLOSED");
    assert_eq!(serde_json::json!(AuctionStatus::Closed), "CLOSED");
    assert_eq!(BidPath::of(true).as_str(), "hot");
    assert_eq!(BidPath::of(false).as_str(), "cold");
}

#[test]
fn the_view_shows_handles_not_accounts() {
    let handles = Handles::new(b"test");
    let row = AuctionRow {
        id: "auc".into(),
        event_id: Some("ev".into()),
        seller_id: "seller@example.com".into(),
        title: "t".into(),
        start_price: 100,
        min_increment: 10,
        current_price: 150,
        leader_id: Some("fan@example.com".into()),
        bid_count: 3,
        hot: false,
        status: AuctionStatus::Open,
        end_time: at(0),
        extensions: 0,
        max_extensions: 5,
        created_at: at(-10),
        closed_at: None,
    };
    let v = row.view_for(&handles, "fan@example.com");
    assert_eq!(v["min_next_bid"], 160);
    assert_eq!(v["status"], "OPEN");
    assert_eq!(v["you_lead"], true);
    assert_eq!(v["you_sell"], false);
    assert_eq!(v["leader"], handles.bidder("auc", "fan@example.com"));
    assert!(!v.to_string().contains("example.com"), "{v}");
    assert_eq!(row.view_for(&handles, "other")["you_lead"], false);
}

fn rec(price: i64, leader: Option<&str>, bids: i64, ext: i32) -> Recorded {
    Recorded {
        current_price: price,
        leader_id: leader.map(str::to_owned),
        bid_count: bids,
        extensions: ext,
    }
}

#[test]
fn a_stale_record_never_lowers_a_newer_one() {
    let mut cur = rec(2000, Some("bob"), 5, 1);
    cur.merge(rec(1500, Some("alice"), 3, 0));
    assert_eq!(cur, rec(2000, Some("bob"), 5, 1));
    // A tie keeps the leader recorded first.
    cur.merge(rec(2000, Some("carol"), 6, 1));
    assert_eq!(cur, rec(2000, Some("bob"), 6, 1));
    cur.merge(rec(2100, Some("dave"), 7, 2));
    assert_eq!(cur, rec(2100, Some("dave"), 7, 2));
    // No leader yet: the start price is no floor over a recorded leader.
    let mut open = rec(1000, None, 0, 0);
    open.merge(rec(1000, Some("erin"), 1, 0));
    assert_eq!(open, rec(1000, Some("erin"), 1, 0));
    open.merge(rec(1000, None, 0, 0));
    assert_eq!(open, rec(1000, Some("erin"), 1, 0));
}
