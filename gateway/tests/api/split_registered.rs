//! A registered room split over sub-queues (`queue_shards` > 1, access `registered`): each
//! account's registration lives beside its place, in the sub-queue it hashes to, so uploads
//! (add, replace, remove), fans' own registrations and the counts cover every sub-queue, joins
//! from anyone off the list are refused and leave no trace, and the draw stays one verifiable
//! order across all sub-queues, which admission follows.

use crate::helpers::*;
use crate::registered::{count, ids, register, rfc3339, upload_ok};
use crate::registered_draw::{draw, wait_revealed};
use crate::split_queue::{admitted, shard_key, waiting};
use futures::StreamExt;
use gateway::draw::{presale_score, seed_hash};
use gateway::store::shard_of;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

const EV: &str = "sreg";
const SHARDS: u32 = 3;

/// Each sub-queue's list, checked to hold only accounts that hash to it; their union.
async fn lists(app: &TestApp) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for k in 0..SHARDS {
        let part: BTreeSet<String> = redis::cmd("SMEMBERS")
            .arg(shard_key(app, EV, k, "reg"))
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        assert!(part.len() > 20, "sub-queue {k} lists {}", part.len());
        for a in &part {
            assert_eq!(shard_of(a, SHARDS), k, "{a} listed on sub-queue {k}");
        }
        all.extend(part);
    }
    all
}

fn set(range: std::ops::Range<usize>) -> BTreeSet<String> {
    ids(range, "sr").lines().map(str::to_owned).collect()
}

/// Joins of `accounts` at once (32 in flight): account → (status, body).
async fn join_each(app: &TestApp, accounts: &[String]) -> HashMap<String, (StatusCode, Value)> {
    futures::stream::iter(accounts)
        .map(|a| async move {
            let token = app.login(a).await;
            let r = app.join(EV, &token).await;
            let s = r.status();
            (a.clone(), (s, r.json().await.unwrap_or(Value::Null)))
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// Every sub-queue's admissions, once there are at least `n`.
async fn admitted_at_least(app: &TestApp, n: usize) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = admitted(app, EV, SHARDS).await;
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} admitted",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_split_registered_room_keeps_registrations_with_places_and_one_draw() {
    let app = TestApp::spawn().await;
    let room = |sale_start: chrono::DateTime<chrono::Utc>, max_active: u64| {
        json!({"sale_start": rfc3339(sale_start), "registration_closes": rfc3339(sale_start),
               "access": "registered", "admit_per_minute": 60000, "max_active": max_active,
               "queue_shards": SHARDS})
    };
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let r = app.put_config(EV, room(later, 0)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());

    // Uploads split the list by account; the counts add the sub-queues up.
    let v = upload_ok(&app, EV, "add", ids(0..300, "sr")).await;
    assert_eq!(
        (v["accounts"].as_u64(), v["count"].as_u64()),
        (Some(300), Some(300))
    );
    assert_eq!(lists(&app).await, set(0..300));
    let v = upload_ok(&app, EV, "add", ids(0..300, "sr")).await;
    assert_eq!(
        (v["changed"].as_u64(), v["count"].as_u64()),
        (Some(0), Some(300))
    );
    let v = upload_ok(&app, EV, "replace", ids(100..400, "sr")).await;
    assert_eq!(v["count"], 300);
    assert_eq!(
        lists(&app).await,
        set(100..400),
        "replace left old accounts"
    );
    let v = upload_ok(&app, EV, "remove", ids(350..400, "sr")).await;
    assert_eq!(
        (v["changed"].as_u64(), v["count"].as_u64()),
        (Some(50), Some(250))
    );
    assert_eq!(lists(&app).await, set(100..350));
    let one = count(&app, EV, Some("sr-0000123")).await;
    assert_eq!(
        (one["count"].as_u64(), one["registered"].as_bool()),
        (Some(250), Some(true))
    );
    assert_eq!(
        count(&app, EV, Some("sr-0000360")).await["registered"],
        false
    );

    // Fans register themselves, each on their own sub-queue.
    let own: Vec<String> = (0..30).map(|i| format!("self-{i:02}")).collect();
    let app_ref = &app;
    let answers: Vec<StatusCode> = futures::stream::iter(&own)
        .map(|a| async move {
            let token = app_ref.login(a).await;
            register(app_ref, EV, &token).await.status()
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(answers.iter().all(|s| *s == StatusCode::OK), "{answers:?}");
    let mut listed = set(100..350);
    listed.extend(own.iter().cloned());
    assert_eq!(lists(&app).await, listed);
    assert_eq!(count(&app, EV, None).await["count"], 280);

    // Everyone listed joins (drawn); anyone else, removed or never listed, is refused and
    // leaves no place in any sub-queue.
    let fans: Vec<String> = listed.iter().cloned().collect();
    let mut strangers: Vec<String> = ["sr-0000000", "sr-0000099", "sr-0000360", "sr-0000399"]
        .map(str::to_owned)
        .to_vec();
    strangers.extend((0..16).map(|i| format!("stranger-{i:02}")));
    let mut every = fans.clone();
    every.extend(strangers.iter().cloned());
    let joined = join_each(&app, &every).await;
    for s in &strangers {
        let (status, v) = &joined[s];
        assert_eq!(
            (*status, v["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("NOT_REGISTERED")),
            "{s}"
        );
    }
    for f in &fans {
        let (status, v) = &joined[f];
        assert_eq!(
            (*status, v["kind"].as_str()),
            (StatusCode::CREATED, Some("draw")),
            "{f}: {v}"
        );
    }
    let parts = waiting(&app, EV, SHARDS).await;
    for (k, part) in parts.iter().enumerate() {
        assert!(part.iter().all(|(a, _)| shard_of(a, SHARDS) as usize == k));
    }
    let queued: HashSet<&str> = parts.iter().flatten().map(|(a, _)| a.as_str()).collect();
    assert_eq!(queued.len(), fans.len());
    assert!(strangers.iter().all(|s| !queued.contains(s.as_str())));
    for k in 0..SHARDS {
        let places: Vec<String> = redis::cmd("HKEYS")
            .arg(shard_key(&app, EV, k, "places"))
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        assert!(
            places.iter().all(|a| !strangers.contains(a)),
            "a refused join left a place"
        );
    }

    // The sale starts: the seed is revealed, and every score, whichever sub-queue holds it,
    // is the one anyone recomputes from it.
    let committed = draw(&app, EV).await;
    let start = chrono::Utc::now() + chrono::Duration::seconds(1);
    assert_eq!(
        app.put_config(EV, room(start, 100)).await.status(),
        StatusCode::OK
    );
    let revealed = wait_revealed(&app, EV).await;
    let seed = hex::decode(revealed["seed"].as_str().unwrap()).unwrap();
    assert_eq!(seed_hash(&seed), committed["seed_hash"].as_str().unwrap());
    let mut order: Vec<(i64, String)> = fans
        .iter()
        .map(|f| (presale_score(&seed, f), f.clone()))
        .collect();
    for (score, f) in &order {
        assert_eq!(joined[f].1["score"], score.to_string(), "{f}");
    }
    order.sort();

    // Admission under max_active 100 takes exactly the 100 lowest scores of all sub-queues,
    // then (the cap lifted) everyone else, nobody twice.
    let first: BTreeSet<String> = admitted_at_least(&app, 100)
        .await
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    let lowest: BTreeSet<String> = order[..100].iter().map(|(_, a)| a.clone()).collect();
    assert_eq!(
        first, lowest,
        "not the 100 lowest draws over every sub-queue"
    );
    assert_eq!(
        app.put_config(EV, room(start, 0)).await.status(),
        StatusCode::OK
    );
    let all = admitted_at_least(&app, fans.len()).await;
    let distinct: HashSet<&str> = all.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(
        (all.len(), distinct.len()),
        (fans.len(), fans.len()),
        "admitted twice or lost"
    );
}
