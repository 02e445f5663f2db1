//! The transfer endpoints (class `identity`, on booking's listener until the gateway's route
//! table exists): offer, cancel, accept. Each refusal changes nothing.

use crate::platform::email::Email;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::tickets::TicketsState;
use crate::tickets::http::{Fan, TicketView};
use crate::tickets::transfer::repo;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `{id}`: a ticket's id (`POST /api/tickets/{id}/transfers`) or a transfer's.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TransferPath {
    pub id: String,
}

/// An offer of one's ticket.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OfferRequest {
    /// Where the offer is mailed (the receiver's address).
    #[schema(example = "friend@example.com")]
    pub to_email: String,
}

/// The offer made.
#[derive(Debug, Serialize, ToSchema)]
pub struct OfferMade {
    pub id: String,
    /// The link mailed to the receiver (`[mail] transfer_accept_url`).
    pub accept_url: String,
    pub expires_at: DateTime<Utc>,
}

/// An acceptance: the receiver's own address, where the ticket is mailed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptRequest {
    #[schema(example = "friend@example.com")]
    pub email: String,
}

/// Ids are ours (at most 64 characters); anything else is not found, without a query.
fn valid_id(id: &str, what: &'static str) -> ApiResult<()> {
    if id.is_empty() || id.len() > 64 {
        return Err(ApiError::not_found(shared::error::codes::NOT_FOUND, what));
    }
    Ok(())
}

fn address(raw: &str, field: &'static str) -> ApiResult<Email> {
    Email::parse(raw).map_err(|e| {
        ApiError::validation(format!("{field}: {e}"))
            .with("field", field)
            .with("reason", format!("{e:?}"))
    })
}

/// Offer one's ticket to an e-mail address
#[utoipa::path(post, path = "/api/tickets/{id}/transfers", tag = tags::TICKETS,
    params(TransferPath),
    request_body = OfferRequest,
    security(("identity" = [])),
    responses(
        (status = 201, description = "Offered; the receiver is mailed the accept link", body = OfferMade),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "`TRANSFERS_DISABLED`: the event does not allow transfers", body = doc::Error),
        (status = 404, description = "No such ticket of the caller's", body = doc::Error),
        (status = 409, description = "`TICKET_VOIDED`, `TICKET_CHECKED_IN`, `TRANSFER_PENDING {transfer_id}`", body = doc::Error),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, description = "`VALIDATION_FAILED` (the address), `TRANSFER_TO_SELF`", body = doc::Error),
    ))]
pub async fn offer(
    State(state): State<TicketsState>,
    Fan(account): Fan,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<OfferRequest>,
) -> ApiResult<Response> {
    valid_id(&id, "no such ticket")?;
    let to = address(&body.to_email, "to_email")?;
    let made = repo::offer(&state.pool, &account, &id, &to, state.transfer.offer_ttl_s).await?;
    tracing::info!(ticket = %id, transfer = %made.id, "ticket offered for transfer");
    let accept_url = state.transfer.accept_url(&made.event_id, &made.id);
    Ok((
        StatusCode::CREATED,
        ApiJson(OfferMade {
            id: made.id,
            accept_url,
            expires_at: made.expires_at,
        }),
    )
        .into_response())
}

/// Cancel one's open offer
#[utoipa::path(delete, path = "/api/transfers/{id}", tag = tags::TICKETS,
    params(TransferPath),
    security(("identity" = [])),
    responses(
        (status = 204, description = "Cancelled"),
        (status = 401, response = doc::Unauthorized),
        (status = 404, description = "No such offer of the caller's", body = doc::Error),
        (status = 409, description = "`TRANSFER_NOT_OPEN {status}`, `TRANSFER_EXPIRED`", body = doc::Error),
    ))]
pub async fn cancel(
    State(state): State<TicketsState>,
    Fan(account): Fan,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    valid_id(&id, "no such transfer")?;
    repo::cancel(&state.pool, &account, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Accept a ticket offered to you
#[utoipa::path(post, path = "/api/transfers/{id}/accept", tag = tags::TICKETS,
    params(TransferPath),
    request_body = AcceptRequest,
    security(("identity" = [])),
    responses(
        (status = 200, description = "The ticket is the caller's, with a new code (the old one is void)", body = TicketView),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "`TRANSFER_TO_SELF`: the sender accepting their own offer", body = doc::Error),
        (status = 404, response = doc::NotFound),
        (status = 409, description = "`TRANSFER_NOT_OPEN {status}`, `TRANSFER_EXPIRED`, `TRANSFER_STALE`, `LIMIT_EXCEEDED {limit, held, requested}`", body = doc::Error),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Invalid),
    ))]
pub async fn accept(
    State(state): State<TicketsState>,
    Fan(account): Fan,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<AcceptRequest>,
) -> ApiResult<Response> {
    valid_id(&id, "no such transfer")?;
    let email = address(&body.email, "email")?;
    let ticket = repo::accept(&state.pool, &account, &id, &email).await?;
    tracing::info!(ticket = %ticket, transfer = %id, "ticket transfer accepted");
    let view = state
        .ticket_view(&ticket, &account)
        .await?
        .ok_or_else(|| ApiError::unexpected(anyhow::anyhow!("the accepted ticket vanished")))?;
    Ok(crate::tickets::http::private_json(view))
}
