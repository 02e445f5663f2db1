//! Booking's OpenAPI document (`docs/openapi/booking.json`, served at `GET /openapi.json`)
//! names every JSON route booking serves. The document is generated from the routes mounted
//! with `utoipa_axum::routes!` (`platform/openapi.rs`), so those are documented by
//! construction; this test, reading the source like `layers.rs`, checks that every route
//! mounted the plain axum way (`.route(..)`, undocumented) is one of the non-JSON ones, and that
//! the committed document is whole. `tests/api/openapi.rs` keeps the committed document equal
//! to the served one; the schemathesis run (`deploy/tests/openapi.sh`) checks the answers.

use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Served but not JSON, so not in the document: Prometheus text, the auction WebSocket and
/// the ops page's static files (all described in docs/api.md).
const NOT_JSON: [&str; 8] = [
    "/metrics",
    "/ws/auctions/{id}",
    "/ops",
    "/ops/",
    "/ops/ops.js",
    "/ops/ops-i18n.js",
    "/ops/ops.css",
    "/ops/favicon.svg",
];
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `(path, method)` of every `.route("path", get(..).post(..))` in `src/`.
fn routes_in_source() -> BTreeSet<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut routes = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("source file");
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(") {
            let call = &rest[at + ".route(".len()..];
            // The call's own text: up to its closing parenthesis.
            let mut depth = 1usize;
            let mut end = call.len();
            for (i, c) in call.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &call[..end];
            rest = &call[end..];
            let Some(path) = args
                .trim_start()
                .strip_prefix('"')
                .and_then(|p| p.split('"').next())
            else {
                continue; // a route built from a variable: none in booking today
            };
            let handlers = &args[args.find(',').unwrap_or(args.len())..];
            for method in METHODS {
                let mut h = handlers;
                while let Some(i) = h.find(&format!("{method}(")) {
                    let before = h[..i].chars().next_back();
                    if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
                        routes.insert((path.to_owned(), method.to_owned()));
                    }
                    h = &h[i + method.len()..];
                }
            }
        }
    }
    routes
}

fn document() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/booking.json");
    let text = fs::read_to_string(&path).expect("docs/openapi/booking.json");
    serde_json::from_str(&text).expect("booking.json is JSON")
}

fn routes_in_document(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("path item");
            METHODS
                .iter()
                .filter(|m| item.contains_key(**m))
                .map(|m| (path.clone(), (*m).to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_route_outside_the_document_is_a_non_json_one() {
    let plain: BTreeSet<_> = routes_in_source();
    assert!(
        plain.iter().any(|(p, _)| p == "/metrics"),
        "the source scan found none of the plain routes: {plain:?}"
    );
    let undocumented: Vec<_> = plain
        .iter()
        .filter(|(p, _)| !NOT_JSON.contains(&p.as_str()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "JSON routes mounted with `.route(..)` are missing from the OpenAPI document: mount them \
         with `utoipa_axum::routes!` and a `#[utoipa::path]` on the handler: {undocumented:?}"
    );
    let doc = routes_in_document(&document());
    let stale: Vec<_> = doc
        .iter()
        .filter(|(p, _)| NOT_JSON.contains(&p.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "non-JSON routes in the document: {stale:?}"
    );
    assert!(
        doc.len() > 40,
        "the document names too few operations: {doc:?}"
    );
}

/// Every `$ref` points at a component that exists, and every operation says what it answers.
#[test]
fn the_document_is_whole() {
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        let pointer = r.strip_prefix('#').expect("local reference");
        assert!(doc.pointer(pointer).is_some(), "dangling reference {r}");
    }
    for ((path, method), _) in routes_in_document(&doc).iter().map(|r| (r.clone(), ())) {
        let responses = &doc["paths"][&path][&method]["responses"];
        assert!(
            responses.as_object().is_some_and(|m| !m.is_empty()),
            "{method} {path} lists no responses"
        );
    }
}

/// Every operation behind an operator credential documents the two refusals any of them can
/// give: `403` (a role below the one it needs, or a scanner's credential) and `429` (too many
/// failed credential checks from the caller's address). They were once added before the
/// routers' operations were merged in, so no operation got them.
#[test]
fn every_admin_operation_documents_403_and_429() {
    let doc = document();
    let paths = doc["paths"].as_object().expect("paths");
    let mut admin_ops = 0;
    let mut missing = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let admin = op["security"]
                .as_array()
                .is_some_and(|reqs| reqs.iter().any(|r| r.get("admin").is_some()));
            if !admin {
                continue;
            }
            admin_ops += 1;
            for status in ["403", "429"] {
                if op["responses"].get(status).is_none() {
                    missing.push(format!("{method} {path}: {status}"));
                }
            }
        }
    }
    assert!(admin_ops > 20, "only {admin_ops} admin operations found");
    assert!(missing.is_empty(), "undocumented refusals: {missing:?}");
}
