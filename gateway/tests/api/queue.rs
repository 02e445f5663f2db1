//! Joining, status, fairness of the pre-sale draw, FIFO after the start.

use crate::helpers::*;
use futures::future::join_all;
use reqwest::StatusCode;
use ring::hmac;
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test]
async fn join_needs_login_and_a_known_event() {
    let app = TestApp::spawn().await;
    let r = app
        .http
        .post(app.url("/queue/nope/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let tok = app.login("fan-1").await;
    let r = app.join("nope", &tok).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json(r).await["code"], "UNKNOWN_EVENT");
    let r = app.join("Bad{Slug}", &tok).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = app.join("nope", "not-a-jwt").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // Status before joining.
    app.open_event("ev", 60).await;
    let r = app.status("ev", &tok).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json(r).await["code"], "NOT_IN_QUEUE");
}

#[tokio::test]
async fn many_concurrent_joins_from_one_account_get_one_place() {
    let app = TestApp::spawn().await;
    // Rate 1/min: the only admission possible happens at once, the rest stay queued.
    app.put_config(
        "ev",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "paused"}),
    )
    .await;
    let tok = app.login("fan-1").await;
    let other = app.login("fan-2").await;
    let rs = join_all((0..200).map(|_| app.join("ev", &tok))).await;
    let mut created = 0;
    let mut places = std::collections::HashSet::new();
    for r in rs {
        match r.status() {
            StatusCode::CREATED => created += 1,
            StatusCode::OK => {}
            s => panic!("unexpected {s}"),
        }
        let v = json(r).await;
        places.insert((v["session"].to_string(), v["score"].to_string()));
    }
    assert_eq!(created, 1, "exactly one join creates the place");
    assert_eq!(places.len(), 1, "every tab got the same place");
    let r = app.join("ev", &other).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let mut c = app.redis.clone();
    let n: u64 = redis::cmd("ZCARD")
        .arg(app.key("ev", "q"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 2);
    let v = json(app.status("ev", &other).await).await;
    assert_eq!(v["state"], "paused");
    assert_eq!(v["position"], 2);
    assert_eq!(v["ahead"], 1);
    assert!(v["poll_after_ms"].as_u64().unwrap() >= 800);
}

/// Spearman's rank correlation of two permutations of 0..n.
fn spearman(a: &[usize], b: &[usize]) -> f64 {
    let n = a.len() as f64;
    let d2: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

fn recompute_score(seed: &[u8], account: &str) -> i64 {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, seed), account.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&tag.as_ref()[..8]);
    (u64::from_be_bytes(b) >> 12) as i64 - (1i64 << 52)
}

#[tokio::test]
async fn presale_arrivals_are_shuffled_verifiably_then_fifo() {
    let app = TestApp::spawn().await;
    let before = json!({"sale_start": "2099-01-01T00:00:00Z", "admit_per_minute": 60000,
                        "mode": "paused"});
    assert_eq!(
        app.put_config("fair", before.clone()).await.status(),
        StatusCode::OK
    );
    // The commitment is published before the sale; the seed is not.
    let draw = json(
        app.http
            .get(app.url("/queue/fair/draw"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(draw["revealed"], false);
    assert!(draw["seed"].is_null());
    let commitment = draw["seed_hash"].as_str().unwrap().to_owned();

    let n = 300;
    let accounts: Vec<String> = (0..n).map(|i| format!("early-{i:03}")).collect();
    let mut tokens = Vec::new();
    for a in &accounts {
        tokens.push(app.login(a).await);
    }
    // Arrive in a known order, one after another.
    for t in &tokens {
        assert_eq!(app.join("fair", t).await.status(), StatusCode::CREATED);
    }
    // The sale starts (ops move the start into the past) and admission runs; a PUT never
    // changes the committed seed.
    let start = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000});
    assert_eq!(app.put_config("fair", start).await.status(), StatusCode::OK);
    let draw = json(
        app.http
            .get(app.url("/queue/fair/draw"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(draw["revealed"], true);
    assert_eq!(draw["seed_hash"], commitment.as_str());
    let seed = hex::decode(draw["seed"].as_str().unwrap()).unwrap();
    assert_eq!(
        hex::encode(ring::digest::digest(&ring::digest::SHA256, &seed)),
        commitment
    );
    // Late arrivals (after the start) queue behind every early one, in arrival order.
    let late: Vec<String> = (0..20).map(|i| format!("late-{i:02}")).collect();
    for a in &late {
        let t = app.login(a).await;
        let v = json(app.join("fair", &t).await).await;
        assert_eq!(v["kind"], "fifo");
    }
    // Wait for everyone to be admitted.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let admitted = loop {
        let a = app.admissions("fair").await;
        if a.len() == n + late.len() {
            break a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} admitted",
            a.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let order: Vec<&str> = admitted.iter().map(|(a, _, _)| a.as_str()).collect();
    // 1. Early arrivals first, then late ones in arrival order (FIFO after the start).
    assert_eq!(
        &order[n..],
        late.iter().map(String::as_str).collect::<Vec<_>>()
    );
    // 2. The early order matches the order anyone can recompute from the revealed seed.
    let mut expected: Vec<&str> = accounts.iter().map(String::as_str).collect();
    expected.sort_by_key(|a| (recompute_score(&seed, a), a.to_string()));
    assert_eq!(&order[..n], expected);
    // 3. ...and is uncorrelated with arrival order. Under independence rho has standard
    // deviation 1/sqrt(n-1) ≈ 0.058; 0.25 is more than 4 standard deviations.
    let arrival_rank: Vec<usize> = (0..n).collect();
    let admitted_rank: Vec<usize> = accounts
        .iter()
        .map(|a| order.iter().position(|o| o == a).unwrap())
        .collect();
    let rho = spearman(&arrival_rank, &admitted_rank);
    assert!(
        rho.abs() < 0.25,
        "admission order correlates with arrival: rho = {rho}"
    );
    // 4. Every fan holds a signed receipt the gateway verifies (and a forged one fails).
    let t = app.login("early-007").await;
    let v = json(app.join("fair", &t).await).await;
    let receipt = v["receipt"].as_str().unwrap().to_owned();
    let check = |r: String| {
        app.http
            .post(app.url("/queue/fair/receipt"))
            .json(&json!({"receipt": r}))
            .send()
    };
    let ok: Value = check(receipt.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(ok["valid"], true);
    assert_eq!(ok["place"]["sub"], "early-007");
    assert_eq!(ok["place"]["kind"], "draw");
    let forged = format!("{}x", receipt);
    let bad: Value = check(forged).await.unwrap().json().await.unwrap();
    assert_eq!(bad["valid"], false);
}

#[tokio::test]
async fn admitted_fan_gets_a_token_and_cookie_that_open_the_api() {
    let app = TestApp::spawn().await;
    app.open_event("show", 6000).await;
    let tok = app.login("fan-9").await;
    let j = app.join("show", &tok).await;
    assert_eq!(j.status(), StatusCode::CREATED);
    let v = app
        .wait_admitted("show", &tok, Duration::from_secs(5))
        .await;
    assert_eq!(v["next"], "/e/show/shop");
    // The claim sets the cookie with the required attributes.
    let r = app.status("show", &tok).await;
    let cookie = r
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    for attr in [
        "fg_admission=",
        "HttpOnly",
        "Secure",
        "SameSite=Lax",
        "Path=/",
    ] {
        assert!(cookie.contains(attr), "{cookie} lacks {attr}");
    }
    let admission = v["token"].as_str().unwrap();
    // Bearer, with a spoofed identity header that must not survive.
    let r = app
        .http
        .get(app.url("/api/events/show/seats"))
        .bearer_auth(admission)
        .header("x-floodgate-account", "someone-else")
        .header("x-floodgate-admin", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let e = json(r).await;
    assert_eq!(e["account"], "fan-9");
    assert_eq!(e["event"], "show");
    assert!(e["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    let internal: Vec<String> = serde_json::from_value(e["internal_headers"].clone()).unwrap();
    assert_eq!(
        internal.len(),
        2,
        "only the gateway's own identity headers: {internal:?}"
    );
    // The cookie works the same way (browsers).
    let cookie_pair = cookie.split(';').next().unwrap().to_owned();
    let r = app
        .http
        .post(app.url("/api/orders"))
        .header("cookie", format!("theme=dark; {cookie_pair}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json(r).await["method"], "POST");
    // A repeat join after admission returns the same place, admitted.
    let again = json(app.join("show", &tok).await).await;
    assert_eq!(again["state"], "admitted");
}

#[tokio::test]
async fn modes_closed_sold_out_and_passthrough() {
    let app = TestApp::spawn().await;
    app.put_config(
        "m",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "closed"}),
    )
    .await;
    let tok = app.login("fan-m").await;
    let r = app.join("m", &tok).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json(r).await["code"], "EVENT_CLOSED");
    // Passthrough: admitted at once, token still minted and required.
    app.put_config(
        "m",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "passthrough"}),
    )
    .await;
    let j = json(app.join("m", &tok).await).await;
    assert_eq!(j["state"], "admitted");
    let s = json(app.status("m", &tok).await).await;
    assert_eq!(s["state"], "admitted");
    assert!(s["token"].as_str().is_some());
    let r = app
        .http
        .get(app.url("/api/events/m/seats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // Sold out: new joins refused, waiting fans told.
    app.put_config(
        "m",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1, "mode": "paused"}),
    )
    .await;
    let waiting = app.login("fan-w").await;
    assert_eq!(app.join("m", &waiting).await.status(), StatusCode::CREATED);
    let r = app
        .http
        .put(app.admin_url("/admin/events/m/sold_out"))
        .bearer_auth(ADMIN)
        .json(&json!({"sold_out": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let late = app.login("fan-late").await;
    let r = app.join("m", &late).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json(r).await["code"], "SOLD_OUT");
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let s = json(app.status("m", &waiting).await).await;
        if s["state"] == "sold_out" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn proof_of_work_when_configured() {
    let app = TestApp::spawn().await;
    app.put_config(
        "pow",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60, "pow_difficulty": 8}),
    )
    .await;
    let tok = app.login("fan-p").await;
    let r = app.join("pow", &tok).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(json(r).await["code"], "POW_REQUIRED");
    let c = json(
        app.http
            .get(app.url("/queue/pow/challenge"))
            .bearer_auth(&tok)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let challenge = c["challenge"].as_str().unwrap().to_owned();
    let bad = app
        .http
        .post(app.url("/queue/pow/join"))
        .bearer_auth(&tok)
        .json(&json!({"pow": {"challenge": challenge, "solution": "x"}}))
        .send()
        .await
        .unwrap();
    // "x" meets 8 bits with probability 1/256; accept either outcome only if it truly does.
    if gateway::pow::leading_zero_bits(&challenge, "x") < 8 {
        assert_eq!(bad.status(), StatusCode::FORBIDDEN);
        assert_eq!(json(bad).await["code"], "POW_INVALID");
    }
    let solution = gateway::pow::solve(&challenge, 8);
    let ok = app
        .http
        .post(app.url("/queue/pow/join"))
        .bearer_auth(&tok)
        .json(&json!({"pow": {"challenge": challenge, "solution": solution}}))
        .send()
        .await
        .unwrap();
    assert!(ok.status().is_success(), "{}", ok.status());
    // Someone else's challenge does not work.
    let other = app.login("fan-q").await;
    let stolen = app
        .http
        .post(app.url("/queue/pow/join"))
        .bearer_auth(&other)
        .json(&json!({"pow": {"challenge": challenge, "solution": solution}}))
        .send()
        .await
        .unwrap();
    assert_eq!(stolen.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let app = TestApp::spawn_with(|c| c.gateway.limits.join_per_account_per_min = 3).await;
    app.open_event("rl", 60).await;
    let tok = app.login("fan-r").await;
    for _ in 0..3 {
        assert!(app.join("rl", &tok).await.status().is_success());
    }
    let r = app.join("rl", &tok).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let ra: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ra >= 1);
    assert_eq!(json(r).await["code"], "RATE_LIMITED");
    // Another account is unaffected.
    let other = app.login("fan-s").await;
    assert!(app.join("rl", &other).await.status().is_success());
}

#[tokio::test]
async fn per_ip_limits_use_forwarded_for_only_from_trusted_proxies() {
    let join_as = |app: &TestApp, tok: String, xff: &'static str| {
        let req = app
            .http
            .post(app.url("/queue/ip/join"))
            .bearer_auth(tok)
            .header("x-forwarded-for", xff);
        async move { req.send().await.unwrap().status() }
    };
    // Behind a trusted balancer (the test client connects from 127.0.0.1): each fan's own
    // address is limited, not the balancer's.
    let app = TestApp::spawn_with(|c| {
        c.gateway.limits.join_per_ip_per_min = 2;
        c.gateway.trusted_proxies = vec!["127.0.0.0/8".into()];
    })
    .await;
    app.open_event("ip", 60).await;
    for n in 0..2 {
        let tok = app.login(&format!("fan-ip-a{n}")).await;
        assert!(join_as(&app, tok, "203.0.113.1").await.is_success());
    }
    let tok = app.login("fan-ip-a2").await;
    assert_eq!(
        join_as(&app, tok, "203.0.113.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another address behind the same balancer is unaffected…
    let tok = app.login("fan-ip-b").await;
    assert!(join_as(&app, tok, "203.0.113.2").await.is_success());
    // …and a fan cannot dodge the limit by prepending an address of their own choosing.
    let tok = app.login("fan-ip-a3").await;
    assert_eq!(
        join_as(&app, tok, "198.51.100.9, 203.0.113.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Without trusted proxies the header is ignored: every fan here shares 127.0.0.1.
    let direct = TestApp::spawn_with(|c| c.gateway.limits.join_per_ip_per_min = 2).await;
    direct.open_event("ip", 60).await;
    for (n, xff) in ["203.0.113.1", "203.0.113.2"].into_iter().enumerate() {
        let tok = direct.login(&format!("fan-ip-d{n}")).await;
        assert!(join_as(&direct, tok, xff).await.is_success());
    }
    let tok = direct.login("fan-ip-d2").await;
    assert_eq!(
        join_as(&direct, tok, "203.0.113.3").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
