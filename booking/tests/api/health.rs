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
