//! The invariant: each ticket enters once however many gates scan it at the same moment; and a
//! replayed `scan_id` (sequentially or at once) answers the first answer and writes nothing.

use super::*;
use crate::events::{create_event, small_event};
use std::collections::HashMap;
use std::sync::Arc;

/// Tickets × attempts, spread over gates, all released at once.
const TICKETS: usize = 20;
const ATTEMPTS: usize = 30;
const GATES: usize = 10;

#[tokio::test]
async fn each_ticket_enters_once_however_many_gates_scan_it_at_once() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let mut body = small_event("big", 1, 1, TICKETS as i32, 2);
    body["max_tickets_per_account"] = json!(TICKETS);
    create_event(app, &body).await;
    let tickets = paid_ga(&env, "big", "alice", TICKETS as i32).await;
    assert_eq!(tickets.len(), TICKETS);
    let mut scanners = Vec::new();
    for g in 0..GATES {
        scanners.push(provision(app, "big", &format!("G{g}")).await.1);
    }

    let barrier = Arc::new(tokio::sync::Barrier::new(TICKETS * ATTEMPTS));
    let mut tasks = Vec::new();
    for (t, (id, code, _)) in tickets.iter().enumerate() {
        for n in 0..ATTEMPTS {
            let (client, url) = (app.client.clone(), app.url("/api/checkin/big/scans"));
            let scanner = scanners[(t + n) % GATES].clone();
            let (id, code, barrier) = (id.clone(), code.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let resp = client
                    .post(url)
                    .bearer_auth(scanner)
                    .json(&json!({"code": code, "direction": "in"}))
                    .send()
                    .await
                    .expect("scan");
                let (s, v) = answer(resp).await;
                (id, s, v)
            }));
        }
    }
    let mut by_ticket: HashMap<String, Vec<(u16, Value)>> = HashMap::new();
    for task in tasks {
        let (id, s, v) = task.await.expect("task");
        by_ticket.entry(id).or_default().push((s, v));
    }
    assert_eq!(by_ticket.len(), TICKETS);
    for (id, answers) in &by_ticket {
        let entries: Vec<&Value> = answers
            .iter()
            .filter(|(s, _)| *s == 200)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(entries.len(), 1, "{id}: exactly one ENTRY");
        assert_eq!(entries[0]["result"], "ENTRY");
        let entry = &entries[0]["ticket"];
        for (s, v) in answers.iter().filter(|(s, _)| *s != 200) {
            assert_eq!(
                (*s, v["code"].as_str()),
                (409, Some("ALREADY_INSIDE")),
                "{id}: {v}"
            );
            // Every refusal names the one entry in force.
            assert_eq!(
                (&v["gate"], &v["at"]),
                (&entry["gate"], &entry["at"]),
                "{id}: {v}"
            );
        }
    }
    // The database agrees: one ENTRY row per ticket, every attempt logged, all inside once.
    let per_ticket: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT ticket_id, count(*) FILTER (WHERE result = 'ENTRY'),
                count(*) FILTER (WHERE result = 'ALREADY_INSIDE')
           FROM checkins GROUP BY ticket_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("per ticket");
    assert_eq!(per_ticket.len(), TICKETS);
    for (id, entries, refused) in &per_ticket {
        assert_eq!((*entries, *refused), (1, ATTEMPTS as i64 - 1), "{id}");
    }
    let (inside, entries): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE inside), COALESCE(sum(entries), 0)::bigint
           FROM tickets WHERE event_id = 'big'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("inside");
    assert_eq!((inside, entries), (TICKETS as i64, TICKETS as i64));
    assert_eq!(checkins(app).await, (TICKETS * ATTEMPTS) as i64);
    assert!(app.metrics_text().await.contains(&format!(
        "checkin_scans_total{{result=\"ENTRY\"}} {TICKETS}"
    )));
    env.app.stop().await;
}

#[tokio::test]
async fn a_replayed_scan_id_answers_the_first_answer_and_changes_nothing() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let mut body = small_event("ev", 1, 4, 5, 1);
    body["reentry"] = json!(true);
    create_event(app, &body).await;
    let (_, codes) = paid_seats(&env, "ev", "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let ((a, code), (_, other_code)) = (&codes[0], &codes[1]);
    let (_, scanner) = provision(app, "ev", "A").await;
    let (_, second) = provision(app, "ev", "B").await;

    // The same scan sent 20 times at once: one decision, 20 identical answers.
    let mut sends = Vec::new();
    for _ in 0..20 {
        sends.push(scan_raw(app, &scanner, "ev", code, "in", Some("scan-1")));
    }
    let answers = futures::future::join_all(sends).await;
    let first = answers
        .iter()
        .find(|(_, _, replayed)| !replayed)
        .expect("one original")
        .1
        .clone();
    assert_eq!(first["result"], "ENTRY", "{first}");
    assert_eq!(
        answers.iter().filter(|(_, _, replayed)| !replayed).count(),
        1
    );
    for (s, v, _) in &answers {
        assert_eq!((*s, v), (200, &first));
    }
    assert_eq!(checkins(app).await, 1);
    assert_eq!(door_state(app, a).await, (true, 1));

    // Out, then the first scan again: still its ENTRY answer, and the ticket stays out.
    let (s, v) = scan(app, &scanner, "ev", code, "out", Some("scan-2")).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("EXIT")), "{v}");
    let (s, v, replayed) = scan_raw(app, &scanner, "ev", code, "in", Some("scan-1")).await;
    assert_eq!((s, &v, replayed), (200, &first, true));
    assert_eq!(door_state(app, a).await, (false, 1));
    // A refusal replays as a refusal.
    let (s, v) = scan(app, &scanner, "ev", code, "out", Some("scan-3")).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("NOT_INSIDE")), "{v}");
    let (s, v2, replayed) = scan_raw(app, &scanner, "ev", code, "out", Some("scan-3")).await;
    assert_eq!((s, &v2, replayed), (409, &v, true));
    // The same id for another ticket or direction is not the same scan.
    let (s, v) = scan(app, &scanner, "ev", other_code, "in", Some("scan-1")).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED")),
        "{v}"
    );
    let (s, v) = scan(app, &scanner, "ev", code, "out", Some("scan-1")).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (422, Some("IDEMPOTENCY_KEY_REUSED")),
        "{v}"
    );
    assert_eq!(checkins(app).await, 3);
    assert_eq!(door_state(app, a).await, (false, 1));
    // A code we signed for a ticket that does not exist: refused, and replayed as refused.
    let ghost = booking::tickets::TicketSettings::default()
        .keys()
        .expect("the app's keys")
        .sign(&booking::tickets::code::TicketClaims {
            tid: "tkt_ghost".into(),
            evt: "ev".into(),
            seat: None,
            tier: Some("FLOOR".into()),
            hnd: "h".into(),
            ver: 1,
            iat: 0,
            rot: None,
        });
    let (s, v) = scan(app, &scanner, "ev", &ghost, "in", Some("scan-4")).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (400, Some("INVALID_CODE"), Some("unknown_ticket")),
        "{v}"
    );
    let (s, v2, replayed) = scan_raw(app, &scanner, "ev", &ghost, "in", Some("scan-4")).await;
    assert_eq!((s, &v2, replayed), (400, &v, true));
    // Another scanner's scan-1 is its own scan.
    let (s, v) = scan(app, &second, "ev", code, "in", Some("scan-1")).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    assert_eq!(door_state(app, a).await, (true, 2));
    assert_eq!(checkins(app).await, 5);
    env.app.stop().await;
}
