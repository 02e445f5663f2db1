//! `POST /api/orders` and `GET /api/orders/{id}`; with `http/errors.rs`, the one place where the
//! orders domain's errors become HTTP answers.
//!
//! A cart order runs, in this order: the event check of every line (catalogue cache), the
//! flash gate (Redis only, so a sold-out rush never reaches Postgres), the order in Postgres
//! (`http/cart_order.rs`: one statement that also stores the key's answer, or the full
//! transaction whose first statement claims the key, [`idempotency::claim_tx`]; either way the
//! key commits with the order or not at all), and after the commit, best effort, the gate
//! settlement, the cart cleanup and the completed-order marker. An order from a hold is a transaction of two statements, the hold's pin and the
//! order's insert that also stores the key with its answer ([`KeyAnswer::Insert`]); a refusal
//! reads the key afterwards, so a retry of a request that made its order replays it.

use crate::orders::flash::{self, Gate};
use crate::orders::model::{
    AccountId, EventId, HoldId, OrderId, OrderKey, OrderRequest, OrderView, PricedSku,
    RequestedSource, Shortage, done_marker_suffix, gate_admission, request_record_ttl_s,
};
use crate::orders::repo::{
    During, KeyAnswer, OrderError, create_hold_order_tx, load_order, stored_answer,
};
use crate::orders::{OrdersState, cart, contacts, products};
use crate::platform::auth::Admitted;
use crate::platform::db::{self, MaybeRetryable};
use crate::platform::email::Email;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Fingerprint, IdempotencyKey, Replay};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::platform::session_until::SessionUntil;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use errors::insufficient;
use shared::error::codes;
use std::collections::BTreeMap;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod cart_order;
mod errors;
mod fans;

pub fn router() -> OpenApiRouter<OrdersState> {
    OpenApiRouter::new()
        .routes(routes!(create_order, fans::list_orders))
        .routes(routes!(get_order))
        .routes(routes!(fans::cancel_order))
}

/// The order request as the document states it: `{"source": "cart"}` or `{"hold_id"}`
/// (optionally with `"source": "hold"`); `OrderRequest::source` refuses anything else.
#[derive(ToSchema)]
#[serde(untagged)]
#[expect(
    dead_code,
    reason = "a schema only: the request's one-of in the document"
)]
enum OrderRequestDoc {
    Cart(FromCart),
    Hold(FromHold),
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "a schema only")]
struct FromCart {
    source: CartSource,
    /// Where the tickets are mailed once paid (optional). Stored only in Postgres.
    #[schema(required = false, max_length = 254, format = "email")]
    email: String,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "a schema only")]
struct FromHold {
    #[schema(required = false)]
    source: HoldSource,
    #[schema(min_length = 1, max_length = 64)]
    hold_id: String,
    /// Where the tickets are mailed once paid (optional). Stored only in Postgres.
    #[schema(required = false, max_length = 254, format = "email")]
    email: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[expect(dead_code, reason = "a schema only")]
enum CartSource {
    Cart,
}

#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[expect(dead_code, reason = "a schema only")]
enum HoldSource {
    Hold,
}

/// How long this request's gate admissions and done marker live.
fn record_ttl_s(state: &OrdersState) -> u64 {
    request_record_ttl_s(state.idempotency.settings.retention_h)
}

/// Order a hold or the cart (reserves inventory; idempotent)
#[utoipa::path(post, path = "/api/orders", tag = tags::ORDERS,
    params(doc::IdempotencyKey),
    request_body = inline(OrderRequestDoc),
    responses(
        (status = 201, description = "Created", body = OrderView),
        (status = 200, description = "The first answer, replayed", body = OrderView,
            headers(("Idempotent-Replayed" = String, description = "a replay of the first answer"))),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 429, response = doc::RateLimited),
        (status = 503, response = doc::Unavailable),
    ))]
#[tracing::instrument(skip_all, fields(account = %admitted.account()))]
async fn create_order(
    State(state): State<OrdersState>,
    admitted: Admitted,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> ApiResult<Response> {
    let fingerprint = Fingerprint::of_json(&Method::POST, "/api/orders", &body);
    let mut req: OrderRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::validation(format!("invalid request body: {e}")))?;
    // Checked before anything is written: a refused address creates nothing.
    let email = req
        .email
        .take()
        .map(|raw| Email::parse(&raw))
        .transpose()
        .map_err(|e| ApiError::validation(e.to_string()).with("field", "email"))?;
    let source = req.source().ok_or_else(|| {
        ApiError::validation(r#"body must be {"source": "cart"} or {"hold_id": "..."}"#)
    })?;
    let order_id = shared::ids::new_id();
    if let Some(email) = &email {
        contacts::store(&state.pool, &order_id, email).await?;
    }
    let result = match source {
        RequestedSource::Cart => {
            create_from_cart(&state, &admitted, &key, &fingerprint, &order_id).await
        }
        RequestedSource::Hold(hold_id) => {
            create_from_hold(
                &state,
                &admitted,
                &key,
                &fingerprint,
                HoldId::new(&hold_id),
                &order_id,
            )
            .await
        }
    };
    // Only a `201` made the order `order_id`; a replay answers an earlier order, a refusal
    // made none.
    if email.is_some() && !matches!(&result, Ok(r) if r.status() == StatusCode::CREATED) {
        contacts::discard(&state.pool, &order_id).await;
    }
    if let Err(e) = &result
        && e.status() == StatusCode::CONFLICT
    {
        state.refusals.with_label_values(&[e.code()]).inc();
    }
    result
}

/// Takes flash-gate slots for the hot lines (sorted). Returns the SKUs whose slot this
/// request took (release them unless the order commits). A refusal is answered without any
/// Postgres query, unless this key already produced an order (then it is replayed).
async fn gate_lines(
    state: &OrdersState,
    account: AccountId<'_>,
    key: OrderKey<'_>,
    admission: &str,
    lines: &BTreeMap<String, i64>,
) -> ApiResult<Vec<String>> {
    let mut taken = Vec::new();
    for (sku, &q) in lines {
        let gate = flash::acquire(&state.redis, sku, q, admission, record_ttl_s(state)).await;
        state
            .metrics
            .flash_gate
            .with_label_values(&[gate.label()])
            .inc();
        match gate {
            Gate::Admitted => taken.push(sku.clone()),
            Gate::Retry | Gate::Ungated => {}
            Gate::Refused { remaining } => {
                release_slots(state, &taken, admission).await;
                if done_marker_exists(state, account, key).await {
                    return Ok(Vec::new());
                }
                return Err(insufficient(sku, q, Shortage::of(remaining)));
            }
        }
    }
    Ok(taken)
}

async fn release_slots(state: &OrdersState, skus: &[String], admission: &str) {
    for sku in skus {
        flash::release(&state.redis, sku, admission).await;
    }
}

/// The completed marker's key (the account's hash tag, as the cart's key).
fn done_marker_key(state: &OrdersState, account: AccountId<'_>, key: OrderKey<'_>) -> String {
    state.redis.key(&done_marker_suffix(account, key))
}

/// "This key already produced an order": lets a retry through a gate that has since hit zero
/// (only consulted on a refusal). A missing or unreadable marker means "no".
async fn done_marker_exists(
    state: &OrdersState,
    account: AccountId<'_>,
    key: OrderKey<'_>,
) -> bool {
    let Ok(mut conn) = state.redis.conn().await else {
        return false;
    };
    redis::cmd("EXISTS")
        .arg(done_marker_key(state, account, key))
        .query_async::<bool>(&mut conn)
        .await
        .unwrap_or(false)
}

async fn create_from_cart(
    state: &OrdersState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    order_id: &str,
) -> ApiResult<Response> {
    let account = AccountId::new(admitted.account());
    let event = EventId::new(admitted.event());
    let order_key = OrderKey::new(key.as_str());
    let lines = cart::lines(&state.redis, account.as_str(), event.as_str()).await?;
    // One admission, one event, before the flash gate: a SKU of another event neither takes
    // nor is refused a gate slot. Cached, so no query on the hot path; the transaction checks
    // it again from the rows it reads.
    for sku in lines.keys() {
        if let Some(sku_event) = products::event_of(&state.catalog, &state.pool, sku).await? {
            admitted
                .opens(sku_event.as_deref())
                .map_err(|e| e.with("sku", sku.as_str()))?;
        }
    }
    let admission = gate_admission(account, order_key);
    // 1. The flash gate (Redis only), so a sold-out rush never reaches Postgres.
    let taken = gate_lines(state, account, order_key, &admission, &lines).await?;
    // 2. The order: one statement when it can (`repo::one_statement`), else the full
    // transaction (`create_cart_order`).
    let result = match cart_order::one_statement_order(
        state,
        order_id,
        account,
        event,
        order_key,
        fingerprint,
        &lines,
    )
    .await
    {
        Ok(Some(created)) => Ok(created),
        Ok(None) => {
            cart_order::transaction_order(state, order_id, account, event, key, fingerprint, &lines)
                .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(Created::Replay(stored)) => {
            release_slots(state, &taken, &admission).await;
            state.metrics.orders.with_label_values(&["replayed"]).inc();
            Ok(stored.into_response())
        }
        Ok(Created::Order(body, until, prices)) => {
            if let Some(prices) = prices {
                state.catalog.learn_order_prices(&prices);
            }
            state.metrics.orders.with_label_values(&["created"]).inc();
            // 3. After the commit, best effort and at once (each gate's slot on its SKU's
            // key, the cart and the marker on the account's): the gate slots are sold; the
            // ordered lines leave the cart; the completed marker lets a later retry with this
            // key through a gate that has since hit zero (only consulted on a refusal), even
            // if this order had no hot line.
            let settled = futures::future::join_all(
                taken
                    .iter()
                    .map(|sku| flash::settle(&state.redis, sku, &admission)),
            );
            let marker = done_marker_key(state, account, order_key);
            let cleared = cart::clear_ordered(
                &state.redis,
                account.as_str(),
                event.as_str(),
                &lines,
                &marker,
                record_ttl_s(state),
            );
            tokio::join!(settled, cleared);
            let resp = idempotency::respond(StatusCode::CREATED, body);
            Ok((SessionUntil(Some(until)), resp).into_response())
        }
        Err(e) => {
            release_slots(state, &taken, &admission).await;
            if matches!(e, OrderError::Shortage { .. }) && !taken.is_empty() {
                // The gate let through more than Postgres had: correct it now, before
                // answering, so the work is bound to this request (it cannot outlive the
                // process) and a retry meets the corrected gate.
                for sku in &taken {
                    if let Err(e) = flash::reconcile(&state.pool, &state.redis, sku).await {
                        tracing::warn!(error = ?e, sku, "flash gate reconcile after a shortage failed");
                    }
                }
            }
            Err(e.into())
        }
    }
}

/// What the order transaction ended with: a new order's body, or the stored answer of the
/// key's earlier order (the transaction rolled back).
enum Created {
    /// The body, the account's checkout end with the order, and the prices the full
    /// transaction read (for the next one-statement order).
    Order(Vec<u8>, i64, Option<BTreeMap<String, PricedSku>>),
    Replay(Replay),
}

async fn create_from_hold(
    state: &OrdersState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    hold_id: HoldId<'_>,
    order_id: &str,
) -> ApiResult<Response> {
    let account = AccountId::new(admitted.account());
    let settings = &*state.settings;
    let result = db::retry(settings.deadlock_retries, || async {
        state.metrics.order_db_transactions.inc();
        let mut tx = state
            .pool
            .begin()
            .await
            .during("begin the order transaction")?;
        // The pin, then the order with its key and stored answer in one statement: a
        // concurrent duplicate queues on the hold's row, finds it ordered, and replays below.
        let created = create_hold_order_tx(
            &mut tx,
            settings,
            OrderId::new(order_id),
            account,
            OrderKey::new(key.as_str()),
            hold_id,
            Some(EventId::new(admitted.event())),
            KeyAnswer::Insert {
                key: key.as_str(),
                fingerprint,
            },
        )
        .await;
        match created {
            Ok((_, body, until)) => {
                tx.commit().await.during("commit the order transaction")?;
                Ok::<_, OrderError>(Created::Order(body, until, None))
            }
            Err(e) if e.retryable() || matches!(e, OrderError::Db { .. }) => Err(e),
            // Refused (or the key taken): nothing of this attempt stays. A retry of a request
            // that made its order lands here (its hold is ordered) and gets that order back.
            Err(e) => {
                tx.rollback()
                    .await
                    .during("roll back the order transaction")?;
                let mut conn = state
                    .pool
                    .acquire()
                    .await
                    .during("read the Idempotency-Key")?;
                match stored_answer(&mut conn, account, key, fingerprint).await? {
                    Some(stored) => Ok(Created::Replay(stored)),
                    None => Err(e),
                }
            }
        }
    })
    .await?;
    match result {
        Created::Replay(stored) => Ok(stored.into_response()),
        Created::Order(body, until, _) => {
            state.metrics.orders.with_label_values(&["created"]).inc();
            let resp = idempotency::respond(StatusCode::CREATED, body);
            Ok((SessionUntil(Some(until)), resp).into_response())
        }
    }
}

/// One's own order
#[utoipa::path(get, path = "/api/orders/{id}", tag = tags::ORDERS,
    params(doc::IdPath),
    responses(
        (status = 200, description = "OK", body = OrderView),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
async fn get_order(
    State(state): State<OrdersState>,
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
