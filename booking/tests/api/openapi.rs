//! Booking's OpenAPI document is generated from the routes it mounts (`platform/openapi.rs`)
//! and served at `GET /openapi.json`; the reviewed copy is `docs/openapi/booking.json`. This
//! test keeps the two byte for byte equal, so a change of a handler's types, bounds or
//! answers shows up as a diff of the committed document in review.
//!
//! `UPDATE_OPENAPI=1 cargo test -p booking --test api openapi::` rewrites the committed file
//! with what booking serves (docs/api.md).

use crate::helpers::TestApp;
use std::path::Path;

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let app = TestApp::spawn().await;
    let resp = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let served = resp.text().await.expect("body");
    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/booking.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&committed_path, &served).expect("write docs/openapi/booking.json");
    }
    let committed = std::fs::read_to_string(&committed_path).expect("docs/openapi/booking.json");
    assert!(
        served == committed,
        "booking serves another document than docs/openapi/booking.json: regenerate it with \
         `UPDATE_OPENAPI=1 cargo test -p booking --test api openapi::` and review the diff"
    );
    let doc: serde_json::Value = serde_json::from_str(&served).expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(served.ends_with("}\n"), "one final newline");
    app.stop().await;
}
