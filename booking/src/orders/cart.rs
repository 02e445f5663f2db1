//! The cart: one Redis hash per account and event (`cart:{account}:{event}`, SKU → quantity),
//! TTL 30 days refreshed on every write, at `/api/events/{event}/cart`.
//!
//! Guarantees:
//! - One admission, one event: every cart path needs an admission token of the path's event
//!   (`403 WRONG_EVENT` otherwise), and a SKU of another event (or of none) never enters the
//!   cart (`403 WRONG_EVENT`, nothing written). `/api/cart…` is an alias for the cart of the
//!   token's own event.
//! - Writes are absolute (`PUT` sets the quantity, `0` or `DELETE` removes the line), so every
//!   write is idempotent; two devices editing different SKUs never overwrite each other (each
//!   write touches only its own hash field).
//! - The line limit (default 100) is checked and applied in one Lua script, so concurrent adds
//!   cannot exceed it; the 101st line is `422 CART_FULL`.
//! - Prices are never stored in the cart: `GET` shows current prices from the per-process
//!   catalogue cache, which every product change invalidates in every process
//!   ([`catalog`]: one Redis round trip per read, no Postgres query while prices are
//!   unchanged); checkout recomputes them (and checks every SKU's event again, in its
//!   transaction).
//! - An unknown SKU is `404 UNKNOWN_SKU`; a quantity that is not an integer in
//!   `1..=max_line_quantity` (or 0 to remove) is `422`.

pub mod store;

pub use store::{CART_TTL_S, cart_key, clear_ordered, lines};

use crate::orders::OrdersState;
use crate::orders::products::{self, catalog};
use crate::orders::repo::OrderError;
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[expect(
    deprecated,
    reason = "the alias paths stay served (and documented as deprecated)"
)]
pub fn router() -> OpenApiRouter<OrdersState> {
    OpenApiRouter::new()
        .routes(routes!(get_event_cart))
        .routes(routes!(put_event_item, delete_event_item))
        // Alias kept for clients of the first release: the cart of the token's own event.
        .routes(routes!(get_cart))
        .routes(routes!(put_item, delete_item))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetQuantity {
    #[schema(minimum = 0, maximum = 99)]
    pub quantity: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CartItem)]
pub struct LineSet {
    pub sku: String,
    pub quantity: i64,
    /// Lines in the cart after the change.
    pub lines: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CartLine {
    pub sku: String,
    pub name: String,
    pub quantity: i64,
    /// Current unit price (minor units); the order snapshots the price at checkout.
    pub unit_price: i64,
    /// integer minor units
    pub amount: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Cart)]
pub struct CartView {
    pub lines: Vec<CartLine>,
    /// integer minor units
    pub total: i64,
    pub currency: String,
}

/// Set a line's quantity (0 removes)
#[utoipa::path(put, path = "/api/events/{event}/cart/items/{sku}", tag = tags::CART,
    params(doc::EventPath, doc::SkuPath),
    request_body = SetQuantity,
    responses(
        (status = 200, description = "OK", body = LineSet),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 503, response = doc::Unavailable),
    ))]
async fn put_event_item(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path((event, sku)): Path<(String, String)>,
    ApiJson(req): ApiJson<SetQuantity>,
) -> ApiResult<ApiJson<LineSet>> {
    admitted.for_event(&event)?;
    set_line(&state, &admitted, sku, req).await
}

/// Set a line's quantity (0 removes)
///
/// Alias of the event-scoped path for the token's own event.
#[utoipa::path(put, path = "/api/cart/items/{sku}", tag = tags::CART,
    operation_id = "put_item_deprecated",
    params(doc::SkuPath),
    request_body = SetQuantity,
    responses(
        (status = 200, description = "OK", body = LineSet),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 503, response = doc::Unavailable),
    ))]
#[deprecated = "the event-scoped path"]
async fn put_item(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path(sku): Path<String>,
    ApiJson(req): ApiJson<SetQuantity>,
) -> ApiResult<ApiJson<LineSet>> {
    set_line(&state, &admitted, sku, req).await
}

/// Sets a line of the cart of the token's event (the caller has checked the path's event).
async fn set_line(
    state: &OrdersState,
    admitted: &Admitted,
    sku: String,
    req: SetQuantity,
) -> ApiResult<ApiJson<LineSet>> {
    let settings = &state.settings;
    let max_q = i64::from(settings.max_line_quantity);
    if !(0..=max_q).contains(&req.quantity) {
        return Err(ApiError::validation(format!(
            "quantity must be an integer from 1 to {max_q} (0 removes the line)"
        ))
        .with("field", "quantity")
        .with("max", max_q));
    }
    // A product's event never changes once set, so this check cannot go stale; checkout
    // checks it again in its transaction anyway.
    match products::event_of(&state.catalog, &state.pool, &sku).await? {
        None => return Err(products::unknown_sku(&sku)),
        Some(event) => admitted
            .opens(event.as_deref())
            .map_err(|e| e.with("sku", sku.as_str()))?,
    }
    let lines = store::set_quantity(
        &state.redis,
        admitted.account(),
        admitted.event(),
        &sku,
        req.quantity,
        settings.max_cart_lines,
    )
    .await?;
    state.metrics.cart_ops.with_label_values(&["put"]).inc();
    let lines = lines.ok_or(OrderError::CartFull {
        max_lines: settings.max_cart_lines,
    })?;
    Ok(ApiJson(LineSet {
        sku,
        quantity: req.quantity,
        lines,
    }))
}

/// Remove a line (also when absent)
#[utoipa::path(delete, path = "/api/events/{event}/cart/items/{sku}", tag = tags::CART,
    params(doc::EventPath, doc::SkuPath),
    responses(
        (status = 204, description = "Done, no body"),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
async fn delete_event_item(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path((event, sku)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    admitted.for_event(&event)?;
    remove_line(&state, &admitted, &sku).await
}

/// Remove a line (also when absent)
///
/// Alias of the event-scoped path for the token's own event.
#[utoipa::path(delete, path = "/api/cart/items/{sku}", tag = tags::CART,
    params(doc::SkuPath),
    responses(
        (status = 204, description = "Done, no body"),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
#[deprecated = "the event-scoped path"]
async fn delete_item(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path(sku): Path<String>,
) -> ApiResult<StatusCode> {
    remove_line(&state, &admitted, &sku).await
}

async fn remove_line(state: &OrdersState, admitted: &Admitted, sku: &str) -> ApiResult<StatusCode> {
    // Removing a line that is not there is fine (idempotent); no product lookup needed.
    store::remove(&state.redis, admitted.account(), admitted.event(), sku).await?;
    state.metrics.cart_ops.with_label_values(&["delete"]).inc();
    Ok(StatusCode::NO_CONTENT)
}

/// The cart at current prices
#[utoipa::path(get, path = "/api/events/{event}/cart", tag = tags::CART,
    params(doc::EventPath),
    responses(
        (status = 200, description = "OK", body = CartView),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
async fn get_event_cart(
    State(state): State<OrdersState>,
    admitted: Admitted,
    Path(event): Path<String>,
) -> ApiResult<ApiJson<CartView>> {
    admitted.for_event(&event)?;
    show_cart(&state, &admitted).await
}

/// The cart at current prices
///
/// Alias of the event-scoped path for the token's own event.
#[utoipa::path(get, path = "/api/cart", tag = tags::CART,
    responses(
        (status = 200, description = "OK", body = CartView),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
#[deprecated = "the event-scoped path"]
async fn get_cart(
    State(state): State<OrdersState>,
    admitted: Admitted,
) -> ApiResult<ApiJson<CartView>> {
    show_cart(&state, &admitted).await
}

/// One Redis round trip (the cart and the catalogue's version); Postgres only for SKUs whose
/// price this process has not cached under the current version.
async fn show_cart(state: &OrdersState, admitted: &Admitted) -> ApiResult<ApiJson<CartView>> {
    let (lines, version) =
        store::lines_and_version(&state.redis, admitted.account(), admitted.event()).await?;
    state.metrics.cart_ops.with_label_values(&["get"]).inc();
    let prices = &state.catalog.prices;
    let max_age = Duration::from_millis(state.settings.cart_price_max_age_ms);
    let (mut found, missing) = prices.lookup(
        version.as_deref(),
        max_age,
        lines.keys().map(String::as_str),
    );
    if !missing.is_empty() {
        let read = catalog::read(&state.pool, &missing).await?;
        prices.fill(version.as_deref(), &read);
        found.extend(read.into_iter().map(|p| (p.sku.clone(), p)));
    }
    let mut view = CartView {
        lines: Vec::with_capacity(lines.len()),
        total: 0,
        currency: state.settings.currency.clone(),
    };
    for (sku, quantity) in lines {
        // Only this event's products (a line of another event could only come from a bug).
        let Some(p) = found
            .get(&sku)
            .filter(|p| p.event.as_deref() == Some(admitted.event()))
        else {
            continue;
        };
        let amount = p.price.saturating_mul(quantity);
        view.total = view.total.saturating_add(amount);
        view.lines.push(CartLine {
            sku,
            name: p.name.clone(),
            quantity,
            unit_price: p.price,
            amount,
        });
    }
    Ok(ApiJson(view))
}
