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
