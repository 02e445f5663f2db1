//! Orders: `POST /api/orders` (from the cart or from a seat/GA hold, `Idempotency-Key`
//! required) and `GET /api/orders/{id}`, plus the transaction helpers the payment flow and the
//! expiry job use; the cart, the flash-sale gate and the product catalogue.
//!
//! Layout: [`model`] (statuses, ids, views, pure rules), [`repo`] (creating and reading orders
//! in a transaction, [`OrderError`]), [`transitions`] (paid, expired, cancelled), [`http`]
//! (handlers; the only mapping to HTTP errors), [`expiry`] (the expiry job), [`stock`] (a
//! SKU's stock split over shard rows: take, move, spread), and [`cart`], [`flash`],
//! [`products`].
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
//!   each SKU reserved by a conditional `UPDATE ... WHERE available >= q` on one of its stock
//!   shard rows (or their sum, [`stock`]) in sorted SKU order,
//!   unit prices snapshotted into `order_items`, an `order.created` outbox row, and the stored
//!   idempotent response. Any shortage rolls everything back: `409 INSUFFICIENT_STOCK` with
//!   the real remaining quantity (`SOLD_OUT` when none is left). Deadlocks and serialization
//!   failures are retried from the top a bounded number of times (`[orders] deadlock_retries`).
//! - The idempotency claim and the flash gate run before any inventory is touched; nothing
//!   outside Postgres (Redis, the cart) happens inside the transaction. The cart is cleared
//!   after the commit, best effort, and only the lines that were ordered, unchanged.
//! - Orders from a hold pin the hold (`inventory::holds::pin_hold_tx`): the hold becomes
//!   `ordered` and its seats stay held until the order expires; one hold becomes at most one
//!   order.
//! - One admission, one event: a cart order takes the cart of the token's event and every
//!   SKU in it must belong to that event (checked before the flash gate from the catalogue,
//!   and again by the transaction's own price read); a hold order needs the hold's event. The
//!   order records its event. A mismatch is `403 WRONG_EVENT` and changes nothing.
//! - Only the owner can read an order (`404` for anyone else, never `403`).
//! - Money is integer minor units; totals are computed in Rust from the snapshotted prices
//!   with checked arithmetic.
//! - Nothing of this domain runs outside a request or the job runner ([`jobs`]): the gate
//!   correction after a shortage the flash gate let through runs inside that request, so no
//!   task outlives the process's stop signal.

pub mod batcher;
pub mod cart;
pub mod contacts;
pub mod cursor;
pub mod expiry;
pub mod flash;
pub mod http;
pub mod model;
pub mod products;
pub mod repo;
pub mod stock;
pub mod transitions;

pub use expiry::ExpireOrders;
pub use http::router;
pub use model::{EndedOrder, OrderItemView, OrderRow, OrderStatus, OrderView};
pub use repo::{OrderError, create_cart_order_tx, create_hold_order_tx, load_order};
pub use stock::StockWay;
pub use transitions::{cancel_order_tx, commit_reserved_stock_tx, expire_order_tx, mark_paid_tx};

use crate::platform::auth::Auth;
use crate::platform::idempotency::Idempotency;
use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use serde::Deserialize;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Everything the orders domain's handlers and jobs use; the app layer builds it and handlers
/// take it with `State<OrdersState>` (axum `FromRef`). Cheap to clone (one `Arc`: axum clones
/// the state for every request).
#[derive(Clone)]
pub struct OrdersState(Arc<Inner>);

impl OrdersState {
    pub fn new(inner: Inner) -> Self {
        Self(Arc::new(inner))
    }
}

impl std::ops::Deref for OrdersState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

pub struct Inner {
    pub pool: PgPool,
    /// The one-statement cart orders' connections (`platform::db::checkout_statements`).
    pub statements: crate::platform::kept::KeptPool,
    pub redis: Redis,
    pub auth: Auth,
    /// Idempotency keys of `POST /api/orders`.
    pub idempotency: Idempotency,
    pub settings: Arc<OrderSettings>,
    pub metrics: Arc<CommerceMetrics>,
    /// The process-wide `refusals_total{code}` (client-facing refusals of every domain).
    pub refusals: IntCounterVec,
    /// SKUs known to exist, with their event (cart writes skip the Postgres lookup).
    pub catalog: Arc<products::Catalog>,
    /// One-line cart orders of a hot SKU, coalesced into one statement ([`batcher`]).
    pub batcher: batcher::Batcher,
}

impl axum::extract::FromRef<OrdersState> for Auth {
    fn from_ref(state: &OrdersState) -> Self {
        state.auth.clone()
    }
}

/// The background jobs of this domain: order expiry and the flash-gate reconcile. Each is
/// safe on many instances (`FOR UPDATE SKIP LOCKED`, or idempotent `SET`s).
pub fn jobs(state: &OrdersState) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(ExpireOrders::new(
            state.pool.clone(),
            state.redis.clone(),
            state.metrics.clone(),
            &state.settings,
        )),
        Arc::new(flash::ReconcileGates {
            pool: state.pool.clone(),
            redis: state.redis.clone(),
            period: Duration::from_millis(state.settings.flash_reconcile_interval_ms.max(500)),
        }),
    ]
}

/// Runs the expiry job once now (tests and ops): ends every due `PENDING_PAYMENT` order and
/// returns how many it expired.
pub async fn expire_due(state: &OrdersState) -> anyhow::Result<u64> {
    ExpireOrders::new(
        state.pool.clone(),
        state.redis.clone(),
        state.metrics.clone(),
        &state.settings,
    )
    .expire_due()
    .await
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
    /// Longest a process serves a cached cart price without a catalogue version change
    /// (bounds a change whose version write failed; `products::catalog`).
    pub cart_price_max_age_ms: u64,
    /// Most one-line cart orders of one SKU in one statement (`batcher`); below 2, every order
    /// runs on its own.
    pub batch_max: u32,
    /// Statements one process runs at once for one SKU's batches: an order waits only when
    /// this many are running.
    pub batch_concurrency: u32,
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
            cart_price_max_age_ms: 10_000,
            batch_max: 64,
            batch_concurrency: 2,
        }
    }
}

/// Metrics of carts, orders and the flash gate (registered on booking's registry).
pub struct CommerceMetrics {
    /// Order transactions (or one-statement cart orders) started against Postgres (each
    /// retry counts).
    pub order_db_transactions: IntCounter,
    /// Order lifecycle: created, replayed, expired, refused.
    pub orders: IntCounterVec,
    /// Flash-gate answers: admitted, retry, ungated, refused.
    pub flash_gate: IntCounterVec,
    /// Cart operations: get, put, delete.
    pub cart_ops: IntCounterVec,
    /// Cart orders tried as one statement (`repo::one_statement`), by outcome: created;
    /// short (answered `409` by the statement); busy (every row busy, tried again waiting
    /// for one); not_served (the full transaction ran); stale_prices (likewise, and the
    /// prices were forgotten); read_prices (the prices were read first: this process had not
    /// seen a line's SKU).
    pub one_statement_orders: IntCounterVec,
    /// Batch statements of one-line cart orders (`batcher`), and the orders sent in them: their
    /// ratio is the mean batch size.
    pub order_batches: IntCounter,
    pub batched_orders: IntCounter,
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
        let one_statement_orders = IntCounterVec::new(
            Opts::new(
                "cart_order_one_statement_total",
                "Cart orders tried as one statement, by outcome",
            ),
            &["outcome"],
        )?;
        let order_batches = IntCounter::new(
            "cart_order_batches_total",
            "Batch statements of one-line cart orders of one SKU",
        )?;
        let batched_orders = IntCounter::new(
            "cart_order_batched_total",
            "Cart orders sent in batch statements (whatever each one's outcome)",
        )?;
        registry.register(Box::new(order_batches.clone()))?;
        registry.register(Box::new(batched_orders.clone()))?;
        registry.register(Box::new(order_db_transactions.clone()))?;
        registry.register(Box::new(orders.clone()))?;
        // Exported at 0 from startup (the dashboard's orders/min reads `created`).
        for event in ["created", "replayed", "cancelled"] {
            orders.with_label_values(&[event]);
        }
        registry.register(Box::new(flash_gate.clone()))?;
        registry.register(Box::new(cart_ops.clone()))?;
        registry.register(Box::new(one_statement_orders.clone()))?;
        Ok(Self {
            order_db_transactions,
            orders,
            flash_gate,
            cart_ops,
            one_statement_orders,
            order_batches,
            batched_orders,
        })
    }
}
