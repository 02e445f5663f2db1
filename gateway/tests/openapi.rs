//! The gateway's two OpenAPI documents (`docs/openapi/gateway.json`, `gateway-admin.json`)
//! are exactly what `gateway::openapi` generates from the code, and they name every API
//! route the route tables answer, with the same methods, and nothing the tables do not
//! answer; of booking's forwarded routes, the public one names exactly the payment webhook
//! and the checkout writes that can be answered `409 ROOM_FULL` (`slots.rs`). `UPDATE_OPENAPI=1 cargo test -p gateway --test openapi` rewrites the files; the
//! schemathesis run (`deploy/tests/openapi.sh`) checks the running listeners against them.

use gateway::routes::{self, AdminRoute, Route};
use http::Method;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn committed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/openapi")
        .join(name)
}

/// Compares (or, with `UPDATE_OPENAPI=1`, writes) one document.
fn check(name: &str, generated: &str) {
    let path = committed(name);
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&path, generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        text == generated,
        "docs/openapi/{name} is not what the code generates: run \
         `UPDATE_OPENAPI=1 cargo test -p gateway --test openapi`, review the diff and commit it"
    );
}

#[test]
fn public_document_is_generated_from_the_code() {
    check("gateway.json", &gateway::openapi::public_json());
}

#[test]
fn admin_document_is_generated_from_the_code() {
    check("gateway-admin.json", &gateway::openapi::admin_json());
}

const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// `(path, method)` of every operation in a document, with `{event}` and `{id}` filled in.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    let paths = doc["paths"].as_object().expect("paths");
    for (path, item) in paths {
        let concrete = path.replace("{event}", "demo").replace("{id}", "c1");
        for method in item.as_object().expect("path item").keys() {
            ops.insert((concrete.clone(), method.to_uppercase()));
        }
    }
    ops
}

/// Paths to try on the routers: every path literal and every action name in routes.rs, as
/// a top-level path, a waiting-room action and an admin action (a new route in the table
/// shows up here without editing this test).
fn candidates() -> BTreeSet<String> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/routes.rs"))
        .expect("routes.rs");
    let code = src.split("#[cfg(test)]").next().unwrap_or(&src);
    let mut out = BTreeSet::new();
    for (i, lit) in code.split('"').enumerate() {
        if i % 2 == 0 || lit.is_empty() || lit.len() > 40 {
            continue;
        }
        if lit.starts_with('/') {
            out.insert(lit.to_owned());
        } else if lit
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'/')
        {
            let action = lit.trim_end_matches('/');
            out.insert(format!("/queue/demo/{action}"));
            out.insert(format!("/admin/events/demo/{action}"));
            out.insert(format!("/admin/events/demo/{action}/c1"));
        }
    }
    out
}

/// The checkout writes of `slots.rs`, from its doc comments (`` /// `POST /api/orders` ``),
/// with `{…}` parameters filled in as in [`documented`].
fn checkout_writes() -> BTreeSet<String> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/slots.rs"))
        .expect("slots.rs");
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("/// `"))
        .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest))
        .filter_map(|rest| rest.strip_suffix('`'))
        .filter(|path| path.starts_with("/api/"))
        .map(|path| {
            path.replace("{event}", "demo")
                .replace("{id}", "c1")
                .replace("{hold}", "c1")
        })
        .collect()
}

/// The public routes in the document: the waiting room's own API, and of booking's forwarded
/// routes the payment webhook and the writes that may be answered `ROOM_FULL`; the others
/// are pages, metrics, or booking's (described by booking's document).
fn public_api(method: &Method, path: &str) -> bool {
    match routes::public(method, path) {
        Route::Healthz
        | Route::Readyz
        | Route::OpenApi
        | Route::DevLogin
        | Route::Join(_)
        | Route::Register(_)
        | Route::Status(_)
        | Route::Draw(_)
        | Route::Receipt(_)
        | Route::Challenge(_)
        | Route::Webhook => true,
        Route::Api { .. } => {
            gateway::slots::checkout(method, path).is_some_and(gateway::slots::Checkout::takes_slot)
        }
        _ => false,
    }
}

fn admin_api(route: AdminRoute<'_>) -> bool {
    !matches!(
        route,
        AdminRoute::Metrics
            | AdminRoute::UnknownEvent
            | AdminRoute::MethodNotAllowed
            | AdminRoute::NotFound
    )
}

fn answered(
    api: impl Fn(&Method, &str) -> bool,
    extra: BTreeSet<String>,
) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for path in candidates().into_iter().chain(extra) {
        for method in &METHODS {
            if api(method, &path) {
                ops.insert((path.clone(), method.to_string()));
            }
        }
    }
    ops
}

#[test]
fn the_public_document_names_every_route_the_table_answers() {
    let doc = gateway::openapi::public_value();
    let writes = checkout_writes();
    assert!(writes.len() >= 5, "slots.rs read wrongly: {writes:?}");
    let answered = answered(public_api, writes);
    let documented = documented(&doc);
    assert!(answered.len() >= 15, "routes.rs read wrongly: {answered:?}");
    assert_eq!(
        answered, documented,
        "routes::public and docs/openapi/gateway.json differ"
    );
}

#[test]
fn the_admin_document_names_every_route_the_table_answers() {
    let doc = gateway::openapi::admin_value();
    let answered = answered(|m, p| admin_api(routes::admin(m, p)), BTreeSet::new());
    let documented = documented(&doc);
    assert!(answered.len() >= 15, "routes.rs read wrongly: {answered:?}");
    assert_eq!(
        answered, documented,
        "routes::admin and docs/openapi/gateway-admin.json differ"
    );
}
