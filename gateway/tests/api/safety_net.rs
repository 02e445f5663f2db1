//! The safety net across two gateway instances on one Redis: joins pass straight through
//! while arrivals and admitted fans stay under the thresholds, a surge is queued the moment
//! either is passed (decided in the join script, so both instances agree), nobody is admitted
//! twice, the cap holds within one tick's worth, the backlog drains at the admit rate and the
//! room lets joins through again.

use crate::helpers::*;
use futures::future::join_all;
use gateway::GatewayHandle;
use gateway::store::Store;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

pub async fn two(prefix: &str, echo: &Echo) -> (GatewayHandle, GatewayHandle) {
    let a = start(config(prefix, vec![echo.upstream()])).await;
    let b = start(config(prefix, vec![echo.upstream()])).await;
    (a, b)
}

pub async fn put(http: &reqwest::Client, g: &GatewayHandle, event: &str, cfg: Value) {
    let r = http
        .put(format!("http://{}/admin/events/{event}/config", g.admin))
        .bearer_auth(ADMIN)
        .json(&cfg)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
}

/// `n` fans join at once, alternating between the instances; returns (account, answer).
pub async fn surge(
    http: &reqwest::Client,
    gs: [&GatewayHandle; 2],
    event: &str,
    prefix: &str,
    n: usize,
) -> Vec<(String, Value)> {
    let mut tokens = Vec::new();
    for i in 0..n {
        let g = gs[i % 2];
        let acct = format!("{prefix}-{i:04}");
        let t = login(http, &format!("http://{}/dev/login", g.public), &acct).await;
        tokens.push((acct, t, g.public));
    }
    join_all(tokens.into_iter().map(|(acct, t, public)| async move {
        let r = http
            .post(format!("http://{public}/queue/{event}/join"))
            .bearer_auth(t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        (acct, r.json::<Value>().await.unwrap())
    }))
    .await
}

pub async fn card(conn: &mut Conn, key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// Waits until one of the instances (the leader) sets `fg_safety_net_queueing` to 1.
pub async fn leader_reports_queueing(http: &reqwest::Client, gs: [&GatewayHandle; 2]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut any = false;
        for g in gs {
            any |= metric(http, &g.admin.to_string(), "fg_safety_net_queueing").await == Some(1);
        }
        if any {
            return;
        }
        assert!(Instant::now() < deadline, "no instance reports queueing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn state(http: &reqwest::Client, g: &GatewayHandle, event: &str) -> Value {
    http.get(format!("http://{}/admin/events/{event}/config", g.admin))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["safety_net_state"]
        .clone()
}

#[tokio::test]
async fn a_surge_over_the_arrivals_threshold_queues_on_every_instance() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let (a, b) = two(&prefix, &echo).await;
    let http = client();
    // A slow admit rate, so the queue visibly holds.
    put(
        &http,
        &a,
        "sn",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
               "mode": "safety_net", "safety_net": {"arrivals_per_minute": 50}}),
    )
    .await;
    let answers = surge(&http, [&a, &b], "sn", "s", 300).await;
    let passed = answers
        .iter()
        .filter(|(_, v)| v["state"] == "admitted")
        .count();
    // Arrivals are counted in the join script: exactly the first 50 pass, whichever
    // instance they came through.
    assert_eq!(passed, 50, "passed straight through");
    let queued: Vec<&Value> = answers
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["state"] == "waiting")
        .collect();
    assert_eq!(queued.len(), 250);
    assert!(
        queued.iter().all(|v| v["safety_net"] == "queueing"),
        "{:?}",
        queued[0]
    );
    for g in [&a, &b] {
        assert_eq!(state(&http, g, "sn").await, "queueing");
    }
    // The leader's metric says so too.
    leader_reports_queueing(&http, [&a, &b]).await;
    stop(a).await;
    stop(b).await;
}

#[tokio::test]
async fn the_cap_holds_nobody_is_admitted_twice_and_the_room_passes_again_once_drained() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let (a, b) = two(&prefix, &echo).await;
    let http = client();
    let cap = 100;
    // 6000/min with 100 ms ticks: one tick's worth is 10 admissions.
    let tick_worth = 10;
    put(
        &http,
        &a,
        "cap",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 6000,
               "max_active": cap, "mode": "safety_net",
               "safety_net": {"arrivals_per_minute": 100000}}),
    )
    .await;
    let key = |s: &str| format!("{prefix}fg:{{cap}}:{s}");
    // Sample the admitted fans (unclaimed + active) all along.
    let peak = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, adm, act) = (peak.clone(), done.clone(), key("adm"), key("active"));
        tokio::spawn(async move {
            let mut conn = redis_conn().await;
            while !done.load(Ordering::SeqCst) {
                let n = card(&mut conn, &adm).await + card(&mut conn, &act).await;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let answers = surge(&http, [&a, &b], "cap", "c", 400).await;
    let passed: HashSet<String> = answers
        .iter()
        .filter(|(_, v)| v["state"] == "admitted")
        .map(|(acct, _)| acct.clone())
        .collect();
    assert_eq!(passed.len(), cap as usize, "the cap decides who passes");
    assert_eq!(state(&http, &a, "cap").await, "queueing");
    // Fans finish and leave (as a paid order releases a slot); the ticker admits the queue
    // behind them at the admit rate, never above the cap.
    let store = Store::new(&redis_settings(&prefix)).unwrap();
    let mut conn = redis_conn().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let active: Vec<String> = redis::cmd("ZRANGE")
            .arg(key("active"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let unclaimed: Vec<String> = redis::cmd("ZRANGE")
            .arg(key("adm"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Admitted by the ticker: claimed when the fan polls; here the test releases them.
        for f in active.iter().chain(unclaimed.iter()).take(25) {
            let _: i64 = redis::cmd("ZREM")
                .arg(key("adm"))
                .arg(f)
                .query_async(&mut conn)
                .await
                .unwrap();
            store.release_active("cap", 1, f, 60_000).await.unwrap();
        }
        if card(&mut conn, &key("q")).await == 0 && state(&http, &a, "cap").await == "pass" {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= cap + tick_worth,
        "{peak} admitted at once (cap {cap})"
    );
    // Everyone admitted exactly once: by the join (passed) or by the ticker (the stream),
    // never both, nobody twice, nobody lost.
    let ticked = admissions(&mut conn, &key("admissions")).await;
    let ticked_set: HashSet<String> = ticked.iter().map(|(a, _, _)| a.clone()).collect();
    assert_eq!(
        ticked_set.len(),
        ticked.len(),
        "the ticker admitted someone twice"
    );
    assert!(
        passed.is_disjoint(&ticked_set),
        "passed and then admitted again"
    );
    assert_eq!(passed.len() + ticked_set.len(), 400, "someone was lost");
    // Drained and calm: the next fan passes straight through, on either instance.
    for (i, g) in [&a, &b].into_iter().enumerate() {
        let t = login(
            &http,
            &format!("http://{}/dev/login", g.public),
            &format!("late-{i}"),
        )
        .await;
        let v: Value = http
            .post(format!("http://{}/queue/cap/join", g.public))
            .bearer_auth(t)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["state"], "admitted", "{v}");
    }
    stop(a).await;
    stop(b).await;
}

#[tokio::test]
async fn safety_net_mode_needs_its_thresholds() {
    let app = TestApp::spawn().await;
    let r = app
        .put_config(
            "nt",
            json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
                   "mode": "safety_net"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["errors"][0]["field"], "safety_net");
    let r = app
        .put_config(
            "nt",
            json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
                   "mode": "safety_net", "safety_net": {"arrivals_per_minute": 0}}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = app
        .http
        .get(app.admin_url("/admin/events/nt/config"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "nothing was stored");
}
