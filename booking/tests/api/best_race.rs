//! Best available under real concurrency: hundreds of simultaneous requests (and explicit
//! holds racing them) never share a seat and never strand one; the orphan guard of the hold
//! statement holds when two holds that are each fine would strand a seat together.

use crate::best::{best, explicit};
use crate::events::create_event;
use crate::helpers::TestApp;
use booking::inventory::holds::best::lonely;
use futures::future::join_all;
use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};

/// 2,000 seats: two sections of 20 rows of 50, `no_orphans` on.
fn arena() -> Value {
    json!({
        "id": "arena",
        "name": "Arena",
        "sale_start": "2020-01-01T00:00:00Z",
        "max_tickets_per_account": 10,
        "no_orphans": true,
        "price_tiers": [{"tier": "A", "price": 1000}],
        "seat_map": {"sections": [
            {"name": "S1", "rows": 20, "seats_per_row": 50, "price_tier": "A"},
            {"name": "S2", "rows": 20, "seats_per_row": 50, "price_tier": "A"}
        ]},
    })
}

/// Every seat's (section, row) → free flags in number order, from the database.
async fn free_rows(app: &TestApp, event: &str) -> BTreeMap<(String, i32), Vec<bool>> {
    let rows: Vec<(String, i32, bool)> = sqlx::query_as(
        "SELECT section, row_no, status = 'available' FROM seats WHERE event_id = $1
         ORDER BY section, row_no, number",
    )
    .bind(event)
    .fetch_all(&app.pool)
    .await
    .expect("test query");
    let mut map: BTreeMap<(String, i32), Vec<bool>> = BTreeMap::new();
    for (section, row, free) in rows {
        map.entry((section, row)).or_default().push(free);
    }
    map
}

/// No free seat without a free neighbour anywhere: no request ever strands one (no hold is
/// released here, and no row starts with a lone seat).
async fn assert_no_lonely_seat(app: &TestApp, event: &str) {
    for (row, free) in free_rows(app, event).await {
        assert!(lonely(&free).is_empty(), "row {row:?}: {free:?}");
    }
}

/// (section, row, number) of a generated seat id `S1-R3-7`.
fn position(seat: &str) -> (String, i32, i32) {
    let parts: Vec<&str> = seat.split('-').collect();
    let row = parts[1].trim_start_matches('R').parse().expect("row");
    (parts[0].to_owned(), row, parts[2].parse().expect("number"))
}

fn seat_list(v: &Value) -> Vec<String> {
    v["seats"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Records a successful hold: its seats are new, and the database agrees they are its own.
async fn record(app: &TestApp, seen: &mut HashSet<String>, hold: &Value) -> usize {
    let seats = seat_list(hold);
    for s in &seats {
        assert!(seen.insert(s.clone()), "seat {s} in two holds");
    }
    let mine: Vec<String> = sqlx::query_scalar(
        "SELECT seat_id FROM seats WHERE hold_id = $1 AND status = 'held' ORDER BY seat_id",
    )
    .bind(hold["hold_id"].as_str().expect("hold id"))
    .fetch_all(&app.pool)
    .await
    .expect("test query");
    let mut sorted = seats.clone();
    sorted.sort();
    assert_eq!(mine, sorted);
    seats.len()
}

#[tokio::test]
async fn three_hundred_concurrent_best_available_holds_share_no_seat_and_strand_none() {
    let app = TestApp::spawn().await;
    create_event(&app, &arena()).await;
    enum Req {
        Best(usize, bool),
        Explicit(Vec<String>),
    }
    let mut rng = rand::rng();
    let mut reqs: Vec<(String, Req)> = (0..300)
        .map(|i| (format!("fan-{i}"), Req::Best(1 + i % 8, i % 4 != 0)))
        .collect();
    // Explicit holds of random pairs race them (the guarded statement is theirs too).
    for i in 0..100 {
        let section = if i % 2 == 0 { "S1" } else { "S2" };
        let (row, n) = (rng.random_range(1..=20), rng.random_range(1..=49));
        let pair = vec![
            format!("{section}-R{row}-{n}"),
            format!("{section}-R{row}-{}", n + 1),
        ];
        reqs.push((format!("picker-{i}"), Req::Explicit(pair)));
    }
    reqs.shuffle(&mut rng);
    let results = join_all(reqs.iter().map(|(account, req)| {
        let app = &app;
        async move {
            match req {
                Req::Best(q, adjacent) => {
                    let body = json!({"quantity": q, "adjacent": adjacent});
                    (
                        Some((*q, *adjacent)),
                        best(app, "arena", account, body).await,
                    )
                }
                Req::Explicit(seats) => {
                    let seats: Vec<&str> = seats.iter().map(String::as_str).collect();
                    (None, explicit(app, "arena", account, &seats).await)
                }
            }
        }
    }))
    .await;
    let mut seen = HashSet::new();
    let (mut best_ok, mut explicit_ok) = (0, 0);
    for (asked, (status, body)) in &results {
        match asked {
            Some((q, adjacent)) => {
                // 1,350 seats asked of 2,000: every best-available request gets a block.
                assert_eq!(*status, 201, "{body}");
                assert_eq!(record(&app, &mut seen, body).await, *q);
                if *adjacent {
                    let at: Vec<(String, i32, i32)> =
                        seat_list(body).iter().map(|s| position(s)).collect();
                    for w in at.windows(2) {
                        assert_eq!((&w[1].0, w[1].1, w[1].2), (&w[0].0, w[0].1, w[0].2 + 1));
                    }
                }
                best_ok += 1;
            }
            None if *status == 201 => {
                record(&app, &mut seen, body).await;
                explicit_ok += 1;
            }
            None => {
                assert_eq!(*status, 409, "{body}");
                let code = body["code"].as_str().unwrap_or_default();
                assert!(["SEAT_TAKEN", "ORPHAN_SEAT"].contains(&code), "{body}");
            }
        }
    }
    assert_eq!(best_ok, 300);
    assert!(explicit_ok > 0, "some explicit holds got their seats");
    assert_no_lonely_seat(&app, "arena").await;

    // Then hold everything possible, 50 requests at a time (1 or 2 seats): since no free seat
    // is ever left alone, every run of 2 or more can be emptied, so the hall sells out.
    for round in 0.. {
        assert!(round < 200, "the drain must end");
        let results = join_all((0..50).map(|j| {
            let app = &app;
            async move {
                let account = format!("drain-{round}-{j}");
                best(app, "arena", &account, json!({"quantity": 1 + j % 2})).await
            }
        }))
        .await;
        let mut got = 0;
        for (status, body) in &results {
            if *status == 201 {
                record(&app, &mut seen, body).await;
                got += 1;
            } else {
                assert_eq!(*status, 409, "{body}");
                let code = body["code"].as_str().unwrap_or_default();
                assert!(["NO_SEATS_TOGETHER", "SOLD_OUT"].contains(&code), "{body}");
            }
        }
        assert_no_lonely_seat(&app, "arena").await;
        if got == 0 {
            break;
        }
    }
    let free: usize = free_rows(&app, "arena")
        .await
        .values()
        .map(|r| r.iter().filter(|&&f| f).count())
        .sum();
    assert_eq!(
        (free, seen.len()),
        (0, 2000),
        "sold out, every seat in one hold"
    );
    app.stop().await;
}

#[tokio::test]
async fn two_holds_that_would_strand_a_seat_together_never_both_succeed() {
    let app = TestApp::spawn().await;
    create_event(
        &app,
        &json!({
            "id": "strict", "name": "Strict", "sale_start": "2020-01-01T00:00:00Z",
            "no_orphans": true,
            "price_tiers": [{"tier": "A", "price": 1}],
            "seat_map": {"sections": [
                {"name": "S1", "rows": 40, "seats_per_row": 5, "price_tier": "A"}]},
        }),
    )
    .await;
    // Per row, 1-2 and 4-5 at the same moment: each alone leaves 3 free seats in a run;
    // together they would strand seat 3.
    let mut reqs: Vec<(i32, String, [String; 2])> = Vec::new();
    for row in 1..=40 {
        reqs.push((
            row,
            format!("l{row}"),
            [format!("S1-R{row}-1"), format!("S1-R{row}-2")],
        ));
        reqs.push((
            row,
            format!("r{row}"),
            [format!("S1-R{row}-4"), format!("S1-R{row}-5")],
        ));
    }
    reqs.shuffle(&mut rand::rng());
    let results = join_all(reqs.iter().map(|(row, account, seats)| {
        let app = &app;
        async move {
            let seats: Vec<&str> = seats.iter().map(String::as_str).collect();
            (*row, explicit(app, "strict", account, &seats).await)
        }
    }))
    .await;
    let mut per_row: HashMap<i32, Vec<(u16, Value)>> = HashMap::new();
    for (row, r) in results {
        per_row.entry(row).or_default().push(r);
    }
    for (row, rs) in per_row {
        let ok = rs.iter().filter(|(s, _)| *s == 201).count();
        assert_eq!(ok, 1, "row {row}: {rs:?}");
        let refused = rs.iter().find(|(s, _)| *s != 201).expect("one refused");
        assert_eq!(refused.0, 409, "{refused:?}");
        assert_eq!(refused.1["code"], "ORPHAN_SEAT");
        assert_eq!(refused.1["seats"], json!([format!("S1-R{row}-3")]));
    }
    assert_no_lonely_seat(&app, "strict").await;
    app.stop().await;
}

/// `name value` of one metric line in booking's `/metrics` text (0 when absent).
async fn metric(app: &TestApp, name: &str) -> f64 {
    app.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn two_hundred_concurrent_pairs_are_picked_in_batches_disjoint_and_fill_the_hall() {
    let app = TestApp::spawn().await;
    // 160 seats in rows of 10, for 200 fans asking 2 each at once: 80 get a pair, and the
    // pairs, picked front-row centre first, always leave runs of an even length, so nothing is
    // ever refused before the hall is full.
    create_event(
        &app,
        &json!({
            "id": "pairs", "name": "Pairs", "sale_start": "2020-01-01T00:00:00Z",
            "max_tickets_per_account": 10, "no_orphans": true,
            "price_tiers": [{"tier": "A", "price": 100}],
            "seat_map": {"sections": [
                {"name": "S1", "rows": 8, "seats_per_row": 10, "price_tier": "A"},
                {"name": "S2", "rows": 8, "seats_per_row": 10, "price_tier": "A"}
            ]},
        }),
    )
    .await;
    let results = join_all((0..200).map(|i| {
        let app = &app;
        async move { best(app, "pairs", &format!("fan-{i}"), json!({"quantity": 2})).await }
    }))
    .await;
    let mut seen = HashSet::new();
    let mut held = 0;
    for (status, body) in &results {
        if *status == 201 {
            assert_eq!(record(&app, &mut seen, body).await, 2);
            let at: Vec<(String, i32, i32)> = seat_list(body).iter().map(|s| position(s)).collect();
            assert_eq!(
                (&at[1].0, at[1].1, at[1].2),
                (&at[0].0, at[0].1, at[0].2 + 1)
            );
            held += 1;
        } else {
            // Only ever from a read of the full hall: no 503, no NO_SEATS_TOGETHER.
            assert_eq!(
                (*status, body["code"].as_str()),
                (409, Some("SOLD_OUT")),
                "{body}"
            );
        }
    }
    assert_eq!((held, seen.len()), (80, 160));
    assert_no_lonely_seat(&app, "pairs").await;
    let free: usize = free_rows(&app, "pairs")
        .await
        .values()
        .map(|r| r.iter().filter(|&&f| f).count())
        .sum();
    assert_eq!(free, 0, "every seat held");
    // Batching really happened: some batch served more than one request, and far fewer
    // batches than requests ran.
    let batches = metric(&app, "floodgate_booking_best_available_batch_size_count").await;
    let singles = metric(
        &app,
        "floodgate_booking_best_available_batch_size_bucket{le=\"1\"}",
    )
    .await;
    let served = metric(&app, "floodgate_booking_best_available_batch_size_sum").await;
    assert!(
        batches > singles,
        "a batch of more than one: {batches} {singles}"
    );
    assert!(served >= 200.0, "every request was in a batch: {served}");
    assert!(batches < 100.0, "requests share batches: {batches} batches");
    app.stop().await;
}
