//! Unit tests of the orders model's pure rules.

use super::*;

fn priced(name: &str, price: i64, event: Option<&str>) -> PricedSku {
    PricedSku {
        name: name.into(),
        price,
        event: event.map(str::to_owned),
        stock_rows: 1,
    }
}

fn lines(l: &[(&str, i64)]) -> BTreeMap<String, i64> {
    l.iter().map(|(s, q)| ((*s).to_owned(), *q)).collect()
}

const SHOP: EventId<'static> = EventId("shop");

#[test]
fn statuses_are_the_stored_strings() {
    use OrderStatus::*;
    for (s, text) in [
        (PendingPayment, "PENDING_PAYMENT"),
        (Paid, "PAID"),
        (Expired, "EXPIRED"),
        (Cancelled, "CANCELLED"),
        (Refunded, "REFUNDED"),
        (Disputed, "DISPUTED"),
    ] {
        assert_eq!(s.as_str(), text);
        assert_eq!(s.to_string(), text);
        assert_eq!(
            serde_json::to_value(s).expect("serialise"),
            serde_json::json!(text)
        );
        let back: OrderStatus = serde_json::from_value(serde_json::json!(text)).expect("parse");
        assert_eq!(back, s);
    }
}

#[test]
fn sources_and_kinds_are_the_stored_strings() {
    for (s, text) in [(OrderSource::Cart, "cart"), (OrderSource::Hold, "hold")] {
        assert_eq!(s.as_str(), text);
        assert_eq!(
            serde_json::to_value(s).expect("ser"),
            serde_json::json!(text)
        );
    }
    for (k, text) in [
        (ItemKind::Sku, "sku"),
        (ItemKind::Seat, "seat"),
        (ItemKind::Ga, "ga"),
    ] {
        assert_eq!(k.as_str(), text);
        assert_eq!(
            serde_json::to_value(k).expect("ser"),
            serde_json::json!(text)
        );
    }
}

#[test]
fn only_pending_orders_end_and_only_paid_ones_reverse() {
    use OrderStatus::*;
    let all = [PendingPayment, Paid, Expired, Cancelled, Refunded, Disputed];
    let allowed: Vec<(OrderStatus, OrderStatus)> = all
        .iter()
        .flat_map(|&a| all.iter().map(move |&b| (a, b)))
        .filter(|&(a, b)| a.can_become(b))
        .collect();
    assert_eq!(
        allowed,
        vec![
            (PendingPayment, Paid),
            (PendingPayment, Expired),
            (PendingPayment, Cancelled),
            (Paid, Refunded),
            (Paid, Disputed),
        ]
    );
    for end in [OrderEnd::Expired, OrderEnd::Cancelled] {
        assert!(PendingPayment.can_become(end.status()));
    }
}

#[test]
fn an_order_end_names_its_status_hold_status_and_topic() {
    let e = OrderEnd::Expired;
    assert_eq!(
        (
            e.status(),
            e.hold_status().as_str(),
            e.topic(),
            e.due_only()
        ),
        (OrderStatus::Expired, "expired", "order.expired", true)
    );
    let c = OrderEnd::Cancelled;
    assert_eq!(
        (
            c.status(),
            c.hold_status().as_str(),
            c.topic(),
            c.due_only()
        ),
        (OrderStatus::Cancelled, "released", "order.cancelled", false)
    );
    // The topic is the lower-cased status, as consumers expect.
    for end in [e, c] {
        assert_eq!(
            end.topic(),
            format!("order.{}", end.status().as_str().to_ascii_lowercase())
        );
    }
}

#[test]
fn cart_lines_are_priced_in_sku_order_with_snapshotted_prices() {
    let prices = BTreeMap::from([
        ("A".to_owned(), priced("Mug", 1200, Some("shop"))),
        ("B".to_owned(), priced("Cap", 500, Some("shop"))),
    ]);
    let (items, total) =
        price_cart_lines(&lines(&[("B", 3), ("A", 2)]), &prices, SHOP).expect("priced");
    assert_eq!(total, 2 * 1200 + 3 * 500);
    let got: Vec<_> = items
        .iter()
        .map(|i| (i.sku.as_deref(), i.quantity, i.unit_price, i.amount, i.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("A"), 2, 1200, 2400, ItemKind::Sku),
            (Some("B"), 3, 500, 1500, ItemKind::Sku)
        ]
    );
    assert_eq!(items[0].name, "Mug");
}

#[test]
fn an_unknown_sku_or_another_events_sku_refuses_the_whole_cart() {
    let prices = BTreeMap::from([
        ("A".to_owned(), priced("Mug", 1200, Some("shop"))),
        ("OTHER".to_owned(), priced("Flag", 100, Some("tour"))),
        ("OLD".to_owned(), priced("Pin", 100, None)),
    ]);
    assert_eq!(
        price_cart_lines(&lines(&[("A", 1), ("NOPE", 1)]), &prices, SHOP),
        Err(PricingError::UnknownSku("NOPE".into()))
    );
    assert_eq!(
        price_cart_lines(&lines(&[("A", 1), ("OTHER", 1)]), &prices, SHOP),
        Err(PricingError::WrongEvent("OTHER".into()))
    );
    // A product without an event opens for no admission.
    assert_eq!(
        price_cart_lines(&lines(&[("OLD", 1)]), &prices, SHOP),
        Err(PricingError::WrongEvent("OLD".into()))
    );
}

#[test]
fn amounts_that_do_not_fit_are_refused_not_wrapped() {
    let prices = BTreeMap::from([
        ("A".to_owned(), priced("Big", i64::MAX / 2, Some("shop"))),
        (
            "B".to_owned(),
            priced("Big too", i64::MAX / 2 + 2, Some("shop")),
        ),
        ("C".to_owned(), priced("Cheap", 1, Some("shop"))),
    ]);
    // One line overflows.
    assert_eq!(
        price_cart_lines(&lines(&[("A", 3)]), &prices, SHOP),
        Err(PricingError::Overflow)
    );
    // Each line fits, the sum does not.
    assert_eq!(
        price_cart_lines(&lines(&[("A", 1), ("B", 1)]), &prices, SHOP),
        Err(PricingError::Overflow)
    );
    // A quantity beyond a line's column type.
    assert_eq!(
        price_cart_lines(&lines(&[("C", i64::from(i32::MAX) + 1)]), &prices, SHOP),
        Err(PricingError::Overflow)
    );
}

const SEATS: [HeldSeat<'static>; 2] = [
    HeldSeat {
        seat_id: "S1-R1-1",
        tier: "A",
        price: 9000,
    },
    HeldSeat {
        seat_id: "S1-R1-2",
        tier: "B",
        price: 7000,
    },
];

fn ga(unit_price: i64) -> HeldUnits<'static> {
    HeldUnits::Ga {
        tier: "floor",
        unit_price,
        quantity: 3,
    }
}

#[test]
fn a_seat_hold_becomes_one_line_per_seat() {
    let (items, total) = price_hold(&HeldUnits::Seats(SEATS.to_vec())).expect("priced");
    assert_eq!(total, 16_000);
    let names: Vec<_> = items.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["Seat S1-R1-1 (tier A)", "Seat S1-R1-2 (tier B)"]);
    assert!(
        items
            .iter()
            .all(|i| i.kind == ItemKind::Seat && i.quantity == 1)
    );
}

#[test]
fn a_ga_hold_becomes_one_line_and_overflow_is_refused() {
    let (items, total) = price_hold(&ga(4000)).expect("priced");
    assert_eq!(total, 12_000);
    assert_eq!(items.len(), 1);
    assert_eq!(
        (
            items[0].kind,
            items[0].ga_tier.as_deref(),
            items[0].name.as_str()
        ),
        (ItemKind::Ga, Some("floor"), "General admission (floor)")
    );
    assert_eq!(price_hold(&ga(i64::MAX)), Err(PricingError::Overflow));
    // Seats whose sum does not fit.
    let dear = HeldSeat {
        price: i64::MAX / 2 + 1,
        ..SEATS[0]
    };
    assert_eq!(
        price_hold(&HeldUnits::Seats(vec![dear, dear])),
        Err(PricingError::Overflow)
    );
}

#[test]
fn a_shortage_is_sold_out_only_when_nothing_is_left() {
    assert_eq!(Shortage::of(0), Shortage::SoldOut);
    assert_eq!(Shortage::of(-3), Shortage::SoldOut);
    assert_eq!(Shortage::of(-3).available(), 0);
    assert_eq!(Shortage::of(4), Shortage::Insufficient { available: 4 });
    assert_eq!(Shortage::of(4).available(), 4);
}

fn request(source: Option<&str>, hold_id: Option<&str>) -> Option<RequestedSource> {
    OrderRequest {
        source: source.map(str::to_owned),
        hold_id: hold_id.map(str::to_owned),
        email: None,
    }
    .source()
}

#[test]
fn an_order_request_names_the_cart_or_one_hold() {
    assert_eq!(request(Some("cart"), None), Some(RequestedSource::Cart));
    assert_eq!(
        request(None, Some("h1")),
        Some(RequestedSource::Hold("h1".into()))
    );
    assert_eq!(
        request(Some("hold"), Some("h1")),
        Some(RequestedSource::Hold("h1".into()))
    );
    let longest = "h".repeat(MAX_HOLD_ID);
    assert!(request(None, Some(&longest)).is_some());
    for (source, hold) in [
        (None, None),
        (Some("cart"), Some("h1")),
        (Some("hold"), None),
        (Some("other"), Some("h1")),
        (None, Some("")),
        (None, Some(&*"h".repeat(MAX_HOLD_ID + 1))),
    ] {
        assert_eq!(request(source, hold), None, "{source:?} {hold:?}");
    }
}

#[test]
fn request_identities_keep_account_and_key_apart() {
    let (a, k) = (AccountId::new("alice"), OrderKey::new("k-1"));
    assert_eq!(gate_admission(a, k), "alice\u{1f}k-1");
    assert_ne!(
        gate_admission(AccountId::new("al"), OrderKey::new("ice")),
        gate_admission(AccountId::new("ali"), OrderKey::new("ce"))
    );
    assert_eq!(done_marker_suffix(a, k), "idem:done:{alice}:k-1");
    assert_eq!(request_record_ttl_s(1), 24 * 3600);
    assert_eq!(request_record_ttl_s(48), 48 * 3600);
}

#[test]
fn ids_show_what_they_wrap() {
    let e = EventId::new("tour");
    assert_eq!((e.as_str(), e.to_string()), ("tour", "tour".to_owned()));
    assert_eq!(OrderId::new("o1").as_str(), "o1");
    assert_eq!(HoldId::new("h1").to_string(), "h1");
}
