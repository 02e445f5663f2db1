//! The ticket endpoints, on booking's listener until the gateway's route table exists (DESIGN
//! section 9, "Who may call what"):
//!
//! - `GET /api/events/{event}/ticket-keys` (class `public`): the JWKS that verifies the
//!   event's codes. Every configured key is in it (deployment-wide keys; a retired key stays
//!   until its events are over). Cached briefly (`[tickets] jwks_max_age_s`).
//! - `GET /api/tickets`, `GET /api/orders/{id}/tickets` (class `identity`): the caller's own
//!   tickets, by the login token's subject. An admission token is refused (`401`): it proves
//!   a place in a queue, not who holds a ticket, and it ends with the sale.
//! - `GET /api/events/{event}/ticket-info` (class `public`): what a ticket prints about its
//!   event (name, venue, address, date, doors, zone, code kind) for the fan's ticket page,
//!   which must show it on the day of the show, long after admission has ended.
//!
//! All of them answer cross-origin reads (`super::cors`): the ticket page is served by the
//! gateway and calls booking's listener directly until the route table exists.

use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use crate::tickets::TicketsState;
use crate::tickets::code::{Jwks, TicketClaims, b64};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{AUTHORIZATION, CACHE_CONTROL};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use shared::error::codes;
use shared::token::bearer;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Most tickets one list returns (a fan's lifetime of tickets fits; the per-event limit is
/// at most 100).
const MAX_LISTED: i64 = 1000;

pub fn router() -> OpenApiRouter<TicketsState> {
    OpenApiRouter::new()
        .routes(routes!(ticket_keys))
        .routes(routes!(my_tickets))
        .routes(routes!(order_tickets))
        .routes(routes!(ticket_info))
        .layer(axum::middleware::from_fn(crate::tickets::cors::cors))
        // After the layer: the ticket page reads cross-origin; a resend is asked for where the
        // fan is signed in to booking's own origin (or, later, through the gateway's routes).
        .routes(routes!(crate::tickets::mail::http::fan_resend))
        // Transfers: called by the shop's or ticket page's own origin, like the resend.
        .routes(routes!(crate::tickets::transfer::http::offer))
        .routes(routes!(crate::tickets::transfer::http::cancel))
        .routes(routes!(crate::tickets::transfer::http::accept))
}

/// A caller holding a valid login (identity) token: `Authorization: Bearer` only (no cookie:
/// the gateway's cookie is the admission token).
pub struct Fan(pub String);

impl FromRequestParts<TicketsState> for Fan {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &TicketsState) -> Result<Self, ApiError> {
        let refuse = |reason: &'static str| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                codes::UNAUTHORIZED,
                "a login (identity) token is required: Authorization: Bearer <token>",
            )
            .with("reason", reason)
        };
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .ok_or_else(|| refuse("missing"))?;
        state
            .identity
            .verify(token)
            .map(Fan)
            .map_err(|_| refuse("invalid"))
    }
}

/// The JWKS verifying an event's ticket codes
#[utoipa::path(get, path = "/api/events/{event}/ticket-keys", tag = tags::TICKETS,
    params(doc::EventPath),
    security(()),
    responses(
        (status = 200, description = "The public keys (RFC 7517, Ed25519 per RFC 8037)", body = Jwks,
            headers(("Cache-Control" = String, description = "public, max-age=<[tickets] jwks_max_age_s>"))),
        (status = 404, response = doc::NotFound),
    ))]
async fn ticket_keys(
    State(state): State<TicketsState>,
    Path(event): Path<String>,
) -> ApiResult<Response> {
    let exists: bool = event.len() <= 128
        && sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)")
            .bind(&event)
            .fetch_one(&state.pool)
            .await?;
    if !exists {
        return Err(ApiError::not_found(codes::NOT_FOUND, "no such event"));
    }
    let mut resp = ApiJson(state.keys.jwks()).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("public, max-age={}", state.jwks_max_age_s)) {
        resp.headers_mut().insert(CACHE_CONTROL, v);
    }
    Ok(resp)
}

/// What a ticket shows about its event. Nothing here is secret: it is what a printed ticket
/// carries.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct TicketEventInfo {
    pub id: String,
    pub name: String,
    pub venue: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub venue_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doors_at: Option<DateTime<Utc>>,
    /// IANA zone the event's times are shown in (`Asia/Tokyo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// `static` or `rotating`.
    #[schema(example = "static")]
    pub ticket_code: String,
}

/// What the fan's ticket page shows about an event
#[utoipa::path(get, path = "/api/events/{event}/ticket-info", tag = tags::TICKETS,
    params(doc::EventPath),
    security(()),
    responses(
        (status = 200, description = "OK", body = TicketEventInfo,
            headers(("Cache-Control" = String, description = "public, max-age=60"))),
        (status = 404, response = doc::NotFound),
    ))]
async fn ticket_info(
    State(state): State<TicketsState>,
    Path(event): Path<String>,
) -> ApiResult<Response> {
    let info: Option<TicketEventInfo> = if event.len() <= 128 {
        sqlx::query_as(
            "SELECT id, name, venue, venue_address, starts_at, doors_at, timezone, ticket_code
               FROM events WHERE id = $1",
        )
        .bind(&event)
        .fetch_optional(&state.pool)
        .await?
    } else {
        None
    };
    let info = info.ok_or_else(|| ApiError::not_found(codes::NOT_FOUND, "no such event"))?;
    let mut resp = ApiJson(info).into_response();
    // A changed date or venue reaches pages within a minute; the page keeps its own copy for
    // offline use anyway.
    resp.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=60"),
    );
    Ok(resp)
}

/// One ticket as its holder sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TicketView {
    pub id: String,
    pub event: String,
    /// Reserved seating: the seat id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    /// General admission: the tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// `valid` or `voided`.
    #[schema(example = "valid")]
    pub status: &'static str,
    /// Why a voided ticket was voided (`refunded`, `disputed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub void_reason: Option<String>,
    /// Valid tickets only: the signed code (docs/api.md, "Ticket codes"); on rotating events
    /// its static part, to which the device appends `~` and the TOTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Valid tickets of rotating events only: the per-ticket TOTP secret, base64url.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotating_secret: Option<String>,
}

/// The caller's tickets.
#[derive(Debug, Serialize, ToSchema)]
pub struct TicketList {
    pub tickets: Vec<TicketView>,
}

#[derive(sqlx::FromRow)]
struct TicketRow {
    id: String,
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    void_reason: Option<String>,
    version: i32,
    issued_at: DateTime<Utc>,
    holder_account: String,
    ticket_code: String,
}

/// The ticket columns a view needs, then the condition (one literal per statement).
macro_rules! select_tickets {
    ($rest:literal) => {
        concat!(
            "SELECT t.id, t.event_id, t.seat_id, t.ga_tier, t.void_reason, t.version,
                    t.issued_at, t.holder_account, e.ticket_code
               FROM tickets t JOIN events e ON e.id = t.event_id ",
            $rest
        )
    };
}

impl TicketsState {
    fn view(&self, row: TicketRow) -> TicketView {
        let valid = row.void_reason.is_none();
        let rotating = row.ticket_code == "rotating";
        let (code, rotating_secret) = if valid {
            let claims = TicketClaims {
                tid: row.id.clone(),
                evt: row.event_id.clone(),
                seat: row.seat_id.clone(),
                tier: row.ga_tier.clone(),
                hnd: self.keys.handle(&row.holder_account),
                ver: row.version,
                iat: row.issued_at.timestamp(),
                rot: rotating.then_some(true),
            };
            let secret = rotating
                .then(|| b64(&self.keys.ticket_secret(&row.event_id, &row.id, row.version)));
            (Some(self.keys.sign(&claims)), secret)
        } else {
            (None, None)
        };
        TicketView {
            id: row.id,
            event: row.event_id,
            seat: row.seat_id,
            tier: row.ga_tier,
            status: if valid { "valid" } else { "voided" },
            void_reason: row.void_reason,
            code,
            rotating_secret,
        }
    }
}

/// All of the caller's tickets
#[utoipa::path(get, path = "/api/tickets", tag = tags::TICKETS,
    security(("identity" = [])),
    responses(
        (status = 200, description = "OK (oldest first)", body = TicketList),
        (status = 401, response = doc::Unauthorized),
    ))]
async fn my_tickets(State(state): State<TicketsState>, Fan(account): Fan) -> ApiResult<Response> {
    let rows: Vec<TicketRow> = sqlx::query_as(select_tickets!(
        "WHERE t.holder_account = $1 ORDER BY t.issued_at, t.id LIMIT $2"
    ))
    .bind(&account)
    .bind(MAX_LISTED)
    .fetch_all(&state.pool)
    .await?;
    Ok(private(TicketList {
        tickets: rows.into_iter().map(|r| state.view(r)).collect(),
    }))
}

/// The caller's tickets of one order
#[utoipa::path(get, path = "/api/orders/{id}/tickets", tag = tags::TICKETS,
    params(doc::IdPath),
    security(("identity" = [])),
    responses(
        (status = 200, description = "OK (none before the order is paid)", body = TicketList),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
async fn order_tickets(
    State(state): State<TicketsState>,
    Fan(account): Fan,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let not_found = || ApiError::not_found(codes::NOT_FOUND, "no such order");
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let rows: Vec<TicketRow> = sqlx::query_as(select_tickets!(
        "WHERE t.order_id = $1 AND t.holder_account = $2 ORDER BY t.issued_at, t.id LIMIT $3"
    ))
    .bind(&id)
    .bind(&account)
    .bind(MAX_LISTED)
    .fetch_all(&state.pool)
    .await?;
    if rows.is_empty() {
        // The buyer of an order without (or with no more) tickets of theirs sees an empty
        // list; anyone else, including another fan, learns nothing: 404.
        let own: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1 AND account_id = $2)",
        )
        .bind(&id)
        .bind(&account)
        .fetch_one(&state.pool)
        .await?;
        if !own {
            return Err(not_found());
        }
    }
    Ok(private(TicketList {
        tickets: rows.into_iter().map(|r| state.view(r)).collect(),
    }))
}

impl TicketsState {
    /// One ticket as `holder` sees it (`None`: not theirs).
    pub async fn ticket_view(&self, id: &str, holder: &str) -> ApiResult<Option<TicketView>> {
        let row: Option<TicketRow> =
            sqlx::query_as(select_tickets!("WHERE t.id = $1 AND t.holder_account = $2"))
                .bind(id)
                .bind(holder)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| self.view(r)))
    }
}

/// Codes and secrets are the fan's alone: never stored by a shared cache.
fn private(list: TicketList) -> Response {
    private_json(list)
}

/// [`private`] for any body.
pub fn private_json<T: Serialize>(body: T) -> Response {
    let mut resp = ApiJson(body).into_response();
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    resp
}
