//! The inventory's HTTP edge, shared by its handlers: the one mapping of [`InventoryError`] to
//! `ApiError` (status, code, message and details exactly as clients know them), the
//! event-scoped admission check, and refusal counting.

use crate::inventory::InventoryState;
use crate::inventory::error::InventoryError;
use crate::platform::auth::Admitted;
use crate::platform::db;
use crate::platform::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use shared::error::codes;

impl From<InventoryError> for ApiError {
    fn from(e: InventoryError) -> Self {
        use InventoryError as E;
        match e {
            E::Invalid(invalid) => invalid
                .details
                .into_iter()
                .fold(ApiError::validation(invalid.message), |e, (k, v)| {
                    e.with(k, v)
                }),
            E::UnknownEvent => ApiError::not_found(codes::UNKNOWN_EVENT, "no such event"),
            E::EventExists { id } => {
                ApiError::conflict(codes::EVENT_EXISTS, "an event with this id already exists")
                    .with("id", id)
            }
            E::EventCancelled => {
                ApiError::conflict(codes::EVENT_CANCELLED, "this event was cancelled")
            }
            E::SaleNotStarted { sale_start } => {
                ApiError::conflict(codes::SALE_NOT_STARTED, "the sale has not started")
                    .with("sale_start", sale_start.to_rfc3339())
            }
            E::LimitExceeded {
                limit,
                held,
                requested,
            } => ApiError::conflict(
                codes::LIMIT_EXCEEDED,
                format!("at most {limit} tickets per account for this event"),
            )
            .with("limit", limit)
            .with("held", held)
            .with("requested", requested),
            E::UnknownSeats { seats } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::UNKNOWN_SEATS,
                "some seats do not exist in this event",
            )
            .with("seats", seats),
            E::SeatTaken { seats } => {
                ApiError::conflict(codes::SEAT_TAKEN, "some seats are no longer available")
                    .with("seats", seats)
            }
            E::OrphanSeat { seats } => ApiError::conflict(
                codes::ORPHAN_SEAT,
                "this choice would leave a single seat stranded",
            )
            .with("seats", seats),
            E::NoSeatsTogether { quantity, free } => ApiError::conflict(
                codes::NO_SEATS_TOGETHER,
                format!("no {quantity} seats fit together"),
            )
            .with("quantity", quantity)
            .with("free", free),
            E::SeatsSoldOut => {
                ApiError::conflict(codes::SOLD_OUT, "no seats left for this request")
            }
            E::Contended => ApiError::Unavailable(anyhow::anyhow!(
                "best available lost every retry to concurrent holds"
            )),
            E::UnknownTier { tier } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::UNKNOWN_TIER,
                "no such GA tier for this event",
            )
            .with("tier", tier),
            E::SoldOut { available: Some(n) } => {
                ApiError::conflict(codes::SOLD_OUT, "not enough units left in this tier")
                    .with("available", n)
            }
            E::SoldOut { available: None } => {
                ApiError::conflict(codes::SOLD_OUT, "this tier is sold out")
            }
            E::HoldNotFound => ApiError::not_found(codes::NOT_FOUND, "no such hold"),
            E::HoldOrdered { status } => ApiError::conflict(
                codes::HOLD_ORDERED,
                "an order owns this hold; cancel the order instead",
            )
            .with("status", status.as_str()),
            E::Render(e) => ApiError::unexpected(anyhow::Error::new(e).context("render seat map")),
            E::Db { statement, source } => db_failure(statement, source),
        }
    }
}

/// A failed statement: a deadlock that outlived [`db::retry`] is load, not a bug (`503` with
/// `Retry-After`); otherwise the platform's rule (an unreachable database is a `503`,
/// anything else a `500`). The log names the statement either way.
fn db_failure(statement: &'static str, source: sqlx::Error) -> ApiError {
    let context = format!("inventory statement failed: {statement}");
    if db::is_retryable(&source) {
        return ApiError::Unavailable(
            anyhow::Error::new(source)
                .context("transaction kept deadlocking")
                .context(context),
        );
    }
    match ApiError::from(source) {
        ApiError::Unavailable(e) => ApiError::Unavailable(e.context(context)),
        ApiError::Unexpected(e) => ApiError::Unexpected(e.context(context)),
        client => client,
    }
}

/// Resolves the event-scoped caller: a valid token for exactly this event, and an event id
/// that can exist at all. Returns the account.
pub(crate) fn admitted_for(admitted: Result<Admitted, ApiError>, event: &str) -> ApiResult<String> {
    let admitted = admitted?;
    admitted.for_event(event)?;
    if !shared::ids::is_valid_slug(event) {
        return Err(InventoryError::UnknownEvent.into());
    }
    Ok(admitted.account().to_owned())
}

/// Counts a client-facing refusal by code (metrics), passing the result through.
pub(crate) fn counted<T>(state: &InventoryState, r: ApiResult<T>) -> ApiResult<T> {
    if let Err(e) = &r
        && e.status().is_client_error()
    {
        state.metrics.refusals.with_label_values(&[e.code()]).inc();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{HoldStatus, Invalid};
    use axum::response::IntoResponse;

    async fn body(e: InventoryError) -> (StatusCode, serde_json::Value) {
        let resp = ApiError::from(e).into_response();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn refusals_keep_their_status_code_and_details() {
        let (s, b) = body(InventoryError::LimitExceeded {
            limit: 4,
            held: 3,
            requested: 2,
        })
        .await;
        assert_eq!(s, StatusCode::CONFLICT);
        assert_eq!(b["code"], "LIMIT_EXCEEDED");
        assert_eq!(b["message"], "at most 4 tickets per account for this event");
        assert_eq!(
            (
                b["limit"].clone(),
                b["held"].clone(),
                b["requested"].clone()
            ),
            (4.into(), 3.into(), 2.into())
        );

        let (s, b) = body(InventoryError::HoldOrdered {
            status: HoldStatus::Ordered,
        })
        .await;
        assert_eq!(
            (s, b["code"].as_str(), b["status"].as_str()),
            (StatusCode::CONFLICT, Some("HOLD_ORDERED"), Some("ordered"))
        );

        let (s, b) = body(InventoryError::SoldOut { available: None }).await;
        assert_eq!(
            (s, b["message"].as_str()),
            (StatusCode::CONFLICT, Some("this tier is sold out"))
        );
        assert!(b.get("available").is_none());
    }

    #[tokio::test]
    async fn an_invalid_request_is_a_422_with_its_details() {
        let (s, b) = body(
            Invalid::field("seats", "at most 2 seats per hold")
                .with("max", 2)
                .into(),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(b["code"], "VALIDATION_FAILED");
        assert_eq!(
            (b["field"].as_str(), b["max"].as_i64()),
            (Some("seats"), Some(2))
        );
    }

    #[tokio::test]
    async fn an_unreachable_database_is_a_503_and_a_bug_a_500() {
        let down = InventoryError::Db {
            statement: "insert the hold row",
            source: sqlx::Error::PoolTimedOut,
        };
        let api = ApiError::from(down);
        assert_eq!(api.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(format!("{:?}", api).contains("insert the hold row"));
        let bug = InventoryError::Db {
            statement: "read the seat map",
            source: sqlx::Error::RowNotFound,
        };
        assert_eq!(
            ApiError::from(bug).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
