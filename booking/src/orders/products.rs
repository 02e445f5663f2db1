//! Products and their stock: the admin API (`POST /admin/products`, `PUT`/`GET
//! /admin/products/{sku}`) and a per-process catalogue cache for the cart.
//!
//! Guarantees:
//! - Every product belongs to one event (`event`, required on creation, `422 UNKNOWN_EVENT`
//!   when booking has no such event). Carts and orders only take it with an admission token
//!   of that event. A product's event never changes once set; a product created before
//!   events were required has none (no token opens it) until `PUT` assigns one.
//! - Stock lives in `inventory` (available/reserved/sold) with `CHECK (available >= 0)`, split
//!   over `stock_shards` rows (default 1, at most 64, settable on update; see
//!   [`super::stock`]) and summed for every read; every change is one conditional statement on
//!   the locked rows, never read-then-write in Rust.
//! - `stock` is the **total** number of units (available + reserved + sold). Setting it is an
//!   absolute (idempotent) change computed on the locked row: `available = stock - reserved -
//!   sold`, refused with `409` when fewer than the units already reserved or sold.
//! - Setting `hot` (or changing the stock of a hot SKU) reconciles the flash-sale gate from
//!   Postgres after the commit; clearing it removes the gate.
//! - Products are never deleted and their event never changes once set, so the catalogue's
//!   "this SKU exists in event E" cannot go stale; names and prices can, and every change of
//!   them invalidates the cart's price cache in every process ([`catalog`]).

pub mod catalog;
pub mod repo;

use crate::orders::model::PricedSku;
use crate::orders::repo::{During, OrderError};
use crate::orders::stock::MAX_STOCK_SHARDS;
use crate::orders::{OrdersState, flash};
use crate::platform::audit::Viewer;
use crate::platform::audit::{self, AdminCaller};
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use shared::error::codes;
use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Largest accepted price (minor units) and stock, to keep sums far from overflow.
pub const MAX_PRICE: i64 = 1_000_000_000_000;
pub const MAX_STOCK: i64 = 1_000_000_000;
/// Entries kept in the catalogue cache before it is reset.
const CATALOG_CACHE_MAX: usize = 200_000;

pub fn router() -> OpenApiRouter<OrdersState> {
    OpenApiRouter::new()
        .routes(routes!(create_product))
        .routes(routes!(get_product, update_product))
        .routes(routes!(reconcile_gate))
}

/// SKU syntax (same rule as the `products.sku` CHECK): 1-64 of `[A-Za-z0-9._-]`, starting
/// with a letter or digit.
pub fn valid_sku(sku: &str) -> bool {
    let b = sku.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// SKU -> event of the products known to exist. Products are never deleted and a product's
/// event never changes once set, so an entry never goes stale; products without an event and
/// misses are not cached (they always ask Postgres).
#[derive(Default)]
pub struct Catalog {
    known: RwLock<HashMap<String, String>>,
    /// Names and prices for the cart, valid for one catalogue version ([`catalog`]).
    pub prices: catalog::Prices,
    /// Name, price and event of each SKU as this process's last full order transaction read
    /// them: what a one-statement order builds its body from (`repo::one_statement`), which
    /// the statement checks against the products, so an entry may be stale without harm.
    ordered: RwLock<HashMap<String, PricedSku>>,
}

impl Catalog {
    fn event_of(&self, sku: &str) -> Option<String> {
        self.known.read().ok()?.get(sku).cloned()
    }

    /// The prices of every SKU of `lines` as last read by an order, or `None` when one is
    /// missing.
    pub fn order_prices<'a>(
        &self,
        skus: impl Iterator<Item = &'a String>,
    ) -> Option<BTreeMap<String, PricedSku>> {
        let known = self.ordered.read().ok()?;
        skus.map(|sku| Some((sku.clone(), known.get(sku)?.clone())))
            .collect()
    }

    /// Remembers prices an order transaction read.
    pub fn learn_order_prices(&self, prices: &BTreeMap<String, PricedSku>) {
        if let Ok(mut s) = self.ordered.write() {
            if s.len() + prices.len() > CATALOG_CACHE_MAX {
                s.clear();
            }
            for (sku, p) in prices {
                s.insert(sku.clone(), p.clone());
            }
        }
    }

    /// Forgets the order prices of `skus` (a one-statement order found them stale).
    pub fn forget_order_prices<'a>(&self, skus: impl Iterator<Item = &'a String>) {
        if let Ok(mut s) = self.ordered.write() {
            for sku in skus {
                s.remove(sku);
            }
        }
    }

    fn insert(&self, sku: &str, event: &str) {
        if let Ok(mut s) = self.known.write() {
            if s.len() >= CATALOG_CACHE_MAX {
                s.clear();
            }
            s.insert(sku.to_owned(), event.to_owned());
        }
    }
}

/// The event of product `sku` (cached in `catalog`): `None` when there is no such product,
/// `Some(None)` for a product that has no event yet.
pub async fn event_of(
    catalog: &Catalog,
    pool: &sqlx::PgPool,
    sku: &str,
) -> Result<Option<Option<String>>, OrderError> {
    if !valid_sku(sku) {
        return Ok(None);
    }
    if let Some(event) = catalog.event_of(sku) {
        return Ok(Some(Some(event)));
    }
    let found: Option<Option<String>> =
        sqlx::query_scalar("SELECT event_id FROM products WHERE sku = $1")
            .bind(sku)
            .fetch_optional(pool)
            .await
            .during("read the product's event")?;
    if let Some(Some(event)) = &found {
        catalog.insert(sku, event);
    }
    Ok(found)
}

/// `422 UNKNOWN_EVENT` for an `event` field naming no event booking knows.
pub fn unknown_event_field(event: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::UNKNOWN_EVENT,
        "no such event; create it with POST /admin/events first",
    )
    .with("field", "event")
    .with("event", event)
}

/// True when booking has event `event` (for the `event` field of a new product or auction).
pub async fn event_exists<'c>(conn: impl sqlx::PgExecutor<'c>, event: &str) -> ApiResult<bool> {
    Ok(repo::event_known(conn, event).await?)
}

pub fn unknown_sku(sku: &str) -> ApiError {
    ApiError::not_found(codes::UNKNOWN_SKU, "no such product").with("sku", sku)
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateProduct)]
pub struct NewProduct {
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    pub sku: String,
    /// The event this product is sold in (must exist).
    pub event: String,
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    /// integer minor units
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    pub price: i64,
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub stock: i64,
    #[serde(default)]
    pub hot: bool,
    /// Rows the stock is split over (1 to [`MAX_STOCK_SHARDS`]); more rows let more orders
    /// of a hot SKU commit at once.
    #[serde(default = "one_shard")]
    #[schema(minimum = 1, maximum = 64, default = 1)]
    pub stock_shards: i32,
}

fn one_shard() -> i32 {
    1
}

/// `PUT /admin/products/{sku}`: every field optional, every field absolute.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateProduct)]
pub struct ProductUpdate {
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: Option<String>,
    /// integer minor units
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    pub price: Option<i64>,
    /// Total units (available + reserved + sold).
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub stock: Option<i64>,
    pub hot: Option<bool>,
    /// Assigns the event of a product that has none (created before events were required);
    /// the same event again is a no-op, another event `409`.
    pub event: Option<String>,
    /// Rows the stock is split over; the available units are spread over them again.
    #[schema(minimum = 1, maximum = 64)]
    pub stock_shards: Option<i32>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, ToSchema)]
#[schema(as = Product)]
pub struct ProductView {
    pub sku: String,
    /// `null` only for a product created before events were required.
    pub event: Option<String>,
    pub name: String,
    /// integer minor units
    pub price: i64,
    pub hot: bool,
    pub stock_shards: i32,
    /// Summed over the stock's shard rows, like `available`, `reserved` and `sold`.
    pub stock: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

fn validate_name(name: &str) -> ApiResult<()> {
    if name.trim().is_empty() || name.chars().count() > 200 {
        return Err(ApiError::validation("name must be 1 to 200 characters").with("field", "name"));
    }
    Ok(())
}

fn validate_price(price: i64) -> ApiResult<()> {
    if !(0..=MAX_PRICE).contains(&price) {
        return Err(ApiError::validation(format!(
            "price must be an integer amount in minor units between 0 and {MAX_PRICE}"
        ))
        .with("field", "price"));
    }
    Ok(())
}

fn validate_stock(stock: i64) -> ApiResult<()> {
    if !(0..=MAX_STOCK).contains(&stock) {
        return Err(
            ApiError::validation(format!("stock must be between 0 and {MAX_STOCK}"))
                .with("field", "stock"),
        );
    }
    Ok(())
}

fn validate_shards(shards: i32) -> ApiResult<()> {
    if !(1..=MAX_STOCK_SHARDS).contains(&shards) {
        return Err(ApiError::validation(format!(
            "stock_shards must be between 1 and {MAX_STOCK_SHARDS}"
        ))
        .with("field", "stock_shards"));
    }
    Ok(())
}

/// Create a product of an event
#[utoipa::path(post, path = "/admin/products", tag = tags::PRODUCTS, security(("admin" = ["admin"])),
    request_body = NewProduct,
    responses(
        (status = 201, description = "Created", body = ProductView),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
#[tracing::instrument(skip_all, fields(sku = %req.sku))]
async fn create_product(
    actor: AdminCaller,
    State(state): State<OrdersState>,
    ApiJson(req): ApiJson<NewProduct>,
) -> ApiResult<impl IntoResponse> {
    if !valid_sku(&req.sku) {
        return Err(ApiError::validation(
            "sku must be 1 to 64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit",
        )
        .with("field", "sku"));
    }
    validate_name(&req.name)?;
    validate_price(req.price)?;
    validate_stock(req.stock)?;
    validate_shards(req.stock_shards)?;
    let mut tx = state
        .pool
        .begin()
        .await
        .during("begin the product transaction")?;
    repo::create_tx(&mut tx, &req).await?;
    let detail = serde_json::to_value(&req).map_err(OrderError::Serialize)?;
    audit::insert_tx(
        &mut tx,
        &actor,
        "product.create",
        &format!("product:{}", req.sku),
        Some(&req.event),
        &detail,
    )
    .await
    .during("record the audit entry")?;
    tx.commit().await.during("commit the product transaction")?;
    state.catalog.insert(&req.sku, &req.event);
    if req.hot {
        flash::reconcile(&state.pool, &state.redis, &req.sku).await?;
    }
    let view = repo::load(&state.pool, &req.sku)
        .await?
        .ok_or_else(|| ApiError::unexpected(anyhow::anyhow!("product vanished after insert")))?;
    Ok((StatusCode::CREATED, ApiJson(view)))
}

/// Change a product (absolute values)
#[utoipa::path(put, path = "/admin/products/{sku}", tag = tags::PRODUCTS, security(("admin" = ["admin"])),
    params(doc::SkuPath),
    request_body = ProductUpdate,
    responses(
        (status = 200, description = "OK", body = ProductView),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
#[tracing::instrument(skip_all, fields(sku = %sku))]
async fn update_product(
    actor: AdminCaller,
    State(state): State<OrdersState>,
    Path(sku): Path<String>,
    ApiJson(req): ApiJson<ProductUpdate>,
) -> ApiResult<ApiJson<ProductView>> {
    if let Some(name) = &req.name {
        validate_name(name)?;
    }
    if let Some(price) = req.price {
        validate_price(price)?;
    }
    if let Some(stock) = req.stock {
        validate_stock(stock)?;
    }
    if let Some(shards) = req.stock_shards {
        validate_shards(shards)?;
    }
    if !valid_sku(&sku) {
        return Err(unknown_sku(&sku));
    }
    // Retried on deadlock: spreading the stock locks all the SKU's rows while orders take
    // theirs (an order waiting for a row can keep a row it re-checked and passed over).
    db::retry(3, || async {
        let mut tx = state
            .pool
            .begin()
            .await
            .during("begin the product transaction")?;
        repo::update_tx(&mut tx, &sku, &req).await?;
        let detail = serde_json::to_value(&req).map_err(OrderError::Serialize)?;
        audit::insert_tx(
            &mut tx,
            &actor,
            "product.update",
            &format!("product:{sku}"),
            None,
            &detail,
        )
        .await
        .during("record the audit entry")?;
        tx.commit().await.during("commit the product transaction")
    })
    .await?;
    if req.name.is_some() || req.price.is_some() || req.event.is_some() {
        catalog::changed(&state.redis, &state.catalog.prices).await;
    }
    let view = repo::load(&state.pool, &sku)
        .await?
        .ok_or_else(|| unknown_sku(&sku))?;
    // Keep the gate in step with Postgres (outside the transaction: Redis is not part of it).
    if view.hot && (req.hot == Some(true) || req.stock.is_some() || req.stock_shards.is_some()) {
        flash::reconcile(&state.pool, &state.redis, &sku).await?;
    } else if req.hot == Some(false) {
        flash::remove(&state.redis, &sku).await?;
    }
    Ok(ApiJson(view))
}

/// A product with its stock summed over its rows
#[utoipa::path(get, path = "/admin/products/{sku}", tag = tags::PRODUCTS, security(("admin" = ["viewer"])),
    params(doc::SkuPath),
    responses(
        (status = 200, description = "OK", body = ProductView),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
async fn get_product(
    _caller: Viewer,
    State(state): State<OrdersState>,
    Path(sku): Path<String>,
) -> ApiResult<ApiJson<ProductView>> {
    if !valid_sku(&sku) {
        return Err(unknown_sku(&sku));
    }
    repo::load(&state.pool, &sku)
        .await?
        .map(ApiJson)
        .ok_or_else(|| unknown_sku(&sku))
}

#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the reconcile answer (built with `json!`)"
)]
struct Reconciled {
    sku: String,
    #[schema(required = false)]
    gate: Option<i64>,
}

/// Reset the flash gate from Postgres
///
/// Resets the flash gate of `sku` from Postgres (ops and tests).
#[utoipa::path(post, path = "/admin/products/{sku}/flash/reconcile", tag = tags::PRODUCTS,
    security(("admin" = ["admin"])),
    params(doc::SkuPath),
    responses(
        (status = 200, description = "OK", body = inline(Reconciled)),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
async fn reconcile_gate(
    actor: AdminCaller,
    State(state): State<OrdersState>,
    Path(sku): Path<String>,
) -> ApiResult<impl IntoResponse> {
    if !valid_sku(&sku) {
        return Err(unknown_sku(&sku));
    }
    // Unknown products are not reset (nor audited): the gate of a SKU that never existed.
    let event: Option<Option<String>> =
        sqlx::query_scalar("SELECT event_id FROM products WHERE sku = $1")
            .bind(&sku)
            .fetch_optional(&state.pool)
            .await
            .during("read the product of the flash gate")?;
    let Some(event) = event else {
        return Err(unknown_sku(&sku));
    };
    // The value before, for the audit entry only (a reset is how ops repair a drifted gate).
    let before = flash::current(&state.redis, &sku).await.ok().flatten();
    let gate = flash::reconcile(&state.pool, &state.redis, &sku).await?;
    let mut conn = state
        .pool
        .acquire()
        .await
        .during("connect to record the flash gate reset")?;
    audit::insert_tx(
        &mut conn,
        &actor,
        "product.flash_gate.reset",
        &format!("product:{sku}"),
        event.as_deref(),
        &serde_json::json!({"before": before, "gate": gate}),
    )
    .await
    .during("record the audit entry")?;
    Ok(ApiJson(serde_json::json!({"sku": sku, "gate": gate})))
}
