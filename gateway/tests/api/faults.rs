//! Redis faults under a running gateway, through a [`testkit::ChaosProxy`] between the gateway
//! and the shared test Redis: connections cut (FIN), reset (RST) or slowed. What DESIGN.md
//! section 3 promises for Redis down: admitted fans keep working (tokens are verified without
//! Redis), new arrivals get a quick `503 WAITING_ROOM_UNAVAILABLE` with `Retry-After`, nothing
//! crashes, and the gateway recovers by itself once Redis is reachable again.

use crate::helpers::*;
use reqwest::StatusCode;
use std::time::{Duration, Instant};
use testkit::ChaosProxy;

/// Far above the gateway's own bound on a Redis call (2 × the 500 ms response timeout), far
/// below the reply of a Redis slowed down by 30 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

async fn spawn_behind_proxy() -> (TestApp, ChaosProxy) {
    // A proxy in front of one server (a cluster would hand out its nodes' own addresses).
    let (proxy, via) = ChaosProxy::in_front_of(&standalone_redis_url())
        .await
        .unwrap();
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(via);
        c.redis.mode = shared::config::RedisMode::Standalone;
        c.redis.response_timeout_ms = crate::helpers::FAIL_FAST_REDIS_TIMEOUT_MS;
    })
    .await;
    (app, proxy)
}

/// Sends a join, failing the test if the gateway takes longer than [`ANSWER_WITHIN`].
async fn join_bounded(app: &TestApp, event: &str, token: &str) -> reqwest::Response {
    let t0 = Instant::now();
    let r = tokio::time::timeout(ANSWER_WITHIN, app.join(event, token))
        .await
        .unwrap_or_else(|_| panic!("join hung for {ANSWER_WITHIN:?}"));
    assert!(t0.elapsed() < ANSWER_WITHIN, "join took {:?}", t0.elapsed());
    r
}

async fn assert_waiting_room_unavailable(r: reqwest::Response) {
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(json(r).await["code"], "WAITING_ROOM_UNAVAILABLE");
}

/// Joins until the gateway answers `201` again; only `503`s are allowed meanwhile.
async fn join_until_recovered(app: &TestApp, event: &str, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = join_bounded(app, event, token).await;
        if r.status() == StatusCode::CREATED {
            return;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "gateway did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Clone, Copy)]
enum Break {
    Cut,
    Reset,
}

async fn outage_then_recovery(how: Break) {
    let (app, proxy) = spawn_behind_proxy().await;
    app.open_event("out", 60000).await;
    let fan = app.login("fan-admitted").await;
    app.join("out", &fan).await;
    let v = app.wait_admitted("out", &fan, Duration::from_secs(5)).await;
    let admission = v["token"].as_str().unwrap().to_owned();

    match how {
        Break::Cut => proxy.cut().await,
        Break::Reset => proxy.reset().await,
    }
    // Admitted fans keep working: the token is verified without Redis.
    for _ in 0..5 {
        let r = app
            .http
            .get(app.url("/api/events/out/seats"))
            .bearer_auth(&admission)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // New arrivals and status polls get a clear, quick 503.
    let newcomer = app.login("fan-new").await;
    assert_waiting_room_unavailable(join_bounded(&app, "out", &newcomer).await).await;
    let r = tokio::time::timeout(ANSWER_WITHIN, app.status("out", &fan))
        .await
        .expect("status hung");
    assert_waiting_room_unavailable(r).await;
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // The network comes back: the gateway recovers without a restart.
    proxy.restore();
    join_until_recovered(&app, "out", &newcomer).await;
    app.wait_admitted("out", &newcomer, Duration::from_secs(5))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .http
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
        != StatusCode::OK
    {
        assert!(Instant::now() < deadline, "/readyz never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn redis_cut_keeps_admitted_fans_working_and_recovers_without_restart() {
    outage_then_recovery(Break::Cut).await;
}

#[tokio::test]
async fn redis_reset_keeps_admitted_fans_working_and_recovers_without_restart() {
    outage_then_recovery(Break::Reset).await;
}

#[tokio::test]
async fn slow_redis_answers_joins_within_the_response_timeout() {
    let (app, proxy) = spawn_behind_proxy().await;
    app.open_event("slow", 60000).await;
    let fan = app.login("fan-slow").await;
    // Every Redis reply would take 30 s: the gateway gives up on its own bound instead.
    proxy.slow(Duration::from_secs(30));
    assert_waiting_room_unavailable(join_bounded(&app, "slow", &fan).await).await;
    proxy.restore();
    join_until_recovered(&app, "slow", &fan).await;
    app.wait_admitted("slow", &fan, Duration::from_secs(5))
        .await;
}
