//! `POST /webhooks/payments` is its own limit class (DESIGN.md section 9, "provider-signed";
//! issue 41, item 4): a per-IP rate budget sized for a provider's burst of retries that fans'
//! requests never spend and that never spends theirs, and a body limit of its own. Real
//! gateway, real Redis, the echo upstream standing in for booking.

use crate::edge::chunked_post;
use crate::helpers::*;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Instant;

const WEBHOOK: &str = "/webhooks/payments";

async fn webhook(app: &TestApp, body: impl Into<reqwest::Body>) -> reqwest::Response {
    app.http
        .post(app.url(WEBHOOK))
        .header("content-type", "application/json")
        .header("stripe-signature", "t=1,v1=00")
        .body(body)
        .send()
        .await
        .expect("an answer, not a broken connection")
}

/// An event cancellation: far more webhooks from one address than the fans' per-IP limit
/// allows, all at once. Every one reaches booking, and the fans on that address keep their
/// whole budget, and are still limited by it.
#[tokio::test]
async fn a_webhook_burst_past_the_fans_per_ip_limit_all_reaches_booking() {
    const FANS_PER_IP_PER_S: u32 = 5;
    const BURST: usize = 600;
    let app = TestApp::spawn_with(|c| c.gateway.limits.api_per_ip_per_s = FANS_PER_IP_PER_S).await;
    let hits = app.echo.hits.load(Ordering::SeqCst);

    let statuses: Vec<StatusCode> = futures::stream::iter(0..BURST)
        .map(|i| {
            let app = &app;
            async move {
                webhook(app, format!("{{\"id\": \"evt_{i}\"}}"))
                    .await
                    .status()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let refused: Vec<&StatusCode> = statuses.iter().filter(|s| **s != StatusCode::OK).collect();
    assert!(
        refused.is_empty(),
        "{} of {BURST} webhooks refused, first {:?}",
        refused.len(),
        refused.first()
    );
    assert_eq!(
        app.echo.hits.load(Ordering::SeqCst) - hits,
        BURST as u64,
        "every webhook of the burst reached booking"
    );

    // The same address's fans: their budget is whole (the webhooks spent none of it) and
    // still theirs to run out of.
    let tok = fan_token();
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..30 {
        answers.push(api(&app, &tok, "/api/events/ev/seats").await.status());
    }
    let elapsed = started.elapsed();
    let burst = FANS_PER_IP_PER_S as usize;
    assert!(
        answers[..burst].iter().all(|s| *s == StatusCode::OK),
        "the fans' per-IP budget was spent by webhooks: {answers:?}"
    );
    let ok = answers.iter().filter(|s| **s == StatusCode::OK).count();
    // GCRA: the burst, plus what refilled meanwhile.
    let refilled = (elapsed.as_secs_f64() * f64::from(FANS_PER_IP_PER_S)).ceil() as usize;
    assert!(
        ok <= burst + refilled,
        "{ok} of 30 fan calls passed in {elapsed:?}: the fans' per-IP limit no longer holds"
    );
    assert!(
        answers
            .iter()
            .all(|s| matches!(*s, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS))
    );
}

/// The webhooks' own budget refuses past its size with `429 RATE_LIMITED` and `Retry-After`
/// (the provider retries), and fans' requests from the same address never spend it.
#[tokio::test]
async fn the_webhook_budget_refuses_past_its_size_and_fans_never_spend_it() {
    const BUDGET: u32 = 20;
    let app = TestApp::spawn_with(|c| c.gateway.limits.webhooks_per_ip_per_min = BUDGET).await;
    let hits = app.echo.hits.load(Ordering::SeqCst);

    // Many fan calls from this address first: none may count against the webhooks.
    let tok = fan_token();
    for _ in 0..50 {
        let r = api(&app, &tok, "/api/events/ev/seats").await;
        assert_eq!(r.status(), StatusCode::OK);
    }

    let started = Instant::now();
    let mut answers: Vec<(StatusCode, Option<u64>, Value)> = Vec::new();
    for i in 0..(2 * BUDGET) {
        let r = webhook(&app, format!("{{\"id\": \"evt_{i}\"}}")).await;
        let status = r.status();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        answers.push((status, retry_after, r.json().await.unwrap_or(Value::Null)));
    }
    let elapsed = started.elapsed();
    let budget = BUDGET as usize;
    assert!(
        answers[..budget].iter().all(|a| a.0 == StatusCode::OK),
        "the budget's first {BUDGET} webhooks must pass (fans spent none of it): {:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    let ok = answers.iter().filter(|a| a.0 == StatusCode::OK).count();
    // One webhook refills every 60 s / BUDGET.
    let refilled = (elapsed.as_secs_f64() * f64::from(BUDGET) / 60.0).ceil() as usize;
    assert!(
        ok <= budget + refilled,
        "{ok} of {} webhooks passed in {elapsed:?} on a budget of {BUDGET} a minute",
        answers.len()
    );
    for (status, retry_after, body) in answers.iter().filter(|a| a.0 != StatusCode::OK) {
        assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["code"], "RATE_LIMITED", "{body}");
        assert!(
            retry_after.is_some_and(|s| s >= 1),
            "a refused webhook says when to retry: {retry_after:?}"
        );
    }
    assert_eq!(
        app.echo.hits.load(Ordering::SeqCst) - hits,
        50 + ok as u64,
        "a refused webhook never reaches booking"
    );
    let text = app
        .http
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let limited =
        testkit::promtext::value(&text, "fg_rate_limited_total", Some("scope=\"webhook\""));
    assert_eq!(
        limited,
        Some((answers.len() - ok) as f64),
        "each refusal counted under scope webhook"
    );
}

/// A webhook body over `gateway.webhook_max_body_bytes` is `413 BODY_TOO_LARGE` naming that
/// limit, declared or streamed, and booking never receives it; one at the limit passes.
#[tokio::test]
async fn an_oversized_webhook_is_413_and_never_reaches_booking() {
    const LIMIT: usize = 8 * 1024;
    let app = TestApp::spawn_with(|c| c.gateway.webhook_max_body_bytes = LIMIT).await;
    let hits = app.echo.hits.load(Ordering::SeqCst);
    let bodies = app.echo.bodies.load(Ordering::SeqCst);

    let r = webhook(&app, vec![b' '; 2 * LIMIT]).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let v = json(r).await;
    assert_eq!(v["code"], "BODY_TOO_LARGE", "{v}");
    assert_eq!(v["limit_bytes"], LIMIT, "{v}");
    assert_eq!(
        app.echo.hits.load(Ordering::SeqCst),
        hits,
        "a declared oversized webhook never reaches booking"
    );

    let (status, v) = chunked_post(app.gw().public, WEBHOOK, "-", 2 * LIMIT, 1024).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["limit_bytes"], LIMIT, "{v}");
    assert_eq!(
        app.echo.bodies.load(Ordering::SeqCst),
        bodies,
        "booking never received a complete oversized webhook"
    );

    let r = webhook(&app, vec![b' '; LIMIT]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(app.echo.bodies.load(Ordering::SeqCst), bodies + 1);
}

/// The webhook's limit never exceeds booking's own (booking would cut a larger body off
/// mid-upload and the provider would see a `502`).
#[tokio::test]
async fn the_webhook_limit_never_exceeds_bookings() {
    let app = TestApp::spawn_with(|c| {
        c.gateway.webhook_max_body_bytes = 1024 * 1024;
        c.booking.body_limit_bytes = 16 * 1024;
    })
    .await;
    let r = webhook(&app, vec![b' '; 32 * 1024]).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(r).await["limit_bytes"], 16 * 1024);
    let r = webhook(&app, vec![b' '; 16 * 1024]).await;
    assert_eq!(r.status(), StatusCode::OK);
}
