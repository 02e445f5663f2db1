//! Live prices over WebSocket: snapshot, coalesced updates, the final close; one Redis
//! subscription per auction per node shared by 1,000 clients, one of which never reads.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failure must panic the test"
)]

use crate::auctions::{bid, create_ok, spawn_unlimited};
use crate::helpers::{TestApp, json, open_auction};
use booking::auctions::closer;
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(app: &TestApp, auction: &str, viewer: &str) -> Ws {
    let mut req = format!("ws://127.0.0.1:{}/ws/auctions/{auction}", app.port)
        .into_client_request()
        .unwrap();
    let token = app.admission(viewer, "auction-day");
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("ws connect");
    ws
}

/// Reads text messages until the server closes; returns them with their arrival times.
async fn read_all(ws: &mut Ws, limit: Duration) -> Vec<(Instant, Value)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                out.push((Instant::now(), serde_json::from_str(t.as_str()).unwrap()))
            }
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => return out,
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!(
                "no close within {limit:?}; got {:?}",
                out.iter().map(|m| &m.1).collect::<Vec<_>>()
            ),
        }
    }
}

async fn end_and_close(app: &TestApp, auction: &str) {
    sqlx::query(
        "UPDATE auctions SET end_time = clock_timestamp() - interval '1 millisecond' WHERE id = $1",
    )
    .bind(auction)
    .execute(&app.pool)
    .await
    .unwrap();
    let closed = closer::close_due(&app.state.auctions).await.unwrap();
    assert_eq!(closed.len(), 1);
}

async fn subscribers(app: &TestApp, auction: &str) -> i64 {
    let mut conn = app.state.redis.conn().await.unwrap();
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(app.state.auctions.live.channel(auction))
        .query_async::<Vec<redis::Value>>(&mut conn)
        .await
        .map(|v| {
            (
                redis::from_redis_value(v[0].clone()).unwrap(),
                redis::from_redis_value(v[1].clone()).unwrap(),
            )
        })
        .unwrap();
    n
}

#[tokio::test]
async fn a_viewer_sees_coalesced_prices_the_final_price_and_the_close() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, false, 3600).await;
    let mut ws = connect(&app, &auction, "viewer").await;
    let first = ws.next().await.unwrap().unwrap();
    let snap: Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
    assert_eq!(snap["type"], "snapshot");
    assert_eq!(snap["current_price"], 1000);
    // Wait until this node's subscription is live (it is set up asynchronously).
    let t0 = Instant::now();
    while subscribers(&app, &auction).await < 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "never subscribed");
        tokio::task::yield_now().await;
    }
    // Read while bidding, so arrival times are real.
    let read_from = Instant::now();
    let reader = tokio::spawn(async move { read_all(&mut ws, Duration::from_secs(20)).await });
    // 100 bids over about a second.
    for i in 1..=100 {
        let (s, _) = bid(&app, &auction, &format!("b{i}"), "k", json!(1000 + i * 10)).await;
        assert_eq!(s, 201);
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    end_and_close(&app, &auction).await;
    let msgs = reader.await.unwrap();
    let (_, last) = msgs.last().expect("messages");
    assert_eq!(last["type"], "closed", "{msgs:?}");
    assert_eq!(last["final_price"], 2000);
    assert_eq!(
        last["winner"],
        app.state.auctions.handles.bidder(&auction, "b100")
    );
    let prices: Vec<&(Instant, Value)> =
        msgs.iter().filter(|(_, m)| m["type"] == "price").collect();
    assert!(!prices.is_empty());
    assert!(
        prices.len() < 40,
        "coalesced: {} messages for 100 bids",
        prices.len()
    );
    assert!(
        prices
            .windows(2)
            .all(|w| w[0].1["current_price"].as_i64() < w[1].1["current_price"].as_i64()),
        "prices only rise"
    );
    // At most one update per 150 ms: counted over the whole run (arrival gaps alone would
    // be at the mercy of the test's own scheduling).
    let span = msgs.last().unwrap().0 - read_from;
    let bound = (span.as_millis() / 150) as usize + 2;
    assert!(
        prices.len() <= bound,
        "{} price messages in {span:?}",
        prices.len()
    );
    // A viewer arriving after the close gets the snapshot and the close at once.
    let mut late = connect(&app, &auction, "late").await;
    let msgs = read_all(&mut late, Duration::from_secs(5)).await;
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0].1["status"], "CLOSED");
    assert_eq!(msgs[1].1["type"], "closed");
    assert_eq!(msgs[1].1["final_price"], 2000);
    app.stop().await;
}

#[tokio::test]
async fn websocket_needs_a_token_header_cookie_or_query() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, false, 3600).await;
    let url = format!("ws://127.0.0.1:{}/ws/auctions/{auction}", app.port);
    let err = tokio_tungstenite::connect_async(url.clone())
        .await
        .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 401),
        other => panic!("{other:?}"),
    }
    let bad = format!("{url}?token=forged.token.value");
    let err = tokio_tungstenite::connect_async(bad).await.unwrap_err();
    assert!(matches!(err, tokio_tungstenite::tungstenite::Error::Http(ref r) if r.status() == 401));
    let token = app.admission("browser", "auction-day");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}?token={token}"))
        .await
        .expect("query token accepted");
    let snap: Value =
        serde_json::from_str(ws.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(snap["type"], "snapshot");
    ws.close(None).await.unwrap();
    let unknown = format!("ws://127.0.0.1:{}/ws/auctions/nope?token={token}", app.port);
    let err = tokio_tungstenite::connect_async(unknown).await.unwrap_err();
    assert!(matches!(err, tokio_tungstenite::tungstenite::Error::Http(ref r) if r.status() == 404));
    app.stop().await;
}

#[tokio::test]
async fn a_thousand_viewers_and_a_slow_one_all_see_the_close() {
    let app = spawn_unlimited().await;
    let auction = create_ok(&app, true, 3600).await;
    // The slow viewer connects first and never reads anything.
    let slow = connect(&app, &auction, "slow").await;
    let mut viewers = Vec::new();
    for chunk in (0..1000).collect::<Vec<_>>().chunks(100) {
        let batch = futures::future::join_all(chunk.iter().map(|i| {
            let (app, auction) = (&app, &auction);
            async move { connect(app, auction, &format!("v{i}")).await }
        }))
        .await;
        viewers.extend(batch);
    }
    // One Redis subscription for the whole node, one topic in the hub.
    let t0 = Instant::now();
    while subscribers(&app, &auction).await < 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "never subscribed");
        tokio::task::yield_now().await;
    }
    assert_eq!(subscribers(&app, &auction).await, 1);
    assert_eq!(app.state.auctions.live.topics(), 1);
    let readers: Vec<_> = viewers
        .into_iter()
        .map(|mut ws| tokio::spawn(async move { read_all(&mut ws, Duration::from_secs(30)).await }))
        .collect();
    for i in 1..=50 {
        let (s, b) = bid(&app, &auction, &format!("b{i}"), "k", json!(1000 + i * 10)).await;
        assert_eq!(s, 201, "{b}");
    }
    // Close the hot auction: freeze in Redis, record, publish.
    let k = booking::auctions::hot::keys(&app.state.redis, &auction);
    let mut conn = app.state.redis.conn().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&k.state)
        .arg("end")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE auctions SET end_time = clock_timestamp() - interval '1 second' WHERE id = $1",
    )
    .bind(&auction)
    .execute(&app.pool)
    .await
    .unwrap();
    let closed = closer::close_due(&app.state.auctions).await.unwrap();
    assert_eq!(closed.len(), 1);
    let started = Instant::now();
    for r in readers {
        let msgs = r.await.unwrap();
        let last = &msgs.last().expect("messages").1;
        assert_eq!(last["type"], "closed", "{msgs:?}");
        assert_eq!(last["final_price"], 1500);
        assert_eq!(
            last["winner"],
            app.state.auctions.handles.bidder(&auction, "b50")
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(slow);
    app.stop().await;
}

/// Ends an auction now (Redis end as well for a hot one) and runs the closer.
async fn end_now_and_close(app: &TestApp, auction: &str, hot: bool) {
    if hot {
        let k = booking::auctions::hot::keys(&app.state.redis, auction);
        let mut conn = app.state.redis.conn().await.unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&k.state)
            .arg("end")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    end_and_close(app, auction).await;
}

#[tokio::test]
async fn other_fans_see_the_leader_as_a_stable_handle_never_as_an_account_id() {
    const LEADER: &str = "leader@example.com";
    const RIVAL: &str = "rival@example.com";
    const SELLER: &str = "seller@example.com";
    let app = spawn_unlimited().await;
    let mut handles = Vec::new();
    for hot in [false, true] {
        let auction = open_auction(&app, SELLER, hot, 3600).await;
        let mut rival_ws = connect(&app, &auction, RIVAL).await;
        let mut leader_ws = connect(&app, &auction, LEADER).await;
        for ws in [&mut rival_ws, &mut leader_ws] {
            let snap = ws.next().await.unwrap().unwrap();
            assert!(!snap.to_text().unwrap().contains("example.com"), "{snap}");
        }
        let t0 = Instant::now();
        while subscribers(&app, &auction).await < 1 {
            assert!(t0.elapsed() < Duration::from_secs(5), "never subscribed");
            tokio::task::yield_now().await;
        }

        let (s, placed) = bid(&app, &auction, LEADER, "k1", json!(1500)).await;
        assert_eq!(s, 201, "{placed}");
        let handle = placed["leader"].as_str().unwrap().to_owned();
        assert!(
            handle.starts_with("bidder-") && handle.len() == 15,
            "{placed}"
        );
        assert_eq!(
            (&placed["bidder"], &placed["you_lead"]),
            (&json!(handle), &json!(true))
        );
        // A retry replays the stored answer: the same body, still no account id.
        let (s, replay) = bid(&app, &auction, LEADER, "k1", json!(1500)).await;
        assert_eq!((s, &replay), (200, &placed));

        // The rival's view, refusal and (below) live frames name the handle, never the account.
        let rival = app.admission(RIVAL, "auction-day");
        for _ in 0..2 {
            let resp = app.get(&format!("/api/auctions/{auction}"), &rival).await;
            let text = resp.text().await.unwrap();
            assert!(!text.contains(LEADER) && !text.contains(SELLER), "{text}");
            let view: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                (&view["leader"], &view["you_lead"]),
                (&json!(handle), &json!(false))
            );
            assert!(
                view["seller"].as_str().unwrap().starts_with("seller-"),
                "{view}"
            );
            assert_eq!(view["you_sell"], false);

            let resp = app
                .client
                .post(app.url(&format!("/api/auctions/{auction}/bids")))
                .bearer_auth(&rival)
                .header("Idempotency-Key", "low")
                .json(&json!({"amount": 1200}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 409);
            let text = resp.text().await.unwrap();
            assert!(!text.contains(LEADER), "{text}");
            let low: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(low["code"], "BID_TOO_LOW");
            assert_eq!(
                (&low["leader"], &low["you_lead"]),
                (&json!(handle), &json!(false))
            );
        }
        // The leader sees that it is them.
        let leader = app.admission(LEADER, "auction-day");
        let (_, view) = json(app.get(&format!("/api/auctions/{auction}"), &leader).await).await;
        assert_eq!(
            (&view["leader"], &view["you_lead"]),
            (&json!(handle), &json!(true))
        );

        // Live frames: each client sees the price under the handle, the leader as theirs.
        for (ws, you) in [(&mut rival_ws, false), (&mut leader_ws, true)] {
            let price = loop {
                let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
                    .await
                    .expect("a price frame within 10 s")
                    .unwrap()
                    .unwrap();
                let text = m.to_text().unwrap();
                assert!(!text.contains("example.com"), "{text}");
                let v: Value = serde_json::from_str(text).unwrap();
                if v["type"] == "price" && v["current_price"] == 1500 {
                    break v;
                }
            };
            assert_eq!(
                (&price["leader"], &price["you_lead"]),
                (&json!(handle), &json!(you))
            );
        }

        end_now_and_close(&app, &auction, hot).await;
        let (s, closed) = bid(&app, &auction, RIVAL, "late", json!(9000)).await;
        assert_eq!(
            (s, closed["code"].as_str()),
            (409, Some("AUCTION_CLOSED")),
            "{closed}"
        );
        assert!(!closed.to_string().contains(LEADER), "{closed}");
        assert_eq!(
            (&closed["leader"], &closed["you_lead"]),
            (&json!(handle), &json!(false))
        );

        for (ws, you) in [(&mut rival_ws, false), (&mut leader_ws, true)] {
            let msgs = read_all(ws, Duration::from_secs(20)).await;
            for (_, m) in &msgs {
                assert!(!m.to_string().contains("example.com"), "{m}");
            }
            let last = &msgs.last().expect("the closed frame").1;
            assert_eq!(last["type"], "closed", "{msgs:?}");
            assert_eq!(
                (&last["winner"], &last["you_won"]),
                (&json!(handle), &json!(you))
            );
        }
        handles.push(handle);
    }
    // Stable within an auction, unlinkable across auctions.
    assert_ne!(handles[0], handles[1]);
    app.stop().await;
}

/// Connects `viewer` to `auction` with a token of `event` valid `ttl_s` more seconds.
async fn connect_for(app: &TestApp, auction: &str, viewer: &str, event: &str, ttl_s: u64) -> Ws {
    let now = chrono::Utc::now().timestamp();
    let (token, _) = app
        .tokens()
        .mint(viewer, &format!("sess-{viewer}"), event, now, ttl_s)
        .unwrap();
    let url = format!(
        "ws://127.0.0.1:{}/ws/auctions/{auction}?token={token}",
        app.port
    );
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// Reads until the server closes; returns the close code and when (unix ms) it arrived.
async fn close_of(ws: &mut Ws, limit: Duration) -> (u16, i64) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => {
                let code = frame.map(|f| u16::from(f.code)).unwrap_or(0);
                return (code, chrono::Utc::now().timestamp_millis());
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("no close frame within {limit:?}: {other:?}"),
        }
    }
}

/// The socket ends with its admission (issue 41, item 4), with the close code the client
/// reconnects on; before, it lived until the auction closed.
#[tokio::test]
async fn a_socket_closes_when_its_admission_ends() {
    let app = TestApp::spawn().await;
    let auction = create_ok(&app, false, 3600).await;
    let mut ws = connect_for(&app, &auction, "brief", "auction-day", 2).await;
    let exp_ms = (chrono::Utc::now().timestamp() + 2) * 1000;
    let (code, at) = close_of(&mut ws, Duration::from_secs(30)).await;
    assert_eq!(
        code,
        booking::auctions::live::ws::ADMISSION_ENDED,
        "close code"
    );
    // Never before the admission's end (the token's `exp`, whole seconds).
    assert!(
        at >= exp_ms - 1000,
        "closed at {at}, admission until {exp_ms}"
    );
    // The auction is still open: the socket ended for the admission, not the auction.
    let fresh = app.admission("brief", "auction-day");
    let (s, v) = json(app.get(&format!("/api/auctions/{auction}"), &fresh).await).await;
    assert_eq!((s, v["status"].clone()), (200, json!("OPEN")), "{v}");
    app.stop().await;
}

/// A fan whose checkout (a live hold in the auction's event) extends the admission keeps the
/// socket until that checkout ends, as the gateway keeps refreshing the token until then.
#[tokio::test]
async fn a_socket_stays_while_the_fans_checkout_extends_the_admission() {
    let app = TestApp::spawn().await;
    crate::events::create_event(&app, &crate::events::small_event("ev", 2, 5, 10, 1)).await;
    let end = (chrono::Utc::now() + chrono::Duration::seconds(3600)).to_rfc3339();
    let (s, created) = crate::helpers::create_auction(
        &app,
        "ev",
        "seller",
        json!({"title": "Signed ball", "start_price": 1000, "min_increment": 10,
               "end_time": end}),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let auction = created["id"].as_str().unwrap().to_owned();
    // The fan holds a seat in the same event; the hold ends in 4 s (its event's hold TTL is
    // at least 10 s, so the test moves the end closer).
    let token = app.admission("fan", "ev");
    let (s, hold) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-1"]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 201, "{hold}");
    let hold_end_ms: i64 = sqlx::query_scalar(
        "UPDATE holds SET expires_at = clock_timestamp() + interval '4 seconds'
          WHERE id = $1
         RETURNING (extract(epoch FROM expires_at) * 1000)::bigint",
    )
    .bind(hold["hold_id"].as_str().unwrap())
    .fetch_one(&app.pool)
    .await
    .unwrap();
    // A token of 1 s: the gateway would have refreshed it until the hold's end.
    let mut ws = connect_for(&app, &auction, "fan", "ev", 1).await;
    let (code, at) = close_of(&mut ws, Duration::from_secs(30)).await;
    assert_eq!(
        code,
        booking::auctions::live::ws::ADMISSION_ENDED,
        "close code"
    );
    assert!(
        at >= hold_end_ms,
        "closed at {at}, before the checkout's end {hold_end_ms}"
    );
    app.stop().await;
}
