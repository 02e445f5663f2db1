//! Status polls answered from the gateway's memory: a waiting fan who shows their place
//! receipt gets their position with no Redis command, within 1 % or 25 places of the exact
//! rank; an admitted fan still claims through Redis. A private redis-server, so its command
//! counters are this test's alone.

use crate::helpers::*;
use crate::redis_outage::PrivateRedis;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

async fn commandstats(redis: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

fn exact_ranks(members: Vec<String>) -> HashMap<String, u64> {
    members
        .into_iter()
        .enumerate()
        .map(|(i, a)| (a, i as u64))
        .collect()
}

#[tokio::test]
async fn waiting_fans_with_a_receipt_are_placed_from_memory_within_bounds() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fg-redis-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut private = PrivateRedis::start(port, &dir);
    let url = format!("redis://127.0.0.1:{port}");
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(url.clone());
        // A private single server, whatever the suite runs on.
        c.redis.mode = shared::config::RedisMode::Standalone;
    })
    .await;
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ev = "mem";
    // Pre-sale: every arrival draws a random place.
    let presale = json!({"sale_start": "2099-01-01T00:00:00Z", "admit_per_minute": 60000});
    assert_eq!(app.put_config(ev, presale).await.status(), StatusCode::OK);
    let mut fans = join_fans(&app, ev, "draw", 600).await;
    // The sale starts, paused: later arrivals queue FIFO behind every draw.
    let started = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
                         "mode": "paused"});
    assert_eq!(app.put_config(ev, started).await.status(), StatusCode::OK);
    fans.extend(join_fans(&app, ev, "fifo", 200).await);
    // Ops revoke a few waiting fans, then admit exactly 150 (max_active stops the rest).
    let revoked: Vec<String> = ["draw-0007", "draw-0300", "fifo-0010", "fifo-0150"]
        .map(String::from)
        .to_vec();
    for a in &revoked {
        app.revoke(ev, a).await;
    }
    let admit = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
                       "max_active": 150});
    assert_eq!(app.put_config(ev, admit).await.status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    let akey = app.key(ev, "admissions");
    while admissions(&mut redis, &akey).await.len() < 150 {
        assert!(Instant::now() < deadline, "150 not admitted in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg(app.key(ev, "q"))
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(queued.len(), 800 - 4 - 150);
    let exact = exact_ranks(queued);
    // Wait for the gateway's progress view to catch up (one refresh a second): the last
    // FIFO fan is always answered from memory.
    let probe = fans.iter().find(|f| f.account == "fifo-0199").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, v) = poll_place(&app, ev, probe, true).await;
        assert_eq!(s, StatusCode::OK);
        if v["queue_length"] == exact.len() as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "progress not refreshed: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let prog: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(app.key(ev, "prog"))
        .query_async(&mut redis)
        .await
        .unwrap();
    println!("progress: {prog:?}");
    // Every waiting fan: placed from memory, within 1 % or 25 places (FIFO: exactly).
    let before = commandstats(&mut redis).await;
    let t0 = Instant::now();
    let mut polls = 0u64;
    let mut worst = 0i64;
    for f in fans.iter().filter(|f| exact.contains_key(&f.account)) {
        let (s, v) = poll_place(&app, ev, f, true).await;
        polls += 1;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["state"], "waiting", "{v}");
        let want = exact[&f.account] as i64;
        let got = v["ahead"].as_i64().unwrap();
        assert_eq!(v["position"].as_i64().unwrap(), got + 1);
        assert_eq!(v["queue_length"], exact.len() as u64);
        let err = (got - want).abs();
        if f.account.starts_with("fifo") {
            assert_eq!(got, want, "{}", f.account);
        } else {
            assert!(
                err <= 25.max(want / 100),
                "{}: {got} vs exact {want}",
                f.account
            );
        }
        worst = worst.max(err);
    }
    let elapsed = t0.elapsed().as_secs() + 1;
    let after = commandstats(&mut redis).await;
    let delta = |cmd: &str| after.get(cmd).unwrap_or(&0) - before.get(cmd).unwrap_or(&0);
    // The background work of one gateway is bounded by time: a tick every 250 ms and a
    // health publish every second (EVALSHA), a config refresh every 250 ms (4 commands per
    // event), a progress read every second. A poll through Redis would cost an EVALSHA each.
    // On a loaded box the background timers catch up on missed ticks in a burst that may land
    // inside this short window (77 commands in "1 s" was seen with a benchmark running beside
    // the suite), so the bound is the larger of the time budget and a quarter of the polls:
    // still far below the one command per poll this test exists to rule out.
    assert_eq!(polls, 646);
    let evalsha_bound = (6 * elapsed).max(polls / 8);
    assert!(
        delta("evalsha") <= evalsha_bound,
        "{} EVALSHA for {polls} polls in {elapsed} s",
        delta("evalsha")
    );
    let total: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    assert!(
        total <= (40 * elapsed).max(polls / 4),
        "{total} commands for {polls} polls in {elapsed} s"
    );
    println!("{polls} polls from memory; worst error {worst} places; {total} redis commands");

    // Admitted fans still claim through Redis and get their token; revoked fans are told to
    // join again.
    let admitted: Vec<String> = admissions(&mut redis, &akey)
        .await
        .into_iter()
        .map(|a| a.0)
        .collect();
    let first = fans.iter().find(|f| f.account == admitted[0]).unwrap();
    let (s, v) = poll_place(&app, ev, first, true).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "admitted", "{v}");
    assert!(v["token"].as_str().is_some());
    let gone = fans.iter().find(|f| f.account == revoked[2]).unwrap();
    let (s, v) = poll_place(&app, ev, gone, true).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["code"], "NOT_IN_QUEUE");

    // A receipt of another account or event, or a forged one, is ignored (Redis answers).
    let mut other = Fan {
        account: probe.account.clone(),
        token: probe.token.clone(),
        receipt: gone.receipt.clone(),
    };
    let (_, v) = poll_place(&app, ev, &other, true).await;
    assert_eq!(
        v["ahead"], exact[&probe.account],
        "someone else's receipt: {v}"
    );
    other.receipt = format!("{}x", probe.receipt);
    let (_, v) = poll_place(&app, ev, &other, true).await;
    assert_eq!(v["ahead"], exact[&probe.account], "forged receipt: {v}");

    // With Redis gone, waiting fans who show their receipt still see where they stand (the
    // queue cannot move without Redis); without it they get the usual 503.
    private.stop();
    let (s, v) = poll_place(&app, ev, probe, true).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "waiting");
    let r = app.status(ev, &probe.token).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn nobody_is_admitted_before_the_sale_start() {
    let app = TestApp::spawn().await;
    let start = chrono::Utc::now() + chrono::Duration::seconds(8);
    let cfg = json!({"sale_start": start.to_rfc3339(), "admit_per_minute": 60000});
    assert_eq!(app.put_config("early", cfg).await.status(), StatusCode::OK);
    join_many(&app, "early", 30, "early").await;
    // Ticks run every 250 ms; before the fix the first tick admitted the earliest arrivals.
    while chrono::Utc::now() < start - chrono::Duration::milliseconds(1500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admitted = app.admissions("early").await.len();
    assert!(chrono::Utc::now() < start, "the test itself was too slow");
    assert_eq!(admitted, 0, "admitted before the sale start");
    // ...and at the start the draw order runs.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.admissions("early").await.len() < 30 {
        assert!(Instant::now() < deadline, "not admitted after the start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn join_with(app: &TestApp, event: &str, token: &str, receipt: &str) -> Value {
    let r = app
        .http
        .post(app.url(&format!("/queue/{event}/join")))
        .bearer_auth(token)
        .header("x-floodgate-place", receipt)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    json(r).await
}

/// What a crash of a Redis on `appendfsync everysec` does to a place joined in its last
/// second: the place record, the queue entry and the counter are gone.
async fn lose(app: &TestApp, event: &str, account: &str) {
    let mut r = app.redis.clone();
    let _: () = redis::pipe()
        .cmd("HDEL")
        .arg(app.key(event, "places"))
        .arg(account)
        .cmd("ZREM")
        .arg(app.key(event, "q"))
        .arg(account)
        .cmd("HINCRBY")
        .arg(app.key(event, "prog"))
        .arg("fifos")
        .arg(-1)
        .query_async(&mut r)
        .await
        .unwrap();
}

#[tokio::test]
async fn lost_places_come_back_from_receipts_but_never_past_admission() {
    let app = TestApp::spawn().await;
    let ev = "lost";
    let paused = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
                        "mode": "paused"});
    assert_eq!(app.put_config(ev, paused).await.status(), StatusCode::OK);
    let fans = join_fans(&app, ev, "crash", 5).await;
    let mut fans = fans;
    fans.sort_by(|a, b| a.account.cmp(&b.account));
    let ranks = |v: &Value| v["ahead"].as_u64().unwrap();

    // Fan 3's place is lost; their re-join (the waiting page sends the fg_place cookie)
    // gets the very same place back: same session, same score, same position.
    let f = &fans[3];
    let before = json(app.join(ev, &f.token).await).await;
    lose(&app, ev, &f.account).await;
    let v = join_with(&app, ev, &f.token, &f.receipt).await;
    assert_eq!(v["restored"], true, "{v}");
    assert_eq!(v["session"], before["session"]);
    assert_eq!(v["score"], before["score"]);
    assert_eq!(ranks(&v), ranks(&before));
    // ...and the status view agrees (the FIFO arithmetic still holds).
    let (s, st) = poll_place(&app, ev, f, true).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(st["ahead"], before["ahead"], "{st}");

    // Someone else's receipt restores nothing: it is not theirs.
    let g = &fans[4];
    lose(&app, ev, &g.account).await;
    let v = join_with(&app, ev, &g.token, &f.receipt).await;
    assert_eq!(v["restored"], false);
    assert_ne!(v["score"], before["score"]);
    assert!(ranks(&v) >= 4, "a new place is at the back: {v}");

    // Admission passes fans 0..=3; fan 0 lets the claim lapse (here: the place is deleted as
    // the status script does) and tries to come back with the old receipt: back of the queue.
    let admit = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
                       "max_active": 4});
    assert_eq!(app.put_config(ev, admit).await.status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.admissions(ev).await.len() < 4 {
        assert!(Instant::now() < deadline, "not admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = &fans[0];
    let mut r = app.redis.clone();
    let _: () = redis::pipe()
        .cmd("HDEL")
        .arg(app.key(ev, "places"))
        .arg(&first.account)
        .cmd("ZREM")
        .arg(app.key(ev, "adm"))
        .arg(&first.account)
        .query_async(&mut r)
        .await
        .unwrap();
    let v = join_with(&app, ev, &first.token, &first.receipt).await;
    assert_eq!(
        v["restored"], false,
        "a place admission passed came back: {v}"
    );
    assert_eq!(v["kind"], "fifo");
    assert_ne!(v["session"].as_str(), None);

    // A revoked account's receipt (a place admission has not reached) restores nothing
    // either.
    let h = &fans[4];
    app.revoke(ev, &h.account).await;
    let v = join_with(&app, ev, &h.token, &h.receipt).await;
    assert_eq!(v["restored"], false);
}
