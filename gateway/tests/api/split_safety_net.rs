//! The safety net on a split queue (`queue_shards` = 3) across two gateway instances: each
//! sub-queue lets joins through on the budgets the leader handed out at its last tick (its
//! share of what is left of the minute's arrivals and of `max_active`), so a surge racing over
//! sub-queues and instances never passes more than the event's thresholds; once a sub-queue
//! queues, every one does from the next tick; the backlog drains, nobody is admitted twice, and
//! the room lets joins through again.

use crate::helpers::*;
use crate::safety_net::{leader_reports_queueing, put, state, surge, two};
use crate::split_queue::split_key;
use gateway::store::{Store, shard_of};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

const SHARDS: u32 = 3;

/// Waits until both instances report the room's safety-net state `want` (the leader writes
/// it with the budgets, once per tick).
async fn wait_state(
    http: &reqwest::Client,
    gs: [&gateway::GatewayHandle; 2],
    event: &str,
    want: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for g in gs {
        loop {
            let s = state(http, g, event).await;
            if s == want {
                break;
            }
            assert!(Instant::now() < deadline, "state {s}, waiting for {want}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Admitted fans (unclaimed + active) of every sub-queue, each sub-queue read in one script.
async fn used(conn: &mut Conn, app_prefix: &str, event: &str) -> i64 {
    let mut n = 0;
    for k in 0..SHARDS {
        let key = |s: &str| split_key(app_prefix, event, k, s);
        let c: i64 = redis::cmd("EVAL")
            .arg("return redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])")
            .arg(2)
            .arg(key("adm"))
            .arg(key("active"))
            .query_async(conn)
            .await
            .unwrap();
        n += c;
    }
    n
}

async fn members(conn: &mut Conn, key: String) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_surge_on_a_split_safety_net_passes_no_more_than_the_threshold() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let (a, b) = two(&prefix, &echo).await;
    let http = client();
    put(
        &http,
        &a,
        "ssn",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
               "mode": "safety_net", "safety_net": {"arrivals_per_minute": 50},
               "queue_shards": SHARDS}),
    )
    .await;
    // Joins pass once the leader has handed out the first budgets.
    wait_state(&http, [&a, &b], "ssn", "pass").await;
    let answers = surge(&http, [&a, &b], "ssn", "s", 300).await;
    let passed: HashSet<&str> = answers
        .iter()
        .filter(|(_, v)| v["state"] == "admitted")
        .map(|(acct, _)| acct.as_str())
        .collect();
    // Never more than the threshold, whatever sub-queue or instance the joins raced on; and
    // the net queued only once a sub-queue had passed its whole share (at least 50 / 3).
    assert!(
        (16..=50).contains(&passed.len()),
        "{} passed straight through",
        passed.len()
    );
    eprintln!(
        "split safety net: {} of 300 passed (threshold 50)",
        passed.len()
    );
    let queued: Vec<&Value> = answers
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["state"] == "waiting")
        .collect();
    assert_eq!(queued.len() + passed.len(), 300);
    assert!(
        queued.iter().all(|v| v["safety_net"] == "queueing"),
        "{:?}",
        queued[0]
    );
    // Each fan in their own sub-queue, and nobody who passed is also waiting.
    let mut conn = redis_conn().await;
    for k in 0..SHARDS {
        let q = members(&mut conn, split_key(&prefix, "ssn", k, "q")).await;
        assert!(
            q.iter()
                .all(|f| shard_of(f, SHARDS) == k && !passed.contains(f.as_str()))
        );
    }
    wait_state(&http, [&a, &b], "ssn", "queueing").await;
    leader_reports_queueing(&http, [&a, &b]).await;
    stop(a).await;
    stop(b).await;
}

#[tokio::test]
async fn the_cap_holds_over_every_sub_queue_and_the_split_room_passes_again_once_drained() {
    let echo = Echo::start().await;
    let prefix = unique_prefix();
    let (a, b) = two(&prefix, &echo).await;
    let http = client();
    let cap = 100;
    put(
        &http,
        &a,
        "scap",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 6000,
               "max_active": cap, "mode": "safety_net",
               "safety_net": {"arrivals_per_minute": 100000}, "queue_shards": SHARDS}),
    )
    .await;
    wait_state(&http, [&a, &b], "scap", "pass").await;
    let peak = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, prefix) = (peak.clone(), done.clone(), prefix.clone());
        tokio::spawn(async move {
            let mut conn = redis_conn().await;
            while !done.load(Ordering::SeqCst) {
                let n = used(&mut conn, &prefix, "scap").await;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let answers = surge(&http, [&a, &b], "scap", "c", 400).await;
    let passed: HashSet<String> = answers
        .iter()
        .filter(|(_, v)| v["state"] == "admitted")
        .map(|(acct, _)| acct.clone())
        .collect();
    // The sub-queues' slot shares add up to the cap; the first to run out queues, and the
    // others follow at the next tick.
    assert!(
        (33..=cap as usize).contains(&passed.len()),
        "{} passed (cap {cap})",
        passed.len()
    );
    eprintln!(
        "split safety net: {} of 400 passed (max_active {cap})",
        passed.len()
    );
    wait_state(&http, [&a, &b], "scap", "queueing").await;
    // Fans finish and leave; the ticker admits the backlog behind them in score order over
    // every sub-queue, never above the cap.
    let store = Store::new(&redis_settings(&prefix)).unwrap();
    let mut conn = redis_conn().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut leaving = Vec::new();
        for k in 0..SHARDS {
            leaving.extend(members(&mut conn, split_key(&prefix, "scap", k, "active")).await);
            leaving.extend(members(&mut conn, split_key(&prefix, "scap", k, "adm")).await);
        }
        for f in leaving.iter().take(25) {
            let k = shard_of(f, SHARDS);
            let _: i64 = redis::cmd("ZREM")
                .arg(split_key(&prefix, "scap", k, "adm"))
                .arg(f)
                .query_async(&mut conn)
                .await
                .unwrap();
            store
                .release_active("scap", SHARDS, f, 60_000)
                .await
                .unwrap();
        }
        let mut waiting = 0;
        for k in 0..SHARDS {
            waiting += members(&mut conn, split_key(&prefix, "scap", k, "q"))
                .await
                .len();
        }
        if waiting == 0 && state(&http, &a, "scap").await == "pass" {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let peak = peak.load(Ordering::SeqCst);
    eprintln!("split safety net: peak {peak} admitted at once (max_active {cap})");
    // Exactly as on one sub-queue: the joins' slot grants and the ticker's admissions are
    // counted against one another, so racing them never goes over the cap.
    assert!(peak <= cap, "{peak} admitted at once (cap {cap})");
    // Everyone admitted exactly once: by the join or by the ticker, never both.
    let mut ticked = Vec::new();
    for k in 0..SHARDS {
        let key = split_key(&prefix, "scap", k, "admissions");
        ticked.extend(
            admissions(&mut conn, &key)
                .await
                .into_iter()
                .map(|(a, _, _)| a),
        );
    }
    let ticked_set: HashSet<String> = ticked.iter().cloned().collect();
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
    // Drained and calm: the next fans pass straight through, on either instance, whichever
    // sub-queue they hash to.
    for (i, g) in [&a, &b, &a, &b, &a, &b].into_iter().enumerate() {
        let t = login(
            &http,
            &format!("http://{}/dev/login", g.public),
            &format!("late-{i}"),
        )
        .await;
        let r = http
            .post(format!("http://{}/queue/scap/join", g.public))
            .bearer_auth(t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["state"], "admitted", "late-{i}: {v}");
    }
    stop(a).await;
    stop(b).await;
}
