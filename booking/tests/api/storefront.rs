//! `GET /api/events/{event}`: the storefront's event details.

use crate::helpers::{TestApp, json};
use serde_json::json;

async fn create_event(app: &TestApp, id: &str) {
    let (status, body) = json(
        app.admin_post(
            "/admin/events",
            &json!({
                "id": id, "name": "Tour 2027 Tokyo", "venue": "Dome",
                "sale_start": "2026-01-01T10:00:00+09:00", "hold_ttl_s": 600,
                "max_tickets_per_account": 3,
                "price_tiers": [{"tier": "B", "price": 8000}, {"tier": "A", "price": 12000}],
                "seat_map": {"sections": [
                    {"name": "S1", "rows": 2, "seats_per_row": 3, "price_tier": "A"}]},
                "ga_tiers": [{"tier": "FLOOR", "price": 9000, "capacity": 100, "shards": 4}]
            }),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn event_info_shows_limit_tiers_and_ga_availability() {
    let app = TestApp::spawn().await;
    create_event(&app, "info").await;
    let token = app.admission("fan-1", "info");

    let (status, info) = json(app.get("/api/events/info", &token).await).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["name"], "Tour 2027 Tokyo");
    assert_eq!(info["venue"], "Dome");
    assert_eq!(info["max_tickets_per_account"], 3);
    assert_eq!(info["currency"], "JPY");
    assert_eq!(
        info["price_tiers"],
        json!([{"tier": "A", "price": 12000}, {"tier": "B", "price": 8000}])
    );
    assert_eq!(
        info["ga_tiers"],
        json!([{"tier": "FLOOR", "price": 9000, "capacity": 100, "available": 100}])
    );

    // A GA hold is visible in `available` (the counters are the source).
    let (status, hold) = json(
        app.post(
            "/api/events/info/ga-holds",
            &token,
            &json!({"tier": "FLOOR", "quantity": 2}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let (_, info) = json(app.get("/api/events/info", &token).await).await;
    assert_eq!(info["ga_tiers"][0]["available"], 98);
    app.stop().await;
}

#[tokio::test]
async fn event_info_needs_an_admission_for_that_event() {
    let app = TestApp::spawn().await;
    create_event(&app, "info").await;
    create_event(&app, "other").await;

    let resp = app
        .client
        .get(app.url("/api/events/info"))
        .send()
        .await
        .expect("request");
    let (status, body) = json(resp).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "ADMISSION_REQUIRED");

    let wrong = app.admission("fan-1", "other");
    let (status, body) = json(app.get("/api/events/info", &wrong).await).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "WRONG_EVENT");

    let token = app.admission("fan-1", "nope");
    let (status, body) = json(app.get("/api/events/nope", &token).await).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "UNKNOWN_EVENT");
    app.stop().await;
}
