//! The admin listener's document: ops control of the waiting room (`routes::admin`).
//! `/metrics` is Prometheus text, not API.
//!
//! Each function below documents one route of `routes::admin` (named after its variant)
//! and is never called: the admin listener dispatches by hand in `admin.rs`.

use super::answers::{
    AuditPage, Count, Health, Pending, Ready, Revoked, ShownConfig, SoldOut, Uploaded,
};
use super::refusals::{
    BadRequest, Conflict, MethodNotAllowed, NotFound, PayloadTooLarge, RoleForbidden,
    TooManyFailedLogins, Unauthorized, Unavailable, Unprocessable, UnsupportedMediaType,
};
use super::{AdminScheme, ErrorDoc, VERSION};
use crate::admin::SoldOutBody;
use crate::event_config::EventConfigInput;
use crate::schedule::{Change, ChangeInput};
use serde::Deserialize;
use utoipa::{IntoParams, OpenApi, ToSchema};

/// Operations answered without credentials. Every other operation states the least role it
/// needs as its security requirement's scope (`auth::required_role`, held equal by the test
/// below).
pub(super) const NO_AUTH: [(&str, &str); 3] = [
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/openapi.json", "get"),
];

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    /// The event's id.
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    pub event: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ChangePath {
    /// The event's id.
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    pub event: String,
    /// The change's id.
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    pub id: String,
}

/// The person behind a change made with the bootstrap admin secret, kept as the audit
/// entry's `note` (`admin::caller_note`).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct Actor {
    /// With the bootstrap secret: 1 to 200 visible characters (`400 ACTOR_REQUIRED` when
    /// missing or unusable), kept as the audit entry's `note`. Ignored with an operator
    /// credential (the operator's name is the actor).
    #[param(
        rename = "X-Floodgate-Actor",
        min_length = 1,
        max_length = 200,
        pattern = "^[ -~]*[!-~][ -~]*$"
    )]
    pub actor: String,
}

/// The person behind a change made with the bootstrap admin secret, when named.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct OptionalActor {
    /// With the bootstrap secret: 1 to 200 visible characters (`400 ACTOR_REQUIRED` when
    /// present but unusable), kept as the audit entry's `note`. Ignored with an operator
    /// credential.
    #[param(
        rename = "X-Floodgate-Actor",
        required = false,
        min_length = 1,
        max_length = 200,
        pattern = "^[ -~]*[!-~][ -~]*$"
    )]
    pub actor: String,
}

/// `?limit=&before=` (`admin/audit.rs`; any other parameter is `422`).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Entries per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// `next_before` of the previous page.
    #[param(pattern = "^[0-9]{1,19}-[0-9]{1,19}$")]
    pub before: Option<String>,
}

/// How an upload changes the list.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListMode {
    /// The union (default).
    Add,
    Remove,
    /// The list becomes exactly this upload.
    Replace,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// add (default: union), remove, or replace (the list becomes exactly this body).
    pub mode: Option<ListMode>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CountQuery {
    /// An account id to look up.
    #[param(pattern = "^[A-Za-z0-9._@-]{1,128}$")]
    pub account: Option<String>,
}

/// Revoke one account's or one session's admission: exactly one of the two (the handler's
/// body takes both as optional and refuses anything else with `422`).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RevokeBody {
    Account(RevokeAccount),
    Session(RevokeSession),
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeAccount {
    #[schema(pattern = "^[A-Za-z0-9._@-]{1,128}$")]
    pub account: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeSession {
    #[schema(pattern = "^[a-z0-9_-]{1,64}$")]
    pub session: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Floodgate gateway (admin listener)",
        version = VERSION,
        description = "Ops control of the waiting room. Every refusal is `{\"code\", \"message\", ...details}` with a stable `code` (docs/api.md lists them per endpoint). Each operation's security scope names the least role it needs (`viewer` < `support` < `admin`): an operator credential of a lower role is refused `403 ROLE_FORBIDDEN`; the bootstrap admin secret has every role.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "http://127.0.0.1:8081", description = "the local stack")),
    paths(
        healthz, readyz, openapi_json, get_config, put_config, schedule, add_change, change,
        edit_change, cancel_change, audit, revoke, sold_out, put_registrations,
        get_registrations
    ),
    components(
        schemas(ErrorDoc),
        responses(
            BadRequest, Unauthorized, RoleForbidden, NotFound, MethodNotAllowed, Conflict,
            PayloadTooLarge, UnsupportedMediaType, Unprocessable, TooManyFailedLogins,
            Unavailable
        )
    ),
    modifiers(&AdminScheme),
    tags(
        (name = "health", description = "Liveness, readiness and this document (no secret needed)"),
        (name = "room config", description = "An event's waiting-room config, its scheduled changes and audit log"),
        (name = "registrations", description = "Registration lists of registered rooms"),
    )
)]
pub struct AdminApi;

/// Liveness
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
pub fn healthz() {}

/// Readiness
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Ready),
        (status = 503, description = "Not ready", body = Ready),
    ))]
pub fn readyz() {}

/// This document
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "docs/openapi/gateway-admin.json", body = Object)))]
pub fn openapi_json() {}

/// An event's room config
#[utoipa::path(get, path = "/admin/events/{event}/config", security(("admin" = ["viewer"])), tag = "room config",
    params(EventPath),
    responses(
        (status = 200, description = "The config in force", body = ShownConfig),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn get_config() {}

/// Set an event's room config (validated whole; nothing applied on a refusal)
#[utoipa::path(put, path = "/admin/events/{event}/config", security(("admin" = ["admin"])), tag = "room config",
    params(EventPath, OptionalActor),
    request_body = EventConfigInput,
    responses(
        (status = 200, description = "The config now in force", body = ShownConfig),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 409, response = Conflict),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn put_config() {}

/// Pending scheduled changes, by time
#[utoipa::path(get, path = "/admin/events/{event}/schedule", security(("admin" = ["viewer"])), tag = "room config",
    params(EventPath),
    responses(
        (status = 200, description = "The pending changes", body = Pending),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn schedule() {}

/// Schedule a change (the merged config must validate; nothing stored otherwise)
#[utoipa::path(post, path = "/admin/events/{event}/schedule", security(("admin" = ["admin"])), tag = "room config",
    params(EventPath, Actor),
    request_body = ChangeInput,
    responses(
        (status = 201, description = "Scheduled", body = Change),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn add_change() {}

/// One scheduled change, any status
#[utoipa::path(get, path = "/admin/events/{event}/schedule/{id}", security(("admin" = ["viewer"])), tag = "room config",
    params(ChangePath),
    responses(
        (status = 200, description = "The change", body = Change),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn change() {}

/// Edit a pending change (`409 CHANGE_NOT_PENDING` once applied or cancelled)
#[utoipa::path(put, path = "/admin/events/{event}/schedule/{id}", security(("admin" = ["admin"])), tag = "room config",
    params(ChangePath, Actor),
    request_body = ChangeInput,
    responses(
        (status = 200, description = "The edited change", body = Change),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 409, response = Conflict),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn edit_change() {}

/// Cancel a pending change
#[utoipa::path(delete, path = "/admin/events/{event}/schedule/{id}", security(("admin" = ["admin"])), tag = "room config",
    params(ChangePath, Actor),
    responses(
        (status = 200, description = "The cancelled change", body = Change),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 409, response = Conflict),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn cancel_change() {}

/// The config audit log, newest first
#[utoipa::path(get, path = "/admin/events/{event}/audit", security(("admin" = ["viewer"])), tag = "room config",
    params(EventPath, AuditQuery),
    responses(
        (status = 200, description = "A page of entries", body = AuditPage),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn audit() {}

/// Revoke an account's or a session's admission
#[utoipa::path(post, path = "/admin/events/{event}/revoke", security(("admin" = ["support"])), tag = "room config",
    params(EventPath, OptionalActor),
    request_body = RevokeBody,
    responses(
        (status = 200, description = "Revoked", body = Revoked),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn revoke() {}

/// Mark an event sold out (or not)
#[utoipa::path(put, path = "/admin/events/{event}/sold_out", security(("admin" = ["admin"])), tag = "room config",
    params(EventPath, OptionalActor),
    request_body = SoldOutBody,
    responses(
        (status = 200, description = "The flag now", body = SoldOut),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn sold_out() {}

/// Upload a registration list: one account id per line (text/plain)
///
/// Validated whole: any malformed id is `422 INVALID_ACCOUNTS` with the bad line numbers and
/// nothing changes. Idempotent. Bounded by `gateway.registrations_max_body_bytes` (64 MiB by
/// default; `413` above).
#[utoipa::path(put, path = "/admin/events/{event}/registrations", security(("admin" = ["admin"])), tag = "registrations",
    params(EventPath, UploadQuery, OptionalActor),
    request_body(content = AccountList, content_type = "text/plain"),
    responses(
        (status = 200, description = "The list now", body = Uploaded),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn put_registrations() {}

/// How many accounts are on the list (and whether one is)
#[utoipa::path(get, path = "/admin/events/{event}/registrations", security(("admin" = ["viewer"])), tag = "registrations",
    params(EventPath, CountQuery),
    responses(
        (status = 200, description = "The count", body = Count),
        (status = 401, response = Unauthorized),
        (status = 403, response = RoleForbidden),
        (status = 404, response = NotFound),
        (status = 405, response = MethodNotAllowed),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyFailedLogins),
        (status = 503, response = Unavailable),
    ))]
pub fn get_registrations() {}

/// Account ids, one per line (blank lines and `\r` ignored).
pub struct AccountList;

impl utoipa::PartialSchema for AccountList {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::String)
            .pattern(Some(
                "^([A-Za-z0-9._@-]{1,128}\\r?\\n|\\r?\\n)*([A-Za-z0-9._@-]{1,128}\\r?)?$",
            ))
            .description(Some(
                "Account ids, one per line (blank lines and `\\r` ignored)",
            ))
            .into()
    }
}

impl ToSchema for AccountList {}

#[cfg(test)]
mod tests {
    use crate::admin::auth::required_role;
    use crate::routes::{self, AdminRoute};
    use http::Method;

    /// Each operation's documented scope is the role the listener enforces on its route,
    /// and the operations answered without credentials are exactly the open routes.
    #[test]
    fn documented_roles_are_the_enforced_ones() {
        let doc = super::super::admin_value();
        let paths = doc["paths"].as_object().expect("paths");
        let mut checked = 0;
        for (path, item) in paths {
            let concrete = path.replace("{event}", "demo").replace("{id}", "c1");
            for (method, op) in item.as_object().expect("path item") {
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
                let route = routes::admin(&m, &concrete);
                let security = op["security"].as_array().expect("every operation says");
                let documented: Vec<&str> = security
                    .iter()
                    .flat_map(|req| req["admin"].as_array().into_iter().flatten())
                    .filter_map(|v| v.as_str())
                    .collect();
                match required_role(&route) {
                    None => {
                        assert!(security.is_empty(), "{method} {path} is open: {security:?}");
                        assert!(matches!(
                            route,
                            AdminRoute::Healthz | AdminRoute::Readyz | AdminRoute::OpenApi
                        ));
                    }
                    Some(role) => {
                        assert_eq!(security.len(), 1, "{method} {path}");
                        assert_eq!(documented, [role.as_str()], "{method} {path}");
                        for status in ["401", "403", "429", "503"] {
                            assert!(
                                op["responses"].get(status).is_some(),
                                "{method} {path} does not document {status}"
                            );
                        }
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 15, "{checked}");
    }
}
