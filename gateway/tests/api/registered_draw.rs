//! The draw of a registered room stays verifiable: every registered fan's first join scores
//! `presale_score(seed, account)` whether it came before or after the sale start, anyone can
//! recompute those scores from the revealed seed, and the queue and the admissions follow them.

use crate::helpers::*;
use crate::registered::{rfc3339, upload};
use futures::future::join_all;
use gateway::draw::{presale_score, seed_hash};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

async fn join_all_fans(
    urls: &[String],
    http: &reqwest::Client,
    tokens: &[(String, String)],
) -> Vec<(String, reqwest::Response)> {
    let joins = tokens.iter().enumerate().map(|(i, (a, t))| {
        let url = format!("{}/queue/rd/join", urls[i % urls.len()]);
        let http = http.clone();
        let (a, t) = (a.clone(), t.clone());
        async move { (a, http.post(url).bearer_auth(t).send().await.unwrap()) }
    });
    join_all(joins).await
}

/// `GET /queue/{event}/draw`: the committed seed hash, and the seed once revealed.
pub async fn draw(app: &TestApp, event: &str) -> Value {
    let r = app
        .http
        .get(app.url(&format!("/queue/{event}/draw")))
        .send()
        .await
        .unwrap();
    json(r).await
}

/// Waits until the draw's seed is revealed (Redis time past the sale start).
pub async fn wait_revealed(app: &TestApp, event: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = draw(app, event).await;
        if v["revealed"] == true {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the seed was never revealed: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_registered_fan_is_drawn_by_the_revealed_seed_and_admitted_in_that_order() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let a = start(config(&prefix, vec![echo.upstream()])).await;
    let b = start(config(&prefix, vec![echo.upstream()])).await;
    let app = TestApp {
        gw: Some(a),
        echo,
        prefix,
        http: client(),
        redis: redis_conn().await,
    };
    let urls = [app.url(""), format!("http://{}", b.public)];
    // The sale starts in an hour until the early fans have joined; then it is moved to a
    // second from now (the committed seed stays), so no step depends on how fast joins are.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let room = |sale_start: chrono::DateTime<chrono::Utc>, mode: &str| {
        json!({
            "sale_start": rfc3339(sale_start),
            "registration_closes": rfc3339(sale_start),
            "access": "registered",
            "admit_per_minute": 60000,
            "mode": mode,
        })
    };
    assert_eq!(
        app.put_config("rd", room(later, "paused")).await.status(),
        StatusCode::OK
    );
    let fans: Vec<String> = (0..300).map(|i| format!("drawn-{i:03}")).collect();
    let body: String = fans.iter().map(|f| format!("{f}\n")).collect();
    let r = upload(&app.http, &app.admin_url(""), "rd", "add", body).await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut tokens = Vec::new();
    for f in &fans {
        tokens.push((f.clone(), app.login(f).await));
    }
    let strangers: Vec<(String, String)> = {
        let mut v = Vec::new();
        for i in 0..20 {
            let s = format!("stranger-{i:02}");
            v.push((s.clone(), app.login(&s).await));
        }
        v
    };

    // Two thirds join before the sale start, on both instances at once.
    let mut answers: HashMap<String, Value> = HashMap::new();
    let early = join_all_fans(&urls, &app.http, &tokens[..200]).await;
    let committed = draw(&app, "rd").await;
    assert_eq!(committed["revealed"], false);
    for (a, r) in early {
        assert_eq!(r.status(), StatusCode::CREATED, "{a}");
        answers.insert(a, json(r).await);
    }
    let sale_start = chrono::Utc::now() + chrono::Duration::seconds(1);
    let r = app.put_config("rd", room(sale_start, "paused")).await;
    assert_eq!(r.status(), StatusCode::OK);
    // Wait for the reveal (Redis time past the sale start), then the last third joins late.
    let revealed = wait_revealed(&app, "rd").await;
    assert_eq!(revealed["seed_hash"], committed["seed_hash"]);
    assert_eq!(revealed["access"], "registered");
    for (a, r) in join_all_fans(&urls, &app.http, &tokens[200..]).await {
        assert_eq!(r.status(), StatusCode::CREATED, "{a}");
        answers.insert(a, json(r).await);
    }
    for (s, r) in join_all_fans(&urls, &app.http, &strangers).await {
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{s}");
    }

    // Anyone can check the commitment and recompute every score.
    let seed = hex::decode(revealed["seed"].as_str().unwrap()).unwrap();
    assert_eq!(seed_hash(&seed), committed["seed_hash"].as_str().unwrap());
    let mut expected: Vec<(i64, String)> = Vec::new();
    for f in &fans {
        let v = &answers[f];
        let score = presale_score(&seed, f);
        assert_eq!(v["kind"], "draw", "{f}: {v}");
        assert_eq!(v["score"], score.to_string(), "{f}");
        expected.push((score, f.clone()));
    }
    expected.sort();
    let order: Vec<String> = expected.iter().map(|(_, a)| a.clone()).collect();
    let mut c = app.redis.clone();
    let queue: Vec<String> = redis::cmd("ZRANGE")
        .arg(app.key("rd", "q"))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(queue, order, "the queue is not in draw order");

    // One draw per account: a fan revoked while waiting joins again at the back (FIFO).
    let back = &order[0];
    let r = app
        .http
        .post(app.admin_url("/admin/events/rd/revoke"))
        .bearer_auth(ADMIN)
        .json(&json!({"account": back}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let token = &tokens.iter().find(|(a, _)| a == back).unwrap().1;
    let v = json(app.join("rd", token).await).await;
    assert_eq!(v["kind"], "fifo", "{v}");

    // Admission follows the draw, then the fan who went to the back.
    assert_eq!(
        app.put_config("rd", room(sale_start, "queue"))
            .await
            .status(),
        StatusCode::OK
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let admitted = loop {
        let adm = app.admissions("rd").await;
        if adm.len() == fans.len() {
            break adm;
        }
        assert!(Instant::now() < deadline, "only {} admitted", adm.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let got: Vec<String> = admitted.into_iter().map(|(a, _, _)| a).collect();
    let mut want: Vec<String> = order[1..].to_vec();
    want.push(back.clone());
    assert_eq!(got, want);
    stop(b).await;
}
