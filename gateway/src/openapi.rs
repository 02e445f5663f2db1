//! The gateway's two OpenAPI documents, generated from its own request and answer types with
//! `utoipa`: [`public`] describes the public listener, [`admin`] the admin listener.
//!
//! Guarantee: `docs/openapi/gateway.json` and `gateway-admin.json` are exactly what
//! [`public_json`] and [`admin_json`] print (`gateway/tests/openapi.rs` fails otherwise and
//! rewrites them with `UPDATE_OPENAPI=1`), and every path the route tables (`routes.rs`)
//! answer is in them. The listeners serve the committed files (`respond.rs`), so what runs
//! is what was reviewed; nothing here runs on a request.
//!
//! The gateway routes by hand on pingora and its handlers take pingora's `Session`, so each
//! operation is described by a documentation-only function (`public.rs`, `admin.rs`) named
//! after its route variant. Bodies the handlers (de)serialise through a type use that type
//! (`EventConfigInput`, `Change`, `AuditEntry`, …); answers the handlers build with `json!`
//! (the waiting room's hot paths) are described by the types in `answers.rs`, kept in step
//! by schemathesis' response checks (`deploy/tests/openapi.sh`).

use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

pub mod admin;
pub mod answers;
pub mod public;

/// The documents' version (`info.version`).
pub const VERSION: &str = "0.2.0";

/// Said once in each document's description.
pub const ERROR_CODES_NOTE: &str = "Every refusal is `{\"code\", \"message\", ...details}` with a stable `code` (docs/api.md lists them per endpoint).";

/// Every refusal is `{"code", "message", ...details}` with a stable `code` (docs/api.md lists
/// them per endpoint). The shape of `shared::error::ErrorBody`.
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorDoc {
    /// Stable and machine-readable (`UNKNOWN_EVENT`, `VALIDATION_FAILED`, …).
    #[schema(pattern = "^[A-Z][A-Z0-9_]*$")]
    pub code: String,
    /// For people; never internal detail.
    pub message: String,
}

/// The usual refusals, one reusable response each (`#/components/responses/…`).
pub mod refusals {
    use super::ErrorDoc;
    use utoipa::ToResponse;

    #[derive(ToResponse)]
    #[response(description = "Malformed request (bad JSON, a missing or unusable header)")]
    pub struct BadRequest(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "No valid credentials (`UNAUTHORIZED`)")]
    pub struct Unauthorized(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Not allowed (`NOT_REGISTERED`, `WRONG_EVENT`, …)")]
    pub struct Forbidden(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(
        description = "A valid operator credential whose role is below the operation's scope (`ROLE_FORBIDDEN`, with `role` and `required_role`; nothing changed), or a scanner credential (`WRONG_CREDENTIAL_TYPE`)"
    )]
    pub struct RoleForbidden(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(
        description = "This address failed too many credential checks (`TOO_MANY_FAILED_LOGINS`, `Retry-After`): every credential it presents is refused until then, a valid one too"
    )]
    pub struct TooManyFailedLogins(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Not found (`UNKNOWN_EVENT` for an event without a room)")]
    pub struct NotFound(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Method not allowed")]
    pub struct MethodNotAllowed(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Conflict with the current state (the code says which)")]
    pub struct Conflict(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Body too large")]
    pub struct PayloadTooLarge(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Not `application/json`")]
    pub struct UnsupportedMediaType(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(
        description = "Well-formed but invalid (`VALIDATION_FAILED` with the problems, `INVALID_ACCOUNTS`, …)"
    )]
    pub struct Unprocessable(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Rate limited (`Retry-After`)")]
    pub struct TooManyRequests(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(description = "Redis is unavailable (`Retry-After`)")]
    pub struct Unavailable(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(
        description = "No valid admission token (`ADMISSION_REQUIRED`, with `reason`; `WWW-Authenticate: Bearer`). A browser asking for HTML is sent to the waiting room (`302`) instead"
    )]
    pub struct AdmissionRequired(pub ErrorDoc);

    #[derive(ToResponse)]
    #[response(
        description = "Booking could not be used (`UPSTREAM_UNAVAILABLE`): `502` it failed to answer, `503` none is reachable (`Retry-After`), `504` it did not answer in time"
    )]
    pub struct Upstream(pub ErrorDoc);
}

/// The public listener's bearer scheme: `identity`, a fan's login token.
struct IdentityScheme;

impl Modify for IdentityScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut http: Http = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .build();
        http.description = Some("the fan's login (identity) token".into());
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("identity", SecurityScheme::Http(http));
    }
}

/// The public listener's other bearer scheme: `admission`, the waiting room's admission token
/// (or its `fg_admission` cookie), on the forwarded checkout writes.
struct AdmissionScheme;

impl Modify for AdmissionScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut http: Http = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .build();
        http.description = Some("an admission token from the waiting room".into());
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("admission", SecurityScheme::Http(http));
    }
}

/// The admin listener's bearer scheme: `admin`, an operator credential or the bootstrap
/// admin secret; an operation's scopes are the roles it needs.
struct AdminScheme;

impl Modify for AdminScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut http: Http = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build();
        http.description = Some(
            "an operator credential (`fgop_…`, its role from booking) or the bootstrap admin \
             secret (role admin); an operation's scope is the least role it needs"
                .into(),
        );
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("admin", SecurityScheme::Http(http));
    }
}

/// The public listener's document as JSON.
pub fn public_value() -> Value {
    finish(public::PublicApi::openapi(), &public::NO_AUTH)
}

/// The admin listener's document as JSON.
pub fn admin_value() -> Value {
    finish(admin::AdminApi::openapi(), &admin::NO_AUTH)
}

/// The text of `docs/openapi/gateway.json`.
pub fn public_json() -> String {
    render(&public_value())
}

/// The text of `docs/openapi/gateway-admin.json`.
pub fn admin_json() -> String {
    render(&admin_value())
}

/// Pretty JSON with every object's keys sorted and a trailing newline, so the text does not
/// depend on map types or on which features a build unified.
fn render(doc: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let mut text = serde_json::to_string_pretty(&sorted(doc)).unwrap_or_default();
    text.push('\n');
    text
}

/// What `utoipa`'s attributes cannot say, set on the JSON: operations that take no
/// credentials in a document with a global scheme (`security: []`, where `utoipa` writes
/// `[{}]`, "credentials optional").
fn finish(doc: utoipa::openapi::OpenApi, no_auth: &[(&str, &str)]) -> Value {
    let mut v = serde_json::to_value(doc).unwrap_or_default();
    for (path, method) in no_auth {
        if let Some(op) = v
            .get_mut("paths")
            .and_then(|p| p.get_mut(*path))
            .and_then(|p| p.get_mut(*method))
            .and_then(Value::as_object_mut)
        {
            op.insert("security".into(), Value::Array(Vec::new()));
        }
    }
    v
}

/// A JSON object with at least one field (a scheduled change's `set`).
pub fn nonempty_object() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Object)
        .min_properties(Some(1))
        .build()
}

/// The audit log's actions (`AuditEntry::action`).
#[derive(Serialize, ToSchema)]
pub enum AuditAction {
    #[serde(rename = "config.put")]
    ConfigPut,
    #[serde(rename = "schedule.add")]
    ScheduleAdd,
    #[serde(rename = "schedule.edit")]
    ScheduleEdit,
    #[serde(rename = "schedule.cancel")]
    ScheduleCancel,
    #[serde(rename = "schedule.apply")]
    ScheduleApply,
    #[serde(rename = "schedule.fail")]
    ScheduleFail,
    #[serde(rename = "sold_out")]
    SoldOut,
    #[serde(rename = "revoke")]
    Revoke,
    #[serde(rename = "registrations.add")]
    RegistrationsAdd,
    #[serde(rename = "registrations.remove")]
    RegistrationsRemove,
    #[serde(rename = "registrations.replace")]
    RegistrationsReplace,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_sorts_keys_and_ends_with_a_newline() {
        let text = render(&serde_json::json!({"b": 1, "a": {"d": 2, "c": 3}}));
        assert_eq!(
            text,
            "{\n  \"a\": {\n    \"c\": 3,\n    \"d\": 2\n  },\n  \"b\": 1\n}\n"
        );
    }
}
