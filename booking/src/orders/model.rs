//! The orders model: statuses and kinds as the strings Postgres stores, borrowed id newtypes
//! so an account can never be passed where an event is expected, the views clients get, and
//! the pure rules (pricing with checked arithmetic, hold lines, request shape, gate and marker
//! identities). No I/O here; everything is unit-tested below.

use crate::inventory::holds::HoldStatus;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use utoipa::ToSchema;

/// `orders.status` (see the CHECK in `migrations/0007_refunds_disputes.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    PendingPayment,
    Paid,
    Expired,
    Cancelled,
    Refunded,
    Disputed,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::PendingPayment => "PENDING_PAYMENT",
            OrderStatus::Paid => "PAID",
            OrderStatus::Expired => "EXPIRED",
            OrderStatus::Cancelled => "CANCELLED",
            OrderStatus::Refunded => "REFUNDED",
            OrderStatus::Disputed => "DISPUTED",
        }
    }

    /// The transitions of the module doc's diagram. The database enforces them (each
    /// transition is one `UPDATE ... WHERE status = <from>`); this states them in one place.
    pub fn can_become(self, to: OrderStatus) -> bool {
        use OrderStatus::*;
        matches!(
            (self, to),
            (PendingPayment, Paid | Expired | Cancelled) | (Paid, Refunded | Disputed)
        )
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `orders.source`: where the order's lines came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, ToSchema)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum OrderSource {
    Cart,
    Hold,
}

impl OrderSource {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderSource::Cart => "cart",
            OrderSource::Hold => "hold",
        }
    }
}

/// `order_items.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, ToSchema)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum ItemKind {
    Sku,
    Seat,
    Ga,
}

impl ItemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Sku => "sku",
            ItemKind::Seat => "seat",
            ItemKind::Ga => "ga",
        }
    }
}

/// How a pending order ends without payment; each returns its units and hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderEnd {
    /// The expiry job: only orders whose `expires_at` has passed.
    Expired,
    /// Now, due or not (a payment that lost its hold's seats).
    Cancelled,
}

impl OrderEnd {
    pub fn status(self) -> OrderStatus {
        match self {
            OrderEnd::Expired => OrderStatus::Expired,
            OrderEnd::Cancelled => OrderStatus::Cancelled,
        }
    }

    /// The status the order's hold moves to (from `ordered`).
    pub fn hold_status(self) -> HoldStatus {
        match self {
            OrderEnd::Expired => HoldStatus::Expired,
            OrderEnd::Cancelled => HoldStatus::Released,
        }
    }

    /// The outbox topic of the transition.
    pub fn topic(self) -> &'static str {
        match self {
            OrderEnd::Expired => "order.expired",
            OrderEnd::Cancelled => "order.cancelled",
        }
    }

    /// Only due orders end (expiry), or any pending one (cancel).
    pub fn due_only(self) -> bool {
        matches!(self, OrderEnd::Expired)
    }
}

macro_rules! borrowed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<'a>(&'a str);

        impl<'a> $name<'a> {
            pub fn new(id: &'a str) -> Self {
                Self(id)
            }

            pub fn as_str(self) -> &'a str {
                self.0
            }
        }

        impl fmt::Display for $name<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
    };
}

borrowed_id!(
    /// An order's id (`orders.id`).
    OrderId
);
borrowed_id!(
    /// The account (the admission token's subject) that owns an order.
    AccountId
);
borrowed_id!(
    /// An event's id (slug): the admission's event, a product's or a hold's.
    EventId
);
borrowed_id!(
    /// The `Idempotency-Key` an order was created with (`UNIQUE (account_id, idempotency_key)`).
    OrderKey
);
borrowed_id!(
    /// A seat/GA hold's id.
    HoldId
);

/// One order line as clients see it (and as `order_items` stores it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, ToSchema)]
#[schema(as = OrderItem)]
pub struct OrderItemView {
    pub kind: ItemKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seat_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ga_tier: Option<String>,
    pub name: String,
    pub quantity: i32,
    /// Unit price snapshotted at order time (minor units).
    pub unit_price: i64,
    /// integer minor units
    pub amount: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Order)]
pub struct OrderView {
    pub id: String,
    pub status: OrderStatus,
    pub source: OrderSource,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// integer minor units
    pub total: i64,
    pub currency: String,
    pub items: Vec<OrderItemView>,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderRow {
    pub id: String,
    pub account_id: String,
    pub status: OrderStatus,
    pub source: OrderSource,
    pub hold_id: Option<String>,
    pub event_id: Option<String>,
    pub total: i64,
    pub currency: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
}

/// An order that a transition just ended.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EndedOrder {
    pub id: String,
    pub account_id: String,
    pub source: OrderSource,
    pub hold_id: Option<String>,
    pub total: i64,
}

/// A product as the order transaction reads it: name, current price, event; and how many rows
/// its stock is split over (`stock_shards`), which only sets how many of its batches run at
/// once (`orders::batcher`), never what an order may take.
#[derive(Debug, Clone, PartialEq, Eq, Hash, sqlx::FromRow)]
pub struct PricedSku {
    pub name: String,
    pub price: i64,
    #[sqlx(rename = "event_id")]
    pub event: Option<String>,
    #[sqlx(rename = "stock_shards")]
    pub stock_rows: i32,
}

/// Why a set of lines cannot be priced. Nothing has been written when this is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PricingError {
    UnknownSku(String),
    /// The SKU belongs to another event than the order's (or to none).
    WrongEvent(String),
    /// A line amount, the total or a quantity does not fit.
    Overflow,
}

/// Prices cart `lines` (SKU → quantity) from `prices` for an order of `event`: the items in SKU
/// order with the snapshotted unit price, and the total, all with checked arithmetic.
pub fn price_cart_lines(
    lines: &BTreeMap<String, i64>,
    prices: &BTreeMap<String, PricedSku>,
    event: EventId<'_>,
) -> Result<(Vec<OrderItemView>, i64), PricingError> {
    let mut items = Vec::with_capacity(lines.len());
    let mut total: i64 = 0;
    for (sku, &q) in lines {
        let Some(p) = prices.get(sku) else {
            return Err(PricingError::UnknownSku(sku.clone()));
        };
        if p.event.as_deref() != Some(event.as_str()) {
            return Err(PricingError::WrongEvent(sku.clone()));
        }
        let amount = p.price.checked_mul(q).ok_or(PricingError::Overflow)?;
        total = total.checked_add(amount).ok_or(PricingError::Overflow)?;
        items.push(OrderItemView {
            kind: ItemKind::Sku,
            sku: Some(sku.clone()),
            seat_id: None,
            ga_tier: None,
            name: p.name.clone(),
            quantity: i32::try_from(q).map_err(|_| PricingError::Overflow)?,
            unit_price: p.price,
            amount,
        });
    }
    Ok((items, total))
}

/// One seat of a pinned hold, as the order prices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldSeat<'a> {
    pub seat_id: &'a str,
    pub tier: &'a str,
    pub price: i64,
}

/// What a pinned hold holds (read from the hold the order pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldUnits<'a> {
    /// Seats in seat order.
    Seats(Vec<HeldSeat<'a>>),
    /// General-admission units of one tier.
    Ga {
        tier: &'a str,
        unit_price: i64,
        quantity: i32,
    },
}

/// The lines of an order from a pinned hold (one per seat, or one GA line) and its total.
/// `Err(PricingError::Overflow)` when an amount does not fit.
pub fn price_hold(held: &HeldUnits<'_>) -> Result<(Vec<OrderItemView>, i64), PricingError> {
    let mut items = Vec::new();
    match held {
        HeldUnits::Seats(seats) => {
            for s in seats {
                items.push(OrderItemView {
                    kind: ItemKind::Seat,
                    sku: None,
                    seat_id: Some(s.seat_id.to_owned()),
                    ga_tier: None,
                    name: format!("Seat {} (tier {})", s.seat_id, s.tier),
                    quantity: 1,
                    unit_price: s.price,
                    amount: s.price,
                });
            }
        }
        &HeldUnits::Ga {
            tier,
            unit_price,
            quantity,
        } => items.push(OrderItemView {
            kind: ItemKind::Ga,
            sku: None,
            seat_id: None,
            ga_tier: Some(tier.to_owned()),
            name: format!("General admission ({tier})"),
            quantity,
            unit_price,
            amount: unit_price
                .checked_mul(i64::from(quantity))
                .ok_or(PricingError::Overflow)?,
        }),
    }
    let total = items
        .iter()
        .try_fold(0i64, |acc, i| acc.checked_add(i.amount))
        .ok_or(PricingError::Overflow)?;
    Ok((items, total))
}

/// How a refused line is reported: `SOLD_OUT` when nothing is left, else
/// `INSUFFICIENT_STOCK` with the real remaining quantity (never negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    SoldOut,
    Insufficient { available: i64 },
}

impl Shortage {
    pub fn of(available: i64) -> Self {
        if available <= 0 {
            Shortage::SoldOut
        } else {
            Shortage::Insufficient { available }
        }
    }

    /// The remaining quantity to report (0 when sold out).
    pub fn available(self) -> i64 {
        match self {
            Shortage::SoldOut => 0,
            Shortage::Insufficient { available } => available,
        }
    }
}

/// `POST /api/orders` body: `{"source": "cart"}` or `{"hold_id": "..."}` (optionally with
/// `"source": "hold"`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    pub source: Option<String>,
    pub hold_id: Option<String>,
    /// Where the tickets are mailed (optional; validated by `platform::email`, stored only in
    /// `order_contacts`).
    pub email: Option<String>,
}

/// Where a requested order takes its lines from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestedSource {
    Cart,
    Hold(String),
}

/// Longest hold id a request may name.
pub const MAX_HOLD_ID: usize = 64;

impl OrderRequest {
    /// The requested source, or `None` for any other shape.
    pub fn source(self) -> Option<RequestedSource> {
        match (self.source.as_deref(), self.hold_id) {
            (Some("cart"), None) => Some(RequestedSource::Cart),
            (None | Some("hold"), Some(h)) if !h.is_empty() && h.len() <= MAX_HOLD_ID => {
                Some(RequestedSource::Hold(h))
            }
            _ => None,
        }
    }
}

/// The flash gate's identity of one order request: the idempotency identity (account + key),
/// so a retry of an admitted request is recognised. The separator cannot occur in either.
pub fn gate_admission(account: AccountId<'_>, key: OrderKey<'_>) -> String {
    format!("{account}\u{1f}{key}")
}

/// Redis key suffix of the "this key already produced an order" marker (hash tag on the
/// account, like the cart).
pub fn done_marker_suffix(account: AccountId<'_>, key: OrderKey<'_>) -> String {
    format!("idem:done:{{{account}}}:{key}")
}

/// How long per-request Redis records (gate admissions, done markers) live: as long as the
/// idempotency key they stand for, at least a day.
pub fn request_record_ttl_s(retention_h: u32) -> u64 {
    u64::from(retention_h.max(24)) * 3600
}

#[cfg(test)]
mod tests;
