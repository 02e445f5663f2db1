//! The admission ticker in a running gateway: rate, `max_active`, claim deadlines, lease
//! failover, auto mode (`slots.rs`: what frees a `max_active` slot).
//!
//! Tests that show somebody is *not* admitted step admission themselves ([`Stepper`] holds
//! the event's lease, so the gateway's own ticker stays a follower): "nobody got in" then
//! means "over ticks that certainly ran", never "within some sleep".

use crate::helpers::*;
use crate::stepper::{Stepper, pace};
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn admission_never_exceeds_the_rate_over_several_ticks() {
    let app = TestApp::spawn().await;
    // 600/min = 10/s; ticks every 100 ms, so one batch is one fan.
    app.put_config(
        "rate",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600, "mode": "paused"}),
    )
    .await;
    join_many(&app, "rate", 200, "r").await;
    app.put_config(
        "rate",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600}),
    )
    .await;
    // Enough admissions to judge the rate (~3 s at 10/s); the bounds below are checked on
    // their timestamps (Redis time), so a slow machine cannot make them pass or fail.
    let deadline = Instant::now() + Duration::from_secs(20);
    let adm = loop {
        let adm = app.admissions("rate").await;
        if adm.len() >= 30 {
            break adm;
        }
        assert!(
            Instant::now() < deadline,
            "admission too slow: {}",
            adm.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let times: Vec<u64> = adm.iter().map(|(_, _, ms)| *ms).collect();
    // Any 1-second window: at most rate·1s (10) plus one batch (1).
    for (i, t0) in times.iter().enumerate() {
        let in_window = times[i..].iter().take_while(|t| **t < t0 + 1000).count();
        assert!(
            in_window <= 11,
            "{in_window} admitted within 1 s starting at {t0}"
        );
    }
    // Over the whole run: never more than rate × elapsed + one batch.
    let span = times.last().unwrap() - times.first().unwrap();
    assert!(
        times.len() as u64 <= span * 600 / 60_000 + 2,
        "{} in {span} ms",
        times.len()
    );
    // No one admitted twice.
    let mut names: Vec<_> = adm.iter().map(|(a, _, _)| a.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), adm.len());
}

#[tokio::test]
async fn max_active_is_honoured_and_unclaimed_admissions_return_to_the_budget() {
    let app = TestApp::spawn().await;
    let mut stepper = Stepper::take_lease(&app, "cap").await;
    app.put_config(
        "cap",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
               "max_active": 5, "mode": "paused"}),
    )
    .await;
    let tokens = join_many(&app, "cap", 30, "c").await;
    app.put_config(
        "cap",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000, "max_active": 5}),
    )
    .await;
    stepper.watch("cap").await;
    let mut c = app.redis.clone();
    let count = |c: &mut Conn| {
        let adm = app.key("cap", "adm");
        let act = app.key("cap", "active");
        let mut c = c.clone();
        async move {
            let a: u64 = redis::cmd("ZCARD")
                .arg(adm)
                .query_async(&mut c)
                .await
                .unwrap();
            let b: u64 = redis::cmd("ZCARD")
                .arg(act)
                .query_async(&mut c)
                .await
                .unwrap();
            (a, b)
        }
    };
    // Ticks at a rate that would admit everyone: the cap fills, then holds tick after tick.
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.admissions("cap").await.len() < 5 {
        stepper.lead("cap").await;
        let (a, b) = count(&mut c).await;
        assert!(a + b <= 5, "{a} unclaimed + {b} active > 5");
        assert!(Instant::now() < deadline, "the cap never filled");
        pace().await;
    }
    for _ in 0..10 {
        pace().await;
        assert_eq!(stepper.lead("cap").await.admitted, 0);
        let (a, b) = count(&mut c).await;
        assert!(a + b <= 5, "{a} unclaimed + {b} active > 5");
    }
    // The bucket had tokens all along: the cap, not the rate, held the other fans back.
    assert!(stepper.bucket_tokens("cap").await >= 3.0);
    assert_eq!(app.admissions("cap").await.len(), 5);
    // Two fans claim (their status returns a token); still 5 in total.
    let first: Vec<String> = app
        .admissions("cap")
        .await
        .into_iter()
        .map(|(a, _, _)| a)
        .collect();
    let idx = |a: &str| a.trim_start_matches("c-").parse::<usize>().unwrap();
    for a in &first[..2] {
        let v = json(app.status("cap", &tokens[idx(a)]).await).await;
        assert_eq!(v["state"], "admitted");
    }
    // Claiming frees no slot: more ticks admit nobody.
    for _ in 0..3 {
        pace().await;
        assert_eq!(stepper.lead("cap").await.admitted, 0);
    }
    assert_eq!(count(&mut c).await, (3, 2));
    // The other three miss their claim deadline (set explicitly rather than waiting).
    for a in &first[2..] {
        let _: () = redis::cmd("ZADD")
            .arg(app.key("cap", "adm"))
            .arg(1)
            .arg(a)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    // The next tick expires them and reuses their slots (the bucket holds ≥ 3 tokens).
    let l = stepper.lead("cap").await;
    assert_eq!(
        (l.expired_unclaimed, l.admitted),
        (3, 3),
        "expired slots were not reused"
    );
    let (a, b) = count(&mut c).await;
    assert!(a + b <= 5);
    assert_eq!(app.admissions("cap").await.len(), 8);
    // Those who missed the deadline lost the admission: told so, and may join again (at the back).
    let missed = &first[2];
    let v = json(app.status("cap", &tokens[idx(missed)]).await).await;
    assert!(
        v["state"] == "expired" || v["code"] == "NOT_IN_QUEUE",
        "{v}"
    );
    let r = app.join("cap", &tokens[idx(missed)]).await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn lease_failover_admits_everyone_exactly_once() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let a = start(config(&prefix, vec![echo.upstream()])).await;
    let b = start(config(&prefix, vec![echo.upstream()])).await;
    let http = client();
    let a_url = format!("http://{}", a.public);
    let put = |rate: u64, mode: &str| {
        http.put(format!("http://{}/admin/events/fo/config", a.admin))
            .bearer_auth(ADMIN)
            .json(
                &json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": rate,
                          "mode": mode}),
            )
            .send()
    };
    assert_eq!(put(3000, "paused").await.unwrap().status(), StatusCode::OK);
    let n = 150;
    for i in 0..n {
        let t = login(&http, &format!("{a_url}/dev/login"), &format!("f-{i:03}")).await;
        let r = http
            .post(format!("{a_url}/queue/fo/join"))
            .bearer_auth(t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    // 3000/min = 50/s: 150 fans take ~3 s, long enough to kill the leader midway.
    assert_eq!(put(3000, "queue").await.unwrap().status(), StatusCode::OK);
    let mut conn = redis_conn().await;
    let lease_key = format!("{prefix}fg:{{fo}}:lease");
    let adm_key = format!("{prefix}fg:{{fo}}:admissions");
    let deadline = Instant::now() + Duration::from_secs(5);
    let leader: String = loop {
        let l: Option<String> = redis::cmd("GET")
            .arg(&lease_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(l) = l
            && admissions(&mut conn, &adm_key).await.len() >= 20
        {
            break l;
        }
        assert!(Instant::now() < deadline, "nobody admits");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (dead, survivor) = if leader == a.instance { (a, b) } else { (b, a) };
    assert_eq!(leader, dead.instance);
    let killed_at = Instant::now();
    stop(dead).await;
    // The survivor takes the lease within a few seconds and finishes the job.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let adm = admissions(&mut conn, &adm_key).await;
        if adm.len() >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} admitted after failover",
            adm.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let adm = admissions(&mut conn, &adm_key).await;
    assert_eq!(adm.len(), n, "someone was admitted twice");
    let mut names: Vec<_> = adm.iter().map(|(a, _, _)| a.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "someone was admitted twice");
    let by_survivor = adm
        .iter()
        .filter(|(_, by, _)| *by == survivor.instance)
        .count();
    assert!(by_survivor > 0, "the survivor never admitted");
    let by_dead = adm.iter().filter(|(_, by, _)| *by == leader).count();
    assert!(by_dead >= 20);
    // Takeover time: first survivor admission after the kill.
    let first_survivor_ms = adm
        .iter()
        .find(|(_, by, _)| *by == survivor.instance)
        .map(|(_, _, ms)| *ms)
        .unwrap();
    let last_dead_ms = adm
        .iter()
        .filter(|(_, by, _)| *by == leader)
        .map(|(_, _, ms)| *ms)
        .max()
        .unwrap();
    assert!(
        first_survivor_ms.saturating_sub(last_dead_ms) < 3000,
        "takeover took {} ms",
        first_survivor_ms - last_dead_ms
    );
    // The survivor's first tick admits what was due during the gap (the bucket refills for
    // the time since the dead leader's last tick, up to the lease TTL plus one tick), so the
    // crash does not lower the admit rate over the run. Times are Redis times.
    let gap = first_survivor_ms - last_dead_ms;
    // One tick's stream entries may span a few milliseconds on a loaded machine; the next
    // tick comes 100 ms later.
    let first_batch = adm
        .iter()
        .filter(|(_, by, ms)| *by == survivor.instance && *ms < first_survivor_ms + 50)
        .count() as u64;
    let owed = gap.min(1000 + 100) * 3000 / 60_000;
    let left = (n - by_dead) as u64;
    assert!(
        first_batch + 1 >= owed.min(left),
        "the survivor's first tick admitted {first_batch}, {owed} were due for a {gap} ms gap"
    );
    assert!(
        first_batch <= owed + 5 + 1,
        "the survivor's first tick admitted {first_batch}: more than the {owed} due plus one tick"
    );
    assert!(killed_at.elapsed() < Duration::from_secs(15));
    stop(survivor).await;
}

#[tokio::test]
async fn auto_mode_backs_off_when_booking_fails() {
    use axum::routing::any;
    // An upstream that is up (health check passes) but answers every API call with 503.
    let app_fail = axum::Router::new()
        .route("/healthz", any(|| async { "ok" }))
        .fallback(any(|| async {
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy")
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let failing = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app_fail).await;
    });
    let app = TestApp::spawn_with(|c| {
        c.gateway.upstreams = vec![failing.clone()];
        c.gateway.auto_window_s = 5;
    })
    .await;
    app.put_config(
        "auto",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
               "auto": {"floor": 60, "ceiling": 6000}}),
    )
    .await;
    let get_rate = || async {
        json(
            app.http
                .get(app.admin_url("/admin/events/auto/config"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap(),
        )
        .await["effective_admit_per_minute"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(get_rate().await, 600);
    let tokens = shared::token::AdmissionTokens::new(&token_settings(&["k1"], "k1")).unwrap();
    let (tok, _) = tokens
        .mint("fan", "s", "auto", chrono::Utc::now().timestamp(), 60)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for _ in 0..30 {
            let r = app
                .http
                .get(app.url("/api/events/auto/seats"))
                .bearer_auth(&tok)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        let rate = get_rate().await;
        if rate < 600 {
            assert!(rate >= 60, "below the floor: {rate}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "auto mode did not lower the rate"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.abort();
}
