//! One event's queue split over `queue_shards` sub-queues (`fg:{event:k}:…`): fans spread over
//! every sub-queue, admission takes them in score order across all of them, nobody is admitted
//! twice or lost while joins race admission, and the fans' positions (from memory or from
//! Redis) count every sub-queue. Runs on the suite's Redis: a single server, or a Redis
//! Cluster where the sub-queues' hash tags land on different masters.

use crate::helpers::*;
use crate::stepper::{Stepper, pace};
use futures::StreamExt;
use gateway::store::shard_of;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

pub fn shard_key(app: &TestApp, event: &str, k: u32, suffix: &str) -> String {
    split_key(&app.prefix, event, k, suffix)
}

/// Sub-queue `k`'s key `suffix` of `event` under `prefix` (`fg:{event}:…` for the home).
pub fn split_key(prefix: &str, event: &str, k: u32, suffix: &str) -> String {
    if k == 0 {
        format!("{prefix}fg:{{{event}}}:{suffix}")
    } else {
        format!("{prefix}fg:{{{event}:{k}}}:{suffix}")
    }
}

/// Every waiting place of every sub-queue, by score.
pub async fn waiting(app: &TestApp, event: &str, shards: u32) -> Vec<Vec<(String, f64)>> {
    let mut out = Vec::new();
    for k in 0..shards {
        let q: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(shard_key(app, event, k, "q"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        out.push(q);
    }
    out
}

/// Every admission of every sub-queue's log.
pub async fn admitted(app: &TestApp, event: &str, shards: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for k in 0..shards {
        let key = shard_key(app, event, k, "admissions");
        for (a, _, _) in admissions(&mut app.redis.clone(), &key).await {
            out.push((k, a));
        }
    }
    out
}

/// The master serving `key`'s slot (`CLUSTER KEYSLOT`, then `CLUSTER SLOTS`).
async fn master_of(app: &TestApp, key: String) -> String {
    let mut c = app.redis.clone();
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut c)
        .await
        .unwrap();
    let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap_or(-1);
    for r in ranges {
        let redis::Value::Array(r) = r else { continue };
        if let [start, end, redis::Value::Array(node), ..] = r.as_slice()
            && (int(start)..=int(end)).contains(&slot)
        {
            return format!("{:?}:{}", node.first(), node.get(1).map_or(-1, int));
        }
    }
    panic!("no master serves slot {slot} of {key}");
}

fn within_bounds(got: i64, want: i64) -> bool {
    (got - want).abs() <= 25.max(want / 100)
}

#[tokio::test]
async fn a_split_queue_admits_in_score_order_over_every_sub_queue() {
    let app = TestApp::spawn().await;
    let ev = "split";
    let cfg = |extra: Value| {
        let mut c = json!({"sale_start": "2099-01-01T00:00:00Z", "admit_per_minute": 60000,
                           "queue_shards": 4});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let r = app.put_config(ev, cfg(json!({}))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json(r).await["config"]["queue_shards"], 4);
    // Pre-sale arrivals draw; after the start (paused) they queue FIFO behind every draw.
    let mut fans = join_fans(&app, ev, "draw", 300).await;
    let started = cfg(json!({"sale_start": "2020-01-01T00:00:00Z", "mode": "paused"}));
    assert_eq!(app.put_config(ev, started).await.status(), StatusCode::OK);
    fans.extend(join_fans(&app, ev, "fifo", 200).await);
    let revoked = ["draw-0007", "fifo-0010", "fifo-0150"];
    for a in revoked {
        app.revoke(ev, a).await;
    }

    // Every sub-queue holds its share, each fan in the one its account hashes to.
    let parts = waiting(&app, ev, 4).await;
    for (k, part) in parts.iter().enumerate() {
        assert!(part.len() > 60, "sub-queue {k} holds {}", part.len());
        assert!(part.iter().all(|(a, _)| shard_of(a, 4) as usize == k));
    }
    let mut all: Vec<(String, f64)> = parts.into_iter().flatten().collect();
    assert_eq!(all.len(), 500 - 3);
    all.sort_by(|a, b| a.1.total_cmp(&b.1));
    let exact: HashMap<String, i64> = all
        .iter()
        .enumerate()
        .map(|(i, (a, _))| (a.clone(), i as i64))
        .collect();

    // Wait for the gateway's view of every sub-queue (one refresh a second): the probe is
    // answered from memory and counts everyone.
    let from_memory = "fg_status_polls_from_memory_total";
    let admin = app.gw().admin.to_string();
    let memory_polls = || metric(&app.http, &admin, from_memory);
    let probe = fans.iter().find(|f| f.account == "fifo-0199").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = memory_polls().await.unwrap_or(0);
        let (s, v) = poll_place(&app, ev, probe, true).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if v["queue_length"] == all.len() as u64 && memory_polls().await.unwrap_or(0) > before {
            break;
        }
        assert!(Instant::now() < deadline, "progress not refreshed: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every waiting fan, from memory: their rank over all four sub-queues within 1 % or 25.
    let m0 = memory_polls().await.unwrap_or(0);
    let mut worst = 0;
    let mut polls = 0;
    for f in fans.iter().filter(|f| exact.contains_key(&f.account)) {
        let (s, v) = poll_place(&app, ev, f, true).await;
        polls += 1;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["state"], "paused", "{v}");
        assert_eq!(v["queue_length"], all.len() as u64);
        let (got, want) = (v["ahead"].as_i64().unwrap(), exact[&f.account]);
        assert!(within_bounds(got, want), "{}: {got} vs {want}", f.account);
        worst = worst.max((got - want).abs());
    }
    let m1 = memory_polls().await.unwrap_or(0);
    assert_eq!(m1 - m0, polls, "every waiting fan answered from memory");
    println!("{polls} polls from memory over 4 sub-queues; worst error {worst} places");

    // Admit 150 (max_active stops the rest): exactly the 150 lowest scores of all sub-queues.
    let open = cfg(json!({"sale_start": "2020-01-01T00:00:00Z", "max_active": 150}));
    assert_eq!(app.put_config(ev, open).await.status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    while admitted(&app, ev, 4).await.len() < 150 {
        assert!(Instant::now() < deadline, "150 not admitted in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the view catch up (≥ 1 s of ticks, all capped), then check nothing more came in.
    let rest = all.len() as u64 - 150;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = poll_place(&app, ev, probe, true).await;
        if v["queue_length"] == rest {
            break;
        }
        assert!(Instant::now() < deadline, "view not refreshed: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = admitted(&app, ev, 4).await;
    assert_eq!(got.len(), 150, "max_active over the sub-queues");
    let got_set: HashSet<&str> = got.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(got_set.len(), 150, "someone admitted twice");
    let first: HashSet<&str> = all[..150].iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(got_set, first, "not the 150 lowest scores");
    for (k, a) in &got {
        assert_eq!(shard_of(a, 4), *k, "{a} admitted by another sub-queue");
    }

    // A waiting fan without a receipt: Redis ranks them in their sub-queue, the gateway adds
    // the others'.
    for f in fans
        .iter()
        .filter(|f| exact.get(&f.account).is_some_and(|&r| r >= 150))
    {
        let (s, v) = poll_place(&app, ev, f, false).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let (got, want) = (v["ahead"].as_i64().unwrap(), exact[&f.account] - 150);
        assert!(within_bounds(got, want), "{}: {got} vs {want}", f.account);
    }
    // Admitted fans claim through their sub-queue; revoked fans are told to join again.
    let fan = |a: &str| fans.iter().find(|f| f.account == a).unwrap();
    let (s, v) = poll_place(&app, ev, fan(&all[0].0), true).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "admitted", "{v}");
    assert!(v["token"].as_str().is_some());
    for a in revoked {
        let (s, v) = poll_place(&app, ev, fan(a), true).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{a}: {v}");
    }
}

#[tokio::test]
async fn fans_joining_while_a_split_queue_admits_are_each_admitted_once() {
    let app = TestApp::spawn().await;
    let ev = "race";
    let cfg = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 30000,
                     "queue_shards": 3});
    assert_eq!(app.put_config(ev, cfg).await.status(), StatusCode::OK);
    // 400 fans join at once while the ticker admits (500/s, 125 per 250 ms tick).
    let fans = join_fans(&app, ev, "r", 400).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while admitted(&app, ev, 3).await.len() < 400 {
        assert!(Instant::now() < deadline, "not everyone admitted in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = admitted(&app, ev, 3).await;
    let set: HashSet<&str> = got.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!((got.len(), set.len()), (400, 400), "admitted twice or lost");
    assert!(waiting(&app, ev, 3).await.iter().all(Vec::is_empty));
    for k in 0..3 {
        assert!(
            got.iter().any(|(s, _)| *s == k),
            "sub-queue {k} admitted nobody"
        );
    }
    if cluster() {
        // On the Redis Cluster the three sub-queues are served by three masters: this
        // event's joins and pops did not all go to one.
        let mut masters = HashSet::new();
        for k in 0..3 {
            masters.insert(master_of(&app, shard_key(&app, ev, k, "admissions")).await);
        }
        assert_eq!(masters.len(), 3, "{masters:?}");
    }
    // Every one of them claims a token through their own sub-queue (asking Redis: the
    // receipt's answer from memory lags admission by up to a refresh).
    let claimed = futures::stream::iter(&fans)
        .map(|f| async { poll_place(&app, ev, f, false).await })
        .buffer_unordered(64)
        .filter(|(s, v)| {
            let ok = *s == StatusCode::OK && v["state"] == "admitted" && v["token"].is_string();
            async move { ok }
        })
        .count()
        .await;
    assert_eq!(claimed, 400);
}

#[tokio::test]
async fn queue_shards_is_checked_and_fixed_when_the_room_is_created() {
    let app = TestApp::spawn().await;
    let base = |shards: Value| {
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
               "queue_shards": shards})
    };
    for (bad, why) in [
        (base(json!(0)), "between 1 and 16"),
        (base(json!(17)), "between 1 and 16"),
        (base(json!(-2)), "between 1 and 16"),
    ] {
        let r = app.put_config("fixed", bad).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let v = json(r).await;
        assert_eq!(v["errors"][0]["field"], "queue_shards", "{v}");
        assert!(
            v["errors"][0]["problem"].as_str().unwrap().contains(why),
            "{v}"
        );
    }
    assert_eq!(
        app.put_config("fixed", base(json!(3))).await.status(),
        StatusCode::OK
    );
    // Another count, or none (= 1), is refused whole: the admit rate stays too.
    for other in [json!(2), Value::Null] {
        let mut c = base(other);
        c["admit_per_minute"] = json!(1200);
        if c["queue_shards"].is_null() {
            c.as_object_mut().unwrap().remove("queue_shards");
        }
        let r = app.put_config("fixed", c).await;
        assert_eq!(r.status(), StatusCode::CONFLICT);
        let v = json(r).await;
        assert_eq!(v["code"], "QUEUE_SHARDS_FIXED");
        assert_eq!(v["queue_shards"], 3);
    }
    let r = app
        .http
        .get(app.admin_url("/admin/events/fixed/config"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let v = json(r).await;
    assert_eq!(v["config"]["queue_shards"], 3, "{v}");
    assert_eq!(v["config"]["admit_per_minute"], 600, "{v}");
    // A room created whole stays whole.
    app.open_event("whole", 600).await;
    let r = app.put_config("whole", base(json!(2))).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);

    // Sold out reaches every sub-queue at once: nobody joins any of them; cleared, all join.
    let sold = |on: bool| {
        app.http
            .put(app.admin_url("/admin/events/fixed/sold_out"))
            .bearer_auth(ADMIN)
            .json(&json!({ "sold_out": on }))
            .send()
    };
    assert_eq!(sold(true).await.unwrap().status(), StatusCode::OK);
    let mut per = [0u32; 3];
    for i in 0..30 {
        let account = format!("late-{i}");
        per[shard_of(&account, 3) as usize] += 1;
        let r = app.join("fixed", &app.login(&account).await).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{account}");
        assert_eq!(json(r).await["code"], "SOLD_OUT");
    }
    assert!(per.iter().all(|&n| n > 0), "{per:?}");
    assert_eq!(sold(false).await.unwrap().status(), StatusCode::OK);
    for i in 0..30 {
        let r = app
            .join("fixed", &app.login(&format!("late-{i}")).await)
            .await;
        assert!(r.status().is_success(), "{}", r.status());
    }
}

/// The fencing number that makes a stalled former leader's pops harmless must not make the
/// current leader look stale: passthrough deletes the token bucket on every tick, and the
/// number used to live there (a leader that had ticked the room in queue mode was then
/// refused by its own sub-queues in passthrough, and after it until the number caught up).
#[tokio::test]
async fn a_split_room_keeps_its_leader_through_passthrough() {
    let app = TestApp::spawn().await;
    let ev = "fence";
    let mut stepper = Stepper::take_lease(&app, ev).await;
    let cfg = |mode: &str| {
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
               "mode": mode, "queue_shards": 2})
    };
    assert_eq!(
        app.put_config(ev, cfg("queue")).await.status(),
        StatusCode::OK
    );
    stepper.watch(ev).await;
    join_fans(&app, ev, "q", 20).await;
    assert_eq!(lead_until(&mut stepper, ev, 20).await, 20);
    assert_eq!(
        app.put_config(ev, cfg("passthrough")).await.status(),
        StatusCode::OK
    );
    stepper.watch(ev).await;
    for _ in 0..3 {
        pace().await;
        stepper.lead(ev).await;
    }
    // Back to queueing: the same leader admits the next fans from both sub-queues.
    assert_eq!(
        app.put_config(ev, cfg("queue")).await.status(),
        StatusCode::OK
    );
    stepper.watch(ev).await;
    join_fans(&app, ev, "r", 20).await;
    assert_eq!(lead_until(&mut stepper, ev, 20).await, 20);
    assert_eq!(admitted_in(&app, ev, "r").await, 20);
}

/// Paced ticks, each of which must lead `event`, until `want` are admitted (the bucket refills
/// on Redis time); what they admitted.
async fn lead_until(stepper: &mut Stepper, event: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut admitted = 0;
    while admitted < want {
        assert!(Instant::now() < deadline, "{admitted} of {want} admitted");
        pace().await;
        admitted += stepper.lead(event).await.admitted;
    }
    admitted
}

/// Admissions of accounts named `prefix-…` over both sub-queues' logs.
async fn admitted_in(app: &TestApp, event: &str, prefix: &str) -> usize {
    admitted(app, event, 2)
        .await
        .iter()
        .filter(|(_, a)| a.starts_with(&format!("{prefix}-")))
        .count()
}
