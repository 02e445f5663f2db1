//! Group commit for explicit seat holds (issue 16, `inventory::holds::grouped`): the holds of
//! one event that arrive together go in one statement, each still all or nothing. The
//! statement on its own (each request's answer reads like its own statement's, refusals write
//! nothing) and hundreds of fans queued behind a locked seat, then served in batches.

use crate::events::{create_event, db_state, small_event};
use crate::helpers::TestApp;
use crate::holds::{expire_in_db, hold, seats_of, usage};
use booking::inventory::holds::grouped::{SeatRequest, hold_seats_grouped_rows};
use booking::inventory::holds::{HOLD_SEATS, SeatRow};
use futures::future::join_all;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;
use testkit::wait::until;

fn request(account: &str, seats: &[&str]) -> SeatRequest {
    SeatRequest {
        account: account.to_owned(),
        hold_id: shared::ids::new_id(),
        seats: seats.iter().map(|s| (*s).to_owned()).collect(),
        n: seats.len() as i32,
    }
}

fn set(seats: &[&str]) -> BTreeSet<String> {
    seats.iter().map(|s| (*s).to_owned()).collect()
}

/// One statement, five requests: two take their seats (one of them reclaiming a seat of an
/// expired hold), one finds a seat taken, one is over the ticket limit, one names a seat that
/// does not exist. Exactly the two are written; each refusal's rows are the rows THE seat hold
/// statement gives the same request on its own afterwards (the same refusal, nothing written).
#[tokio::test]
async fn one_statement_holds_each_request_of_a_batch_whole_or_not_at_all() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 10, 10, 1)).await;
    let (status, alice) = hold(&app, "ev", "alice", &["S1-R1-1"]).await;
    assert_eq!(status, 201, "{alice}");
    let (status, carol) = hold(&app, "ev", "carol", &["S1-R1-5"]).await;
    assert_eq!(status, 201, "{carol}");
    let carol_hold = carol["hold_id"].as_str().expect("hold id").to_owned();
    expire_in_db(&app, &carol_hold).await;
    let four = ["S2-R1-1", "S2-R1-2", "S2-R1-3", "S2-R1-4"];
    let (status, greedy) = hold(&app, "ev", "greedy", &four).await;
    assert_eq!(status, 201, "{greedy}");

    let batch = [
        request("a1", &["S1-R1-3", "S1-R1-2"]),
        request("b1", &["S1-R1-4", "S1-R1-1"]),
        request("greedy", &["S2-R2-1"]),
        request("c1", &["S1-R1-5", "S1-R1-6"]),
        request("d1", &["S1-R2-1", "S1-R9-99"]),
    ];
    let pool = &app.state.inventory.hold_pool;
    let rows = hold_seats_grouped_rows(pool, "ev", &batch)
        .await
        .expect("the batch statement");
    assert_eq!(rows.len(), batch.len());

    // Taken: every seat, at the tier price, and the hold row with them.
    for (i, seats, prev) in [
        (0, set(&["S1-R1-2", "S1-R1-3"]), None),
        (3, set(&["S1-R1-5", "S1-R1-6"]), Some(carol_hold.as_str())),
    ] {
        let r = &rows[i];
        assert!(r.iter().all(|r| r.0.is_some()), "request {i}: {r:?}");
        assert!(r.iter().all(|r| r.1 == 2 && r.4 == Some(12000)), "{r:?}");
        let got: BTreeSet<String> = r.iter().filter_map(|r| r.2.clone()).collect();
        assert_eq!(got, seats);
        assert_eq!(seats_of(&app, &batch[i].hold_id).await, seats);
        let prevs: Vec<Option<&str>> = r.iter().map(|r| r.3.as_deref()).collect();
        match prev {
            None => assert!(prevs.iter().all(Option::is_none), "{prevs:?}"),
            // The reclaimed seat names the expired hold it came from.
            Some(h) => assert_eq!(prevs, [Some(h), None]),
        }
        assert_eq!(usage(&app, "ev", &batch[i].account).await, 2);
    }
    // Refused: nothing written for them.
    for i in [1, 2, 4] {
        assert!(rows[i].iter().all(|r| r.0.is_none() && r.1 == 0), "{i}");
        assert_eq!(seats_of(&app, &batch[i].hold_id).await, BTreeSet::new());
    }
    assert_eq!(usage(&app, "ev", "b1").await, 0);
    assert_eq!(usage(&app, "ev", "greedy").await, 4);
    assert_eq!(usage(&app, "ev", "d1").await, 0);
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats
          WHERE event_id = 'ev' AND seat_id IN ('S1-R1-4', 'S1-R2-1', 'S2-R2-1')
            AND status = 'available'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("test query");
    assert_eq!(free, 3, "a refused request's free seats stay free");
    assert_eq!(db_state(&app.pool).await["holds"], 5);
    // b1: only its free seat is wanted (SEAT_TAKEN names the other); greedy: the limit says
    // no; d1: one seat is unknown. Exactly the rows the request gets on its own.
    assert_eq!(
        rows[1].iter().map(|r| r.2.as_deref()).collect::<Vec<_>>(),
        [Some("S1-R1-4")]
    );
    assert_eq!(rows[2][0].6, Some(false));
    for i in [1, 2, 4] {
        let r = &batch[i];
        let alone: Vec<SeatRow> = sqlx::query_as(HOLD_SEATS)
            .bind("ev")
            .bind(&r.account)
            .bind(&r.hold_id)
            .bind(&r.seats)
            .bind(r.n)
            .fetch_all(&app.pool)
            .await
            .expect("the statement on its own");
        assert_eq!(rows[i], alone, "request {i}");
    }
    assert_eq!(db_state(&app.pool).await["holds"], 5);
    app.stop().await;
}

/// 300 fans (150 accounts, each asking twice for different seats) queued behind one hold that
/// waits on a locked seat, with one statement per event at a time: once the lock goes, they
/// are served in batches (fewer statements than holds), and every answer is the one the holds
/// would get one by one: no seat held twice, each granted hold owns exactly the seats it
/// asked for, usage equals the seats held and never passes the limit, no deadlock.
#[tokio::test]
async fn hundreds_of_holds_queued_behind_a_locked_seat_go_in_batches_and_never_share_a_seat() {
    let app = TestApp::spawn_with(|c| {
        c.booking.hold_batch_max = 64;
        c.booking.hold_batch_concurrency = 1;
    })
    .await;
    // 2 sections x 4 rows x 10 seats = 80 seats, fought over by 300 requests.
    create_event(&app, &small_event("hot", 4, 10, 10, 1)).await;

    let mut lock = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM seats WHERE event_id = 'hot' AND seat_id = 'S1-R1-1' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .expect("lock a seat");
    let mut requests = Vec::new();
    for i in 0..300usize {
        let section = if i % 2 == 0 { "S1" } else { "S2" };
        let row = 1 + (i / 2) % 4;
        let len = 1 + i % 3;
        let start = 1 + (i * 7) % (11 - len);
        let seats: Vec<String> = (start..start + len)
            .map(|n| format!("{section}-R{row}-{n}"))
            .collect();
        requests.push((format!("fan-{}", i % 150), seats));
    }
    let queued = app.state.inventory.metrics.seat_holds_queued.clone();
    let ((status, body), results) = tokio::join!(
        // Runs alone (a batch of one) and waits on the locked seat, so every later hold of
        // the event queues: one statement at a time.
        hold(&app, "hot", "first", &["S1-R1-1", "S1-R1-2"]),
        async {
            app.until_a_request_waits_for_a_lock().await;
            let holds = join_all(requests.iter().map(|(account, seats)| {
                let app = &app;
                async move { hold(app, "hot", account, seats).await }
            }));
            let release = async {
                until(
                    Duration::from_secs(60),
                    Duration::from_millis(10),
                    "never: all 300 holds queued",
                    || std::future::ready(queued.get() == 300),
                )
                .await;
                lock.rollback().await.expect("let the seat go");
            };
            tokio::join!(holds, release).0
        }
    );
    assert_eq!(status, 201, "{body}");
    let mut held = HashSet::from(["S1-R1-1".to_owned(), "S1-R1-2".to_owned()]);
    let mut holds = 1;
    let mut per_account: HashMap<&str, usize> = HashMap::new();
    for ((status, body), (account, asked)) in results.iter().zip(&requests) {
        match status {
            201 => {
                let got: BTreeSet<String> = body["seats"]
                    .as_array()
                    .expect("seats")
                    .iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect();
                assert_eq!(got, asked.iter().cloned().collect::<BTreeSet<_>>());
                let hold_id = body["hold_id"].as_str().expect("hold id");
                assert_eq!(seats_of(&app, hold_id).await, got);
                for s in got {
                    assert!(held.insert(s.clone()), "seat {s} granted twice");
                }
                holds += 1;
                *per_account.entry(account).or_default() += asked.len();
            }
            409 => assert!(
                ["SEAT_TAKEN", "LIMIT_EXCEEDED"].contains(&body["code"].as_str().unwrap_or("")),
                "{body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(holds > 10, "only {holds} holds granted");
    for (account, seats) in &per_account {
        assert!(*seats <= 4, "{account} holds {seats} seats");
        assert_eq!(usage(&app, "hot", account).await as usize, *seats);
    }
    let state = db_state(&app.pool).await;
    assert_eq!(state["held"].as_u64(), Some(held.len() as u64));
    assert_eq!(state["holds"].as_u64(), Some(holds));
    assert_eq!(state["usage"].as_u64(), Some(held.len() as u64));
    // They went in batches: fewer statements than holds.
    let batches = app
        .state
        .inventory
        .metrics
        .seat_hold_batch
        .get_sample_count();
    let batched = app.state.inventory.metrics.seat_hold_batch.get_sample_sum();
    // (A hold refused for the limit tries once more after expiring the account's own expired
    // holds, so some went through twice.)
    assert!(batched as u64 >= 301, "every hold went through the batcher");
    assert!(
        (batches as f64) < batched / 2.0,
        "{batches} statements for {batched} holds"
    );
    assert_eq!(app.state.inventory.metrics.seat_holds_queued.get(), 0);
    assert_eq!(
        app.stop_counting_deadlocks().await,
        0,
        "deadlocks among seat holds"
    );
}
