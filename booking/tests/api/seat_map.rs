//! The compact seat map (`/seats/layout` + `/seats/availability`): it decodes to exactly the
//! JSON map after holds, sales, releases and expiries; `ETag`/`304`; one build per change
//! however many fans ask at once; and the size of a 60,000-seat map.

use crate::events::{create_event, small_event};
use crate::helpers::{TestApp, json};
use crate::holds::expire_in_db;
use crate::payments::{PayEnv, expire_order_in_db, pay, seat_order};
use base64::Engine;
use futures::future::join_all;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::Read;

/// Decodes a compact layout and availability into the JSON map's `seats` array.
fn decode(layout: &Value, avail: &Value) -> Vec<Value> {
    assert_eq!(
        avail["layout"], layout["id"],
        "availability of another layout"
    );
    assert_eq!(avail["encoding"], "2bit-base64");
    let bits = base64::engine::general_purpose::STANDARD
        .decode(avail["data"].as_str().expect("data"))
        .expect("base64");
    let tiers = layout["tiers"].as_array().expect("tiers");
    let mut out = Vec::new();
    for sec in layout["sections"].as_array().expect("sections") {
        let name = sec["name"].as_str().expect("section name");
        for row in sec["rows"].as_array().expect("rows") {
            let r = row["row"].as_i64().expect("row");
            for run in row["runs"].as_array().expect("runs") {
                let (first, count) = (
                    run[0].as_i64().expect("run start"),
                    run[1].as_i64().expect("run count"),
                );
                let tier = &tiers[run[2].as_u64().expect("run tier") as usize]["tier"];
                for k in 0..count {
                    let number = first + k;
                    let id = match run.get(3) {
                        Some(ids) => ids[k as usize].as_str().expect("seat id").to_owned(),
                        None => format!("{name}-R{r}-{number}"),
                    };
                    let i = out.len();
                    let status = match (bits[i / 4] >> ((i % 4) * 2)) & 3 {
                        0 => "available",
                        1 => "held",
                        2 => "sold",
                        other => panic!("status code {other}"),
                    };
                    out.push(json!({"seat_id": id, "section": name, "row": r,
                                    "number": number, "tier": tier, "status": status}));
                }
            }
        }
    }
    assert_eq!(avail["seats"].as_u64(), Some(out.len() as u64));
    assert_eq!(layout["seats"].as_u64(), Some(out.len() as u64));
    out
}

async fn get_json(app: &TestApp, path: &str, token: &str) -> Value {
    let (status, v) = json(app.get(path, token).await).await;
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// The compact map decoded, and the JSON map's seats; asserts they are equal.
pub async fn compact_equals_json(app: &TestApp, event: &str) -> Vec<Value> {
    let token = app.admission("viewer", event);
    let layout = get_json(app, &format!("/api/events/{event}/seats/layout"), &token).await;
    let avail = get_json(
        app,
        &format!("/api/events/{event}/seats/availability"),
        &token,
    )
    .await;
    let map = get_json(app, &format!("/api/events/{event}/seats"), &token).await;
    let decoded = decode(&layout, &avail);
    assert_eq!(&Value::Array(decoded.clone()), &map["seats"]);
    decoded
}

fn status_of<'a>(seats: &'a [Value], id: &str) -> &'a str {
    seats
        .iter()
        .find(|s| s["seat_id"] == id)
        .and_then(|s| s["status"].as_str())
        .unwrap_or("missing")
}

async fn hold(app: &TestApp, event: &str, account: &str, seats: &[&str]) -> String {
    let token = app.admission(account, event);
    let path = format!("/api/events/{event}/holds");
    let (status, h) = json(app.post(&path, &token, &json!({ "seats": seats })).await).await;
    assert_eq!(status, 201, "{h}");
    h["hold_id"].as_str().expect("hold id").to_owned()
}

#[tokio::test]
async fn the_compact_map_matches_the_json_map_after_holds_sales_releases_and_expiries() {
    let env = PayEnv::spawn_with(|c| c.booking.seat_map_cache_s = 0, |_| {}).await;
    let app = &env.app;
    let mut event = small_event("cm", 2, 5, 10, 1);
    // Named seats (ids not of the generated pattern) and a tier without a run of its own.
    event["seat_map"]["seats"] = json!([
        {"seat_id": "BOX-1", "section": "S1", "row": 9, "number": 1, "price_tier": "B"},
        {"seat_id": "BOX-2", "section": "S1", "row": 9, "number": 2, "price_tier": "B"}
    ]);
    create_event(app, &event).await;
    let seats = compact_equals_json(app, "cm").await;
    assert_eq!(seats.len(), 22);
    assert!(seats.iter().all(|s| s["status"] == "available"));

    let expiring = hold(app, "cm", "fan1", &["S1-R1-1", "BOX-2"]).await;
    let released = hold(app, "cm", "fan2", &["S2-R2-5"]).await;
    let seats = compact_equals_json(app, "cm").await;
    assert_eq!(status_of(&seats, "BOX-2"), "held");
    assert_eq!(status_of(&seats, "S2-R2-5"), "held");

    // A sale through the sandbox provider.
    let paid = seat_order(app, "cm", false, "buyer", &["S1-R2-3", "S1-R2-4"]).await;
    let (status, v) = pay(app, &paid.token, &paid.order_id, "pay-1", "pm_card_visa").await;
    assert_eq!((status, v["status"].as_str()), (200, Some("PAID")), "{v}");
    let seats = compact_equals_json(app, "cm").await;
    assert_eq!(status_of(&seats, "S1-R2-4"), "sold");

    // A release, an expiry by the clock, and an order that expires unpaid.
    let token = app.admission("fan2", "cm");
    let resp = app
        .client
        .delete(app.url(&format!("/api/holds/{released}")))
        .bearer_auth(&token)
        .send()
        .await
        .expect("release");
    assert_eq!(resp.status(), 204);
    expire_in_db(app, &expiring).await;
    let unpaid = seat_order(app, "cm", false, "late", &["S2-R1-1"]).await;
    let seats = compact_equals_json(app, "cm").await;
    assert_eq!(status_of(&seats, "S2-R1-1"), "held");
    expire_order_in_db(app, &unpaid.order_id).await;
    booking::orders::expire_due(&app.state.orders)
        .await
        .expect("expire orders");
    let seats = compact_equals_json(app, "cm").await;
    let shown: Vec<(&str, &str)> = seats
        .iter()
        .filter(|s| s["status"] != "available")
        .map(|s| {
            (
                s["seat_id"].as_str().unwrap(),
                s["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(shown, vec![("S1-R2-3", "sold"), ("S1-R2-4", "sold")]);
}

async fn fetch(app: &TestApp, path: &str, token: &str, etag: Option<&str>) -> reqwest::Response {
    let mut req = app.client.get(app.url(path)).bearer_auth(token);
    if let Some(tag) = etag {
        req = req.header("If-None-Match", tag);
    }
    req.send().await.expect("request")
}

fn etag(resp: &reqwest::Response) -> String {
    resp.headers()["etag"].to_str().expect("etag").to_owned()
}

fn builds(app: &TestApp, part: &str) -> u64 {
    app.state
        .inventory
        .metrics
        .seat_map_builds
        .with_label_values(&[part])
        .get()
}

#[tokio::test]
async fn an_unchanged_map_is_a_304_and_a_hold_gives_a_new_etag_built_once() {
    // A long cache, so every rebuild below is owed to a change, never to age.
    let app = TestApp::spawn_with(|c| c.booking.seat_map_cache_s = 3600).await;
    create_event(&app, &small_event("tag", 50, 40, 10, 1)).await;
    let token = app.admission("viewer", "tag");
    let (avail, layout) = (
        "/api/events/tag/seats/availability",
        "/api/events/tag/seats/layout",
    );

    let first = fetch(&app, avail, &token, None).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["cache-control"], "private, no-cache");
    let e1 = etag(&first);
    let l1 = fetch(&app, layout, &token, None).await;
    assert_eq!(l1.headers()["cache-control"], "private, max-age=86400");
    let l1 = etag(&l1);

    let again = fetch(&app, avail, &token, Some(&e1)).await;
    assert_eq!(again.status(), 304);
    assert_eq!(etag(&again), e1);
    assert!(again.bytes().await.expect("body").is_empty());
    assert_eq!(builds(&app, "availability"), 1);

    hold(&app, "tag", "fan", &["S1-R2-2"]).await;
    // Hundreds of fans ask at once after the change: one build serves them all.
    let resps = join_all((0..300).map(|_| fetch(&app, avail, &token, Some(&e1)))).await;
    let mut bodies = Vec::new();
    for r in resps {
        assert_eq!(r.status(), 200);
        let tag = etag(&r);
        bodies.push((tag, r.bytes().await.expect("body")));
    }
    assert_eq!(builds(&app, "availability"), 2);
    assert_eq!(builds(&app, "layout"), 1);
    let e2 = bodies[0].0.clone();
    assert_ne!(e2, e1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    let l = get_json(&app, layout, &token).await;
    let a: Value = serde_json::from_slice(&bodies[0].1).expect("json");
    assert_eq!(status_of(&decode(&l, &a), "S1-R2-2"), "held");
    // The new tag is now current; the layout never changed.
    assert_eq!(fetch(&app, avail, &token, Some(&e2)).await.status(), 304);
    let lr = fetch(&app, layout, &token, Some(&l1)).await;
    assert_eq!((lr.status().as_u16(), etag(&lr)), (304, l1));

    // gzip when asked for, decoding to the same body.
    let gz = app
        .client
        .get(app.url(avail))
        .bearer_auth(&token)
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .expect("request");
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(gz.headers()["vary"], "accept-encoding");
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&gz.bytes().await.expect("body")[..])
        .read_to_end(&mut plain)
        .expect("gunzip");
    assert_eq!(plain, bodies[0].1);
    // Other events, and tokens for another event, are refused as on the JSON map.
    let other = app.admission("viewer", "nope");
    let (status, err) = json(app.get("/api/events/nope/seats/layout", &other).await).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("UNKNOWN_EVENT")));
    let (status, err) = json(app.get(avail, &other).await).await;
    assert_eq!((status, err["code"].as_str()), (403, Some("WRONG_EVENT")));
    app.stop().await;
}

#[tokio::test]
async fn hundreds_of_fetches_during_concurrent_holds_see_consistent_maps() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("busy", 10, 20, 10, 1)).await;
    let token = app.admission("viewer", "busy");
    let layout = get_json(&app, "/api/events/busy/seats/layout", &token).await;
    let fetches = join_all((0..300).map(|_| async {
        let r = fetch(&app, "/api/events/busy/seats/availability", &token, None).await;
        assert_eq!(r.status(), 200);
        let tag = etag(&r);
        (tag, r.bytes().await.expect("body"))
    }));
    let holds = join_all((0..60).map(|i| {
        let app = &app;
        async move {
            let seat = format!("S{}-R{}-{}", 1 + i % 2, 1 + i / 20, 1 + i % 20);
            hold(app, "busy", &format!("fan{i}"), &[seat.as_str()]).await
        }
    }));
    let (bodies, _) = tokio::join!(fetches, holds);
    // One body per tag, each a whole map of this layout.
    let mut by_tag: HashMap<String, bytes::Bytes> = HashMap::new();
    for (tag, body) in bodies {
        let seen = by_tag.entry(tag).or_insert_with(|| body.clone());
        assert_eq!(seen, &body);
        let a: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(decode(&layout, &a).len(), 400);
    }
    // After the holds, the map shows every one of them, and equals the JSON map.
    let seats = compact_equals_json(&app, "busy").await;
    assert_eq!(seats.iter().filter(|s| s["status"] == "held").count(), 60);
    app.stop().await;
}

#[tokio::test]
async fn a_sixty_thousand_seat_map_is_compact() {
    let app = TestApp::spawn().await;
    let sections: Vec<Value> = (1..=30)
        .map(|s| {
            json!({"name": format!("S{s}"), "rows": 50, "seats_per_row": 40,
                        "price_tier": if s % 2 == 0 { "A" } else { "B" }})
        })
        .collect();
    let mut event = small_event("big", 1, 1, 10, 1);
    event["seat_map"]["sections"] = Value::Array(sections);
    create_event(&app, &event).await;
    // Scattered holds make the availability as irregular as a sale in progress.
    for i in 0..40 {
        let seat = format!(
            "S{}-R{}-{}",
            1 + i % 30,
            1 + (i * 7) % 50,
            1 + (i * 13) % 40
        );
        hold(&app, "big", &format!("fan{i}"), &[seat.as_str()]).await;
    }
    let token = app.admission("viewer", "big");
    let avail = app.get("/api/events/big/seats/availability", &token).await;
    let avail_bytes = avail.bytes().await.expect("body").len();
    let layout = app.get("/api/events/big/seats/layout", &token).await;
    let layout_bytes = layout.bytes().await.expect("body").len();
    let map = app.get("/api/events/big/seats", &token).await;
    let json_bytes = map.bytes().await.expect("body").len();
    eprintln!(
        "60,000 seats: availability {avail_bytes} B, layout {layout_bytes} B, JSON {json_bytes} B"
    );
    assert!(
        avail_bytes <= 300 * 1024,
        "availability is {avail_bytes} bytes"
    );
    assert!(layout_bytes <= 300 * 1024, "layout is {layout_bytes} bytes");
    assert!(json_bytes > 20 * avail_bytes);
    let seats = compact_equals_json(&app, "big").await;
    assert_eq!(seats.len(), 60_000);
    assert_eq!(seats.iter().filter(|s| s["status"] == "held").count(), 40);
    app.stop().await;
}
