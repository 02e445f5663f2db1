//! `POST /api/orders` and `GET /api/orders/{id}`, and the one place where the orders domain's
//! errors become HTTP answers ([`From<OrderError> for ApiError`](OrderError)).
//!
//! A cart order runs, in this order: the event check of every line (catalogue cache), the
//! flash gate (Redis only, so a sold-out rush never reaches Postgres), the idempotency claim,
//! one Postgres transaction retried from the top on deadlock, and after the commit, best
//! effort, the gate settlement, the cart cleanup and the completed-order marker.

use crate::orders::flash::{self, Gate};
use crate::orders::model::{
    AccountId, EventId, HoldId, OrderId, OrderKey, OrderRequest, OrderView, RequestedSource,
    Shortage, done_marker_suffix, gate_admission, request_record_ttl_s,
};
use crate::orders::repo::{
    During, OrderError, complete_claim_tx, create_cart_order_tx, create_hold_order_tx, load_order,
};
use crate::orders::{OrdersState, cart, products};
use crate::platform::auth::Admitted;
use crate::platform::db::{self, TxError, is_retryable};
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use shared::error::codes;
use std::collections::BTreeMap;

pub fn router() -> Router<OrdersState> {
    Router::new()
        .route("/api/orders", post(create_order))
        .route("/api/orders/{id}", get(get_order))
}

impl From<OrderError> for ApiError {
    fn from(e: OrderError) -> Self {
        match e {
            OrderError::CartEmpty => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::CART_EMPTY,
                "the cart is empty",
            ),
            OrderError::CartFull { max_lines } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::CART_FULL,
                format!("a cart holds at most {max_lines} different products"),
            )
            .with("max_lines", max_lines),
            OrderError::UnknownSku(sku) => products::unknown_sku(&sku),
            OrderError::ProductExists(sku) => ApiError::conflict(
                codes::PRODUCT_EXISTS,
                "a product with this sku already exists; use PUT /admin/products/{sku}",
            )
            .with("sku", sku),
            OrderError::UnknownEvent(event) => products::unknown_event_field(&event),
            OrderError::EventLocked { current } => ApiError::conflict(
                codes::CONFLICT,
                "a product's event cannot be changed once set",
            )
            .with("field", "event")
            .with("event", current),
            OrderError::StockBelowCommitted { committed } => ApiError::conflict(
                codes::CONFLICT,
                "stock cannot be lower than the units already reserved or sold",
            )
            .with("reserved_or_sold", committed),
            OrderError::WrongEvent { sku: Some(sku) } => {
                ApiError::wrong_event().with("sku", sku.as_str())
            }
            OrderError::WrongEvent { sku: None } => ApiError::wrong_event(),
            OrderError::Shortage {
                sku,
                requested,
                shortage,
            } => insufficient(&sku, requested, shortage),
            OrderError::Overflow => ApiError::validation("order total is too large"),
            OrderError::HoldNotActive { hold_id } => ApiError::conflict(
                codes::HOLD_EXPIRED,
                "the hold is not active: it expired, was released, is already ordered, or is not yours",
            )
            .with("hold_id", hold_id),
            OrderError::KeyReused => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was already used for another order",
            ),
            OrderError::ClaimLost(e) | OrderError::RedisUnavailable(e) => e,
            // Through the platform's mappings, so an unreachable database or Redis stays a
            // `503`; the statement or command is added to the logged cause.
            OrderError::Db { statement, source } => {
                with_context(ApiError::from(source), format!("failed to {statement}"))
            }
            OrderError::Redis { op, source } => {
                with_context(ApiError::from(source), format!("failed to {op}"))
            }
            OrderError::Serialize(e) => ApiError::unexpected(e),
        }
    }
}

/// For callers outside this domain whose transactions speak `TxError` (the payment flow):
/// a retryable database error stays visible to `db::retry`, anything else is its HTTP answer.
impl From<OrderError> for TxError {
    fn from(e: OrderError) -> Self {
        match e {
            OrderError::Db { source, .. } if is_retryable(&source) => TxError::Db(source),
            other => TxError::Api(other.into()),
        }
    }
}

fn with_context(e: ApiError, context: String) -> ApiError {
    match e {
        ApiError::Unavailable(e) => ApiError::Unavailable(e.context(context)),
        ApiError::Unexpected(e) => ApiError::Unexpected(e.context(context)),
        client => client,
    }
}

fn insufficient(sku: &str, requested: i64, shortage: Shortage) -> ApiError {
    let (code, message) = match shortage {
        Shortage::SoldOut => (codes::SOLD_OUT, "this product is sold out"),
        Shortage::Insufficient { .. } => (
            codes::INSUFFICIENT_STOCK,
            "not enough stock for the requested quantity",
        ),
    };
    ApiError::conflict(code, message)
        .with("sku", sku)
        .with("requested", requested)
        .with("available", shortage.available())
}

/// How long this request's gate admissions and done marker live.
fn record_ttl_s(state: &OrdersState) -> u64 {
    request_record_ttl_s(state.idempotency.settings.retention_h)
}

#[tracing::instrument(skip_all, fields(account = %admitted.account()))]
async fn create_order(
    State(state): State<OrdersState>,
    admitted: Admitted,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> ApiResult<Response> {
    let fingerprint = Fingerprint::of_json(&Method::POST, "/api/orders", &body);
    let req: OrderRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::validation(format!("invalid request body: {e}")))?;
    let source = req.source().ok_or_else(|| {
        ApiError::validation(r#"body must be {"source": "cart"} or {"hold_id": "..."}"#)
    })?;
    let result = match source {
        RequestedSource::Cart => create_from_cart(&state, &admitted, &key, &fingerprint).await,
        RequestedSource::Hold(hold_id) => {
            create_from_hold(&state, &admitted, &key, &fingerprint, HoldId::new(&hold_id)).await
        }
    };
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
        .arg(state.redis.key(&done_marker_suffix(account, key)))
        .query_async::<bool>(&mut conn)
        .await
        .unwrap_or(false)
}

async fn set_done_marker(state: &OrdersState, account: AccountId<'_>, key: OrderKey<'_>) {
    let res: Result<(), OrderError> = async {
        let mut conn = state
            .redis
            .conn()
            .await
            .map_err(OrderError::RedisUnavailable)?;
        redis::cmd("SET")
            .arg(state.redis.key(&done_marker_suffix(account, key)))
            .arg(1)
            .arg("EX")
            .arg(record_ttl_s(state))
            .query_async::<()>(&mut conn)
            .await
            .during("set the completed-order marker")
    }
    .await;
    if let Err(e) = res {
        tracing::debug!(error = ?e, "could not record the completed-order marker");
    }
}

async fn create_from_cart(
    state: &OrdersState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
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
    // 2. The idempotency claim, before any inventory is touched.
    let claim =
        match idempotency::begin(&state.idempotency, account.as_str(), key, fingerprint).await {
            Ok(Begin::Started(claim)) => claim,
            Ok(Begin::Replay(stored)) => {
                release_slots(state, &taken, &admission).await;
                state.metrics.orders.with_label_values(&["replayed"]).inc();
                return Ok(stored.into_response());
            }
            Err(e) => {
                release_slots(state, &taken, &admission).await;
                return Err(e);
            }
        };
    // 3. One transaction, retried from the top on deadlock.
    let order_id = shared::ids::new_id();
    let settings = &*state.settings;
    let result = db::retry(settings.deadlock_retries, || async {
        state.metrics.order_db_transactions.inc();
        let mut tx = if settings.async_commit {
            state
                .pool
                .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
                .await
        } else {
            state.pool.begin().await
        }
        .during("begin the order transaction")?;
        let (_, body) = create_cart_order_tx(
            &mut tx,
            settings,
            OrderId::new(&order_id),
            account,
            event,
            order_key,
            &lines,
            Some(&claim),
        )
        .await?;
        tx.commit().await.during("commit the order transaction")?;
        Ok::<_, OrderError>(body)
    })
    .await;
    match result {
        Ok(body) => {
            state.metrics.orders.with_label_values(&["created"]).inc();
            // 4. After the commit, best effort: the gate slots are sold, the cart, the
            // completed marker.
            for sku in &taken {
                flash::settle(&state.redis, sku, &admission).await;
            }
            cart::clear_ordered(&state.redis, account.as_str(), event.as_str(), &lines).await;
            // Lets a later retry with this key through a gate that has since hit zero (only
            // consulted on a refusal), even if this order had no hot line.
            set_done_marker(state, account, order_key).await;
            Ok(idempotency::respond(StatusCode::CREATED, body))
        }
        Err(e) => {
            claim.release(&state.pool).await;
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

async fn create_from_hold(
    state: &OrdersState,
    admitted: &Admitted,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    hold_id: HoldId<'_>,
) -> ApiResult<Response> {
    let account = AccountId::new(admitted.account());
    let claim =
        match idempotency::begin(&state.idempotency, account.as_str(), key, fingerprint).await? {
            Begin::Started(claim) => claim,
            Begin::Replay(stored) => return Ok(stored.into_response()),
        };
    let order_id = shared::ids::new_id();
    let settings = &*state.settings;
    let result = db::retry(settings.deadlock_retries, || async {
        state.metrics.order_db_transactions.inc();
        let mut tx = state
            .pool
            .begin()
            .await
            .during("begin the order transaction")?;
        let view = create_hold_order_tx(
            &mut tx,
            settings,
            OrderId::new(&order_id),
            account,
            OrderKey::new(key.as_str()),
            hold_id,
            Some(EventId::new(admitted.event())),
        )
        .await?;
        let body = serde_json::to_vec(&view).map_err(OrderError::Serialize)?;
        complete_claim_tx(&mut tx, &claim, &body).await?;
        tx.commit().await.during("commit the order transaction")?;
        Ok::<_, OrderError>(body)
    })
    .await;
    match result {
        Ok(body) => {
            state.metrics.orders.with_label_values(&["created"]).inc();
            Ok(idempotency::respond(StatusCode::CREATED, body))
        }
        Err(e) => {
            claim.release(&state.pool).await;
            Err(e.into())
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Status, code and details of a client error (panics on a server error).
    fn client(e: ApiError) -> (u16, String, serde_json::Value) {
        match e {
            ApiError::Client { status, body, .. } => (
                status.as_u16(),
                body.code,
                serde_json::Value::Object(body.details),
            ),
            other => panic!("not a client error: {other:?}"),
        }
    }

    #[test]
    fn a_shortage_answers_409_with_what_is_really_left() {
        let short = |available| OrderError::Shortage {
            sku: "MUG".into(),
            requested: 5,
            shortage: Shortage::of(available),
        };
        assert_eq!(
            client(short(2).into()),
            (
                409,
                "INSUFFICIENT_STOCK".into(),
                json!({"sku": "MUG", "requested": 5, "available": 2})
            )
        );
        assert_eq!(
            client(short(-1).into()),
            (
                409,
                "SOLD_OUT".into(),
                json!({"sku": "MUG", "requested": 5, "available": 0})
            )
        );
    }

    #[test]
    fn domain_refusals_keep_their_codes() {
        let cases = [
            (OrderError::CartEmpty, 422, "CART_EMPTY"),
            (OrderError::CartFull { max_lines: 100 }, 422, "CART_FULL"),
            (OrderError::UnknownSku("X".into()), 404, "UNKNOWN_SKU"),
            (OrderError::WrongEvent { sku: None }, 403, "WRONG_EVENT"),
            (OrderError::Overflow, 422, "VALIDATION_FAILED"),
            (
                OrderError::HoldNotActive {
                    hold_id: "h".into(),
                },
                409,
                "HOLD_EXPIRED",
            ),
            (OrderError::KeyReused, 422, "IDEMPOTENCY_KEY_REUSED"),
            (OrderError::ProductExists("X".into()), 409, "PRODUCT_EXISTS"),
            (OrderError::UnknownEvent("e".into()), 422, "UNKNOWN_EVENT"),
            (
                OrderError::StockBelowCommitted { committed: 3 },
                409,
                "CONFLICT",
            ),
        ];
        for (e, status, code) in cases {
            let (s, c, _) = client(e.into());
            assert_eq!((s, c.as_str()), (status, code));
        }
    }

    #[test]
    fn an_unreachable_database_is_a_503_naming_the_statement() {
        let e: ApiError = OrderError::Db {
            statement: "insert the order",
            source: sqlx::Error::PoolTimedOut,
        }
        .into();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let ApiError::Unavailable(cause) = e else {
            panic!("not unavailable");
        };
        assert!(format!("{cause:#}").starts_with("failed to insert the order"));
        // Other database errors are a 500 with the same context.
        let e: ApiError = OrderError::Db {
            statement: "end the pending orders",
            source: sqlx::Error::RowNotFound,
        }
        .into();
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn other_domains_see_the_database_error_itself() {
        let db = || OrderError::Db {
            statement: "mark the order paid",
            source: sqlx::Error::PoolTimedOut,
        };
        assert!(matches!(sqlx::Error::from(db()), sqlx::Error::PoolTimedOut));
        // Not retryable: the HTTP answer, still a 503.
        match TxError::from(db()) {
            TxError::Api(e) => assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE),
            TxError::Db(e) => panic!("a pool timeout is not retried: {e:?}"),
        }
    }
}
