//! Offline decisions uploaded in batches: re-decided in the server's order, conflicts recorded
//! and listed, replays changing nothing, revoked scanners' uploads flagged, bad batches
//! refused whole, and uploads racing online scans still give one `ENTRY` per ticket.

use super::offline_kit::*;
use super::*;
use crate::events::{create_event, small_event};
use std::sync::Arc;

/// Rows of `checkins` as (scanner gate, ticket, result, offline_decided, conflict, revoked).
type LogRow = (String, Option<String>, String, Option<String>, bool, bool);

async fn log(app: &TestApp) -> Vec<LogRow> {
    sqlx::query_as(
        "SELECT gate, ticket_id, result, offline_decided, conflict, from_revoked_scanner
           FROM checkins ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("log")
}

#[tokio::test]
async fn a_ticket_admitted_offline_at_two_gates_is_one_entry_and_one_conflict() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 4, 5, 1)).await;
    let t = seed(&app, "ev", "f", 4).await;
    void(&app.pool, &t[2].0).await;
    let (_, north) = provision(&app, "ev", "North").await;
    let (_, south) = provision(&app, "ev", "South").await;

    // Both gates were offline and let t0 in; North also let t1 in and out, admitted the void
    // t2 (its snapshot was older), and refused t3 (a device refusal changes nothing).
    let north_batch = [
        offline("n-1", &t[0].1, "in", "ENTRY"),
        offline("n-2", &t[1].1, "in", "ENTRY"),
        offline("n-3", &t[1].1, "out", "EXIT"),
        offline("n-4", &t[2].1, "in", "ENTRY"),
        offline("n-5", &t[3].1, "in", "VOIDED"),
    ];
    let (s, v) = upload(&app, &north, "ev", &north_batch).await;
    assert_eq!(s, 200, "{v}");
    let results: Vec<(&str, bool)> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| (r["result"].as_str().expect("result"), r["conflict"] == true))
        .collect();
    assert_eq!(
        results,
        [
            ("ENTRY", false),
            ("ENTRY", false),
            ("EXIT", false),
            ("VOIDED", true),
            ("VOIDED", false)
        ]
    );
    assert_eq!(v["conflicts"], 1);
    assert_eq!(v["results"][3]["reason"], "refunded");
    assert_eq!(
        door_state(&app, &t[3].0).await,
        (false, 0),
        "a device refusal applies nothing"
    );

    let (s, v) = upload(
        &app,
        &south,
        "ev",
        &[offline("s-1", &t[0].1, "in", "ENTRY")],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let r = &v["results"][0];
    assert_eq!(
        (r["result"].as_str(), r["conflict"].as_bool()),
        (Some("ALREADY_INSIDE"), Some(true)),
        "{v}"
    );
    assert_eq!(r["entry_gate"], "North");
    assert_eq!(r["ticket"], t[0].0.as_str());

    // The database agrees: t0 entered once, at North; one ENTRY row and one conflict row.
    assert_eq!(door_state(&app, &t[0].0).await, (true, 1));
    let rows = log(&app).await;
    let about_t0: Vec<&LogRow> = rows
        .iter()
        .filter(|r| r.1.as_deref() == Some(t[0].0.as_str()))
        .collect();
    assert_eq!(about_t0.len(), 2);
    assert_eq!(
        (
            about_t0[0].0.as_str(),
            about_t0[0].2.as_str(),
            about_t0[0].4
        ),
        ("North", "ENTRY", false)
    );
    assert_eq!(
        (
            about_t0[1].0.as_str(),
            about_t0[1].2.as_str(),
            about_t0[1].3.as_deref(),
            about_t0[1].4
        ),
        ("South", "ALREADY_INSIDE", Some("ENTRY"), true)
    );

    // Ops see both conflicts, newest first, with both gates; paged.
    let (s, page) = admin(
        &app,
        "GET",
        "/admin/events/ev/checkin/conflicts?limit=1",
        crate::helpers::ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 200, "{page}");
    let c = &page["conflicts"][0];
    assert_eq!(
        (
            c["gate"].as_str(),
            c["device_decided"].as_str(),
            c["server_result"].as_str(),
            c["entry_gate"].as_str()
        ),
        (
            Some("South"),
            Some("ENTRY"),
            Some("ALREADY_INSIDE"),
            Some("North")
        )
    );
    assert_eq!(c["ticket"], t[0].0.as_str());
    assert!(c["scanned_at"].is_string() && c["received_at"].is_string());
    let before = page["next_before"].as_i64().expect("a next page");
    let (_, older) = admin(
        &app,
        "GET",
        &format!("/admin/events/ev/checkin/conflicts?before={before}"),
        crate::helpers::ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(older["conflicts"].as_array().map(Vec::len), Some(1));
    assert_eq!(older["conflicts"][0]["server_result"], "VOIDED");
    assert!(older.get("next_before").is_none());
    let (s, _) = admin(
        &app,
        "GET",
        "/admin/events/nope/checkin/conflicts",
        crate::helpers::ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 404);
    let (s, _) = admin(
        &app,
        "GET",
        "/admin/events/ev/checkin/conflicts?limit=0",
        crate::helpers::ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 422);
    let resp = app
        .client
        .get(app.url("/admin/events/ev/checkin/conflicts"))
        .bearer_auth(&north)
        .send()
        .await
        .expect("as scanner");
    assert_eq!(
        resp.status().as_u16(),
        403,
        "a scanner cannot read the admin API"
    );

    let metrics = app.metrics_text().await;
    assert!(
        metrics
            .contains("checkin_offline_conflicts_total{event=\"ev\",reason=\"ALREADY_INSIDE\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("checkin_offline_conflicts_total{event=\"ev\",reason=\"VOIDED\"} 1"));
    assert!(metrics.contains("checkin_offline_scans_total{result=\"ENTRY\"} 2"));

    // A replayed batch: the same answers, marked replayed, nothing written.
    let before_rows = log(&app).await;
    let (s, again) = upload(&app, &north, "ev", &north_batch).await;
    assert_eq!(s, 200, "{again}");
    for (i, r) in again["results"]
        .as_array()
        .expect("results")
        .iter()
        .enumerate()
    {
        assert_eq!(r["replayed"], true, "{i}");
        assert_eq!(r["result"], json!(results[i].0), "{i}");
        assert_eq!(r["conflict"], json!(results[i].1), "{i}");
    }
    assert_eq!(log(&app).await, before_rows, "a replay writes nothing");
    assert_eq!(door_state(&app, &t[1].0).await, (false, 1));
    // A scan_id reused for another ticket is refused.
    let (s, e) = upload(
        &app,
        &north,
        "ev",
        &[offline("n-1", &t[3].1, "in", "ENTRY")],
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str(), e["index"].as_i64()),
        (422, Some("IDEMPOTENCY_KEY_REUSED"), Some(0)),
        "{e}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_scanner_revoked_while_offline_uploads_facts_flagged_and_nothing_else() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 4, 5, 1)).await;
    let t = seed(&app, "ev", "g", 2).await;
    let (id, gone) = provision(&app, "ev", "Gone").await;
    let (s, _) = admin(
        &app,
        "DELETE",
        &format!("/admin/events/ev/scanners/{id}"),
        crate::helpers::ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 204);

    let (s, v) = upload(&app, &gone, "ev", &[offline("r-1", &t[0].1, "in", "ENTRY")]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["results"][0]["result"], "ENTRY");
    assert_eq!(
        door_state(&app, &t[0].0).await,
        (true, 1),
        "what happened at the door is kept"
    );
    let rows = log(&app).await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].5, "flagged from_revoked_scanner");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("checkin_offline_revoked_scans_total 1"),
        "{metrics}"
    );

    // Online scans and snapshots stay refused; unknown credentials are refused everywhere.
    let (s, e) = scan(&app, &gone, "ev", &t[1].1, "in", None).await;
    assert_eq!((s, e["reason"].as_str()), (401, Some("revoked")));
    let (s, _, _, _) = snapshot_raw(&app, &gone, "ev", None, false).await;
    assert_eq!(s, 401);
    let forged = format!("fgsc_{}", "A".repeat(43));
    let (s, _) = upload(
        &app,
        &forged,
        "ev",
        &[offline("r-2", &t[1].1, "in", "ENTRY")],
    )
    .await;
    assert_eq!(s, 401);
    assert_eq!(log(&app).await.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn bad_batches_are_refused_whole_and_a_bad_code_is_that_scans_result() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 4, 5, 1)).await;
    create_event(&app, &small_event("other", 1, 4, 5, 1)).await;
    let t = seed(&app, "ev", "h", 2).await;
    let (_, north) = provision(&app, "ev", "North").await;
    let (_, elsewhere) = provision(&app, "other", "X").await;
    let good = offline("b-1", &t[0].1, "in", "ENTRY");
    let many: Vec<Value> = (0..501)
        .map(|i| offline(&format!("m-{i}"), &t[0].1, "in", "ENTRY"))
        .collect();
    let mut unknown = good.clone();
    unknown["gate"] = json!("X");
    let mut no_id = good.clone();
    no_id.as_object_mut().expect("object").remove("scan_id");
    let cases: Vec<(&str, Value, u16)> = vec![
        ("empty", json!({"scans": []}), 422),
        ("501 scans", json!({"scans": many}), 422),
        (
            "unknown field in a scan",
            json!({"scans": [good.clone(), unknown]}),
            0,
        ),
        (
            "unknown top-level field",
            json!({"scans": [good.clone()], "gate": "X"}),
            0,
        ),
        ("no scan_id", json!({"scans": [good.clone(), no_id]}), 0),
        (
            "bad decided",
            json!({"scans": [good.clone(), offline("b-2", &t[1].1, "in", "LET_IN")]}),
            422,
        ),
        (
            "decided against direction",
            json!({"scans": [good.clone(), offline("b-3", &t[1].1, "out", "ENTRY")]}),
            422,
        ),
        (
            "scan_id with a space",
            json!({"scans": [good.clone(), offline("b 4", &t[1].1, "in", "ENTRY")]}),
            422,
        ),
        (
            "over 1 MiB",
            json!({"scans": [{"scan_id": "b-5", "code": "x".repeat(1_100_000), "direction": "in", "scanned_at": chrono::Utc::now(), "decided": "ENTRY"}]}),
            413,
        ),
    ];
    for (what, body, status) in cases {
        let (s, v) = upload_body(&app, &north, "ev", &body).await;
        if status == 0 {
            assert!((400..500).contains(&s) && s != 404, "{what}: {s} {v}");
        } else {
            assert_eq!(s, status, "{what}: {v}");
        }
        assert!(v["code"].is_string(), "{what}: {v}");
    }
    // Another event's scanner: 403, nothing written.
    let (s, v) = upload(&app, &elsewhere, "ev", std::slice::from_ref(&good)).await;
    assert_eq!((s, v["code"].as_str()), (403, Some("WRONG_EVENT")));
    assert_eq!(checkins(&app).await, 0, "no bad batch wrote anything");
    assert_eq!(door_state(&app, &t[0].0).await, (false, 0));

    // A forged code inside a good batch is that scan's INVALID_CODE (a conflict, as the device
    // let it in); the rest of the batch is applied.
    let mut parts: Vec<String> = t[1].1.split('.').map(str::to_owned).collect();
    parts[2] = B64.encode([7u8; 64]);
    let forged = parts.join(".");
    let (s, v) = upload(
        &app,
        &north,
        "ev",
        &[offline("f-1", &forged, "in", "ENTRY"), good],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["results"][0]["result"].as_str(),
            v["results"][0]["reason"].as_str(),
            v["results"][0]["conflict"].as_bool()
        ),
        (Some("INVALID_CODE"), Some("bad_signature"), Some(true))
    );
    assert_eq!(v["results"][1]["result"], "ENTRY");
    assert_eq!(
        door_state(&app, &t[1].0).await,
        (false, 0),
        "the forged code admitted nothing"
    );
    assert_eq!(door_state(&app, &t[0].0).await, (true, 1));
    app.stop().await;
}

/// Online scans and offline uploads for the same tickets, all released at once: exactly one
/// `ENTRY` per ticket, ever; every upload that lost is a conflict.
#[tokio::test]
async fn online_scans_and_uploads_racing_for_tickets_enter_each_once() {
    const TICKETS: usize = 12;
    const ONLINE: usize = 8;
    const UPLOADERS: usize = 6;
    let app = Arc::new(TestApp::spawn().await);
    create_event(&app, &small_event("ev", 1, 4, 5, 1)).await;
    let t = seed(&app, "ev", "r", TICKETS).await;
    let mut online = Vec::new();
    for g in 0..ONLINE {
        online.push(provision(&app, "ev", &format!("On{g}")).await.1);
    }
    let mut uploaders = Vec::new();
    for g in 0..UPLOADERS {
        uploaders.push(provision(&app, "ev", &format!("Off{g}")).await.1);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(TICKETS * ONLINE + UPLOADERS));
    let mut tasks = Vec::new();
    for (tid, code) in &t {
        for cred in &online {
            let (app, cred, code, barrier) =
                (app.clone(), cred.clone(), code.clone(), barrier.clone());
            let _ = tid;
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                scan(&app, &cred, "ev", &code, "in", None).await.0
            }));
        }
    }
    for (g, cred) in uploaders.iter().enumerate() {
        let scans: Vec<Value> = t
            .iter()
            .enumerate()
            .map(|(i, (_, code))| offline(&format!("u{g}-{i}"), code, "in", "ENTRY"))
            .collect();
        let (app, cred, barrier) = (app.clone(), cred.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let (s, v) = upload(&app, &cred, "ev", &scans).await;
            assert_eq!(s, 200, "{v}");
            s
        }));
    }
    for task in tasks {
        let s = task.await.expect("task");
        assert!(s == 200 || s == 409, "{s}");
    }
    let per_ticket: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT k.id, count(c.id) FILTER (WHERE c.result = 'ENTRY'), k.entries
           FROM tickets k LEFT JOIN checkins c ON c.ticket_id = k.id
          GROUP BY k.id, k.entries ORDER BY k.id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("counts");
    assert_eq!(per_ticket.len(), TICKETS);
    for (id, entries_logged, entries) in &per_ticket {
        assert_eq!((*entries_logged, *entries), (1, 1), "{id}");
    }
    let (offline_scans, conflicts, offline_entries): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE conflict), count(*) FILTER (WHERE result = 'ENTRY')
           FROM checkins WHERE offline_decided IS NOT NULL",
    )
    .fetch_one(&app.pool)
    .await
    .expect("offline");
    assert_eq!(offline_scans, (TICKETS * UPLOADERS) as i64);
    assert_eq!(
        conflicts,
        offline_scans - offline_entries,
        "every upload that lost is a conflict"
    );
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
}
