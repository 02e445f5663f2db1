//! The stored answer's split around its timestamps.

use super::*;
use crate::orders::model::{ItemKind, OrderItemView};

fn view(name: &str) -> OrderView {
    OrderView {
        id: "o1".into(),
        status: OrderStatus::PendingPayment,
        source: OrderSource::Cart,
        hold_id: None,
        event_id: Some("e1".into()),
        total: 200,
        currency: "JPY".into(),
        items: vec![OrderItemView {
            kind: ItemKind::Sku,
            sku: Some("A".into()),
            seat_id: None,
            ga_tier: None,
            name: name.into(),
            quantity: 2,
            unit_price: 100,
            amount: 200,
        }],
        expires_at: DateTime::UNIX_EPOCH,
        created_at: DateTime::UNIX_EPOCH,
        paid_at: None,
    }
}

#[test]
fn the_body_splits_around_its_own_timestamps_whatever_a_name_says() {
    // A name that spells the timestamps' JSON is escaped, so it cannot be taken for them.
    let tricky = r#"x","expires_at":"1970-01-01T00:00:00Z","created_at":"1970-01-01T00:00:00Z"#;
    for name in ["Tee", tricky] {
        let v = view(name);
        let (head, tail) = body_parts(&v).expect("split");
        let joined = format!(
            r#"{head}2026-12-04T05:00:00.500Z","created_at":"2026-12-04T04:45:00.123456Z{tail}"#
        );
        let mut want = v.clone();
        want.expires_at = "2026-12-04T05:00:00.500Z".parse().expect("time");
        want.created_at = "2026-12-04T04:45:00.123456Z".parse().expect("time");
        assert_eq!(
            joined,
            serde_json::to_string(&want).expect("json"),
            "name {name}"
        );
    }
}
