use crate::helpers::{TestApp, json};

#[tokio::test]
async fn health_ready_and_metrics() {
    let app = TestApp::spawn().await;
    let (status, body) = json(app.client.get(app.url("/healthz")).send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    let (status, body) = json(app.client.get(app.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["postgres"], true);
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("floodgate_booking_http_requests_total"),
        "{text}"
    );
    app.stop().await;
}

/// Every booking metric the launch-day dashboard queries is exported by a booking that has
/// answered nothing but a health check: a panel on a quiet launch shows 0, not "no data"
/// (and the surge bench's dashboard check failed when a run happened to refuse nobody).
#[tokio::test]
async fn a_fresh_booking_exports_every_metric_the_dashboard_queries() {
    let app = TestApp::spawn().await;
    let (status, _) = json(app.client.get(app.url("/healthz")).send().await.unwrap()).await;
    assert_eq!(status, 200);
    let text = app.metrics_text().await;
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/floodgate.json"
    ))
    .expect("read deploy/grafana/floodgate.json");
    let mut names: Vec<&str> = dashboard
        .match_indices("floodgate_booking_")
        .map(|(i, _)| {
            let rest = &dashboard[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 5, "the dashboard queries booking: {names:?}");
    let exported = |name: &str| {
        text.lines()
            .any(|l| !l.starts_with('#') && l.split(['{', ' ']).next() == Some(name))
    };
    let missing: Vec<&&str> = names.iter().filter(|n| !exported(n)).collect();
    assert!(
        missing.is_empty(),
        "not on a fresh booking's /metrics: {missing:?}"
    );
    // And the labels the panels select on.
    for series in [
        "floodgate_booking_orders_total{event=\"created\"} 0",
        "floodgate_booking_payment_attempts_total{outcome=\"paid\"} 0",
        "floodgate_booking_refusals_total{code=\"SOLD_OUT\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing");
    }
    app.stop().await;
}

#[tokio::test]
async fn unknown_path_is_json_404() {
    let app = TestApp::spawn().await;
    let (status, body) = json(app.client.get(app.url("/nope")).send().await.unwrap()).await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "NOT_FOUND");
    app.stop().await;
}

#[tokio::test]
async fn readyz_fails_cleanly_without_database() {
    let app = TestApp::spawn_with(|c| {
        use secrecy::SecretString;
        c.database.url = SecretString::from("postgres://postgres@127.0.0.1:1/none");
        c.database.acquire_timeout_ms = 300;
    })
    .await;
    let (status, body) = json(app.client.get(app.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, 503);
    assert_eq!(body["postgres"], false);
    app.stop().await;
}

#[tokio::test]
async fn request_ids_are_echoed_generated_or_replaced_when_overlong() {
    let app = TestApp::spawn().await;
    let get = |id: Option<String>| {
        let mut req = app.client.get(app.url("/healthz"));
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        req.send()
    };
    let echoed = get(Some("gw-req-42".into())).await.unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "gw-req-42");

    let fresh = get(None).await.unwrap();
    let id = fresh.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(shared::ids::is_valid_slug(&id) && id.len() == 32, "{id}");

    let long = "x".repeat(200);
    let replaced = get(Some(long.clone())).await.unwrap();
    let id = replaced.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_ne!(id, long);
    assert_eq!(id.len(), 32, "{id}");
    app.stop().await;
}

#[tokio::test]
async fn a_request_stuck_on_the_database_answers_503_at_the_request_timeout() {
    let app = TestApp::spawn_with(|c| c.booking.request_timeout_ms = 300).await;
    crate::helpers::ensure_event(&app, "stuck").await;
    let token = app.admission("fan", "stuck");
    // Another transaction holds the tables the seat map reads: the request waits on the lock
    // until the timeout answers for it.
    let mut tx = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events, seats IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let resp = app
        .client
        .get(app.url("/api/events/stuck/seats"))
        .bearer_auth(&token)
        .timeout(std::time::Duration::from_secs(20))
        .send()
        .await
        .expect("booking answers before the client gives up");
    let retry_after = resp.headers().get("retry-after").cloned();
    let (status, body) = json(resp).await;
    tx.rollback().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "UNAVAILABLE");
    assert!(retry_after.is_some(), "a 503 says when to retry");
    // The lock is gone: the same request now succeeds.
    let resp = app
        .client
        .get(app.url("/api/events/stuck/seats"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    app.stop().await;
}
