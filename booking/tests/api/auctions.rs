//! Cold auctions (Postgres decides): creation, validation, concurrent bids, anti-sniping,
//! the end boundary, idempotent retries, the closer.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failure must panic the test"
)]

use crate::helpers::{TestApp, json};
use booking::auctions::closer;
use futures::future::join_all;
use serde_json::{Value, json};

pub fn in_secs(s: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(s)).to_rfc3339()
}

/// Bids are not rate limited in tests that fire many per bidder (the limiter has its own test).
pub async fn spawn_unlimited() -> TestApp {
    TestApp::spawn_with(|c| {
        c.auctions.bids_per_second = 100_000;
        c.auctions.bid_burst = 100_000;
    })
    .await
}

/// `POST /api/auctions` in the `auction-day` event (the event of these tests' tokens).
pub async fn create(app: &TestApp, seller: &str, body: Value) -> (u16, Value) {
    crate::helpers::create_auction(app, "auction-day", seller, body).await
}

pub async fn create_ok(app: &TestApp, hot: bool, end_in_s: i64) -> String {
    let (status, body) = create(
        app,
        "seller",
        json!({"title": "Antique watch", "start_price": 1000, "min_increment": 10,
               "end_time": in_secs(end_in_s), "hot": hot}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

pub async fn bid(
    app: &TestApp,
    auction: &str,
    bidder: &str,
    key: &str,
    amount: Value,
) -> (u16, Value) {
    let token = app.admission(bidder, "auction-day");
    json(
        app.client
            .post(app.url(&format!("/api/auctions/{auction}/bids")))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&json!({ "amount": amount }))
            .send()
            .await
            .expect("request"),
    )
    .await
}

/// 200 bidders, amounts 1010..=3000 in steps of 10, all at once. Returns the responses.
pub async fn fire_increasing(app: &TestApp, auction: &str) -> Vec<(u16, Value)> {
    join_all((1..=200).map(|i| {
        let bidder = format!("bidder-{i}");
        let key = format!("k-{i}");
        async move { bid(app, auction, &bidder, &key, json!(1000 + i * 10)).await }
    }))
    .await
}

/// The invariant after a burst of increasing bids: the highest bid leads, the price equals it,
/// and the largest logged bid equals the price; every 201 is logged and nothing else is.
pub async fn assert_highest_wins(app: &TestApp, auction: &str, results: &[(u16, Value)]) {
    let accepted = results.iter().filter(|(s, _)| *s == 201).count() as i64;
    for (s, b) in results {
        assert!(
            *s == 201 || (*s == 409 && b["code"] == "BID_TOO_LOW"),
            "unexpected answer {s} {b}"
        );
    }
    let (price, leader, bid_count): (i64, Option<String>, i64) =
        sqlx::query_as("SELECT current_price, leader_id, bid_count FROM auctions WHERE id = $1")
            .bind(auction)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let (max_bid, logged): (Option<i64>, i64) =
        sqlx::query_as("SELECT max(amount), count(*) FROM bids WHERE auction_id = $1")
            .bind(auction)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        price, 3000,
        "the highest bid (3000) is always valid, so it must win"
    );
    assert_eq!(leader.as_deref(), Some("bidder-200"));
    assert_eq!(max_bid, Some(price));
    assert_eq!(logged, accepted, "every 201 is logged exactly once");
    assert_eq!(bid_count, accepted);
    // The log is a strictly increasing sequence in acceptance order.
    let amounts: Vec<i64> = sqlx::query_scalar(
        "SELECT amount FROM bids WHERE auction_id = $1 ORDER BY placed_at, amount",
    )
    .bind(auction)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(amounts.windows(2).all(|w| w[0] < w[1]), "{amounts:?}");
}

#[tokio::test]
async fn create_returns_an_open_auction_and_get_shows_it() {
    let app = TestApp::spawn().await;
    let (status, body) = create(
        &app,
        "seller-1",
        json!({"title": "Guitar", "start_price": 1000, "min_increment": 10,
               "end_time": in_secs(3600), "hot": false}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["current_price"], 1000);
    assert_eq!(body["leader"], Value::Null);
    assert_eq!(body["status"], "OPEN");
    // Item 9: fans appear as handles; the creator is told the auction is theirs.
    let id = body["id"].as_str().unwrap();
    assert_eq!(
        body["seller"],
        app.state.auctions.handles.seller(id, "seller-1")
    );
    assert_eq!(body["you_sell"], true);
    assert_eq!(body["max_extensions"], 30);
    assert_eq!(body["min_next_bid"], 1000);
    let token = app.admission("viewer", "auction-day");
    let (status, got) = json(app.get(&format!("/api/auctions/{id}"), &token).await).await;
    assert_eq!(status, 200);
    assert_eq!(got["id"], id);
    assert_eq!(got["end_time"], body["end_time"]);
    let (status, got) = json(app.get("/api/auctions/nope", &token).await).await;
    assert_eq!(status, 404, "{got}");
    // No token, no auction.
    let resp = app
        .client
        .get(app.url(&format!("/api/auctions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    app.stop().await;
}

#[tokio::test]
async fn create_refuses_bad_input_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let base = json!({"title": "x", "start_price": 1000, "min_increment": 10,
                      "end_time": in_secs(3600)});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    for (body, why) in [
        (with("start_price", json!(0)), "zero start price"),
        (with("start_price", json!(-5)), "negative start price"),
        (with("min_increment", json!(0)), "zero increment"),
        (
            with("start_price", json!(i64::MAX)),
            "start price above the ceiling",
        ),
        (with("start_price", json!(10.5)), "fractional money"),
        (with("end_time", json!(in_secs(-10))), "end in the past"),
        (with("end_time", json!("tomorrow")), "end not RFC 3339"),
        (with("title", json!("  ")), "blank title"),
        (
            with("max_extensions", json!(100000)),
            "unbounded extensions",
        ),
        (with("max_extensions", json!(-1)), "negative extensions"),
        (with("colour", json!("red")), "unknown field"),
    ] {
        let (status, b) = create(&app, "s", body).await;
        assert_eq!(status, 422, "{why}: {b}");
        assert_eq!(b["code"], "VALIDATION_FAILED", "{why}: {b}");
    }
    let token = app.admission("s", "auction-day");
    // An amount that does not fit in i64 at all.
    let resp = app
        .client
        .post(app.url("/api/auctions"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "k0")
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"event":"auction-day","title":"x","start_price":100000000000000000000,"min_increment":1,"end_time":"{}"}}"#,
            in_secs(3600)
        ))
        .send()
        .await
        .unwrap();
    let (status, b) = json(resp).await;
    assert_eq!(
        (status, b["code"].as_str()),
        (422, Some("VALIDATION_FAILED")),
        "{b}"
    );
    let resp = app
        .client
        .post(app.url("/api/auctions"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "k1")
        .header("content-type", "application/json")
        .body("{\"title\": ")
        .send()
        .await
        .unwrap();
    let (status, b) = json(resp).await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["code"], "MALFORMED_JSON");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM auctions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    app.stop().await;
}

#[tokio::test]
async fn two_hundred_concurrent_increasing_bids_cold() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, false, 3600).await;
    let results = fire_increasing(&app, &auction).await;
    assert_highest_wins(&app, &auction, &results).await;
    app.stop().await;
}

#[tokio::test]
async fn first_bid_may_equal_start_price_later_ones_need_the_increment() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, false, 3600).await;
    let (s, b) = bid(&app, &auction, "a", "k1", json!(999)).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("BID_TOO_LOW")), "{b}");
    assert_eq!(b["current_price"], 1000);
    assert_eq!(b["min_next_bid"], 1000);
    let (s, b) = bid(&app, &auction, "a", "k2", json!(1000)).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["current_price"], 1000);
    assert_eq!(
        b["leader"],
        app.state.auctions.handles.bidder(&auction, "a")
    );
    assert_eq!(b["you_lead"], true);
    let (s, b) = bid(&app, &auction, "b", "k1", json!(1009)).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("BID_TOO_LOW")), "{b}");
    assert_eq!(b["min_next_bid"], 1010);
    let (s, b) = bid(&app, &auction, "b", "k2", json!(1010)).await;
    assert_eq!(s, 201, "{b}");
    app.stop().await;
}

#[tokio::test]
async fn a_bid_in_the_last_two_minutes_extends_the_end_up_to_the_cap() {
    let app = TestApp::spawn().await;
    let (status, body) = create(
        &app,
        "seller",
        json!({"title": "Lamp", "start_price": 100, "min_increment": 1,
               "end_time": in_secs(3600), "max_extensions": 2}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let auction = body["id"].as_str().unwrap().to_owned();
    // Far from the end: no extension.
    let (s, b) = bid(&app, &auction, "a", "k1", json!(100)).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["extended"], false);
    assert_eq!(b["end_time"], body["end_time"]);
    for (i, key) in ["k2", "k3", "k4"].iter().enumerate() {
        // 30 s before the end (set with the database clock).
        sqlx::query("UPDATE auctions SET end_time = clock_timestamp() + interval '30 seconds' WHERE id = $1")
            .bind(&auction)
            .execute(&app.pool)
            .await
            .unwrap();
        let (s, b) = bid(&app, &auction, "b", key, json!(101 + i as i64)).await;
        assert_eq!(s, 201, "{b}");
        let (ext, remaining): (i32, f64) = sqlx::query_as(
            "SELECT extensions, extract(epoch FROM end_time - clock_timestamp())::float8
               FROM auctions WHERE id = $1",
        )
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if i < 2 {
            assert_eq!(b["extended"], true, "{b}");
            assert_eq!(ext, i as i32 + 1);
            assert!(remaining > 110.0 && remaining <= 120.0, "{remaining}");
            let placed =
                chrono::DateTime::parse_from_rfc3339(b["placed_at"].as_str().unwrap()).unwrap();
            let end =
                chrono::DateTime::parse_from_rfc3339(b["end_time"].as_str().unwrap()).unwrap();
            assert_eq!((end - placed).num_seconds(), 120, "{b}");
        } else {
            // The cap is reached: the close cannot be stalled forever.
            assert_eq!(b["extended"], false, "{b}");
            assert_eq!(ext, 2);
            assert!(remaining <= 30.0, "{remaining}");
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn a_bid_after_the_end_is_refused_before_the_closer_runs() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, false, 3600).await;
    let (s, _) = bid(&app, &auction, "a", "k1", json!(1000)).await;
    assert_eq!(s, 201);
    sqlx::query(
        "UPDATE auctions SET end_time = clock_timestamp() - interval '1 millisecond' WHERE id = $1",
    )
    .bind(&auction)
    .execute(&app.pool)
    .await
    .unwrap();
    let (s, b) = bid(&app, &auction, "b", "k1", json!(5000)).await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["code"], "AUCTION_CLOSED");
    assert_eq!(b["current_price"], 1000);
    let (status, price, bids): (String, i64, i64) = sqlx::query_as(
        "SELECT status, current_price, (SELECT count(*) FROM bids WHERE auction_id = a.id)
           FROM auctions a WHERE id = $1",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), price, bids),
        ("OPEN", 1000, 1),
        "the closer has not run"
    );
    app.stop().await;
}

#[tokio::test]
async fn concurrent_identical_retries_make_one_bid_201_then_200s_with_the_same_body() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, false, 3600).await;
    let results =
        join_all((0..50).map(|_| bid(&app, &auction, "retrier", "same-key", json!(1500)))).await;
    let created: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    let replayed: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(created.len(), 1, "{results:?}");
    assert_eq!(replayed.len(), 49, "{results:?}");
    assert!(
        replayed.iter().all(|b| *b == created[0]),
        "replays carry the same body"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM bids WHERE auction_id = $1")
        .bind(&auction)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // Later, after being outbid, the retry still replays the original result.
    let (s, _) = bid(&app, &auction, "other", "k", json!(2000)).await;
    assert_eq!(s, 201);
    let (s, b) = bid(&app, &auction, "retrier", "same-key", json!(1500)).await;
    assert_eq!(s, 200);
    assert_eq!(&b, created[0]);
    // Same key, different amount: refused, nothing changes.
    let (s, b) = bid(&app, &auction, "retrier", "same-key", json!(2500)).await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["code"], "IDEMPOTENCY_KEY_REUSED");
    // The key is scoped to the bidder: someone else may use the same string.
    let (s, _) = bid(&app, &auction, "third", "same-key", json!(2500)).await;
    assert_eq!(s, 201);
    app.stop().await;
}

#[tokio::test]
async fn bad_bids_are_refused_and_change_nothing() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, false, 3600).await;
    for (amount, why) in [
        (json!(0), "zero"),
        (json!(-10), "negative"),
        (json!(i64::MAX), "above the money ceiling"),
        (json!("1000"), "a string"),
        (json!(1000.5), "fractional"),
    ] {
        let (s, b) = bid(&app, &auction, "a", &format!("k-{}", why.len()), amount).await;
        assert_eq!(s, 422, "{why}: {b}");
        assert_eq!(b["code"], "VALIDATION_FAILED", "{why}: {b}");
    }
    let (s, b) = bid(&app, "no-such-auction", "a", "k", json!(1000)).await;
    assert_eq!(s, 404, "{b}");
    let token = app.admission("a", "auction-day");
    let url = app.url(&format!("/api/auctions/{auction}/bids"));
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .header("Idempotency-Key", "k")
        .header("content-type", "application/json")
        .body("{amount: 1000")
        .send()
        .await
        .unwrap();
    let (s, b) = json(resp).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (400, Some("MALFORMED_JSON")),
        "{b}"
    );
    // An amount that overflows i64.
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .header("Idempotency-Key", "k-overflow")
        .header("content-type", "application/json")
        .body(r#"{"amount": 100000000000000000000}"#)
        .send()
        .await
        .unwrap();
    let (s, b) = json(resp).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("VALIDATION_FAILED")),
        "{b}"
    );
    // Missing Idempotency-Key.
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .unwrap();
    let (s, b) = json(resp).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (400, Some("IDEMPOTENCY_KEY_MISSING")),
        "{b}"
    );
    // No admission token.
    let resp = app
        .client
        .post(&url)
        .header("Idempotency-Key", "k")
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // The seller cannot bid on their own auction.
    let (s, b) = bid(&app, &auction, "seller", "k", json!(5000)).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (403, Some("SELLER_CANNOT_BID")),
        "{b}"
    );
    let (n, price): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM bids), current_price FROM auctions WHERE id = $1",
    )
    .bind(&auction)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((n, price), (0, 1000));
    app.stop().await;
}

#[tokio::test]
async fn bids_are_rate_limited_per_bidder() {
    // Burst 5 (the default), then one bid a second rather than the default 5: the late bid
    // below must find the bucket still empty even on a loaded machine (at 5/s a 200 ms stall
    // after the burst refilled it).
    let app = TestApp::spawn_with(|c| c.auctions.bids_per_second = 1).await;
    let auction = create_ok(&app, false, 3600).await;
    let results = join_all((0..30).map(|i| {
        let (app, auction) = (&app, &auction);
        async move {
            bid(
                app,
                auction,
                "spammer",
                &format!("k{i}"),
                json!(1000 + i * 10),
            )
            .await
        }
    }))
    .await;
    let limited = results.iter().filter(|(s, _)| *s == 429).count();
    // Burst 5, then 1/s: however slowly the 30 arrive within a couple of seconds, most are
    // refused.
    assert!(limited >= 10, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|(s, _)| *s == 429)
            .all(|(_, b)| b["code"] == "RATE_LIMITED")
    );
    // Retry-After is set.
    let token = app.admission("spammer", "auction-day");
    let resp = app
        .client
        .post(app.url(&format!("/api/auctions/{auction}/bids")))
        .bearer_auth(token)
        .header("Idempotency-Key", "late")
        .json(&json!({"amount": 9000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    // Another bidder is not affected.
    let (s, b) = bid(&app, &auction, "calm", "k", json!(9000)).await;
    assert_eq!(s, 201, "{b}");
    app.stop().await;
}

#[tokio::test]
async fn racing_closers_close_each_auction_once_with_one_outbox_event() {
    let app = TestApp::spawn_with(|c| c.auctions.closer_batch = 7).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        let id = create_ok(&app, false, 3600).await;
        if i % 2 == 0 {
            let (s, _) = bid(&app, &id, &format!("b{i}"), "k", json!(1000 + i)).await;
            assert_eq!(s, 201);
        }
        ids.push(id);
    }
    // One auction not yet due must stay open.
    let open = create_ok(&app, false, 3600).await;
    sqlx::query(
        "UPDATE auctions SET end_time = clock_timestamp() - interval '1 second' WHERE id <> $1",
    )
    .bind(&open)
    .execute(&app.pool)
    .await
    .unwrap();
    let runs = join_all((0..4).map(|_| closer::close_due(&app.state.auctions))).await;
    let mut closed: Vec<String> = runs
        .into_iter()
        .flat_map(|r| r.expect("closer"))
        .map(|c| c.id)
        .collect();
    closed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(
        closed, want,
        "each due auction closed by exactly one closer"
    );
    let again = closer::close_due(&app.state.auctions).await.unwrap();
    assert!(again.is_empty(), "rerunning closes nothing");
    let rows: Vec<(String, String, i64, Option<String>, i64)> = sqlx::query_as(
        "SELECT a.id, a.status, (SELECT count(*) FROM outbox o WHERE o.aggregate_id = a.id
                                   AND o.topic = 'auction.closed'),
                a.leader_id, a.current_price
           FROM auctions a ORDER BY a.id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    for (id, status, events, _, _) in &rows {
        if *id == open {
            assert_eq!((status.as_str(), *events), ("OPEN", 0));
        } else {
            assert_eq!((status.as_str(), *events), ("CLOSED", 1), "{id}");
        }
    }
    // The event names the winner and the price.
    let (id, _, _, leader, price) = rows.iter().find(|r| r.3.is_some()).unwrap().clone();
    let payload: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE aggregate_id = $1 AND topic = 'auction.closed'",
    )
    .bind(&id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(payload["winner"].as_str(), leader.as_deref());
    assert_eq!(payload["price"], price);
    assert_eq!(payload["sold"], true);
    // A closed auction takes no bid.
    let (s, b) = bid(&app, &id, "late", "k", json!(99999)).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("AUCTION_CLOSED")));
    app.stop().await;
}

#[tokio::test]
async fn create_is_idempotent_per_seller_key() {
    let app = TestApp::spawn().await;
    crate::helpers::ensure_event(&app, "auction-day").await;
    let token = app.admission("seller-9", "auction-day");
    let body = json!({"event": "auction-day", "title": "Vase", "start_price": 500,
                      "min_increment": 5, "end_time": in_secs(3600)});
    let post = |body: Value| {
        app.client
            .post(app.url("/api/auctions"))
            .bearer_auth(&token)
            .header("Idempotency-Key", "create-1")
            .json(&body)
            .send()
    };
    let (s1, b1) = json(post(body.clone()).await.unwrap()).await;
    assert_eq!(s1, 201, "{b1}");
    let (s2, b2) = json(post(body.clone()).await.unwrap()).await;
    assert_eq!(s2, 200);
    assert_eq!(b1, b2, "the replay carries the first body");
    let mut other = body.clone();
    other["start_price"] = json!(600);
    let (s3, b3) = json(post(other).await.unwrap()).await;
    assert_eq!(
        (s3, b3["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED")),
        "{b3}"
    );
    let resp = app
        .client
        .post(app.url("/api/auctions"))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (s4, b4) = json(resp).await;
    assert_eq!(
        (s4, b4["code"].as_str()),
        (400, Some("IDEMPOTENCY_KEY_MISSING"))
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM auctions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    app.stop().await;
}
