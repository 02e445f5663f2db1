//! Orders: `POST /api/orders` (from the cart or from a seat/GA hold, `Idempotency-Key`
//! required) and `GET /api/orders/{id}`, plus the transaction helpers the payment flow and the
//! expiry job use.
//!
//! # Status transitions
//! ```text
//! PENDING_PAYMENT ──pay──────> PAID ──refund / dispute at the provider──> REFUNDED | DISPUTED
//!        │ ├──expiry job────> EXPIRED     (units/hold returned)
//!        │ └──cancel────────> CANCELLED   (units/hold returned)
//! ```
//! Every transition is one `UPDATE orders ... WHERE status = 'PENDING_PAYMENT'` (or the
//! relevant source status), so of a late payment and the expiry job exactly one wins and the
//! other changes nothing: stock is returned or sold exactly once.
//!
//! # Guarantees
//! - One transaction creates the order: order row (`UNIQUE (account_id, idempotency_key)`),
//!   each SKU reserved by a conditional `UPDATE ... WHERE available >= q` in sorted SKU order,
//!   unit prices snapshotted into `order_items`, an `order.created` outbox row, and the stored
//!   idempotent response. Any shortage rolls everything back: `409 INSUFFICIENT_STOCK` with
//!   the real remaining quantity (`SOLD_OUT` when none is left). Deadlocks and serialization
//!   failures are retried from the top a bounded number of times (`[orders] deadlock_retries`).
//! - The idempotency claim and the flash gate run before any inventory is touched; nothing
//!   outside Postgres (Redis, the cart) happens inside the transaction. The cart is cleared
//!   after the commit, best effort, and only the lines that were ordered, unchanged.
//! - Orders from a hold pin the hold (`holds::pin_hold_tx`): the hold becomes `ordered` and its
//!   seats stay held until the order expires; one hold becomes at most one order.
//! - One admission, one event: a cart order takes the cart of the token's event and every
//!   SKU in it must belong to that event (checked before the flash gate from the catalogue,
//!   and again by the transaction's own price read); a hold order needs the hold's event. The
//!   order records its event. A mismatch is `403 WRONG_EVENT` and changes nothing.
//! - Only the owner can read an order (`404` for anyone else, never `403`).
//! - Money is integer minor units; totals are computed in Rust from the snapshotted prices
//!   with checked arithmetic.

pub mod cart;
pub mod flash;
pub mod products;

/// Everything the orders domain's handlers and jobs use; the app layer builds it and handlers take
/// it with `State<OrdersState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct OrdersState {
    pub pool: sqlx::PgPool,
    pub redis: crate::platform::redis::Redis,
    pub auth: crate::platform::auth::Auth,
}

impl axum::extract::FromRef<OrdersState> for crate::platform::auth::Auth {
    fn from_ref(state: &OrdersState) -> Self {
        state.auth.clone()
    }
}

use crate::platform::auth::Admitted;

use crate::app::state::AppState;
use crate::inventory::holds;
use crate::orders::flash::Gate;
use crate::platform::db::{self, TxError};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use sqlx::PgConnection;
use std::collections::BTreeMap;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/orders", post(create_order))
        .route("/api/orders/{id}", get(get_order))
}

/// `[orders]` settings (carts, orders, expiry, flash gate).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrderSettings {
    /// Seconds an unpaid order keeps its units (default 15 min).
    pub ttl_s: u32,
    /// Most different products in one cart.
    pub max_cart_lines: u32,
    /// Largest quantity of one product in a cart line.
    pub max_line_quantity: u32,
    /// How often the expiry job runs.
    pub expiry_interval_ms: u64,
    /// Orders expired per expiry transaction.
    pub expiry_batch: i64,
    /// How often every hot SKU's flash gate is reset from Postgres.
    pub flash_reconcile_interval_ms: u64,
    /// Retries of an order transaction that lost a deadlock/serialization race.
    pub deadlock_retries: u32,
    /// The store's currency (ISO 4217); amounts are in its minor units.
    pub currency: String,
    /// Commit order-creation transactions with `synchronous_commit = off`. Off by default.
    /// A pending order moves no money: a crash can lose the last few milliseconds of created
    /// orders together with their reservations and stored responses (the stock comes back, a
    /// retry with the same key creates the order again); payments always commit durably, and
    /// a durable commit also flushes every earlier asynchronous one. See docs/decisions.md.
    pub async_commit: bool,
}

impl Default for OrderSettings {
    fn default() -> Self {
        Self {
            ttl_s: 900,
            max_cart_lines: 100,
            max_line_quantity: 99,
            expiry_interval_ms: 1000,
            expiry_batch: 200,
            flash_reconcile_interval_ms: 10_000,
            deadlock_retries: 5,
            currency: "JPY".into(),
            async_commit: false,
        }
    }
}

/// Metrics of carts, orders and the flash gate (registered on booking's registry).
pub struct CommerceMetrics {
    /// Order transactions started against Postgres (each retry counts).
    pub order_db_transactions: IntCounter,
    /// Order lifecycle: created, replayed, expired, refused.
    pub orders: IntCounterVec,
    /// Flash-gate answers: admitted, retry, ungated, refused.
    pub flash_gate: IntCounterVec,
    /// Cart operations: get, put, delete.
    pub cart_ops: IntCounterVec,
}

impl CommerceMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let order_db_transactions = IntCounter::new(
            "order_db_transactions_total",
            "Order transactions started in Postgres (including retries)",
        )?;
        let orders = IntCounterVec::new(
            Opts::new("orders_total", "Orders by lifecycle event"),
            &["event"],
        )?;
        let flash_gate = IntCounterVec::new(
            Opts::new("flash_gate_total", "Flash-sale gate answers"),
            &["outcome"],
        )?;
        let cart_ops = IntCounterVec::new(Opts::new("cart_ops_total", "Cart operations"), &["op"])?;
        registry.register(Box::new(order_db_transactions.clone()))?;
        registry.register(Box::new(orders.clone()))?;
        registry.register(Box::new(flash_gate.clone()))?;
        registry.register(Box::new(cart_ops.clone()))?;
        Ok(Self {
            order_db_transactions,
            orders,
            flash_gate,
            cart_ops,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct OrderItemView {
    /// `sku`, `seat` or `ga`.
    pub kind: String,
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
    pub amount: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OrderView {
    pub id: String,
    pub status: String,
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
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
    pub status: String,
    pub source: String,
    pub hold_id: Option<String>,
    pub event_id: Option<String>,
    pub total: i64,
    pub currency: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
}

/// Loads an order with its items; with `account`, only that account's order.
pub async fn load_order(
    conn: &mut PgConnection,
    id: &str,
    account: Option<&str>,
) -> sqlx::Result<Option<(OrderRow, OrderView)>> {
    let row: Option<OrderRow> = sqlx::query_as(
        "SELECT id, account_id, status, source, hold_id, event_id, total, currency,
                expires_at, created_at, paid_at
           FROM orders WHERE id = $1 AND ($2::text IS NULL OR account_id = $2)",
    )
    .bind(id)
    .bind(account)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let items: Vec<OrderItemView> = sqlx::query_as(
        "SELECT kind, sku, seat_id, ga_tier, name, quantity, unit_price,
                unit_price * quantity AS amount
           FROM order_items WHERE order_id = $1 ORDER BY line",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let view = OrderView {
        id: row.id.clone(),
        status: row.status.clone(),
        source: row.source.clone(),
        hold_id: row.hold_id.clone(),
        event_id: row.event_id.clone(),
        total: row.total,
        currency: row.currency.clone(),
        items,
        expires_at: row.expires_at,
        created_at: row.created_at,
        paid_at: row.paid_at,
    };
    Ok(Some((row, view)))
}

// ---------------------------------------------------------------------------------------------
// Creating orders (service functions; each runs inside the caller's transaction)
// ---------------------------------------------------------------------------------------------

fn insufficient(sku: &str, requested: i64, available: i64) -> ApiError {
    let (code, message) = if available <= 0 {
        (codes::SOLD_OUT, "this product is sold out")
    } else {
        (
            codes::INSUFFICIENT_STOCK,
            "not enough stock for the requested quantity",
        )
    };
    ApiError::conflict(code, message)
        .with("sku", sku)
        .with("requested", requested)
        .with("available", available.max(0))
}

fn overflow() -> ApiError {
    ApiError::validation("order total is too large")
}

/// Creates a `PENDING_PAYMENT` cart order for `lines` (SKU → quantity) inside the caller's
/// transaction and reserves the stock. Returns the view and its serialised body (the bytes
/// the client gets and, with `claim`, the stored idempotent response).
///
/// Statement order keeps hot rows locked as briefly as possible: prices are read without
/// locks (the snapshot is the committed price at order time), then the order, its items, the
/// outbox row and the idempotent response are written, and only then is each SKU reserved by
/// its conditional `UPDATE` (sorted SKU order, so carts sharing SKUs cannot deadlock). The
/// inventory row locks are therefore held for one statement plus the commit. On a shortage it
/// returns `409 INSUFFICIENT_STOCK` (or `SOLD_OUT`) with earlier lines already reserved: the
/// caller must roll back (dropping the transaction does), which undoes everything.
///
/// `event` is the event of the caller's admission: every SKU must belong to it (`403
/// WRONG_EVENT` before anything is written), and the order records it.
#[expect(
    clippy::too_many_arguments,
    reason = "one order's whole input, each a distinct borrowed value"
)]
pub async fn create_cart_order_tx(
    conn: &mut PgConnection,
    settings: &crate::orders::OrderSettings,
    order_id: &str,
    account: &str,
    event: &str,
    idempotency_key: &str,
    lines: &BTreeMap<String, i64>,
    claim: Option<&idempotency::Claim>,
) -> Result<(OrderView, Vec<u8>), TxError> {
    if lines.is_empty() {
        return Err(cart_empty().into());
    }
    let skus: Vec<&str> = lines.keys().map(String::as_str).collect();
    let prices: Vec<(String, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT sku, name, price, event_id FROM products WHERE sku = ANY($1) ORDER BY sku",
    )
    .bind(&skus)
    .fetch_all(&mut *conn)
    .await?;
    let prices: BTreeMap<String, (String, i64, Option<String>)> = prices
        .into_iter()
        .map(|(sku, name, price, evt)| (sku, (name, price, evt)))
        .collect();
    let mut items = Vec::with_capacity(lines.len());
    let mut total: i64 = 0;
    for (sku, &q) in lines {
        let Some((name, price, sku_event)) = prices.get(sku) else {
            return Err(crate::orders::products::unknown_sku(sku).into());
        };
        if sku_event.as_deref() != Some(event) {
            return Err(ApiError::wrong_event().with("sku", sku.as_str()).into());
        }
        let amount = price.checked_mul(q).ok_or_else(overflow)?;
        total = total.checked_add(amount).ok_or_else(overflow)?;
        items.push(OrderItemView {
            kind: "sku".into(),
            sku: Some(sku.clone()),
            seat_id: None,
            ga_tier: None,
            name: name.clone(),
            quantity: i32::try_from(q).map_err(|_| overflow())?,
            unit_price: *price,
            amount,
        });
    }
    let new = NewOrder {
        id: order_id,
        account,
        idempotency_key,
        source: "cart",
        hold_id: None,
        event_id: Some(event),
        total,
        currency: &settings.currency,
        expires_at: None,
        ttl_s: settings.ttl_s,
    };
    let view = insert_order(conn, &new, items).await?;
    let body = serde_json::to_vec(&view).map_err(ApiError::unexpected)?;
    if let Some(claim) = claim {
        claim.complete_tx(conn, StatusCode::CREATED, &body).await?;
    }
    for (sku, &q) in lines {
        let reserved = sqlx::query(
            "UPDATE inventory SET available = available - $2, reserved = reserved + $2
              WHERE sku = $1 AND available >= $2",
        )
        .bind(sku)
        .bind(q)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if reserved == 0 {
            // Report the real remaining quantity (the latest committed row).
            let available: Option<i64> =
                sqlx::query_scalar("SELECT available FROM inventory WHERE sku = $1")
                    .bind(sku)
                    .fetch_optional(&mut *conn)
                    .await?;
            return Err(match available {
                Some(a) => insufficient(sku, q, a),
                None => crate::orders::products::unknown_sku(sku),
            }
            .into());
        }
    }
    Ok((view, body))
}

/// Creates a `PENDING_PAYMENT` order from an active seat/GA hold of `account` inside the
/// caller's transaction (the hold becomes `ordered`, pinned until the order expires).
/// `expected_event`: the event of the caller's admission token, checked against the hold's.
pub async fn create_hold_order_tx(
    conn: &mut PgConnection,
    settings: &crate::orders::OrderSettings,
    order_id: &str,
    account: &str,
    idempotency_key: &str,
    hold_id: &str,
    expected_event: Option<&str>,
) -> Result<OrderView, TxError> {
    let pinned = holds::pin_hold_tx(conn, hold_id, account, i64::from(settings.ttl_s))
        .await?
        .ok_or_else(|| {
            ApiError::conflict(
                codes::HOLD_EXPIRED,
                "the hold is not active: it expired, was released, is already ordered, or is not yours",
            )
            .with("hold_id", hold_id)
        })?;
    if let Some(evt) = expected_event
        && evt != pinned.event_id
    {
        // Dropping the transaction undoes the pin.
        return Err(ApiError::wrong_event().into());
    }
    let mut items = Vec::new();
    if pinned.kind == "seats" {
        for s in &pinned.seats {
            items.push(OrderItemView {
                kind: "seat".into(),
                sku: None,
                seat_id: Some(s.seat_id.clone()),
                ga_tier: None,
                name: format!("Seat {} (tier {})", s.seat_id, s.tier),
                quantity: 1,
                unit_price: s.price,
                amount: s.price,
            });
        }
    } else {
        let tier = pinned.ga_tier.clone().unwrap_or_default();
        let price = pinned.ga_price.unwrap_or(0);
        items.push(OrderItemView {
            kind: "ga".into(),
            sku: None,
            seat_id: None,
            ga_tier: Some(tier.clone()),
            name: format!("General admission ({tier})"),
            quantity: pinned.quantity,
            unit_price: price,
            amount: price
                .checked_mul(i64::from(pinned.quantity))
                .ok_or_else(overflow)?,
        });
    }
    let total = items
        .iter()
        .try_fold(0i64, |acc, i| acc.checked_add(i.amount))
        .ok_or_else(overflow)?;
    let new = NewOrder {
        id: order_id,
        account,
        idempotency_key,
        source: "hold",
        hold_id: Some(hold_id),
        event_id: Some(&pinned.event_id),
        total,
        currency: &settings.currency,
        expires_at: Some(pinned.expires_at),
        ttl_s: settings.ttl_s,
    };
    insert_order(conn, &new, items).await
}

struct NewOrder<'a> {
    id: &'a str,
    account: &'a str,
    idempotency_key: &'a str,
    source: &'a str,
    hold_id: Option<&'a str>,
    event_id: Option<&'a str>,
    total: i64,
    currency: &'a str,
    /// The hold's pinned expiry; cart orders expire `ttl_s` from now (database clock).
    expires_at: Option<DateTime<Utc>>,
    ttl_s: u32,
}

async fn insert_order(
    conn: &mut PgConnection,
    o: &NewOrder<'_>,
    items: Vec<OrderItemView>,
) -> Result<OrderView, TxError> {
    let times: Option<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "INSERT INTO orders (id, account_id, idempotency_key, source, hold_id, event_id, total,
                             currency, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                 COALESCE($9, clock_timestamp() + make_interval(secs => $10)))
         ON CONFLICT (account_id, idempotency_key) DO NOTHING
         RETURNING expires_at, created_at",
    )
    .bind(o.id)
    .bind(o.account)
    .bind(o.idempotency_key)
    .bind(o.source)
    .bind(o.hold_id)
    .bind(o.event_id)
    .bind(o.total)
    .bind(o.currency)
    .bind(o.expires_at)
    .bind(f64::from(o.ttl_s))
    .fetch_optional(&mut *conn)
    .await?;
    let Some((expires_at, created_at)) = times else {
        // The idempotency row was purged (older than the retention) but an order still
        // carries this key: the key cannot be used for a new order.
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this Idempotency-Key was already used for another order",
        )
        .into());
    };
    let n = items.len();
    let mut line = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut sku = Vec::with_capacity(n);
    let mut seat = Vec::with_capacity(n);
    let mut tier = Vec::with_capacity(n);
    let mut name = Vec::with_capacity(n);
    let mut qty = Vec::with_capacity(n);
    let mut price = Vec::with_capacity(n);
    for (i, it) in items.iter().enumerate() {
        line.push(i32::try_from(i + 1).unwrap_or(i32::MAX));
        kind.push(it.kind.clone());
        sku.push(it.sku.clone());
        seat.push(it.seat_id.clone());
        tier.push(it.ga_tier.clone());
        name.push(it.name.clone());
        qty.push(it.quantity);
        price.push(it.unit_price);
    }
    sqlx::query(
        "INSERT INTO order_items (order_id, line, kind, sku, seat_id, ga_tier, name, quantity,
                                  unit_price)
         SELECT $1, l.line, l.kind, l.sku, l.seat_id, l.ga_tier, l.name, l.quantity, l.unit_price
           FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                       $8::int[], $9::bigint[])
                AS l(line, kind, sku, seat_id, ga_tier, name, quantity, unit_price)",
    )
    .bind(o.id)
    .bind(&line)
    .bind(&kind)
    .bind(&sku)
    .bind(&seat)
    .bind(&tier)
    .bind(&name)
    .bind(&qty)
    .bind(&price)
    .execute(&mut *conn)
    .await?;
    let view = OrderView {
        id: o.id.to_owned(),
        status: "PENDING_PAYMENT".into(),
        source: o.source.to_owned(),
        hold_id: o.hold_id.map(str::to_owned),
        event_id: o.event_id.map(str::to_owned),
        total: o.total,
        currency: o.currency.to_owned(),
        items,
        expires_at,
        created_at,
        paid_at: None,
    };
    let payload = serde_json::json!({
        "order_id": view.id,
        "account_id": o.account,
        "status": view.status,
        "source": view.source,
        "hold_id": view.hold_id,
        "event_id": view.event_id,
        "total": view.total,
        "currency": view.currency,
        "items": view.items,
        "expires_at": view.expires_at,
    });
    write_outbox(conn, "order.created", o.id, &payload).await?;
    Ok(view)
}

async fn write_outbox(
    conn: &mut PgConnection,
    topic: &str,
    order_id: &str,
    payload: &serde_json::Value,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO outbox (event_id, topic, aggregate_id, payload) VALUES ($1, $2, $3, $4)",
    )
    .bind(shared::ids::new_id())
    .bind(topic)
    .bind(order_id)
    .bind(payload)
    .execute(conn)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Transitions (for payments and the expiry job)
// ---------------------------------------------------------------------------------------------

/// Moves a cart order's reserved units to sold (`reserved -= q, sold += q` per SKU, rows
/// locked in SKU order). Call it in the transaction that won the order's
/// `PENDING_PAYMENT → PAID` transition. Returns the number of SKUs updated (0 for hold
/// orders, whose seats/GA units are sold by `holds::sell_hold_tx`).
pub async fn commit_reserved_stock_tx(
    conn: &mut PgConnection,
    order_id: &str,
) -> sqlx::Result<u64> {
    move_stock_tx(conn, &[order_id.to_owned()], StockMove::Sell).await
}

#[derive(Clone, Copy)]
enum StockMove {
    /// reserved → sold (payment).
    Sell,
    /// reserved → available (expiry, cancel).
    Return,
}

/// Aggregates the SKU lines of `order_ids` per SKU and applies `how` to each inventory row,
/// locking the rows in SKU order first.
async fn move_stock_tx(
    conn: &mut PgConnection,
    order_ids: &[String],
    how: StockMove,
) -> sqlx::Result<u64> {
    let lines: Vec<(String, i64)> = sqlx::query_as(
        "SELECT sku, SUM(quantity)::bigint FROM order_items
          WHERE order_id = ANY($1) AND kind = 'sku'
          GROUP BY sku ORDER BY sku",
    )
    .bind(order_ids)
    .fetch_all(&mut *conn)
    .await?;
    if lines.is_empty() {
        return Ok(0);
    }
    let (skus, qs): (Vec<String>, Vec<i64>) = lines.into_iter().unzip();
    sqlx::query("SELECT sku FROM inventory WHERE sku = ANY($1) ORDER BY sku FOR UPDATE")
        .bind(&skus)
        .execute(&mut *conn)
        .await?;
    let sql = match how {
        StockMove::Sell => {
            "UPDATE inventory i SET reserved = i.reserved - l.q, sold = i.sold + l.q
               FROM unnest($1::text[], $2::bigint[]) AS l(sku, q) WHERE i.sku = l.sku"
        }
        StockMove::Return => {
            "UPDATE inventory i SET reserved = i.reserved - l.q, available = i.available + l.q
               FROM unnest($1::text[], $2::bigint[]) AS l(sku, q) WHERE i.sku = l.sku"
        }
    };
    Ok(sqlx::query(sql)
        .bind(&skus)
        .bind(&qs)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

/// An order that a transition just ended.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EndedOrder {
    pub id: String,
    pub account_id: String,
    pub source: String,
    pub hold_id: Option<String>,
    pub total: i64,
}

/// `PENDING_PAYMENT → PAID` (one conditional `UPDATE`) and, for cart orders, reserved units
/// to sold. `None` when the order was not pending (expired, cancelled, already paid): nothing
/// changed. Hold orders: the caller sells the hold (`holds::sell_hold_tx`) in the same
/// transaction. Does not look at `expires_at`: a pending order still owns its units until the
/// expiry job ends it.
pub async fn mark_paid_tx(
    conn: &mut PgConnection,
    order_id: &str,
) -> sqlx::Result<Option<EndedOrder>> {
    let won: Option<EndedOrder> = sqlx::query_as(
        "UPDATE orders SET status = 'PAID', paid_at = clock_timestamp(),
                           updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'PENDING_PAYMENT'
         RETURNING id, account_id, source, hold_id, total",
    )
    .bind(order_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(o) = &won
        && o.source == "cart"
    {
        commit_reserved_stock_tx(conn, order_id).await?;
    }
    Ok(won)
}

/// Ends the given pending orders (`EXPIRED` or `CANCELLED`), returns their units (aggregated
/// per SKU) and holds, and writes one outbox row each. `due_only`: only orders whose
/// `expires_at` has passed. Returns the orders ended and the SKUs whose stock came back.
async fn end_orders_tx(
    conn: &mut PgConnection,
    ids: &[String],
    to_status: &str,
    due_only: bool,
) -> sqlx::Result<(Vec<EndedOrder>, Vec<String>)> {
    let ended: Vec<EndedOrder> = sqlx::query_as(
        "UPDATE orders SET status = $2, updated_at = clock_timestamp()
          WHERE id = ANY($1) AND status = 'PENDING_PAYMENT'
            AND (NOT $3 OR expires_at <= clock_timestamp())
         RETURNING id, account_id, source, hold_id, total",
    )
    .bind(ids)
    .bind(to_status)
    .bind(due_only)
    .fetch_all(&mut *conn)
    .await?;
    if ended.is_empty() {
        return Ok((ended, Vec::new()));
    }
    let cart_ids: Vec<String> = ended
        .iter()
        .filter(|o| o.source == "cart")
        .map(|o| o.id.clone())
        .collect();
    let mut skus = Vec::new();
    if !cart_ids.is_empty() {
        skus = sqlx::query_scalar(
            "SELECT DISTINCT sku FROM order_items
              WHERE order_id = ANY($1) AND kind = 'sku' ORDER BY sku",
        )
        .bind(&cart_ids)
        .fetch_all(&mut *conn)
        .await?;
        move_stock_tx(conn, &cart_ids, StockMove::Return).await?;
    }
    let hold_status = if to_status == "EXPIRED" {
        holds::HoldStatus::Expired
    } else {
        holds::HoldStatus::Released
    };
    let mut hold_ids: Vec<&str> = ended.iter().filter_map(|o| o.hold_id.as_deref()).collect();
    hold_ids.sort_unstable();
    for hold_id in hold_ids {
        holds::release_hold_tx(conn, hold_id, &[holds::HoldStatus::Ordered], hold_status).await?;
    }
    let topic = format!("order.{}", to_status.to_ascii_lowercase());
    for o in &ended {
        let payload = serde_json::json!({
            "order_id": o.id,
            "account_id": o.account_id,
            "status": to_status,
            "source": o.source,
            "hold_id": o.hold_id,
            "total": o.total,
        });
        write_outbox(conn, &topic, &o.id, &payload).await?;
    }
    Ok((ended, skus))
}

/// Expires one order if it is still `PENDING_PAYMENT` and due, returning its units/hold.
/// `false` when nothing changed (paid, already ended, or not due yet).
pub async fn expire_order_tx(conn: &mut PgConnection, order_id: &str) -> sqlx::Result<bool> {
    let (ended, _) = end_orders_tx(conn, &[order_id.to_owned()], "EXPIRED", true).await?;
    Ok(!ended.is_empty())
}

/// Cancels one `PENDING_PAYMENT` order now (due or not), returning its units/hold.
pub async fn cancel_order_tx(conn: &mut PgConnection, order_id: &str) -> sqlx::Result<bool> {
    let (ended, _) = end_orders_tx(conn, &[order_id.to_owned()], "CANCELLED", false).await?;
    Ok(!ended.is_empty())
}

/// The expiry job: ends due `PENDING_PAYMENT` orders in `FOR UPDATE SKIP LOCKED` batches
/// (safe on many instances), then resets the flash gates of SKUs whose stock came back.
/// Returns the number of orders expired.
pub async fn expire_due(state: &AppState) -> anyhow::Result<u64> {
    use anyhow::Context;
    let batch = state.config.orders.expiry_batch.max(1);
    let mut total = 0u64;
    loop {
        let (n, skus) = db::retry(3, || async {
            let mut tx = state.pool.begin().await?;
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM orders
                  WHERE status = 'PENDING_PAYMENT' AND expires_at <= clock_timestamp()
                  ORDER BY expires_at
                  LIMIT $1
                  FOR UPDATE SKIP LOCKED",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            if ids.is_empty() {
                return Ok::<_, sqlx::Error>((0usize, Vec::new()));
            }
            let (ended, skus) = end_orders_tx(&mut tx, &ids, "EXPIRED", true).await?;
            tx.commit().await?;
            Ok((ended.len(), skus))
        })
        .await
        .context("order expiry transaction failed")?;
        total += n as u64;
        if n > 0 {
            state
                .metrics
                .commerce
                .orders
                .with_label_values(&["expired"])
                .inc_by(n as u64);
        }
        // Returned units of hot SKUs: let the gate admit them again (outside the transaction).
        for sku in &skus {
            if let Err(e) = flash::reconcile(&state.pool, &state.redis, sku).await {
                tracing::warn!(error = ?e, sku, "flash gate reconcile after expiry failed");
            }
        }
        if (n as i64) < batch {
            return Ok(total);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderRequest {
    source: Option<String>,
    hold_id: Option<String>,
}

enum Source {
    Cart,
    Hold(String),
}

impl OrderRequest {
    fn source(self) -> ApiResult<Source> {
        match (self.source.as_deref(), self.hold_id) {
            (Some("cart"), None) => Ok(Source::Cart),
            (None | Some("hold"), Some(h)) if !h.is_empty() && h.len() <= 64 => Ok(Source::Hold(h)),
            _ => Err(ApiError::validation(
                r#"body must be {"source": "cart"} or {"hold_id": "..."}"#,
            )),
        }
    }
}

fn cart_empty() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::CART_EMPTY,
        "the cart is empty",
    )
}

fn done_marker_key(state: &AppState, account: &str, key: &IdempotencyKey) -> String {
    state.key(&format!("idem:done:{{{account}}}:{}", key.as_str()))
}

#[tracing::instrument(skip_all, fields(account = %admitted.account()))]
async fn create_order(
    State(state): State<AppState>,
    admitted: Admitted,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> ApiResult<Response> {
    let fingerprint = Fingerprint::of_json(&Method::POST, "/api/orders", &body);
    let req: OrderRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::validation(format!("invalid request body: {e}")))?;
    let result = match req.source()? {
        Source::Cart => create_from_cart(&state, &admitted, &key, &fingerprint).await,
        Source::Hold(hold_id) => {
            create_from_hold(&state, &admitted, &key, &fingerprint, &hold_id).await
        }
    };
    if let Err(e) = &result
        && e.status() == StatusCode::CONFLICT
    {
        state.metrics.refusals.with_label_values(&[e.code()]).inc();
    }
    result
}

/// Takes flash-gate slots for the hot lines (sorted). Returns the SKUs whose slot this
/// request took (release them unless the order commits). A refusal is answered without any
/// Postgres query, unless this key already produced an order (then it is replayed).
async fn gate_lines(
    state: &AppState,
    account: &str,
    key: &IdempotencyKey,
    admission: &str,
    lines: &BTreeMap<String, i64>,
) -> ApiResult<Vec<String>> {
    let mut taken = Vec::new();
    for (sku, &q) in lines {
        match flash::acquire(state, sku, q, admission).await {
            Gate::Admitted => taken.push(sku.clone()),
            Gate::Retry | Gate::Ungated => {}
            Gate::Refused { remaining } => {
                release_slots(state, &taken, admission).await;
                if done_marker_exists(state, account, key).await {
                    return Ok(Vec::new());
                }
                return Err(insufficient(sku, q, remaining));
            }
        }
    }
    Ok(taken)
}

async fn release_slots(state: &AppState, skus: &[String], admission: &str) {
    for sku in skus {
        flash::release(state, sku, admission).await;
    }
}

async fn done_marker_exists(state: &AppState, account: &str, key: &IdempotencyKey) -> bool {
    let Ok(mut conn) = state.redis().await else {
        return false;
    };
    redis::cmd("EXISTS")
        .arg(done_marker_key(state, account, key))
        .query_async::<bool>(&mut conn)
        .await
        .unwrap_or(false)
}

async fn set_done_marker(state: &AppState, account: &str, key: &IdempotencyKey) {
    let ttl = u64::from(state.config.idempotency.retention_h.max(24)) * 3600;
    let res: ApiResult<()> = async {
        let mut conn = state.redis().await?;
        redis::cmd("SET")
            .arg(done_marker_key(state, account, key))
            .arg(1)
            .arg("EX")
            .arg(ttl)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
    .await;
    if let Err(e) = res {
        tracing::debug!(error = ?e, "could not record the completed-order marker");
    }
}

async fn create_from_cart(
    state: &AppState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> ApiResult<Response> {
    let account = admitted.account();
    let event = admitted.event();
    let lines = cart::lines(state, account, event).await?;
    // One admission, one event, before the flash gate: a SKU of another event neither takes
    // nor is refused a gate slot. Cached, so no query on the hot path; the transaction checks
    // it again from the rows it reads.
    for sku in lines.keys() {
        if let Some(sku_event) = crate::orders::products::event_of(state, sku).await? {
            admitted
                .opens(sku_event.as_deref())
                .map_err(|e| e.with("sku", sku.as_str()))?;
        }
    }
    let admission = format!("{account}\u{1f}{}", key.as_str());
    // 1. The flash gate (Redis only), so a sold-out rush never reaches Postgres.
    let taken = gate_lines(state, account, key, &admission, &lines).await?;
    // 2. The idempotency claim, before any inventory is touched.
    let claim = match idempotency::begin(&state.idempotency, account, key, fingerprint).await {
        Ok(Begin::Started(claim)) => claim,
        Ok(Begin::Replay(stored)) => {
            release_slots(state, &taken, &admission).await;
            state
                .metrics
                .commerce
                .orders
                .with_label_values(&["replayed"])
                .inc();
            return Ok(stored.into_response());
        }
        Err(e) => {
            release_slots(state, &taken, &admission).await;
            return Err(e);
        }
    };
    // 3. One transaction, retried from the top on deadlock.
    let order_id = shared::ids::new_id();
    let settings = &state.config.orders;
    let result = db::retry(settings.deadlock_retries, || async {
        state.metrics.commerce.order_db_transactions.inc();
        let mut tx = if settings.async_commit {
            state
                .pool
                .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
                .await?
        } else {
            state.pool.begin().await?
        };
        let (_, body) = create_cart_order_tx(
            &mut tx,
            settings,
            &order_id,
            account,
            event,
            key.as_str(),
            &lines,
            Some(&claim),
        )
        .await?;
        tx.commit().await?;
        Ok::<_, TxError>(body)
    })
    .await;
    match result {
        Ok(body) => {
            state
                .metrics
                .commerce
                .orders
                .with_label_values(&["created"])
                .inc();
            // 4. After the commit, best effort: the gate slots are sold, the cart, the
            // completed marker.
            for sku in &taken {
                flash::settle(state, sku, &admission).await;
            }
            cart::clear_ordered(state, account, event, &lines).await;
            // Lets a later retry with this key through a gate that has since hit zero (only
            // consulted on a refusal), even if this order had no hot line.
            set_done_marker(state, account, key).await;
            Ok(idempotency::respond(StatusCode::CREATED, body))
        }
        Err(e) => {
            claim.release(&state.pool).await;
            release_slots(state, &taken, &admission).await;
            let e = ApiError::from(e);
            if matches!(e.code(), codes::INSUFFICIENT_STOCK | codes::SOLD_OUT) && !taken.is_empty()
            {
                // The gate let through more than Postgres had: correct it now.
                let state = state.clone();
                tokio::spawn(async move {
                    for sku in taken {
                        let _ = flash::reconcile(&state.pool, &state.redis, &sku).await;
                    }
                });
            }
            Err(e)
        }
    }
}

async fn create_from_hold(
    state: &AppState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    hold_id: &str,
) -> ApiResult<Response> {
    let account = admitted.account();
    let claim = match idempotency::begin(&state.idempotency, account, key, fingerprint).await? {
        Begin::Started(claim) => claim,
        Begin::Replay(stored) => return Ok(stored.into_response()),
    };
    let order_id = shared::ids::new_id();
    let settings = &state.config.orders;
    let result = db::retry(settings.deadlock_retries, || async {
        state.metrics.commerce.order_db_transactions.inc();
        let mut tx = state.pool.begin().await?;
        let view = create_hold_order_tx(
            &mut tx,
            settings,
            &order_id,
            account,
            key.as_str(),
            hold_id,
            Some(admitted.event()),
        )
        .await?;
        let body = serde_json::to_vec(&view).map_err(ApiError::unexpected)?;
        claim
            .complete_tx(&mut tx, StatusCode::CREATED, &body)
            .await?;
        tx.commit().await?;
        Ok::<_, TxError>(body)
    })
    .await;
    match result {
        Ok(body) => {
            state
                .metrics
                .commerce
                .orders
                .with_label_values(&["created"])
                .inc();
            Ok(idempotency::respond(StatusCode::CREATED, body))
        }
        Err(e) => {
            claim.release(&state.pool).await;
            Err(e.into())
        }
    }
}

async fn get_order(
    State(state): State<AppState>,
    admitted: Admitted,
    Path(id): Path<String>,
) -> ApiResult<ApiJson<OrderView>> {
    let not_found = || ApiError::not_found(codes::NOT_FOUND, "no such order");
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let mut conn = state.pool.acquire().await?;
    match load_order(&mut conn, &id, Some(admitted.account())).await? {
        Some((_, view)) => Ok(ApiJson(view)),
        None => Err(not_found()),
    }
}

/// Background jobs of this area: order expiry and the flash-gate reconcile.
/// Each is safe on many instances (`FOR UPDATE SKIP LOCKED`, or idempotent `SET`s).
pub fn spawn_jobs(
    state: &AppState,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use crate::platform::jobs::spawn_periodic;
    use std::time::Duration;
    let settings = &state.config.orders;
    vec![
        spawn_periodic(
            "order-expiry",
            Duration::from_millis(settings.expiry_interval_ms.max(100)),
            stop.clone(),
            {
                let state = state.clone();
                move || {
                    let state = state.clone();
                    async move { expire_due(&state).await.map(|_| ()) }
                }
            },
        ),
        spawn_periodic(
            "flash-reconcile",
            Duration::from_millis(settings.flash_reconcile_interval_ms.max(500)),
            stop.clone(),
            {
                let state = state.clone();
                move || {
                    let state = state.clone();
                    async move { flash::reconcile_all(&state).await.map(|_| ()) }
                }
            },
        ),
    ]
}
