//! Booking's OpenAPI 3.1 document, generated from the handlers themselves: each handler
//! carries `#[utoipa::path]`, each domain router is a `utoipa_axum::OpenApiRouter` whose
//! `routes!` mount exactly the documented path and method, and `routes::router` splits the
//! merged router into the served routes and this document. What is served at
//! `GET /openapi.json` is therefore what is routed; `booking/tests/openapi.rs` keeps it equal
//! to the committed `docs/openapi/booking.json` (`UPDATE_OPENAPI=1` rewrites the file).
//!
//! Defined once here: the document's head, the error body, the usual refusals (one reusable
//! response per status) and the auth schemes.

use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToResponse, ToSchema};

/// The tags, one per area (the order of the document's operations follows the routes).
pub mod tags {
    pub const HEALTH: &str = "health";
    pub const INVENTORY: &str = "events and seats";
    pub const PRODUCTS: &str = "products";
    pub const CART: &str = "cart";
    pub const ORDERS: &str = "orders";
    pub const PAYMENTS: &str = "payments";
    pub const AUCTIONS: &str = "auctions";
    pub const OPS: &str = "ops";
    pub const TICKETS: &str = "tickets";
    pub const CHECKIN: &str = "check-in";
}

/// The head of the document; the paths and their schemas come from the routers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Floodgate booking",
        version = "0.2.0",
        description = "The booking core behind the waiting room: holds, carts, orders, payments, auctions, ops. Fans reach `/api/…` only through the gateway, with an admission token; `/admin/…` takes the admin bearer secret. WebSocket `GET /ws/auctions/{id}` and the ops page (`GET /ops/` and its files: HTML, script, styles) are described in docs/api.md. Every refusal is `{\"code\", \"message\", ...details}` with a stable `code` (docs/api.md lists them per endpoint).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "http://127.0.0.1:8090", description = "the local stack")),
    security(("admission" = []), ("admissionCookie" = [])),
    components(
        schemas(Error),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            Conflict,
            TooLarge,
            UnsupportedMediaType,
            Invalid,
            RateLimited,
            Unavailable
        )
    ),
    modifiers(&AuthSchemes)
)]
pub struct ApiDoc;

/// Every refusal is `{"code", "message", ...details}` with a stable `code` (docs/api.md lists
/// them per endpoint).
///
/// The shape of `shared::error::ErrorBody` (the gateway's and booking's answers), described
/// here so the shared crate needs no OpenAPI dependency.
#[derive(Serialize, ToSchema)]
pub struct Error {
    #[schema(pattern = "^[A-Z][A-Z0-9_]*$")]
    pub code: String,
    pub message: String,
}

/// Malformed request (bad JSON, a missing header such as `Idempotency-Key`)
#[derive(ToResponse)]
pub struct BadRequest(pub Error);
/// No valid credentials (`ADMISSION_REQUIRED {reason}` or `UNAUTHORIZED`)
#[derive(ToResponse)]
pub struct Unauthorized(pub Error);
/// Not allowed (`WRONG_EVENT`, `FORBIDDEN`, `ROLE_FORBIDDEN {role, required_role}`,
/// `WRONG_CREDENTIAL_TYPE`, ...)
#[derive(ToResponse)]
pub struct Forbidden(pub Error);
/// Not found
#[derive(ToResponse)]
pub struct NotFound(pub Error);
/// Conflict with the current state (the code says which)
#[derive(ToResponse)]
pub struct Conflict(pub Error);
/// Body too large
#[derive(ToResponse)]
pub struct TooLarge(pub Error);
/// Not `application/json`
#[derive(ToResponse)]
pub struct UnsupportedMediaType(pub Error);
/// Well-formed but invalid (`VALIDATION_FAILED {field}`, unknown references)
#[derive(ToResponse)]
pub struct Invalid(pub Error);
/// Rate limited (`RATE_LIMITED`; `TOO_MANY_FAILED_LOGINS` on the admin API) with `Retry-After`
#[derive(ToResponse)]
pub struct RateLimited(pub Error);
/// A dependency is unavailable (`Retry-After`)
#[derive(ToResponse)]
pub struct Unavailable(pub Error);

/// `{event}`: an event's id.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    /// event id (a slug)
    pub event: String,
}

/// `{id}`: an order's or an auction's id.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct IdPath {
    pub id: String,
}

/// `{sku}`: a product's SKU.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SkuPath {
    pub sku: String,
}

/// `X-Floodgate-Actor` (`platform::audit::Operator`).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct ActorHeader {
    /// With the bootstrap admin secret: required, the person behind the change (kept in the
    /// audit entry as a note; the actor is `bootstrap`). With an operator credential: ignored
    /// (the actor is the operator)
    #[serde(rename = "X-Floodgate-Actor")]
    #[param(min_length = 1, max_length = 200, pattern = "^[ -~]*[!-~][ -~]*$")]
    pub actor: Option<String>,
}

/// `Idempotency-Key`, required (`platform::idempotency`).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// 1..=255 visible ASCII characters; the same key replays the first answer
    #[serde(rename = "Idempotency-Key")]
    #[param(min_length = 1, max_length = 255, pattern = "^[!-~]+$")]
    pub key: String,
}

/// `Idempotency-Key`, optional (the ops changes).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct OptionalIdempotencyKey {
    /// Optional; 1..=255 visible ASCII characters; the same key and body replay the first
    /// answer, another body under the key is `422 IDEMPOTENCY_KEY_REUSED`
    #[serde(rename = "Idempotency-Key")]
    #[param(min_length = 1, max_length = 255, pattern = "^[!-~]+$")]
    pub key: Option<String>,
}

/// The three ways to authenticate: the admission token (bearer or the gateway's cookie) and
/// the admin secret.
struct AuthSchemes;

impl Modify for AuthSchemes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admission",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("an admission token from the waiting room"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "identity",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "the fan's login (identity) token; never an admission token",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admissionCookie",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new(
                shared::headers::ADMISSION_COOKIE,
            ))),
        );
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "an operator credential (`fgop_…`, from `POST /admin/operators`) or the \
                         bootstrap admin secret. Each operation's scope list names the least role \
                         it needs: `viewer` < `support` < `admin`; the bootstrap secret acts as \
                         `admin`",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "scanner",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "a scanner credential (`fgsc_…`, from `POST \
                         /admin/events/{event}/scanners`): the door's scan routes of its own \
                         event only",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every operation behind an operator credential can also answer `403` (a role below the one
/// it needs: `ROLE_FORBIDDEN`; a scanner credential: `WRONG_CREDENTIAL_TYPE`) and `429` (too
/// many failed credential checks from this address: `TOO_MANY_FAILED_LOGINS`).
///
/// Applied to the whole document once the routers' operations are merged in (the modifier of
/// [`ApiDoc`] runs before that, when there are none yet).
pub fn admin_refusals(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{Ref, RefOr};
    for item in doc.paths.paths.values_mut() {
        let ops = [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ];
        for op in ops.into_iter().flatten() {
            let admin = serde_json::to_value(&op.security)
                .ok()
                .and_then(|v| v.as_array().cloned())
                .is_some_and(|reqs| reqs.iter().any(|r| r.get("admin").is_some()));
            if !admin {
                continue;
            }
            for (status, name) in [("403", "Forbidden"), ("429", "RateLimited")] {
                op.responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
            }
        }
    }
}

/// The document as served and committed: pretty JSON, keys in a stable order, a final newline.
pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    match doc.to_pretty_json() {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        // Serialising plain maps and strings cannot fail; say so rather than serve nothing.
        Err(e) => format!("{{\"error\": \"the OpenAPI document did not serialise: {e}\"}}\n"),
    }
}
