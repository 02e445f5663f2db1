//! The public listener's document: the waiting room (`routes::public`). Admitted traffic
//! under `/api/…`, `/ws/…` and `/webhooks/payments` is booking's, described by booking's own
//! document; this one names only the gateway's own answers on the payment webhook (its limit
//! class) and on the checkout writes that can be answered `409 ROOM_FULL` (`slots.rs`). The
//! pages (`/`, `/e/{event}`, static files) and `/metrics` are not API.
//!
//! Each function below documents one route of `routes::public` (named after its variant)
//! and is never called: the gateway dispatches by hand in `proxy.rs`.

use super::answers::{
    Challenge, DevLogin, Draw, Health, Ready, ReceiptCheck, Registered, RoomFull, Waiting,
};
use super::refusals::{
    AdmissionRequired, BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge, TooManyRequests,
    Unauthorized, Unavailable, Unprocessable, UnsupportedMediaType, Upstream,
};
use super::{AdmissionScheme, ErrorDoc, IdentityScheme, VERSION};
use crate::queue::{DevLoginBody, JoinBody, ReceiptBody};
use utoipa::{IntoParams, OpenApi};

/// Operations that take no credentials (none: this document has no global scheme).
pub(super) const NO_AUTH: [(&str, &str); 0] = [];

/// The event a waiting-room path names: a slug (`404 UNKNOWN_EVENT` otherwise).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    /// The event's id.
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    pub event: String,
}

/// An order's id, as booking gives it.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OrderPath {
    /// The order's id.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub id: String,
}

/// The place receipt on a status poll.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct PlaceHeader {
    /// The place receipt (or the `fg_place` cookie): with it a waiting fan is answered from
    /// gateway memory.
    #[param(rename = "X-Floodgate-Place", required = false)]
    pub place: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Floodgate gateway (public listener)",
        version = VERSION,
        description = "The waiting room. Admitted traffic under `/api/…`, `/ws/…` and `/webhooks/payments` is forwarded to booking (booking's own document, `GET /openapi.json` on booking, describes it); the operations tagged `forwarded` list only what the gateway itself answers there. Every refusal is `{\"code\", \"message\", ...details}` with a stable `code` (docs/api.md lists them per endpoint).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "http://127.0.0.1:8080", description = "the local stack")),
    paths(
        healthz, readyz, openapi_json, dev_login, join, register, status, draw, receipt, challenge,
        webhook, hold, ga_hold, order, pay
    ),
    components(
        schemas(ErrorDoc, JoinBody),
        responses(
            BadRequest, Unauthorized, Forbidden, NotFound, Conflict,
            PayloadTooLarge, UnsupportedMediaType, Unprocessable, TooManyRequests, Unavailable,
            AdmissionRequired, Upstream
        )
    ),
    modifiers(&IdentityScheme, &AdmissionScheme),
    tags(
        (name = "health", description = "Liveness, readiness and this document"),
        (name = "identity", description = "Development logins"),
        (name = "waiting room", description = "Joining, waiting and being admitted"),
        (name = "forwarded", description = "Booking's operations (booking's document): only the gateway's own answers on them are listed here"),
    )
)]
pub struct PublicApi;

/// Liveness
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
pub fn healthz() {}

/// Readiness (Redis and an upstream reachable)
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Ready),
        (status = 503, description = "Not ready", body = Ready),
    ))]
pub fn readyz() {}

/// This document
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "docs/openapi/gateway.json", body = Object)))]
pub fn openapi_json() {}

/// A development identity token (dev mode only; 404 otherwise)
#[utoipa::path(post, path = "/dev/login", tag = "identity",
    request_body = DevLoginBody,
    responses(
        (status = 200, description = "A login token for the account", body = DevLogin),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyRequests),
    ))]
pub fn dev_login() {}

/// Join the waiting room (the same place again on a repeat)
///
/// The body is read only when the event asks for a proof of work (`pow_difficulty` above
/// 0; `GET /queue/{event}/challenge`): then it is a `JoinBody` (`{"pow": {"challenge",
/// "solution"}}`; `403 POW_REQUIRED` without one, `400`/`415` for another body); otherwise
/// it is ignored, unparsed (the join is the waiting room's hottest path), so the schema
/// below allows any body. A join from an account not on a registered room's list is
/// `403 NOT_REGISTERED`.
#[utoipa::path(post, path = "/queue/{event}/join", tag = "waiting room",
    params(EventPath),
    request_body(content = Option<serde_json::Value>, description = "A `JoinBody` when the event asks for a proof of work; ignored otherwise"),
    responses(
        (status = 201, description = "A new place", body = Waiting),
        (status = 200, description = "The same place again", body = Waiting),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, response = Conflict),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    ),
    security(("identity" = [])))]
pub fn join() {}

/// Register for a registered-only room (idempotent; open until registration_closes)
///
/// `409 REGISTRATION_CLOSED` after `registration_closes` (Redis time) for an account not
/// registered before; `409 REGISTRATION_NOT_REQUIRED` in a room open to everyone. A join from
/// an account not on a registered room's list is `403 NOT_REGISTERED` (`registration_closes`,
/// `registration_open`, `register_url` while open).
#[utoipa::path(post, path = "/queue/{event}/register", tag = "waiting room",
    params(EventPath),
    responses(
        (status = 200, description = "Registered", body = Registered),
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 409, response = Conflict),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    ),
    security(("identity" = [])))]
pub fn register() {}

/// Position, ETA, or the admission token once admitted
#[utoipa::path(get, path = "/queue/{event}/status", tag = "waiting room",
    params(EventPath, PlaceHeader),
    responses(
        (status = 200, description = "Where the fan stands", body = Waiting),
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    ),
    security(("identity" = [])))]
pub fn status() {}

/// The pre-sale draw's commitment and, after the start, its seed
#[utoipa::path(get, path = "/queue/{event}/draw", tag = "waiting room",
    params(EventPath),
    responses(
        (status = 200, description = "The commitment (and the seed once revealed)", body = Draw),
        (status = 404, response = NotFound),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    ))]
pub fn draw() {}

/// Check a place receipt
#[utoipa::path(post, path = "/queue/{event}/receipt", tag = "waiting room",
    params(EventPath),
    request_body = ReceiptBody,
    responses(
        (status = 200, description = "Whether the receipt is valid for this event", body = ReceiptCheck),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyRequests),
    ))]
pub fn receipt() {}

/// A proof-of-work challenge (when the event requires one)
#[utoipa::path(get, path = "/queue/{event}/challenge", tag = "waiting room",
    params(EventPath),
    responses(
        (status = 200, description = "A challenge for this fan and event", body = Challenge),
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    ),
    security(("identity" = [])))]
pub fn challenge() {}

/// A payment provider's event (class `provider-signed`), forwarded to booking
///
/// No admission token: booking checks the provider's signature over the raw body, which the
/// gateway forwards untouched. The gateway's own answers: `413 BODY_TOO_LARGE` over
/// `gateway.webhook_max_body_bytes` (64 KiB; never more than booking's limit), and
/// `429 RATE_LIMITED` with `Retry-After` past the provider's own budget
/// (`gateway.limits.webhooks_per_ip_per_min`, per address; fans' requests never spend it, nor
/// it theirs); the provider retries. Every other answer is booking's.
#[utoipa::path(post, path = "/webhooks/payments", tag = "forwarded",
    request_body(content = Object, description = "The provider's signed event (booking's document)"),
    responses(
        (status = 200, description = "Booking's answer: the event was taken (booking's document)"),
        (status = 400, response = BadRequest),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 502, response = Upstream),
        (status = 503, response = Upstream),
        (status = 504, response = Upstream),
    ))]
pub fn webhook() {}

/// Hold seats (booking's operation; the gateway's own answers)
///
/// `409 ROOM_FULL` (with `waiting_room_url`): the fan's `max_active` slot was freed after a
/// checkout and every slot is taken again; nothing was forwarded or held.
#[utoipa::path(post, path = "/api/events/{event}/holds", tag = "forwarded",
    params(EventPath),
    request_body(content = Object, description = "Booking's hold request (booking's document)"),
    responses(
        (status = 201, description = "Booking's answer (booking's document)"),
        (status = 400, response = BadRequest),
        (status = 401, response = AdmissionRequired),
        (status = 403, response = Forbidden),
        (status = 409, description = "`ROOM_FULL` from the gateway, or booking's conflict", body = RoomFull),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 502, response = Upstream),
        (status = 503, response = Upstream),
        (status = 504, response = Upstream),
    ),
    security(("admission" = [])))]
pub fn hold() {}

/// Hold general-admission places (booking's operation; the gateway's own answers)
///
/// `409 ROOM_FULL` (with `waiting_room_url`): as for seat holds.
#[utoipa::path(post, path = "/api/events/{event}/ga-holds", tag = "forwarded",
    params(EventPath),
    request_body(content = Object, description = "Booking's GA hold request (booking's document)"),
    responses(
        (status = 201, description = "Booking's answer (booking's document)"),
        (status = 400, response = BadRequest),
        (status = 401, response = AdmissionRequired),
        (status = 403, response = Forbidden),
        (status = 409, description = "`ROOM_FULL` from the gateway, or booking's conflict", body = RoomFull),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 502, response = Upstream),
        (status = 503, response = Upstream),
        (status = 504, response = Upstream),
    ),
    security(("admission" = [])))]
pub fn ga_hold() {}

/// Place an order (booking's operation; the gateway's own answers)
///
/// `409 ROOM_FULL` (with `waiting_room_url`): as for seat holds.
#[utoipa::path(post, path = "/api/orders", tag = "forwarded",
    request_body(content = Object, description = "Booking's order request (booking's document)"),
    responses(
        (status = 201, description = "Booking's answer (booking's document)"),
        (status = 400, response = BadRequest),
        (status = 401, response = AdmissionRequired),
        (status = 403, response = Forbidden),
        (status = 409, description = "`ROOM_FULL` from the gateway, or booking's conflict", body = RoomFull),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 502, response = Upstream),
        (status = 503, response = Upstream),
        (status = 504, response = Upstream),
    ),
    security(("admission" = [])))]
pub fn order() {}

/// Pay for an order (booking's operation; the gateway's own answers)
///
/// `409 ROOM_FULL` (with `waiting_room_url`): as for seat holds.
#[utoipa::path(post, path = "/api/orders/{id}/pay", tag = "forwarded",
    params(OrderPath),
    request_body(content = Object, description = "Booking's pay request (booking's document)"),
    responses(
        (status = 200, description = "Booking's answer (booking's document)"),
        (status = 400, response = BadRequest),
        (status = 401, response = AdmissionRequired),
        (status = 403, response = Forbidden),
        (status = 409, description = "`ROOM_FULL` from the gateway, or booking's conflict", body = RoomFull),
        (status = 413, response = PayloadTooLarge),
        (status = 429, response = TooManyRequests),
        (status = 502, response = Upstream),
        (status = 503, response = Upstream),
        (status = 504, response = Upstream),
    ),
    security(("admission" = [])))]
pub fn pay() {}
