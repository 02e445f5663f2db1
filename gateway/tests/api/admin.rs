//! The ops config endpoint: authentication, validation, propagation.

use crate::helpers::*;
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn config_endpoint_authenticates_and_validates() {
    let app = TestApp::spawn().await;
    let url = app.admin_url("/admin/events/cfg/config");
    let good = json!({"sale_start": "2027-01-10T10:00:00+09:00", "admit_per_minute": 600,
                      "mode": "queue", "max_active": 100, "token_ttl_s": 600,
                      "auto": {"floor": 100, "ceiling": 2000}, "claim_deadline_s": 60});
    // Unauthenticated, wrong secret.
    let r = app.http.put(&url).json(&good).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = app
        .http
        .put(&url)
        .bearer_auth("wrong")
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = app
        .http
        .get(&url)
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The public listener does not serve the admin API.
    let r = app
        .http
        .put(app.url("/admin/events/cfg/config"))
        .bearer_auth(ADMIN)
        .json(&good)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    // Invalid values: 422, nothing applied.
    for bad in [
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": -5}),
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 50_000_000}),
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 10, "max_active": -1}),
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 10, "mode": "warp"}),
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 10,
               "auto": {"floor": 500, "ceiling": 100}}),
        json!({"sale_start": "yesterday", "admit_per_minute": 10}),
        json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 10, "surprise": 1}),
    ] {
        let r = app
            .http
            .put(&url)
            .bearer_auth(ADMIN)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(json(r).await["code"], "VALIDATION_FAILED");
    }
    let r = app.http.get(&url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "a refused config was applied"
    );
    let tok = app.login("fan").await;
    assert_eq!(app.join("cfg", &tok).await.status(), StatusCode::NOT_FOUND);
    // Malformed JSON and wrong content type.
    let r = app
        .http
        .put(&url)
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = app
        .http
        .put(&url)
        .bearer_auth(ADMIN)
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Valid: applied, readable, idempotent (absolute PUT), seed commitment stable.
    let r = app
        .http
        .put(&url)
        .bearer_auth(ADMIN)
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v1 = json(r).await;
    assert_eq!(v1["config"]["admit_per_minute"], 600);
    assert_eq!(v1["config"]["auto"]["ceiling"], 2000);
    let v2 = json(
        app.http
            .put(&url)
            .bearer_auth(ADMIN)
            .json(&good)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v1["seed_hash"], v2["seed_hash"]);
    assert_eq!(v1["config"], v2["config"]);
    // A later invalid PUT leaves the valid config in place.
    let r = app
        .http
        .put(&url)
        .bearer_auth(ADMIN)
        .json(&json!({"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let v3 = json(app.http.get(&url).bearer_auth(ADMIN).send().await.unwrap()).await;
    assert_eq!(v3["config"], v1["config"]);
}

#[tokio::test]
async fn a_config_change_reaches_every_instance_within_a_second() {
    let app = TestApp::spawn().await;
    let other = start(config(&app.prefix, vec![app.echo.upstream()])).await;
    app.put_config(
        "prop",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "queue"}),
    )
    .await;
    let http = client();
    let other_url = |p: &str| format!("http://{}{p}", other.public);
    // Two fans wait; the first is admitted at once (one batch), the second waits.
    let a = login(&http, &other_url("/dev/login"), "fan-a").await;
    let b = login(&http, &other_url("/dev/login"), "fan-b").await;
    for t in [&a, &b] {
        http.post(other_url("/queue/prop/join"))
            .bearer_auth(t)
            .send()
            .await
            .unwrap();
    }
    app.put_config(
        "prop",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "paused"}),
    )
    .await;
    let changed = Instant::now();
    loop {
        let v = json(
            http.get(other_url("/queue/prop/status"))
                .bearer_auth(&b)
                .send()
                .await
                .unwrap(),
        )
        .await;
        if v["state"] == "paused" {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(1),
            "not paused after 1 s: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(other).await;
}
