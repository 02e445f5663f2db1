//! The one mapping of the orders domain's errors to HTTP answers, keeping every status, code,
//! message and detail clients and tests rely on; database and Redis failures go through the
//! platform's mappings (unreachable means `503`) with the failed statement added to the cause.

use crate::orders::model::Shortage;
use crate::orders::products;
use crate::orders::repo::OrderError;
use crate::platform::db::{TxError, is_retryable};
use crate::platform::error::ApiError;
use axum::http::StatusCode;
use shared::error::codes;

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
            // The order runs again until the last way answers; only a bug ends here.
            OrderError::StockBusy => {
                ApiError::Unavailable(anyhow::anyhow!("stock rows busy after every way"))
            }
            OrderError::HoldNotActive { hold_id } => ApiError::conflict(
                codes::HOLD_EXPIRED,
                "the hold is not active: it expired, was released, is already ordered, or is not yours",
            )
            .with("hold_id", hold_id),
            OrderError::EventCancelled => {
                ApiError::conflict(codes::EVENT_CANCELLED, "this event was cancelled")
            }
            OrderError::KeyReused => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was already used for another order",
            ),
            OrderError::ClaimLost(e) | OrderError::KeyRefused(e) | OrderError::RedisUnavailable(e) => e,
            // Resolved from the key before answering; the key vanished meanwhile (purged):
            // a retry runs afresh.
            OrderError::KeyTaken => crate::platform::idempotency::Claim::lost(),
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

pub(super) fn insufficient(sku: &str, requested: i64, shortage: Shortage) -> ApiError {
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
            (OrderError::EventCancelled, 409, "EVENT_CANCELLED"),
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
