//! Seat holds: the hold statement under real concurrency, reclaiming expired holds, release,
//! the per-account limit, the seat map, the ticket backstop and the order helpers.

use crate::events::{create_event, db_state, small_event};
use crate::helpers::{TestApp, json};
use booking::inventory::holds::{
    HoldStatus, PinnedHold, SellOutcome, pin_hold_tx, release_hold_tx, sell_hold_tx,
};
use futures::future::join_all;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};

pub async fn hold<S: serde::Serialize>(
    app: &TestApp,
    event: &str,
    account: &str,
    seats: &[S],
) -> (u16, Value) {
    let token = app.admission(account, event);
    json(
        app.post(
            &format!("/api/events/{event}/holds"),
            &token,
            &json!({ "seats": seats }),
        )
        .await,
    )
    .await
}

pub async fn seats_of(app: &TestApp, hold_id: &str) -> BTreeSet<String> {
    sqlx::query_scalar::<_, String>(
        "SELECT seat_id FROM seats WHERE hold_id = $1 AND status = 'held'",
    )
    .bind(hold_id)
    .fetch_all(&app.pool)
    .await
    .expect("test query")
    .into_iter()
    .collect()
}

/// A pinned hold's seat ids, in its order.
fn seat_ids(pinned: &PinnedHold) -> Vec<&str> {
    pinned.seats.iter().map(|s| s.seat_id.as_str()).collect()
}

pub async fn usage(app: &TestApp, event: &str, account: &str) -> i32 {
    sqlx::query_scalar::<_, i32>(
        "SELECT COALESCE((SELECT tickets FROM account_event_usage WHERE event_id = $1 AND account_id = $2), 0)",
    )
    .bind(event)
    .bind(account)
    .fetch_one(&app.pool)
    .await
    .expect("test query")
}

/// Moves a hold (and its seats) into the past, as if its TTL had run out.
pub async fn expire_in_db(app: &TestApp, hold_id: &str) {
    sqlx::query(
        "UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
    )
    .bind(hold_id)
    .execute(&app.pool)
    .await
    .expect("test query");
    sqlx::query(
        "UPDATE seats SET held_until = clock_timestamp() - interval '1 second' WHERE hold_id = $1 AND status = 'held'",
    )
    .bind(hold_id)
    .execute(&app.pool)
    .await
    .expect("test query");
}

#[tokio::test]
async fn hold_then_release_returns_everything() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 10, 10, 1)).await;
    let (status, h) = hold(&app, "ev", "alice", &["S1-R1-2", "S2-R1-1"]).await;
    assert_eq!(status, 201, "{h}");
    assert_eq!(h["event"], "ev");
    assert_eq!(h["seats"], json!(["S1-R1-2", "S2-R1-1"]));
    assert_eq!(h["total"], 12000 + 8000);
    assert!(h["held_until"].is_string() && h["expires_at"] == h["held_until"]);
    let hold_id = h["hold_id"].as_str().unwrap();
    assert_eq!(
        seats_of(&app, hold_id).await,
        BTreeSet::from(["S1-R1-2".to_owned(), "S2-R1-1".to_owned()])
    );
    assert_eq!(usage(&app, "ev", "alice").await, 2);

    // Someone else's token cannot release it, and learns nothing (404).
    let bob = app.admission("bob", "ev");
    let resp = app
        .client
        .delete(app.url(&format!("/api/holds/{hold_id}")))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(seats_of(&app, hold_id).await.len(), 2);

    let alice = app.admission("alice", "ev");
    for _ in 0..2 {
        // Idempotent: the second release is a no-op 204.
        let resp = app
            .client
            .delete(app.url(&format!("/api/holds/{hold_id}")))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204);
    }
    assert!(seats_of(&app, hold_id).await.is_empty());
    assert_eq!(usage(&app, "ev", "alice").await, 0);
    let status: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(hold_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(status, "released");
    // The seats are free again for anyone.
    let (status, _) = hold(&app, "ev", "bob", &["S1-R1-2"]).await;
    assert_eq!(status, 201);
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("floodgate_booking_holds_total{kind=\"seats\"} 2"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn hundreds_of_overlapping_concurrent_holds_never_share_a_seat() {
    let app = TestApp::spawn().await;
    // 2 sections x 2 rows x 10 seats = 40 seats, fought over by 300 clients.
    create_event(&app, &small_event("hot", 2, 10, 10, 1)).await;
    let mut requests = Vec::new();
    for i in 0..300usize {
        let section = if i % 3 == 0 { "S2" } else { "S1" };
        let row = 1 + (i / 3) % 2;
        let len = 2 + i % 3; // 2..=4 adjacent seats
        let first = 1 + (i * 7) % (11 - len);
        let mut seats: Vec<String> = (first..first + len)
            .map(|n| format!("{section}-R{row}-{n}"))
            .collect();
        // Ask in a random order: the statement must lock in seat order regardless.
        seats.shuffle(&mut rand::rng());
        requests.push((format!("fan-{i}"), seats));
    }
    let results = join_all(requests.iter().map(|(account, seats)| {
        let app = &app;
        async move {
            let refs: Vec<&str> = seats.iter().map(String::as_str).collect();
            (hold(app, "hot", account, &refs).await, seats.clone())
        }
    }))
    .await;

    let mut won: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut all_won = HashSet::new();
    for ((status, body), asked) in &results {
        match status {
            201 => {
                let got: BTreeSet<String> = body["seats"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(got, asked.iter().cloned().collect::<BTreeSet<_>>());
                for s in &got {
                    assert!(all_won.insert(s.clone()), "seat {s} granted twice");
                }
                won.insert(body["hold_id"].as_str().unwrap().to_owned(), got);
            }
            409 => {
                assert_eq!(body["code"], "SEAT_TAKEN", "{body}");
                let lost = body["seats"].as_array().unwrap();
                assert!(!lost.is_empty());
                assert!(
                    lost.iter()
                        .all(|s| asked.contains(&s.as_str().unwrap().to_owned()))
                );
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(!won.is_empty());
    // In the database: each successful hold owns exactly its seats, no other seat is held,
    // and only the successful holds exist.
    for (hold_id, seats) in &won {
        assert_eq!(&seats_of(&app, hold_id).await, seats, "hold {hold_id}");
    }
    let state = db_state(&app.pool).await;
    assert_eq!(state["held"].as_u64().unwrap() as usize, all_won.len());
    assert_eq!(state["holds"].as_u64().unwrap() as usize, won.len());
    assert_eq!(state["usage"].as_u64().unwrap() as usize, all_won.len());
    let (status, ev) = json(app.admin_get("/admin/events/hot").await).await;
    assert_eq!(status, 200);
    assert_eq!(ev["held"].as_u64().unwrap() as usize, all_won.len());
    // Seats are locked in seat order by every statement that waits for them: no cycles.
    assert_eq!(
        app.stop_counting_deadlocks().await,
        0,
        "deadlocks among seat holds"
    );
}

#[tokio::test]
async fn an_expired_hold_is_taken_by_the_next_request_without_the_sweeper() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 10, 10, 1)).await;
    let (status, first) = hold(&app, "ev", "early", &["S1-R1-1", "S1-R1-2"]).await;
    assert_eq!(status, 201);
    let first_id = first["hold_id"].as_str().unwrap().to_owned();
    // Not expired yet: taken.
    let (status, err) = hold(&app, "ev", "late", &["S1-R1-2", "S1-R1-3"]).await;
    assert_eq!((status, err["seats"].clone()), (409, json!(["S1-R1-2"])));

    expire_in_db(&app, &first_id).await;
    let (status, second) = hold(&app, "ev", "late", &["S1-R1-2", "S1-R1-3"]).await;
    assert_eq!(status, 201, "{second}");
    let second_id = second["hold_id"].as_str().unwrap();
    assert_eq!(
        seats_of(&app, second_id).await,
        BTreeSet::from(["S1-R1-2".to_owned(), "S1-R1-3".to_owned()])
    );
    // The reclaimed hold was ended exactly once, in the same transaction: its other seat is
    // free, its tickets no longer count.
    let status: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = $1")
        .bind(&first_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(status, "expired");
    assert!(seats_of(&app, &first_id).await.is_empty());
    let s1: String = sqlx::query_scalar(
        "SELECT status FROM seats WHERE event_id = 'ev' AND seat_id = 'S1-R1-1'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(s1, "available");
    assert_eq!(usage(&app, "ev", "early").await, 0);
    assert_eq!(usage(&app, "ev", "late").await, 2);
    // Releasing the expired hold now is a harmless no-op.
    let early = app.admission("early", "ev");
    let resp = app
        .client
        .delete(app.url(&format!("/api/holds/{first_id}")))
        .bearer_auth(&early)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(usage(&app, "ev", "early").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn the_per_account_limit_holds_under_concurrent_requests() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("lim", 4, 10, 10, 1)).await;
    // 80 simultaneous single-seat requests from ONE account, limit 4.
    let seats: Vec<String> = (1..=4)
        .flat_map(|r| (1..=10).map(move |n| format!("S1-R{r}-{n}")))
        .chain((1..=4).flat_map(|r| (1..=10).map(move |n| format!("S2-R{r}-{n}"))))
        .collect();
    let results = join_all(
        seats
            .iter()
            .map(|s| hold(&app, "lim", "greedy", std::slice::from_ref(s))),
    )
    .await;
    let ok = results.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(ok, 4);
    for (status, body) in &results {
        if *status != 201 {
            assert_eq!(
                (*status, body["code"].as_str()),
                (409, Some("LIMIT_EXCEEDED")),
                "{body}"
            );
            assert_eq!(body["limit"], 4);
        }
    }
    assert_eq!(usage(&app, "lim", "greedy").await, 4);
    assert_eq!(db_state(&app.pool).await["held"], 4);

    // Two-seat requests from another account: exactly two succeed.
    let pairs: Vec<[String; 2]> = (1..=5)
        .map(|n| [format!("S1-R4-{}", 2 * n - 1), format!("S1-R4-{}", 2 * n)])
        .collect();
    let taken_by_greedy: HashSet<String> =
        sqlx::query_scalar("SELECT seat_id FROM seats WHERE status = 'held'")
            .fetch_all(&app.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let pairs: Vec<_> = pairs
        .into_iter()
        .filter(|p| !p.iter().any(|s| taken_by_greedy.contains(s)))
        .collect();
    assert!(pairs.len() >= 3, "need at least three free pairs");
    let results = join_all(pairs.iter().map(|p| hold(&app, "lim", "pair", &p[..]))).await;
    assert_eq!(results.iter().filter(|(s, _)| *s == 201).count(), 2);
    assert_eq!(usage(&app, "lim", "pair").await, 4);

    // When the account's own holds expire, the limit frees up without waiting for a sweep.
    let mine: Vec<String> = sqlx::query_scalar("SELECT id FROM holds WHERE account_id = 'greedy'")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    for id in &mine {
        expire_in_db(&app, id).await;
    }
    let free: String = sqlx::query_scalar(
        "SELECT seat_id FROM seats WHERE status = 'available' ORDER BY seat_id LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let (status, body) = hold(&app, "lim", "greedy", &[free.as_str()]).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(usage(&app, "lim", "greedy").await, 1);
    app.stop().await;
}

/// The seat hold is one statement with no transaction around it, so every refusal must be
/// decided before anything is written: a request one seat short, over the limit, or racing an
/// identical request leaves no usage, no hold row and no seat behind (the seats it could have
/// taken stay free, an expired hold it would have reclaimed stays as it was).
#[tokio::test]
async fn a_refused_hold_writes_nothing() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 10, 10, 1)).await;
    let (status, h) = hold(&app, "ev", "alice", &["S1-R1-1"]).await;
    assert_eq!(status, 201, "{h}");
    let (status, carol) = hold(&app, "ev", "carol", &["S1-R1-5"]).await;
    assert_eq!(status, 201, "{carol}");
    let carol_hold = carol["hold_id"].as_str().unwrap().to_owned();
    expire_in_db(&app, &carol_hold).await;
    let before = db_state(&app.pool).await;

    // One of three seats is taken: 409 naming it, and the two free ones (one of them
    // reclaimable from carol's expired hold) are not touched.
    let (status, err) = hold(&app, "ev", "bob", &["S1-R1-1", "S1-R1-2", "S1-R1-5"]).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("SEAT_TAKEN")),
        "{err}"
    );
    assert_eq!(err["seats"], json!(["S1-R1-1"]));
    assert_eq!(db_state(&app.pool).await, before);
    assert_eq!(usage(&app, "ev", "bob").await, 0);
    assert_eq!(
        seats_of(&app, &carol_hold).await,
        BTreeSet::from(["S1-R1-5".to_owned()])
    );

    // Over the limit (4 per account) with free seats: nothing written either.
    let five = ["S2-R1-1", "S2-R1-2", "S2-R1-3", "S2-R1-4", "S2-R1-5"];
    let (status, err) = hold(&app, "ev", "bob", &five).await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["code"], "LIMIT_EXCEEDED", "{err}");
    assert_eq!(db_state(&app.pool).await, before);

    // Sixty fans race for the same four seats: one wins, and the usage of the fifty-nine
    // losers is exactly zero.
    let four = ["S2-R2-1", "S2-R2-2", "S2-R2-3", "S2-R2-4"];
    let fans: Vec<String> = (0..60).map(|i| format!("fan-{i}")).collect();
    let results = join_all(fans.iter().map(|f| hold(&app, "ev", f, &four))).await;
    let won: Vec<&String> = fans
        .iter()
        .zip(&results)
        .filter(|(_, (s, _))| *s == 201)
        .map(|(f, _)| f)
        .collect();
    assert_eq!(won.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|(s, v)| *s == 201 || v["code"] == "SEAT_TAKEN")
    );
    let usage_total: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(tickets), 0) FROM account_event_usage
          WHERE event_id = 'ev' AND account_id LIKE 'fan-%'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(usage_total, 4);
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM holds WHERE account_id LIKE 'fan-%'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(holds, 1);
    app.stop().await;
}

#[tokio::test]
async fn holds_before_the_sale_start_are_refused() {
    let app = TestApp::spawn().await;
    let mut body = small_event("later", 1, 5, 10, 1);
    body["sale_start"] = json!("2099-01-01T00:00:00Z");
    create_event(&app, &body).await;
    let before = db_state(&app.pool).await;
    let (status, err) = hold(&app, "later", "fan", &["S1-R1-1"]).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("SALE_NOT_STARTED")),
        "{err}"
    );
    assert!(
        err["sale_start"]
            .as_str()
            .unwrap()
            .starts_with("2099-01-01")
    );
    let token = app.admission("fan", "later");
    let (status, err) = json(
        app.post(
            "/api/events/later/ga-holds",
            &token,
            &json!({"tier": "FLOOR", "quantity": 1}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("SALE_NOT_STARTED"))
    );
    assert_eq!(db_state(&app.pool).await, before);
    app.stop().await;
}

#[tokio::test]
async fn the_seat_map_shows_availability_and_is_cacheable_for_a_second() {
    let app = TestApp::spawn_with(|c| c.booking.seat_map_cache_s = 0).await;
    create_event(&app, &small_event("map", 1, 3, 10, 1)).await;
    let (_, h) = hold(&app, "map", "fan", &["S1-R1-2"]).await;
    let token = app.admission("viewer", "map");
    let resp = app.get("/api/events/map/seats", &token).await;
    assert_eq!(resp.status(), 200);
    let (_, map) = json(resp).await;
    assert_eq!(map["event"], "map");
    let seats = map["seats"].as_array().unwrap();
    assert_eq!(seats.len(), 6);
    assert_eq!(
        seats[0],
        json!({"seat_id": "S1-R1-1", "section": "S1", "row": 1, "number": 1, "tier": "A", "status": "available"})
    );
    assert_eq!(seats[1]["status"], "held");
    // Held but expired shows as available.
    expire_in_db(&app, h["hold_id"].as_str().unwrap()).await;
    let (_, map) = json(app.get("/api/events/map/seats", &token).await).await;
    assert_eq!(map["seats"][1]["status"], "available");
    // Unknown event and wrong-event token.
    let other = app.admission("viewer", "nope");
    let (status, err) = json(app.get("/api/events/nope/seats", &other).await).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("UNKNOWN_EVENT")));
    let (status, err) = json(app.get("/api/events/map/seats", &other).await).await;
    assert_eq!((status, err["code"].as_str()), (403, Some("WRONG_EVENT")));
    app.stop().await;

    // With the default one-second cache: the header says so and the body is shared.
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("map", 1, 3, 10, 1)).await;
    let token = app.admission("viewer", "map");
    let resp = app.get("/api/events/map/seats", &token).await;
    assert_eq!(resp.headers()["cache-control"], "private, max-age=1");
    assert_eq!(resp.headers()["content-type"], "application/json");
    let bodies = join_all((0..50).map(|_| async {
        app.get("/api/events/map/seats", &token)
            .await
            .text()
            .await
            .unwrap()
    }))
    .await;
    assert!(bodies.iter().all(|b| b.contains("\"S2-R1-3\"")));
    app.stop().await;
}

#[tokio::test]
async fn the_database_refuses_a_second_ticket_for_a_seat() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("tix", 1, 2, 10, 1)).await;
    sqlx::query("INSERT INTO tickets (id, event_id, seat_id, order_id, account_id, holder_account) VALUES ('t1', 'tix', 'S1-R1-1', 'o1', 'a', 'a')")
        .execute(&app.pool)
        .await
        .unwrap();
    let err = sqlx::query("INSERT INTO tickets (id, event_id, seat_id, order_id, account_id, holder_account) VALUES ('t2', 'tix', 'S1-R1-1', 'o2', 'b', 'b')")
        .execute(&app.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23505")
    );
    // GA tickets have no seat and are not constrained by it.
    for id in ["g1", "g2"] {
        sqlx::query("INSERT INTO tickets (id, event_id, ga_tier, order_id, account_id, holder_account) VALUES ($1, 'tix', 'FLOOR', 'o3', 'c', 'c')")
            .bind(id)
            .execute(&app.pool)
            .await
            .unwrap();
    }
    // A GA counter cannot go below zero either.
    let err =
        sqlx::query("UPDATE ga_counters SET available = available - 11 WHERE event_id = 'tix'")
            .execute(&app.pool)
            .await
            .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23514")
    );
    app.stop().await;
}

#[tokio::test]
async fn pin_sell_and_release_helpers_for_orders() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ord", 1, 5, 10, 2)).await;
    let (_, h) = hold(&app, "ord", "buyer", &["S1-R1-1", "S2-R1-1"]).await;
    let hold_id = h["hold_id"].as_str().unwrap().to_owned();

    let mut conn = app.pool.acquire().await.unwrap();
    // Not the owner: nothing happens.
    assert!(
        pin_hold_tx(&mut conn, &hold_id, "thief", 900)
            .await
            .unwrap()
            .is_none()
    );
    let pinned = pin_hold_tx(&mut conn, &hold_id, "buyer", 900)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pinned.kind, "seats");
    assert_eq!(pinned.quantity, 2);
    assert_eq!(pinned.total, 20000);
    assert_eq!(seat_ids(&pinned), ["S1-R1-1", "S2-R1-1"]);
    // Pinned twice: no.
    assert!(
        pin_hold_tx(&mut conn, &hold_id, "buyer", 900)
            .await
            .unwrap()
            .is_none()
    );
    // The fan cannot release a hold an order owns.
    let token = app.admission("buyer", "ord");
    let (status, err) = json(
        app.client
            .delete(app.url(&format!("/api/holds/{hold_id}")))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, err["code"].as_str()), (409, Some("HOLD_ORDERED")));
    // The sweeper does not touch ordered holds even when past expiry.
    sqlx::query(
        "UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
    )
    .bind(&hold_id)
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        booking::inventory::sweeper::sweep_all(&app.state.inventory)
            .await
            .unwrap(),
        0
    );

    match sell_hold_tx(&mut conn, &hold_id, "order-1", "buyer")
        .await
        .unwrap()
    {
        SellOutcome::Sold { event_id, tickets } => {
            assert_eq!(event_id, "ord");
            assert_eq!(tickets.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        sell_hold_tx(&mut conn, &hold_id, "order-1", "buyer")
            .await
            .unwrap(),
        SellOutcome::NotOrdered
    );
    let sold: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats WHERE order_id = 'order-1' AND status = 'sold'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(sold, 2);
    assert_eq!(
        usage(&app, "ord", "buyer").await,
        2,
        "sold tickets keep counting"
    );
    // A sold seat cannot be held.
    let (status, _) = hold(&app, "ord", "other", &["S1-R1-1"]).await;
    assert_eq!(status, 409);

    // A pin that ran out and lost a seat to someone else: Lost, nothing changed.
    let (_, h2) = hold(&app, "ord", "slow", &["S1-R1-2", "S1-R1-3"]).await;
    let h2 = h2["hold_id"].as_str().unwrap().to_owned();
    assert!(
        pin_hold_tx(&mut conn, &h2, "slow", 900)
            .await
            .unwrap()
            .is_some()
    );
    sqlx::query(
        "UPDATE seats SET held_until = clock_timestamp() - interval '1 second' WHERE hold_id = $1",
    )
    .bind(&h2)
    .execute(&app.pool)
    .await
    .unwrap();
    let (status, _) = hold(&app, "ord", "fast", &["S1-R1-3"]).await;
    assert_eq!(status, 201);
    let before = db_state(&app.pool).await;
    assert!(matches!(
        sell_hold_tx(&mut conn, &h2, "order-2", "slow")
            .await
            .unwrap(),
        SellOutcome::Lost {
            expected: 2,
            still_held: 1
        }
    ));
    assert_eq!(db_state(&app.pool).await, before);
    // The order expiry job ends it: the remaining seat and the usage come back.
    let released = release_hold_tx(&mut conn, &h2, &[HoldStatus::Ordered], HoldStatus::Expired)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((released.seats_released, released.quantity), (1, 2));
    assert!(
        release_hold_tx(&mut conn, &h2, &[HoldStatus::Ordered], HoldStatus::Expired)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(usage(&app, "ord", "slow").await, 0);

    // GA: pin, sell, and the counters record the sale.
    let (status, g) = json(
        app.post(
            "/api/events/ord/ga-holds",
            &app.admission("ga", "ord"),
            &json!({"tier": "FLOOR", "quantity": 3}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{g}");
    let gid = g["hold_id"].as_str().unwrap();
    let pinned = pin_hold_tx(&mut conn, gid, "ga", 900)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (pinned.ga_tier.as_deref(), pinned.ga_price, pinned.total),
        (Some("FLOOR"), Some(9000), 27000)
    );
    let SellOutcome::Sold { tickets, .. } =
        sell_hold_tx(&mut conn, gid, "order-3", "ga").await.unwrap()
    else {
        panic!()
    };
    assert_eq!(tickets.len(), 3);
    let (available, sold): (i64, i64) = sqlx::query_as(
        "SELECT sum(available)::bigint, sum(sold)::bigint FROM ga_counters WHERE event_id = 'ord'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((available, sold), (7, 3));
    let (_, ev) = json(app.admin_get("/admin/events/ord").await).await;
    assert_eq!(ev["ga_tiers"][0]["sold"], 3);
    assert_eq!(ev["ga_tiers"][0]["held"], 0);
    app.stop().await;
}

/// Migration 0014: a seat's state change (hold, pin, sale, release) must be able to be a HOT
/// update, which it cannot be while any index of `seats` names a column it changes (in its
/// key or its predicate): each such update would write a new entry into every index of the
/// table. Failed before 0014 (`seats_hold_id`, `seats_held_until`).
#[tokio::test]
async fn no_index_of_seats_names_a_column_a_hold_changes() {
    let app = TestApp::spawn().await;
    let defs: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname, indexdef FROM pg_indexes
          WHERE schemaname = current_schema() AND tablename = 'seats'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("read the seat indexes");
    assert!(defs.len() >= 3, "{defs:?}");
    for (name, def) in &defs {
        for column in ["status", "hold_id", "held_until", "order_id"] {
            assert!(
                !def.contains(column),
                "index {name} names {column}, so seat holds cannot be HOT updates: {def}"
            );
        }
    }
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = 'seats'::regclass")
            .fetch_one(&app.pool)
            .await
            .expect("read the seat table's options");
    assert!(
        options
            .unwrap_or_default()
            .iter()
            .any(|o| o.starts_with("fillfactor=")),
        "seats leave no room on their pages for a HOT update's new row version"
    );
    app.stop().await;
}

/// Migration 0014 on a database with live holds: each seat hold gets exactly the seats that
/// still carry its id (not one a later hold reclaimed), and the order path finds them by
/// them; a hold an old process wrote after 0014 during the rollout (no list) gets its seats
/// from migration 0015, which then refuses a seat hold without a list. The database is
/// migrated to 0013, filled the way booking filled it then, and migrated on.
#[tokio::test]
async fn existing_seat_holds_keep_their_seats_through_migrations_0014_and_0015() {
    use sqlx::Executor;
    let (url, _) = crate::helpers::empty_database().await;
    let pool = crate::helpers::small_pool(&url).await;
    booking::platform::db::MIGRATOR
        .run_to(13, &pool)
        .await
        .expect("migrate to 0013");
    // An event with five seats (the fifth for later). `h-live`: active, seats 1 and 2. `h-old`: expired, had seats
    // 3 and 4, seat 4 since reclaimed by `h-new`. `h-gone`: released, no seats. `h-ga`: GA.
    pool.execute(
        "INSERT INTO events (id, name, sale_start, hold_ttl_s, max_tickets_per_account)
              VALUES ('mig', 'x', '2020-01-01', 600, 8);
         INSERT INTO price_tiers VALUES ('mig', 'A', 100);
         INSERT INTO ga_tiers (event_id, tier, price, capacity, shards) VALUES ('mig', 'FLOOR', 50, 10, 1);
         INSERT INTO seats (event_id, seat_id, section, row_no, number, tier, rank)
              SELECT 'mig', 'S1-R1-' || n, 'S1', 1, n, 'A', n FROM generate_series(1, 5) n;
         INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, status, expires_at)
              VALUES ('h-live', 'mig', 'ann', 'seats', NULL, 2, 'active', clock_timestamp() + interval '10 minutes'),
                     ('h-old', 'mig', 'bob', 'seats', NULL, 2, 'active', clock_timestamp() - interval '1 minute'),
                     ('h-new', 'mig', 'cat', 'seats', NULL, 1, 'active', clock_timestamp() + interval '10 minutes'),
                     ('h-gone', 'mig', 'dan', 'seats', NULL, 1, 'released', clock_timestamp()),
                     ('h-ga', 'mig', 'eve', 'ga', 'FLOOR', 1, 'active', clock_timestamp() + interval '10 minutes');
         UPDATE seats SET status = 'held', hold_id = 'h-live', held_until = clock_timestamp() + interval '10 minutes'
          WHERE seat_id IN ('S1-R1-1', 'S1-R1-2');
         UPDATE seats SET status = 'held', hold_id = 'h-old', held_until = clock_timestamp() - interval '1 minute'
          WHERE seat_id = 'S1-R1-3';
         UPDATE seats SET status = 'held', hold_id = 'h-new', held_until = clock_timestamp() + interval '10 minutes'
          WHERE seat_id = 'S1-R1-4';",
    )
    .await
    .expect("fill the 0013 database");
    booking::platform::db::MIGRATOR
        .run_to(14, &pool)
        .await
        .expect("migrate to 0014");
    let got: Vec<(String, Option<Vec<String>>)> =
        sqlx::query_as("SELECT id, seat_ids FROM holds ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("read the holds");
    let ids = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    assert_eq!(
        got,
        vec![
            ("h-ga".to_owned(), None),
            ("h-gone".to_owned(), ids(&[])),
            ("h-live".to_owned(), ids(&["S1-R1-1", "S1-R1-2"])),
            ("h-new".to_owned(), ids(&["S1-R1-4"])),
            ("h-old".to_owned(), ids(&["S1-R1-3"])),
        ]
    );
    // The order path's pin finds the live hold's seats through them.
    let mut conn = pool.acquire().await.expect("connection");
    let pinned = pin_hold_tx(&mut conn, "h-live", "ann", 900)
        .await
        .expect("pin")
        .expect("the live hold is pinnable");
    assert_eq!(seat_ids(&pinned), ["S1-R1-1", "S1-R1-2"]);
    assert_eq!(pinned.total, 200);
    // A seat hold written during the 0014 rollout by a process from before 0014 has no list;
    // migration 0015 gives it the seats that carry its id.
    (&mut *conn)
        .execute(
        "INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
              VALUES ('h-roll', 'mig', 'fay', 'seats', NULL, 1, clock_timestamp() + interval '10 minutes');
         UPDATE seats SET status = 'held', hold_id = 'h-roll', held_until = clock_timestamp() + interval '10 minutes'
          WHERE seat_id = 'S1-R1-5'",
        )
        .await
    .expect("an old process's hold");
    drop(conn);
    booking::platform::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migrate on");
    let mut conn = pool.acquire().await.expect("connection");
    let pinned = pin_hold_tx(&mut conn, "h-roll", "fay", 900)
        .await
        .expect("pin")
        .expect("the old process's hold is pinnable");
    assert_eq!(seat_ids(&pinned), ["S1-R1-5"]);
    // From 0015 on, a seat hold without its list is refused (a process from before 0014).
    let refused = (&mut *conn)
        .execute(
            "INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
              VALUES ('h-late', 'mig', 'gus', 'seats', NULL, 1, clock_timestamp() + interval '10 minutes')",
        )
        .await
        .expect_err("a listless seat hold");
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.constraint())
            .map(str::to_owned),
        Some("holds_seat_ids_recorded".to_owned()),
        "{refused}"
    );
    drop(conn);
    pool.close().await;
}

/// The by-id statements on a live hold (`id = $1 AND ... status = 'active'`) run as generic
/// plans on the hold and checkout connections. Planned while few holds are live (here 5,000
/// ended holds, analysed), such a plan could take a whole scan of the live holds' expiry index
/// over the primary key, and keep it while thousands of holds go live in a launch. Failed
/// before migration 0014 (`holds_active_expiry`, whose predicate every such statement implies);
/// the sweeper still has its index.
#[tokio::test]
async fn a_live_hold_is_found_by_its_key_not_by_scanning_the_live_holds() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("plan", 1, 5, 10, 1)).await;
    sqlx::query(
        "INSERT INTO holds (id, event_id, account_id, kind, quantity, status, expires_at, seat_ids)
         SELECT 'ended-' || g, 'plan', 'acct-' || g, 'seats', 1, 'released',
                clock_timestamp(), '{}'
           FROM generate_series(1, 5000) g",
    )
    .execute(&app.pool)
    .await
    .expect("ended holds");
    sqlx::query("ANALYZE holds")
        .execute(&app.pool)
        .await
        .expect("analyze");
    let mut conn = app.pool.acquire().await.expect("connection").detach();
    let explain = |sql: &'static str| sqlx::query_scalar::<_, String>(sql).persistent(false);
    for set in [
        "SET plan_cache_mode = force_generic_plan",
        "SET enable_seqscan = off",
        "PREPARE release_by_id(text, text) AS UPDATE holds SET status = 'released'
          WHERE id = $1 AND account_id = $2 AND status = 'active'",
        "PREPARE pin_by_id(text, text) AS UPDATE holds SET status = 'ordered',
                expires_at = clock_timestamp() + interval '15 minutes'
          WHERE id = $1 AND account_id = $2 AND status = 'active'
            AND expires_at > clock_timestamp()",
        "PREPARE reclaim_by_id(text[]) AS SELECT id FROM holds
          WHERE id = ANY($1) AND status = 'active' AND expires_at <= clock_timestamp()
          ORDER BY id FOR UPDATE SKIP LOCKED",
    ] {
        sqlx::query(set)
            .persistent(false)
            .execute(&mut conn)
            .await
            .expect(set);
    }
    for run in [
        "EXPLAIN EXECUTE release_by_id('ended-1', 'acct-1')",
        "EXPLAIN EXECUTE pin_by_id('ended-1', 'acct-1')",
        "EXPLAIN EXECUTE reclaim_by_id(ARRAY['ended-1'])",
    ] {
        let plan = explain(run)
            .fetch_all(&mut conn)
            .await
            .expect(run)
            .join("\n");
        assert!(
            !plan.contains("holds_active_expiry") && !plan.contains("holds_sweep"),
            "{run} scans the live holds' expiry index instead of a key lookup:\n{plan}"
        );
    }
    use sqlx::Connection;
    conn.close().await.expect("close");
    // The sweeper's own statement, as a generic plan: its index, bounded by the expiry (an
    // index condition, not a filter over every live hold's entry).
    let mut conn = app.pool.acquire().await.expect("conn");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET plan_cache_mode = force_generic_plan; PREPARE sweep(bigint) AS {}",
        booking::inventory::sweeper::SWEEP_SQL
    )))
    .execute(&mut *conn)
    .await
    .expect("prepare the sweep");
    let sweep = sqlx::query_scalar::<_, String>("EXPLAIN EXECUTE sweep(100)")
        .fetch_all(&mut *conn)
        .await
        .expect("explain the sweep")
        .join("\n");
    assert!(sweep.contains("holds_sweep"), "{sweep}");
    assert!(
        sweep.contains("Index Cond: (expires_at <= now())"),
        "the sweep reads only the expired holds' entries:\n{sweep}"
    );
    drop(conn);
    app.stop().await;
}
