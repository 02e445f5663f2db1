//! A cart order's response body and `order.created` payload, built in Rust before the
//! statement that writes the order stamps them with the database clock (the one-order
//! statement and the batch statement splice the two timestamps in).

use super::super::OrderError;
use crate::orders::OrderSettings;
use crate::orders::model::{
    AccountId, EventId, OrderId, OrderSource, OrderStatus, OrderView, PricedSku, price_cart_lines,
};
use chrono::DateTime;
use std::collections::BTreeMap;

/// A cart order's text before the database stamps it: the view (timestamps at the epoch), the
/// body split around its two timestamps, and the `order.created` payload without
/// `expires_at` (both added by the statement).
pub struct OrderText {
    pub view: OrderView,
    pub head: String,
    pub tail: String,
    pub payload: serde_json::Value,
}

/// The text of cart order `lines` at `prices`; `None` when these prices cannot price it
/// (another event, an overflow): the full transaction refuses it with the prices it reads.
pub fn order_text(
    settings: &OrderSettings,
    order_id: OrderId<'_>,
    account: AccountId<'_>,
    event: EventId<'_>,
    lines: &BTreeMap<String, i64>,
    prices: &BTreeMap<String, PricedSku>,
) -> Result<Option<OrderText>, OrderError> {
    let Ok((items, total)) = price_cart_lines(lines, prices, event) else {
        return Ok(None);
    };
    let view = OrderView {
        id: order_id.as_str().to_owned(),
        status: OrderStatus::PendingPayment,
        source: OrderSource::Cart,
        hold_id: None,
        event_id: Some(event.as_str().to_owned()),
        total,
        currency: settings.currency.clone(),
        items,
        expires_at: DateTime::UNIX_EPOCH,
        created_at: DateTime::UNIX_EPOCH,
        paid_at: None,
    };
    let (head, tail) = body_parts(&view)?;
    // The outbox row's payload as `insert_order` writes it.
    let payload = serde_json::json!({
        "order_id": order_id.as_str(),
        "account_id": account.as_str(),
        "status": OrderStatus::PendingPayment,
        "source": OrderSource::Cart,
        "hold_id": null,
        "event_id": event.as_str(),
        "total": total,
        "currency": &settings.currency,
        "items": &view.items,
    });
    Ok(Some(OrderText {
        view,
        head,
        tail,
        payload,
    }))
}

/// The two timestamps of the body, placed where serde put them; split around by
/// [`body_parts`]. `expires_at` and `created_at` are adjacent, in this order, at the end of
/// [`OrderView`] (`paid_at` is skipped while `None`).
const STAMPS: &str = r#","expires_at":"1970-01-01T00:00:00Z","created_at":"1970-01-01T00:00:00Z""#;

/// The serialised `view` split around its two timestamps: the statement joins `head`, the
/// expiry, `","created_at":"`, the creation time and `tail`.
fn body_parts(view: &OrderView) -> Result<(String, String), OrderError> {
    let json = serde_json::to_string(view).map_err(OrderError::Serialize)?;
    // The last occurrence: quotes inside names are escaped, so this run of unescaped quotes
    // can only be the view's own fields.
    let at = json
        .rfind(STAMPS)
        .ok_or_else(|| OrderError::Serialize(serde::ser::Error::custom("no timestamps")))?;
    let head = format!(r#"{},"expires_at":""#, &json[..at]);
    let tail = format!("\"{}", &json[at + STAMPS.len()..]);
    Ok((head, tail))
}

#[cfg(test)]
mod tests;
