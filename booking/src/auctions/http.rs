//! The auctions HTTP surface: create, read and bid (the live WebSocket is [`super::live::ws`]).
//! The only place an [`AuctionError`] becomes an `ApiError`, with the status codes, error
//! codes and details of the API contract (docs/api.md).

use super::bids::{self, BidOutcome, PlaceBid, SELLER_CANNOT_BID};
use super::error::AuctionError;
use super::model::AuctionStatus;
use super::model::{self, CreateAuction};
use super::{AuctionsState, live};
use crate::platform::auth::Admitted;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use shared::error::codes;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use crate::platform::idempotency::HEADER as IDEMPOTENCY_KEY;

pub fn router() -> OpenApiRouter<AuctionsState> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(show))
        .routes(routes!(place))
        .route("/ws/auctions/{id}", get(live::ws::upgrade))
}

/// An auction as a fan sees it (`Row::view_for`, built with `json!`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct Auction {
    id: String,
    #[schema(required = false)]
    event: Option<String>,
    #[schema(required = false)]
    seller: String,
    #[schema(required = false)]
    you_sell: bool,
    title: String,
    /// integer minor units
    #[schema(required = false, minimum = 0)]
    start_price: i64,
    /// integer minor units
    #[schema(required = false, minimum = 0)]
    min_increment: i64,
    #[schema(required = false)]
    current_price: Option<i64>,
    #[schema(required = false)]
    min_next_bid: i64,
    #[schema(required = false)]
    leader: Option<String>,
    #[schema(required = false)]
    you_lead: bool,
    #[schema(required = false)]
    bid_count: i64,
    #[schema(required = false)]
    hot: bool,
    status: AuctionStatus,
    end_time: DateTime<Utc>,
    #[schema(required = false)]
    extensions: i64,
    #[schema(required = false)]
    max_extensions: i64,
    #[schema(required = false)]
    created_at: DateTime<Utc>,
    #[schema(required = false)]
    closed_at: Option<DateTime<Utc>>,
}

/// An accepted bid (`AcceptedBid::body`, built with `json!`).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct Bid {
    bid_id: String,
    auction_id: String,
    #[schema(required = false)]
    bidder: String,
    /// integer minor units
    #[schema(minimum = 0)]
    amount: i64,
    status: BidStatus,
    /// integer minor units
    #[schema(required = false, minimum = 0)]
    current_price: i64,
    #[schema(required = false)]
    leader: String,
    #[schema(required = false)]
    you_lead: bool,
    #[schema(required = false)]
    placed_at: DateTime<Utc>,
    #[schema(required = false)]
    end_time: DateTime<Utc>,
    #[schema(required = false)]
    extended: bool,
}

#[derive(ToSchema)]
#[schema(rename_all = "UPPERCASE")]
#[expect(dead_code, reason = "a schema only")]
enum BidStatus {
    Accepted,
}

impl From<AuctionError> for ApiError {
    fn from(e: AuctionError) -> Self {
        match e {
            AuctionError::Invalid { field, message } => {
                ApiError::validation(message).with("field", field)
            }
            AuctionError::NotFound => ApiError::not_found(codes::NOT_FOUND, "no such auction"),
            AuctionError::TooLow {
                current_price,
                min_next,
                leader,
            } => ApiError::conflict(
                codes::BID_TOO_LOW,
                format!("the bid must be at least {min_next}"),
            )
            .with("current_price", current_price)
            .with("min_next_bid", min_next)
            .with("leader", leader.0)
            .with("you_lead", leader.1),
            AuctionError::Closed {
                current_price,
                leader,
                end_time,
            } => ApiError::conflict(codes::AUCTION_CLOSED, "this auction has ended")
                .with("current_price", current_price)
                .with("leader", leader.0)
                .with("you_lead", leader.1)
                .with("end_time", end_time),
            AuctionError::SellerCannotBid => ApiError::new(
                StatusCode::FORBIDDEN,
                SELLER_CANNOT_BID,
                "a seller cannot bid on their own auction",
            ),
            AuctionError::KeyReused => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was already used for a different bid",
            ),
            AuctionError::RateLimited { retry_after_s } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::RATE_LIMITED,
                "too many bids; slow down",
            )
            .retry_after(retry_after_s.max(1)),
            AuctionError::Retry(message) => ApiError::conflict(codes::CONFLICT, message),
            // Unavailability stays a `503` (the platform's mapping), with the statement named.
            AuctionError::Db { statement, source } => {
                with_context(ApiError::from(source), format!("failed to {statement}"))
            }
            AuctionError::Redis { op, source } => {
                with_context(ApiError::from(source), format!("redis failed to {op}"))
            }
            AuctionError::Platform(e) => e,
            AuctionError::Unexpected(e) => ApiError::Unexpected(e),
        }
    }
}

/// Adds `context` to a server-side error (what the log shows); client errors are unchanged.
fn with_context(e: ApiError, context: String) -> ApiError {
    match e {
        ApiError::Unavailable(e) => ApiError::Unavailable(e.context(context)),
        ApiError::Unexpected(e) => ApiError::Unexpected(e.context(context)),
        client => client,
    }
}

/// `POST /api/auctions` (Idempotency-Key): the seller is the token's account. The key is
/// handled by the shared layer ([`crate::platform::idempotency`]): the stored `201` body
/// commits in the same transaction as the auction row, so a retry replays exactly it.
#[utoipa::path(post, path = "/api/auctions", tag = tags::AUCTIONS,
    summary = "Create an auction of the token's event", description = "",
    params(doc::IdempotencyKey),
    request_body = CreateAuction,
    responses(
        (status = 201, description = "Created", body = Auction),
        (status = 200, description = "Replayed", body = Auction,
            headers(("Idempotent-Replayed" = String, description = "a replay of the first answer"))),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
        (status = 503, response = doc::Unavailable),
    ))]
async fn create(
    State(state): State<AuctionsState>,
    who: Admitted,
    key: IdempotencyKey,
    ApiJson(req): ApiJson<CreateAuction>,
) -> ApiResult<Response> {
    let fingerprint = Fingerprint::of_json(
        &Method::POST,
        "/api/auctions",
        &serde_json::to_value(&req).map_err(ApiError::unexpected)?,
    );
    // Bad input is refused before a key is claimed: it changes nothing, not even the key.
    let new = model::validate(req, state.settings.default_max_extensions)?;
    who.for_event(&new.event)?;
    // Events are never deleted while an auction refers to them (foreign key).
    if !crate::orders::products::event_exists(&state.pool, &new.event).await? {
        return Err(crate::orders::products::unknown_event_field(&new.event));
    }
    let claim =
        match idempotency::begin(&state.idempotency, who.account(), &key, &fingerprint).await? {
            Begin::Replay(stored) => return Ok(stored.into_response()),
            Begin::Started(claim) => claim,
        };
    match super::create(&state, who.account(), &new, &claim).await {
        Ok((_, body)) => Ok(idempotency::respond(StatusCode::CREATED, body)),
        Err(e) => {
            claim.release(&state.pool).await;
            Err(e.into())
        }
    }
}

/// `GET /api/auctions/{id}` (an admission of the auction's event).
#[utoipa::path(get, path = "/api/auctions/{id}", tag = tags::AUCTIONS,
    summary = "An auction", description = "",
    params(doc::IdPath),
    responses(
        (status = 200, description = "OK", body = Auction),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 503, response = doc::Unavailable),
    ))]
async fn show(
    State(state): State<AuctionsState>,
    who: Admitted,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let meta = super::meta(&state, &id)
        .await?
        .ok_or(AuctionError::NotFound)?;
    who.opens(meta.event.as_deref())?;
    let row = super::current(&state, &id)
        .await?
        .ok_or(AuctionError::NotFound)?;
    Ok(axum::Json(row.view_for(&state.handles, who.account())).into_response())
}

/// `POST /api/auctions/{id}/bids {"amount": n}` with `Idempotency-Key`.
#[utoipa::path(post, path = "/api/auctions/{id}/bids", tag = tags::AUCTIONS,
    summary = "Bid (decided at once; anti-sniping extends the end)", description = "",
    params(doc::IdPath, doc::IdempotencyKey),
    request_body = PlaceBid,
    responses(
        (status = 201, description = "Accepted", body = Bid),
        (status = 200, description = "Replayed", body = Bid),
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
async fn place(
    State(state): State<AuctionsState>,
    who: Admitted,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PlaceBid>,
) -> ApiResult<Response> {
    match place_inner(&state, &who, &id, &headers, req.amount).await {
        Ok(BidOutcome::Accepted(bid)) => {
            Ok((StatusCode::CREATED, axum::Json(bid.body(&state.handles))).into_response())
        }
        Ok(BidOutcome::Replayed(bid)) => {
            Ok((StatusCode::OK, axum::Json(bid.body(&state.handles))).into_response())
        }
        Err(e) => {
            if e.status().is_client_error() {
                state.metrics.refusals.with_label_values(&[e.code()]).inc();
            }
            Err(e)
        }
    }
}

/// The checks in the order the contract answers them: key, amount, rate, auction, event;
/// then the decision ([`bids::place`]).
async fn place_inner(
    state: &AuctionsState,
    who: &Admitted,
    id: &str,
    headers: &HeaderMap,
    amount: i64,
) -> ApiResult<BidOutcome> {
    // Validated by the shared layer's rules (missing `400`, malformed `422`).
    let key = IdempotencyKey::parse(headers.get(IDEMPOTENCY_KEY))?;
    model::validate_amount(amount)?;
    state
        .runtime
        .check_rate(who.account())
        .map_err(|retry_after_s| AuctionError::RateLimited { retry_after_s })?;
    let meta = super::meta(state, id)
        .await?
        .ok_or(AuctionError::NotFound)?;
    // One admission, one event. The auction's event never changes, so checking it before the
    // decision is not a read-then-write race.
    who.opens(meta.event.as_deref())?;
    Ok(bids::place(state, id, &meta, who.account(), key.as_str(), amount).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn status_and_code(e: AuctionError) -> (StatusCode, String) {
        let api = ApiError::from(e);
        (api.status(), api.code().to_owned())
    }

    #[test]
    fn refusals_keep_their_contract_codes() {
        let leader = (Some("bidder-x".to_owned()), false);
        let cases = [
            (
                AuctionError::Invalid {
                    field: "amount",
                    message: "m".into(),
                },
                422,
                codes::VALIDATION_FAILED,
            ),
            (AuctionError::NotFound, 404, codes::NOT_FOUND),
            (
                AuctionError::TooLow {
                    current_price: 1,
                    min_next: 2,
                    leader: leader.clone(),
                },
                409,
                codes::BID_TOO_LOW,
            ),
            (
                AuctionError::Closed {
                    current_price: 1,
                    leader,
                    end_time: "t".into(),
                },
                409,
                codes::AUCTION_CLOSED,
            ),
            (AuctionError::SellerCannotBid, 403, SELLER_CANNOT_BID),
            (AuctionError::KeyReused, 422, codes::IDEMPOTENCY_KEY_REUSED),
            (
                AuctionError::RateLimited { retry_after_s: 0 },
                429,
                codes::RATE_LIMITED,
            ),
            (AuctionError::Retry("again"), 409, codes::CONFLICT),
        ];
        for (e, status, code) in cases {
            assert_eq!(
                status_and_code(e),
                (StatusCode::from_u16(status).unwrap(), code.into())
            );
        }
    }

    #[test]
    fn an_unreachable_database_stays_a_503_and_names_the_statement() {
        let e = ApiError::from(AuctionError::Db {
            statement: "load the auction",
            source: sqlx::Error::PoolTimedOut,
        });
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let ApiError::Unavailable(cause) = e else {
            panic!("not unavailable")
        };
        assert!(
            format!("{cause:#}").contains("failed to load the auction"),
            "{cause:#}"
        );
        let other = ApiError::from(AuctionError::Db {
            statement: "x",
            source: sqlx::Error::RowNotFound,
        });
        assert_eq!(other.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
