//! Per-account and per-IP budgets hold across gateway instances: two gateways on one Redis
//! prefix, a fan alternating between them gets the budget once, not once per gateway, and a
//! fan whose connection sticks to one gateway still gets the whole budget.

use crate::helpers::*;
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};

async fn members(admin: &str, http: &reqwest::Client) -> i64 {
    metric(http, admin, "fg_gateway_members").await.unwrap_or(0)
}

async fn status_at(http: &reqwest::Client, public: &str, event: &str, token: &str) -> StatusCode {
    http.get(format!("http://{public}/queue/{event}/status"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn budgets_hold_across_two_gateways() {
    const BUDGET: u32 = 12;
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let cfg = || {
        let mut c = config(&prefix, vec![echo.upstream()]);
        c.gateway.limits.status_per_account_per_min = BUDGET;
        c.gateway.limits.join_per_account_per_min = 4;
        c
    };
    let a = start(cfg()).await;
    let b = start(cfg()).await;
    let http = client();
    let (pa, pb) = (a.public.to_string(), b.public.to_string());
    // Both instances see each other (they publish their health every second).
    let deadline = Instant::now() + Duration::from_secs(10);
    while members(&a.admin.to_string(), &http).await != 2
        || members(&b.admin.to_string(), &http).await != 2
    {
        assert!(
            Instant::now() < deadline,
            "the gateways never saw each other"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = http
        .put(format!("http://{}/admin/events/lim/config", a.admin))
        .bearer_auth(ADMIN)
        .json(
            &json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1,
                      "mode": "paused"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Joins: 4 a minute per account, alternating gateways: 4 pass (not 8).
    let tok = login(&http, &format!("http://{pa}/dev/login"), "alternating").await;
    let mut joins = 0;
    for i in 0..10 {
        let at = if i % 2 == 0 { &pa } else { &pb };
        let r = http
            .post(format!("http://{at}/queue/lim/join"))
            .bearer_auth(&tok)
            .send()
            .await
            .unwrap();
        match r.status() {
            s if s.is_success() => joins += 1,
            StatusCode::TOO_MANY_REQUESTS => assert!(r.headers().contains_key("retry-after")),
            s => panic!("unexpected {s}"),
        }
    }
    assert!(
        (4..=5).contains(&joins),
        "{joins} joins passed; budget 4 across both"
    );

    // Status polls alternating between the gateways: the budget once (plus at most one
    // request per instance), where each gateway alone used to allow the whole budget.
    let mut passed = 0;
    for i in 0..40 {
        let at = if i % 2 == 0 { &pa } else { &pb };
        match status_at(&http, at, "lim", &tok).await {
            StatusCode::OK => passed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            s => panic!("unexpected {s}"),
        }
    }
    assert!(
        (BUDGET..=BUDGET + 2).contains(&passed),
        "{passed} polls passed across two gateways; budget {BUDGET}"
    );

    // A fan whose keep-alive connection sticks to one gateway gets the whole budget, not
    // half of it.
    let sticky = login(&http, &format!("http://{pa}/dev/login"), "sticky").await;
    assert!(
        http.post(format!("http://{pa}/queue/lim/join"))
            .bearer_auth(&sticky)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    let mut passed = 0;
    for _ in 0..30 {
        if status_at(&http, &pa, "lim", &sticky).await == StatusCode::OK {
            passed += 1;
        }
    }
    assert_eq!(
        passed, BUDGET,
        "one gateway must still allow the whole budget"
    );
    stop(a).await;
    stop(b).await;
}
