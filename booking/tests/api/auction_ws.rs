//! Live prices over WebSocket: snapshot, coalesced updates, the final close; one Redis
//! subscription per auction per node shared by 1,000 clients, one of which never reads.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failure must panic the test"
)]

use crate::auctions::{bid, create_ok, spawn_unlimited};
use crate::helpers::TestApp;
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
    let closed = closer::close_due(&app.state).await.unwrap();
    assert_eq!(closed.len(), 1);
}

async fn subscribers(app: &TestApp, auction: &str) -> i64 {
    let mut conn = app.state.redis().await.unwrap();
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
    assert_eq!(last["winner"], "b100");
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
    let k = booking::auctions::hot::keys(&app.state, &auction);
    let mut conn = app.state.redis().await.unwrap();
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
    let closed = closer::close_due(&app.state).await.unwrap();
    assert_eq!(closed.len(), 1);
    let started = Instant::now();
    for r in readers {
        let msgs = r.await.unwrap();
        let last = &msgs.last().expect("messages").1;
        assert_eq!(last["type"], "closed", "{msgs:?}");
        assert_eq!(last["final_price"], 1500);
        assert_eq!(last["winner"], "b50");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(slow);
    app.stop().await;
}
