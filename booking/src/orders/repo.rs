//! Creating and reading orders in Postgres: functions that run inside the caller's
//! transaction and return [`OrderError`], never an HTTP error. Every database error names the
//! statement that failed ([`During::during`]), so a `500` in the log says which one.

use crate::inventory::holds;
use crate::orders::OrderSettings;
use crate::orders::model::{
    AccountId, EventId, HeldSeat, HeldUnits, HoldId, OrderId, OrderItemView, OrderKey, OrderRow,
    OrderSource, OrderView, PricedSku, PricingError, Shortage, price_cart_lines, price_hold,
};
use crate::orders::stock;
use crate::platform::db::{MaybeRetryable, TxError, is_retryable};
use crate::platform::error::ApiError;
use crate::platform::idempotency::{
    self, Begin, Claim, Fingerprint, IdempotencyKey, IdempotencySettings, Replay,
};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::collections::BTreeMap;

pub mod fans;
mod insert;
mod one_statement;
use insert::{NewOrder, insert_order};
pub use one_statement::batch::{BatchOrder, BatchOutcome, create_cart_orders_batched};
pub use one_statement::{
    OneStatement, OrderText, Take, create_cart_order_one_statement, order_text, read_prices,
    wait_for_copies,
};

/// What can go wrong in the orders domain (orders, carts, the flash gate, products).
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("the cart is empty")]
    CartEmpty,
    #[error("the cart already holds {max_lines} different products")]
    CartFull { max_lines: u32 },
    #[error("no such product {0}")]
    UnknownSku(String),
    #[error("a product {0} already exists")]
    ProductExists(String),
    #[error("no such event {0}")]
    UnknownEvent(String),
    /// A product's event is set once; this one already belongs to `current`.
    #[error("the product's event is already {current}")]
    EventLocked { current: String },
    /// New stock below the units already reserved or sold (`committed`).
    #[error("stock below the {committed} units reserved or sold")]
    StockBelowCommitted { committed: i64 },
    /// A product (or hold) of another event than the admission's; `sku` when one is to blame.
    #[error("not this admission's event")]
    WrongEvent { sku: Option<String> },
    #[error("not enough stock of {sku}")]
    Shortage {
        sku: String,
        requested: i64,
        shortage: Shortage,
    },
    /// This way of taking stock found a line's rows busy ([`stock::StockWay`]): the caller
    /// rolls back and runs the order again the next way. Never reaches a client.
    #[error("stock rows busy; the order runs again the next way")]
    StockBusy,
    #[error("order total is too large")]
    Overflow,
    #[error("hold {hold_id} is not active")]
    HoldNotActive { hold_id: String },
    /// The order's event was cancelled: it takes no new orders (the order statement's own
    /// condition).
    #[error("the event was cancelled")]
    EventCancelled,
    /// The key's idempotency row was purged but an order still carries the key.
    #[error("idempotency key already used for another order")]
    KeyReused,
    /// This attempt lost its idempotency claim (`409 IDEMPOTENCY_IN_FLIGHT`).
    #[error("idempotency claim lost")]
    ClaimLost(#[source] ApiError),
    /// The key could not be claimed: used for another request (`422`) or in flight (`409`).
    #[error("idempotency key refused")]
    KeyRefused(#[source] ApiError),
    /// The order's statement found its `Idempotency-Key` already stored ([`KeyAnswer::Insert`]):
    /// the caller rolls back and answers from the key ([`stored_answer`]).
    #[error("idempotency key already stored")]
    KeyTaken,
    #[error("failed to {statement}")]
    Db {
        statement: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("redis: failed to {op}")]
    Redis {
        op: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis unavailable")]
    RedisUnavailable(#[source] ApiError),
    #[error("failed to serialise the order")]
    Serialize(#[source] serde_json::Error),
}

impl OrderError {
    /// For a statement on a kept connection (`platform::kept`): whether Postgres answered the
    /// statement that failed; `None` for an error that did not come from a statement.
    pub fn answered(&self) -> Option<bool> {
        match self {
            OrderError::Db { source, .. } => Some(crate::platform::kept::answered(source)),
            _ => None,
        }
    }
}

/// Names the statement (or Redis command) behind an error.
pub trait During<T> {
    fn during(self, what: &'static str) -> Result<T, OrderError>;
}

impl<T> During<T> for Result<T, sqlx::Error> {
    fn during(self, statement: &'static str) -> Result<T, OrderError> {
        self.map_err(|source| OrderError::Db { statement, source })
    }
}

impl<T> During<T> for Result<T, redis::RedisError> {
    fn during(self, op: &'static str) -> Result<T, OrderError> {
        self.map_err(|source| OrderError::Redis { op, source })
    }
}

impl From<PricingError> for OrderError {
    fn from(e: PricingError) -> Self {
        match e {
            PricingError::UnknownSku(sku) => OrderError::UnknownSku(sku),
            PricingError::WrongEvent(sku) => OrderError::WrongEvent { sku: Some(sku) },
            PricingError::Overflow => OrderError::Overflow,
        }
    }
}

/// Deadlocks and serialization failures: run the whole transaction again (`db::retry`).
impl MaybeRetryable for OrderError {
    fn retryable(&self) -> bool {
        matches!(self, OrderError::Db { source, .. } if is_retryable(source))
    }
}

/// For callers that compose order transitions into their own sqlx-typed transactions (the
/// payment flow): the database error itself, so their retry and `503` mapping still see it.
/// The transitions only fail in the database; anything else becomes a protocol error.
impl From<OrderError> for sqlx::Error {
    fn from(e: OrderError) -> Self {
        match e {
            OrderError::Db { source, .. } => source,
            other => sqlx::Error::Protocol(other.to_string()),
        }
    }
}

/// Loads an order with its items; with `account`, only that account's order.
pub async fn load_order(
    conn: &mut PgConnection,
    id: &str,
    account: Option<&str>,
) -> Result<Option<(OrderRow, OrderView)>, OrderError> {
    let row: Option<OrderRow> = sqlx::query_as(
        "SELECT id, account_id, status, source, hold_id, event_id, total, currency,
                expires_at, created_at, paid_at
           FROM orders WHERE id = $1 AND ($2::text IS NULL OR account_id = $2)",
    )
    .bind(id)
    .bind(account)
    .fetch_optional(&mut *conn)
    .await
    .during("read the order")?;
    let Some(row) = row else { return Ok(None) };
    let items: Vec<OrderItemView> = sqlx::query_as(
        "SELECT kind, sku, seat_id, ga_tier, name, quantity, unit_price,
                unit_price * quantity AS amount
           FROM order_items WHERE order_id = $1 ORDER BY line",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .during("read the order's items")?;
    let view = OrderView {
        id: row.id.clone(),
        status: row.status,
        source: row.source,
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

/// A new cart order: its view, the serialised body (the bytes the client gets and, with a
/// claim, the stored idempotent response), and the account's checkout end with it
/// (`platform::session_until`).
#[derive(Debug)]
pub struct CartOrder {
    pub view: OrderView,
    pub body: Vec<u8>,
    pub live_until_ms: i64,
    /// The lines' products as the transaction read them (a later one-statement order of
    /// this process builds its body from them).
    pub prices: BTreeMap<String, PricedSku>,
}

/// Creates a `PENDING_PAYMENT` cart order for `lines` (SKU → quantity) inside the caller's
/// transaction and reserves the stock ([`CartOrder`]).
///
/// Statement order keeps hot rows locked as briefly as possible: prices are read without
/// locks (the snapshot is the committed price at order time), then the order, its items, the
/// outbox row and the idempotent response are written, and only then is each SKU reserved by
/// [`stock::reserve_stock_tx`] the `way` given (one shard row per line in the common case,
/// sorted SKU order; [`OrderError::StockBusy`]: run the order again with `way.next()`).
/// The stock row locks are therefore held for one statement plus the commit. On a shortage it
/// returns [`OrderError::Shortage`] (with the real remaining quantity) with earlier lines
/// already reserved: the caller must roll back (dropping the transaction does), which undoes
/// everything.
///
/// `event` is the event of the caller's admission: every SKU must belong to it
/// ([`OrderError::WrongEvent`] before anything is written), and the order records it.
#[expect(
    clippy::too_many_arguments,
    reason = "one order's whole input, each a distinct typed value"
)]
pub async fn create_cart_order_tx(
    conn: &mut PgConnection,
    settings: &OrderSettings,
    order_id: OrderId<'_>,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: OrderKey<'_>,
    lines: &BTreeMap<String, i64>,
    claim: Option<&Claim>,
    way: stock::StockWay,
) -> Result<CartOrder, OrderError> {
    /// A product's price row and the order's expiry.
    #[derive(sqlx::FromRow)]
    struct PriceRow {
        #[sqlx(flatten)]
        product: one_statement::SkuPrice,
        expires_at: DateTime<Utc>,
    }
    if lines.is_empty() {
        return Err(OrderError::CartEmpty);
    }
    let skus: Vec<&str> = lines.keys().map(String::as_str).collect();
    // The order's expiry (database clock) comes with the prices, so the order, its items and
    // its outbox row can then be written by one statement.
    let prices: Vec<PriceRow> = sqlx::query_as(
        "SELECT sku, name, price, event_id, stock_shards,
                clock_timestamp() + make_interval(secs => $2) AS expires_at
           FROM products WHERE sku = ANY($1) ORDER BY sku",
    )
    .bind(&skus)
    .bind(f64::from(settings.ttl_s))
    .fetch_all(&mut *conn)
    .await
    .during("read the cart's prices")?;
    let expires_at = prices.first().map(|p| p.expires_at);
    let prices: BTreeMap<String, PricedSku> = prices
        .into_iter()
        .map(|p| (p.product.sku, p.product.priced))
        .collect();
    let (items, total) = price_cart_lines(lines, &prices, event)?;
    let new = NewOrder {
        id: order_id,
        account,
        key,
        source: OrderSource::Cart,
        hold_id: None,
        event_id: Some(event),
        total,
        currency: &settings.currency,
        // No price row means an unknown SKU, refused above.
        expires_at: expires_at.ok_or(OrderError::CartEmpty)?,
        created_at: expires_at.ok_or(OrderError::CartEmpty)?
            - chrono::Duration::seconds(i64::from(settings.ttl_s)),
    };
    let answer = claim.map_or(KeyAnswer::None, KeyAnswer::Claimed);
    let (view, body, live_until_ms) = insert_order(conn, &new, items, answer).await?;
    stock::reserve_stock_tx(conn, order_id.as_str(), lines, way).await?;
    Ok(CartOrder {
        view,
        body,
        live_until_ms,
        prices,
    })
}

/// Claims the order's `Idempotency-Key` as the first statement of the order's transaction
/// ([`idempotency::claim_tx`]): `Begin::Replay` means this key already produced an order (roll
/// back and replay it).
pub async fn claim_key_tx(
    conn: &mut PgConnection,
    settings: &IdempotencySettings,
    account: AccountId<'_>,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Begin, OrderError> {
    match idempotency::claim_tx(conn, settings, account.as_str(), key, fingerprint).await {
        Ok(begin) => Ok(begin),
        Err(TxError::Db(source)) => Err(OrderError::Db {
            statement: "claim the Idempotency-Key",
            source,
        }),
        Err(TxError::Api(e)) => Err(OrderError::KeyRefused(e)),
    }
}

/// Creates a `PENDING_PAYMENT` order from an active seat/GA hold of `account` inside the
/// caller's transaction (the hold becomes `ordered`, pinned until the order expires).
/// `expected_event`: the event of the caller's admission, checked against the hold's. Returns
/// the view and the account's checkout end with the order (`platform::session_until`).
#[expect(
    clippy::too_many_arguments,
    reason = "one order's whole input, each a distinct typed value"
)]
pub async fn create_hold_order_tx(
    conn: &mut PgConnection,
    settings: &OrderSettings,
    order_id: OrderId<'_>,
    account: AccountId<'_>,
    key: OrderKey<'_>,
    hold_id: HoldId<'_>,
    expected_event: Option<EventId<'_>>,
    answer: KeyAnswer<'_>,
) -> Result<(OrderView, Vec<u8>, i64), OrderError> {
    let pinned = holds::pin_hold_tx(
        conn,
        hold_id.as_str(),
        account.as_str(),
        i64::from(settings.ttl_s),
    )
    .await
    .during("pin the hold")?
    .ok_or_else(|| OrderError::HoldNotActive {
        hold_id: hold_id.as_str().to_owned(),
    })?;
    if let Some(evt) = expected_event
        && evt.as_str() != pinned.event_id
    {
        // Dropping the transaction undoes the pin.
        return Err(OrderError::WrongEvent { sku: None });
    }
    let held = if pinned.kind == "seats" {
        HeldUnits::Seats(
            pinned
                .seats
                .iter()
                .map(|s| HeldSeat {
                    seat_id: &s.seat_id,
                    tier: &s.tier,
                    price: s.price,
                })
                .collect(),
        )
    } else {
        HeldUnits::Ga {
            tier: pinned.ga_tier.as_deref().unwrap_or_default(),
            unit_price: pinned.ga_price.unwrap_or(0),
            quantity: pinned.quantity,
        }
    };
    let (items, total) = price_hold(&held)?;
    let new = NewOrder {
        id: order_id,
        account,
        key,
        source: OrderSource::Hold,
        hold_id: Some(hold_id),
        event_id: Some(EventId::new(&pinned.event_id)),
        total,
        currency: &settings.currency,
        expires_at: pinned.expires_at,
        created_at: pinned.expires_at - chrono::Duration::seconds(i64::from(settings.ttl_s)),
    };
    insert_order(conn, &new, items, answer).await
}

/// How the order's own statement stores its answer under the request's `Idempotency-Key`.
#[derive(Clone, Copy)]
pub enum KeyAnswer<'a> {
    /// Completes this attempt's claim, taken earlier in the transaction
    /// ([`idempotency::claim_tx`]; the cart order, whose stock step skips busy rows, so a
    /// concurrent duplicate must queue on the key before it, not after).
    Claimed(&'a Claim),
    /// Inserts the key with its answer: claim and answer at once, in the order's statement
    /// (the hold order, whose pin already queues a concurrent duplicate on the hold's row).
    /// A key already there makes it [`OrderError::KeyTaken`].
    Insert {
        key: &'a str,
        fingerprint: &'a Fingerprint,
    },
    /// No key (callers outside an HTTP request).
    None,
}

/// The stored answer of `key` after this request's order was refused or found the key taken
/// (its transaction rolled back): `Some` replays it (or refuses the key: `422` for another
/// request, `409` while in flight), `None` leaves the refusal to stand. Only refusals pay for
/// this read; a retry of a request that made an order is answered from here, since its hold
/// is no longer active.
pub async fn stored_answer(
    conn: &mut PgConnection,
    account: AccountId<'_>,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Option<Replay>, OrderError> {
    match idempotency::existing(conn, account.as_str(), key, fingerprint)
        .await
        .during("read the Idempotency-Key")?
    {
        Some(Ok(Begin::Replay(stored))) => Ok(Some(stored)),
        Some(Ok(Begin::Started(_))) | None => Ok(None),
        Some(Err(e)) => Err(OrderError::KeyRefused(e)),
    }
}

/// One outbox row for an order transition, in the caller's transaction.
pub(crate) async fn write_outbox(
    conn: &mut PgConnection,
    topic: &str,
    order_id: OrderId<'_>,
    payload: &serde_json::Value,
) -> sqlx::Result<()> {
    crate::outbox::write_tx(conn, topic, order_id.as_str(), payload).await?;
    Ok(())
}
