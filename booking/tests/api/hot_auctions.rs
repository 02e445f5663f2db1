//! Hot auctions (Redis Lua decides, a stream consumer records in Postgres): concurrent bids,
//! idempotent retries, anti-sniping, the end boundary, consumer crash and restart, closing.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failure must panic the test"
)]

use crate::auctions::{assert_highest_wins, bid, create_ok, fire_increasing, spawn_unlimited};
use crate::helpers::{TestApp, json, open_auction};
use booking::auctions::{closer, hot};
use futures::future::join_all;
use serde_json::{Value, json};

async fn redis(app: &TestApp) -> redis::aio::ConnectionManager {
    app.state.redis.conn().await.expect("redis")
}

/// Sets the Redis end of a hot auction (ms since the epoch, Redis clock) and Postgres's end.
async fn end_now_minus(app: &TestApp, auction: &str, ms: i64) {
    let k = hot::keys(&app.state.redis, auction);
    let mut conn = redis(app).await;
    let t: (String, String) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = t.0.parse::<i64>().unwrap() * 1000 + t.1.parse::<i64>().unwrap() / 1000;
    let _: () = redis::cmd("HSET")
        .arg(&k.state)
        .arg("end")
        .arg(now_ms - ms)
        .query_async(&mut conn)
        .await
        .unwrap();
    sqlx::query("UPDATE auctions SET end_time = clock_timestamp() - make_interval(secs => $2) WHERE id = $1")
        .bind(auction)
        .bind(ms as f64 / 1000.0)
        .execute(&app.pool)
        .await
        .unwrap();
}

/// Stream entries delivered to a consumer of the group and not acknowledged.
async fn pending(app: &TestApp, auction: &str) -> i64 {
    let k = hot::keys(&app.state.redis, auction);
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(&k.stream)
        .arg(hot::GROUP)
        .query_async(&mut redis(app).await)
        .await
        .unwrap();
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

async fn drain(app: &TestApp, auction: &str) {
    hot::consume_auction(&app.state.auctions, auction, "test-consumer")
        .await
        .expect("consume");
}

#[tokio::test]
async fn two_hundred_concurrent_increasing_bids_hot() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, true, 3600).await;
    let results = fire_increasing(&app, &auction).await;
    // The live view (Redis) already shows the winner, before the consumer ran.
    let token = app.admission("viewer", "auction-day");
    let (_, view) = json(app.get(&format!("/api/auctions/{auction}"), &token).await).await;
    assert_eq!(view["current_price"], 3000, "{view}");
    assert_eq!(
        view["leader"],
        app.state.auctions.handles.bidder(&auction, "bidder-200")
    );
    drain(&app, &auction).await;
    assert_highest_wins(&app, &auction, &results).await;
    app.stop().await;
}

#[tokio::test]
async fn hot_identical_retries_make_one_bid() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, true, 3600).await;
    let results = join_all((0..50).map(|_| bid(&app, &auction, "r", "same", json!(1200)))).await;
    let created: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(created.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|(s, _)| *s == 200)
            .all(|(_, b)| b == created[0])
    );
    assert_eq!(results.iter().filter(|(s, _)| *s == 200).count(), 49);
    let (s, b) = bid(&app, &auction, "r", "same", json!(1300)).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED"))
    );
    drain(&app, &auction).await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM bids WHERE auction_id = $1")
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    app.stop().await;
}

#[tokio::test]
async fn hot_anti_sniping_and_bid_after_end() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, true, 3600).await;
    let (s, b) = bid(&app, &auction, "a", "k1", json!(1000)).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["extended"], false);
    // 30 s before the (Redis) end: the bid extends it to 2 minutes from Redis's now.
    end_now_minus(&app, &auction, -30_000).await;
    let (s, b) = bid(&app, &auction, "b", "k1", json!(1010)).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["extended"], true, "{b}");
    let placed = chrono::DateTime::parse_from_rfc3339(b["placed_at"].as_str().unwrap()).unwrap();
    let end = chrono::DateTime::parse_from_rfc3339(b["end_time"].as_str().unwrap()).unwrap();
    assert_eq!((end - placed).num_milliseconds(), 120_000, "{b}");
    // Past the end: refused, though nobody has closed it yet.
    end_now_minus(&app, &auction, 1).await;
    let (s, b) = bid(&app, &auction, "c", "k1", json!(5000)).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (409, Some("AUCTION_CLOSED")),
        "{b}"
    );
    assert_eq!(b["current_price"], 1010);
    // Seller and low bids are refused by the script as well.
    end_now_minus(&app, &auction, -600_000).await;
    let (s, b) = bid(&app, &auction, "seller", "k1", json!(5000)).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (403, Some("SELLER_CANNOT_BID")),
        "{b}"
    );
    let (s, b) = bid(&app, &auction, "d", "k1", json!(1015)).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("BID_TOO_LOW")), "{b}");
    assert_eq!(b["min_next_bid"], 1020);
    drain(&app, &auction).await;
    let (ext, extended): (i32, i64) = sqlx::query_as(
        "SELECT extensions, (SELECT count(*) FROM bids WHERE auction_id = $1 AND extended)
           FROM auctions WHERE id = $1",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((ext, extended), (1, 1));
    app.stop().await;
}

#[tokio::test]
async fn consumer_killed_mid_stream_and_restarted_records_every_bid_exactly_once() {
    let app = TestApp::spawn_with(|c| {
        c.auctions.bids_per_second = 100_000;
        c.auctions.bid_burst = 100_000;
        c.auctions.consumer_batch = 16;
        // Entries a dead consumer left pending are claimed at once by the next one.
        c.auctions.consumer_claim_idle_ms = 0;
    })
    .await;
    let auction = create_ok(&app, true, 3600).await;
    let results = fire_increasing(&app, &auction).await;
    let mut accepted = results.iter().filter(|(s, _)| *s == 201).count();
    // Then 60 more that are all accepted, so the stream is long enough for every crash below.
    for i in 1..=60 {
        let (s, b) = bid(
            &app,
            &auction,
            &format!("late-{i}"),
            "k",
            json!(3000 + i * 10),
        )
        .await;
        assert_eq!(s, 201, "{b}");
        accepted += 1;
    }

    // Consumer "a" dies after writing a batch to Postgres but before acknowledging it...
    let first = hot::read_batch(&app.state.auctions, &auction, "a", 16)
        .await
        .unwrap();
    assert!(!first.is_empty());
    hot::write_batch(&app.state.auctions, &auction, &first)
        .await
        .unwrap();
    // ...and consumer "b" dies right after reading one (nothing written, nothing acked).
    let second = hot::read_batch(&app.state.auctions, &auction, "b", 16)
        .await
        .unwrap();
    // Consumer "c" runs as a real loop and is killed (task aborted) somewhere mid-stream.
    let state = app.state.auctions.clone();
    let id = auction.clone();
    let killed = tokio::spawn(async move {
        loop {
            let batch = hot::read_batch(&state, &id, "c", 4).await.unwrap();
            if batch.is_empty() {
                break;
            }
            hot::write_batch(&state, &id, &batch).await.unwrap();
            tokio::task::yield_now().await;
            hot::ack(&state, &id, &batch).await.unwrap();
        }
    });
    tokio::task::yield_now().await;
    killed.abort();
    let _ = killed.await;
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM bids WHERE auction_id = $1")
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(
        (before as usize) < accepted,
        "the crash left bids unrecorded ({before} of {accepted})"
    );
    assert_eq!(second.len(), 16);

    // A restarted consumer (new name) picks up the dead ones' pending entries and the rest.
    drain(&app, &auction).await;
    let (logged, distinct, max): (i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT request_id), max(amount) FROM bids WHERE auction_id = $1",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(logged as usize, accepted, "every accepted bid in Postgres");
    assert_eq!(distinct, logged, "exactly once");
    assert_eq!(max, Some(3600));
    let (price, leader): (i64, Option<String>) =
        sqlx::query_as("SELECT current_price, leader_id FROM auctions WHERE id = $1")
            .bind(&auction)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((price, leader.as_deref()), (3600, Some("late-60")));
    // Nothing is left pending in the group.
    let k = hot::keys(&app.state.redis, &auction);
    let mut conn = redis(&app).await;
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(&k.stream)
        .arg(hot::GROUP)
        .query_async(&mut conn)
        .await
        .unwrap();
    let pending = match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(pending, 0);
    app.stop().await;
}

#[tokio::test]
async fn closing_a_hot_auction_freezes_it_and_records_the_result_once() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, true, 3600).await;
    let results = fire_increasing(&app, &auction).await;
    let accepted = results.iter().filter(|(s, _)| *s == 201).count() as i64;
    end_now_minus(&app, &auction, 1).await;
    // Racing closers: one records it; nobody drained the stream before, the closer does.
    let runs = join_all((0..3).map(|_| closer::close_due(&app.state.auctions))).await;
    let closed: Vec<_> = runs.into_iter().flat_map(|r| r.unwrap()).collect();
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert_eq!(closed[0].current_price, 3000);
    let (status, price, leader, logged, events): (String, i64, Option<String>, i64, i64) =
        sqlx::query_as(
            "SELECT status, current_price, leader_id,
                    (SELECT count(*) FROM bids WHERE auction_id = a.id),
                    (SELECT count(*) FROM outbox WHERE aggregate_id = a.id AND topic = 'auction.closed')
               FROM auctions a WHERE id = $1",
        )
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), price, leader.as_deref(), logged, events),
        ("CLOSED", 3000, Some("bidder-200"), accepted, 1)
    );
    // Frozen in Redis: even with the end moved back into the future, no bid gets in.
    end_now_minus(&app, &auction, -600_000).await;
    let (s, b) = bid(&app, &auction, "late", "k", json!(99999)).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (409, Some("AUCTION_CLOSED")),
        "{b}"
    );
    app.stop().await;
}

/// The raw Redis keys of a hot auction (state, replay records, stream with its group), as
/// `DUMP` blobs: restoring them is what a Redis that lost its tail looks like.
async fn dump_hot(app: &TestApp, auction: &str) -> Vec<(String, Vec<u8>)> {
    let k = hot::keys(&app.state.redis, auction);
    let mut conn = redis(app).await;
    let mut out = Vec::new();
    for key in [k.state, k.reqs, k.stream] {
        let blob: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.push((key, blob));
    }
    out
}

async fn restore_hot(app: &TestApp, dumped: &[(String, Vec<u8>)]) {
    let mut conn = redis(app).await;
    for (key, blob) in dumped {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(blob.as_slice())
            .arg("REPLACE")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_redis_rollback_below_a_recorded_bid_neither_accepts_a_lower_bid_nor_lowers_the_close() {
    let app = spawn_unlimited().await;
    let auction = open_auction(&app, "seller", true, 3600).await;
    let (s, b) = bid(&app, &auction, "alice", "k", json!(1000)).await;
    assert_eq!(s, 201, "{b}");
    let before_bob = dump_hot(&app, &auction).await;
    let (s, b) = bid(&app, &auction, "bob", "k", json!(2000)).await;
    assert_eq!(s, 201, "{b}");
    // The consumer records bob's bid in Postgres; then Redis loses its tail (as after an
    // `everysec` crash or a failover): its state says alice leads at 1000 again. (The job's
    // own pass, which also refreshes this instance's copy of Postgres's record.)
    assert_eq!(hot::consume_all(&app.state.auctions).await.unwrap(), 2);
    restore_hot(&app, &before_bob).await;

    // A bid between the rolled-back price and the recorded one is refused, on this instance
    // (which recorded bob's bid) and on a fresh one (which only knows Postgres).
    let peer = app.spawn_peer(|_| {}).await;
    for (who, inst) in [("carol", &app), ("dave", &peer)] {
        let (s, b) = bid(inst, &auction, who, "k", json!(1500)).await;
        assert_eq!((s, b["code"].as_str()), (409, Some("BID_TOO_LOW")), "{b}");
        assert_eq!(
            (&b["current_price"], &b["min_next_bid"]),
            (&json!(2000), &json!(2010))
        );
    }
    let token = app.admission("viewer", "auction-day");
    let (_, view) = json(app.get(&format!("/api/auctions/{auction}"), &token).await).await;
    assert_eq!(view["current_price"], 2000, "{view}");

    // Roll Redis back again (nobody bid since) and close: the recorded higher bid wins.
    restore_hot(&app, &before_bob).await;
    end_now_minus(&app, &auction, 1).await;
    let closed = closer::close_due(&app.state.auctions).await.unwrap();
    assert_eq!(closed.len(), 1, "{closed:?}");
    let (status, price, leader, count, logged): (String, i64, Option<String>, i64, i64) =
        sqlx::query_as(
            "SELECT status, current_price, leader_id, bid_count,
                    (SELECT count(*) FROM bids WHERE auction_id = a.id)
               FROM auctions a WHERE id = $1",
        )
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), price, leader.as_deref(), count, logged),
        ("CLOSED", 2000, Some("bob"), 2, 2)
    );
    let winner: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE aggregate_id = $1 AND topic = 'auction.closed'",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        (&winner["winner"], &winner["price"]),
        (&json!("bob"), &json!(2000))
    );
    peer.stop().await;
    app.stop().await;
}

/// A bid sent from its own task (owned request parts, so hundreds can run at once).
fn spawn_bid(
    inst: &TestApp,
    auction: &str,
    bidder: String,
    amount: i64,
) -> tokio::task::JoinHandle<(u16, Value, String, i64)> {
    let req = inst
        .client
        .post(inst.url(&format!("/api/auctions/{auction}/bids")))
        .bearer_auth(inst.admission(&bidder, "auction-day"))
        .header("Idempotency-Key", format!("k-{bidder}"))
        .json(&json!({ "amount": amount }));
    tokio::spawn(async move {
        let (s, b) = json(req.send().await.expect("request")).await;
        (s, b, bidder, amount)
    })
}

/// Bids `from..to` (amounts 1000 + 5·i, so about every other one is high enough), spread over
/// the instances, each from its own task. Returns the accepted ones: (bid_id, bidder, amount).
async fn bid_load(
    insts: &[&TestApp],
    auction: &str,
    from: i64,
    to: i64,
) -> Vec<(String, String, i64)> {
    let tasks: Vec<_> = (from..to)
        .map(|i| {
            let inst = insts[i as usize % insts.len()];
            spawn_bid(inst, auction, format!("fan-{i}"), 1000 + 5 * i)
        })
        .collect();
    let mut accepted = Vec::new();
    for t in tasks {
        let (s, b, bidder, amount) = t.await.unwrap();
        match s {
            201 => accepted.push((b["bid_id"].as_str().unwrap().to_owned(), bidder, amount)),
            409 => assert_eq!(b["code"], "BID_TOO_LOW", "{b}"),
            _ => panic!("unexpected answer {s} {b}"),
        }
    }
    accepted
}

#[tokio::test]
async fn an_instance_killed_between_reading_and_writing_a_batch_just_before_the_end_loses_no_bid() {
    let app = spawn_unlimited().await;
    let peer = app.spawn_peer(|_| {}).await;
    assert_ne!(
        app.state.auctions.consumer_name,
        peer.state.auctions.consumer_name
    );
    let auction = open_auction(&app, "seller", true, 3600).await;

    // Both instances take bids and run their consumers while the load runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumers: Vec<_> = [&app, &peer]
        .into_iter()
        .map(|inst| {
            let (state, stop, id) = (inst.state.auctions.clone(), stop.clone(), auction.clone());
            tokio::spawn(async move {
                let name = state.consumer_name.clone();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    hot::consume_auction(&state, &id, &name).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    let mut accepted = bid_load(&[&app, &peer], &auction, 0, 300).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in consumers {
        c.await.unwrap();
    }

    // The anti-sniping peak: 20 s before the end, another burst, which nobody has read yet.
    end_now_minus(&app, &auction, -20_000).await;
    accepted.extend(bid_load(&[&app, &peer], &auction, 300, 500).await);
    // The peer's consumer reads the whole burst, and the instance dies before writing it.
    let (read_tx, read_rx) = tokio::sync::oneshot::channel();
    let (state, id) = (peer.state.auctions.clone(), auction.clone());
    let doomed = tokio::spawn(async move {
        let name = state.consumer_name.clone();
        let batch = hot::read_batch(&state, &id, &name, 10_000).await.unwrap();
        let _ = read_tx.send(batch.len());
        std::future::pending::<()>().await;
        hot::write_batch(&state, &id, &batch).await.unwrap();
    });
    let read = read_rx.await.unwrap();
    assert!(read > 0, "the dying consumer holds unwritten entries");
    doomed.abort();
    let _ = doomed.await;
    peer.stop().await;

    // The end passes; the surviving instance closes.
    end_now_minus(&app, &auction, 1).await;
    let closed = closer::close_due(&app.state.auctions).await.unwrap();
    assert_eq!(closed.len(), 1, "{closed:?}");

    let mut want: Vec<String> = accepted.iter().map(|a| a.0.clone()).collect();
    want.sort();
    let got: Vec<String> =
        sqlx::query_scalar("SELECT id FROM bids WHERE auction_id = $1 ORDER BY id")
            .bind(&auction)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(got.len(), want.len(), "every accepted bid recorded, once");
    assert_eq!(got, want);
    let (status, price, leader, count): (String, i64, Option<String>, i64) = sqlx::query_as(
        "SELECT status, current_price, leader_id, bid_count FROM auctions WHERE id = $1",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let top = accepted.iter().max_by_key(|a| a.2).unwrap();
    assert_eq!(
        (status.as_str(), price, leader.as_deref()),
        ("CLOSED", top.2, Some(top.1.as_str()))
    );
    let k = hot::keys(&app.state.redis, &auction);
    let redis_bids: i64 = redis::cmd("HGET")
        .arg(&k.state)
        .arg("bids")
        .query_async(&mut redis(&app).await)
        .await
        .unwrap();
    assert_eq!((count, redis_bids), (want.len() as i64, want.len() as i64));
    assert_eq!(pending(&app, &auction).await, 0);
    app.stop().await;
}
