//! Each answer of the door, logged and counted; rotating codes; re-entry; bad input.

use super::*;
use crate::events::{create_event, small_event};

#[tokio::test]
async fn the_door_answers_each_case_with_its_code_and_logs_it() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, &small_event("ev", 1, 5, 5, 1)).await;
    create_event(app, &small_event("other", 1, 4, 5, 1)).await;
    let (_, alice) = paid_seats(&env, "ev", "alice", &["S1-R1-1", "S1-R1-2", "S1-R1-3"]).await;
    let (bob_order, bob) = paid_seats(&env, "ev", "bob", &["S1-R1-4"]).await;
    let (_, elsewhere) = paid_seats(&env, "other", "alice", &["S1-R1-1"]).await;
    let (_, north) = provision(app, "ev", "North").await;
    let (_, south) = provision(app, "ev", "South").await;
    let (a, b, c) = (&alice[0], &alice[1], &alice[2]);

    // ENTRY, with the seat and gate; again anywhere: ALREADY_INSIDE with when and where.
    let (s, entry) = scan(app, &north, "ev", &a.1, "in", None).await;
    assert_eq!(s, 200, "{entry}");
    assert_eq!(entry["result"], "ENTRY");
    assert_eq!(entry["ticket"]["id"], a.0.as_str());
    assert_eq!(entry["ticket"]["seat"], "S1-R1-1");
    assert_eq!(entry["ticket"]["gate"], "North");
    assert!(entry["ticket"].get("tier").is_none());
    let (s, v) = scan(app, &south, "ev", &a.1, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("ALREADY_INSIDE")),
        "{v}"
    );
    assert_eq!(v["gate"], "North");
    assert_eq!(v["at"], entry["ticket"]["at"]);
    assert_eq!(v["ticket"]["seat"], "S1-R1-1");

    // EXIT, then back in on an event without re-entry: REENTRY_NOT_ALLOWED.
    let (s, v) = scan(app, &south, "ev", &a.1, "out", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("EXIT")), "{v}");
    assert_eq!(v["ticket"]["gate"], "South");
    let (s, v) = scan(app, &north, "ev", &a.1, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("REENTRY_NOT_ALLOWED")),
        "{v}"
    );
    // Out without being in: NOT_INSIDE.
    let (s, v) = scan(app, &north, "ev", &b.1, "out", None).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("NOT_INSIDE")), "{v}");

    // A refunded order's ticket: VOIDED, refunded.
    let (s, v, _) = crate::ops_refunds::ops_post(
        app,
        &format!("/admin/orders/{bob_order}/refund"),
        Some("lead"),
        Some("refund-bob"),
        &json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = scan(app, &north, "ev", &bob[0].1, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (410, Some("VOIDED"), Some("refunded")),
        "{v}"
    );
    // A code of an older version of a valid ticket (what a transfer will do; the version is
    // bumped here directly): VOIDED, reissued. The current version's code enters.
    sqlx::query("UPDATE tickets SET version = version + 1 WHERE id = $1")
        .bind(&c.0)
        .execute(&app.pool)
        .await
        .expect("bump");
    let (s, v) = scan(app, &north, "ev", &c.1, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (410, Some("VOIDED"), Some("reissued")),
        "{v}"
    );
    let order: String = sqlx::query_scalar("SELECT order_id FROM tickets WHERE id = $1")
        .bind(&c.0)
        .fetch_one(&app.pool)
        .await
        .expect("order");
    let fresh = order_codes(app, "alice", &order).await;
    let fresh_c = fresh.iter().find(|t| t.0 == c.0).expect("c").1.clone();
    assert_ne!(fresh_c, c.1);
    let (s, v) = scan(app, &north, "ev", &fresh_c, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");

    // A good code of another event: WRONG_EVENT. Forged, truncated, not codes: INVALID_CODE.
    let (s, v) = scan(app, &north, "ev", &elsewhere[0].1, "in", None).await;
    assert_eq!((s, v["code"].as_str()), (403, Some("WRONG_EVENT")), "{v}");
    let mut parts: Vec<String> = b.1.split('.').map(str::to_owned).collect();
    let mut claims: Value =
        serde_json::from_slice(&B64.decode(&parts[1]).expect("b64")).expect("claims");
    claims["seat"] = json!("S1-R1-5");
    parts[1] = B64.encode(claims.to_string());
    let forged = parts.join(".");
    let with_totp = format!("{}~12345678", b.1);
    for (what, text, reason) in [
        ("forged", forged.as_str(), Some("bad_signature")),
        // Cut inside the signature: malformed or a bad signature, by where the cut falls.
        ("truncated", &b.1[..b.1.len() - 3], None),
        ("junk", "hello", Some("malformed")),
        (
            "with a totp it never had",
            with_totp.as_str(),
            Some("unexpected_totp"),
        ),
    ] {
        let (s, v) = scan(app, &north, "ev", text, "in", None).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (400, Some("INVALID_CODE")),
            "{what}: {v}"
        );
        if let Some(reason) = reason {
            assert_eq!(v["reason"], reason, "{what}: {v}");
        }
    }
    assert_eq!(
        door_state(app, &b.0).await,
        (false, 0),
        "nothing admitted b"
    );

    // Every decision is logged with its scanner, gate, ticket and result, in server order.
    let rows: Vec<(String, Option<String>, String, Option<String>)> = sqlx::query_as(
        "SELECT gate, ticket_id, result, reason FROM checkins ORDER BY received_at, id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("log");
    let results: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        results,
        [
            "ENTRY",
            "ALREADY_INSIDE",
            "EXIT",
            "REENTRY_NOT_ALLOWED",
            "NOT_INSIDE",
            "VOIDED",
            "VOIDED",
            "ENTRY",
            "WRONG_EVENT",
            "INVALID_CODE",
            "INVALID_CODE",
            "INVALID_CODE",
            "INVALID_CODE"
        ]
    );
    assert_eq!(rows[1].0, "South");
    assert_eq!(rows[0].1.as_deref(), Some(a.0.as_str()));
    assert_eq!(rows[9].1, None, "a forged code names no ticket");
    assert_eq!(door_state(app, &a.0).await, (false, 1));
    assert_eq!(door_state(app, &c.0).await, (true, 1));
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("checkin_scans_total{result=\"ENTRY\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("checkin_scans_total{result=\"INVALID_CODE\"} 4"));
    assert!(metrics.contains("checkin_entries_total{event=\"ev\",gate=\"North\"} 2"));
    assert!(metrics.contains("checkin_exits_total{event=\"ev\",gate=\"South\"} 1"));
    // The gauges, read from Postgres (the job every instance runs; run once here): c is inside
    // through North, a entered there and went out.
    use booking::platform::jobs::Job;
    let gauges = booking::checkin::gauges::GateCounts::new(
        app.pool.clone(),
        app.state.checkin.metrics.clone(),
    );
    gauges.run_once().await.expect("gauges");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("checkin_inside{event=\"ev\",gate=\"North\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("checkin_entered{event=\"ev\",gate=\"North\"} 2"));
    // c goes out at South: still entered through North, no longer inside.
    let (s, v) = scan(app, &south, "ev", &fresh_c, "out", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("EXIT")), "{v}");
    gauges.run_once().await.expect("gauges");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("checkin_inside{event=\"ev\",gate=\"North\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("checkin_entered{event=\"ev\",gate=\"North\"} 2"));
    env.app.stop().await;
}

#[tokio::test]
async fn rotating_codes_need_their_current_totp() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let mut body = small_event("rot", 1, 4, 5, 1);
    body["ticket_code"] = json!("rotating");
    create_event(app, &body).await;
    let tickets = paid_ga(&env, "rot", "alice", 1).await;
    let (id, code, secret) = &tickets[0];
    let secret = secret.as_ref().expect("a rotating ticket's secret");
    let (_, scanner) = provision(app, "rot", "Main").await;
    let now = chrono::Utc::now().timestamp() as u64;

    // The bare static code (a screenshot of the code without its moving part).
    let (s, v) = scan(app, &scanner, "rot", code, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (400, Some("INVALID_CODE"), Some("missing_totp")),
        "{v}"
    );
    // A TOTP of an hour ago, and one of two minutes ahead.
    for at in [now - 3600, now + 120] {
        let text = booking::tickets::code::rotating_text(code, secret, at);
        let (s, v) = scan(app, &scanner, "rot", &text, "in", None).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (409, Some("CODE_EXPIRED")),
            "{at}: {v}"
        );
        assert_eq!(v["ticket"]["id"], id.as_str());
    }
    assert_eq!(door_state(app, id).await, (false, 0));
    // The current one enters (the door accepts a step either side, so a second's skew between
    // the test and booking cannot matter).
    let text = booking::tickets::code::rotating_text(code, secret, now);
    let (s, v) = scan(app, &scanner, "rot", &text, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    assert_eq!(v["ticket"]["tier"], "FLOOR");
    assert_eq!(door_state(app, id).await, (true, 1));
    env.app.stop().await;
}

#[tokio::test]
async fn reentry_only_where_the_event_allows_it() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let mut body = small_event("ev", 1, 4, 5, 1);
    body["reentry"] = json!(true);
    let created = create_event(app, &body).await;
    assert_eq!(
        (&created["reentry"], &created["transfers"]),
        (&json!(true), &json!(true))
    );
    let (s, read) = json(app.admin_get("/admin/events/ev").await).await;
    assert_eq!(
        (s, &read["reentry"], &read["transfers"]),
        (200, &json!(true), &json!(true))
    );
    let plain = create_event(app, &small_event("plain", 1, 1, 1, 1)).await;
    assert_eq!(
        (&plain["reentry"], &plain["transfers"]),
        (&json!(false), &json!(true))
    );

    let (_, codes) = paid_seats(&env, "ev", "alice", &["S1-R1-1"]).await;
    let (ticket, code) = &codes[0];
    let (_, scanner) = provision(app, "ev", "A").await;
    for (direction, result) in [
        ("in", "ENTRY"),
        ("out", "EXIT"),
        ("in", "ENTRY"),
        ("out", "EXIT"),
    ] {
        let (s, v) = scan(app, &scanner, "ev", code, direction, None).await;
        assert_eq!(
            (s, v["result"].as_str()),
            (200, Some(result)),
            "{direction}: {v}"
        );
    }
    assert_eq!(door_state(app, ticket).await, (false, 2));
    // Re-entry switched off (and transfers, which the door does not use yet).
    let (s, v) = admin(
        app,
        "PATCH",
        "/admin/events/ev",
        ADMIN_TOKEN,
        Some(&json!({"reentry": false, "transfers": false})),
    )
    .await;
    assert_eq!(
        (s, &v["reentry"], &v["transfers"]),
        (200, &json!(false), &json!(false)),
        "{v}"
    );
    let (s, v) = scan(app, &scanner, "ev", code, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("REENTRY_NOT_ALLOWED")),
        "{v}"
    );
    assert_eq!(door_state(app, ticket).await, (false, 2));
    env.app.stop().await;
}

#[tokio::test]
async fn bad_scan_requests_are_refused_and_change_nothing() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, &small_event("ev", 1, 4, 5, 1)).await;
    let (_, codes) = paid_seats(&env, "ev", "alice", &["S1-R1-1"]).await;
    let (ticket, code) = &codes[0];
    let (_, scanner) = provision(app, "ev", "A").await;
    let url = app.url("/api/checkin/ev/scans");
    let bodies = [
        (
            "unknown field",
            json!({"code": code, "direction": "in", "gate": "X"}).to_string(),
            0,
        ),
        (
            "bad direction",
            json!({"code": code, "direction": "sideways"}).to_string(),
            0,
        ),
        ("no direction", json!({"code": code}).to_string(), 0),
        ("no code", json!({"direction": "in"}).to_string(), 0),
        (
            "code not a string",
            json!({"code": 7, "direction": "in"}).to_string(),
            0,
        ),
        ("not JSON", "code=1".to_owned(), 0),
        (
            "empty scan_id",
            json!({"code": code, "direction": "in", "scan_id": ""}).to_string(),
            422,
        ),
        (
            "long scan_id",
            json!({"code": code, "direction": "in", "scan_id": "s".repeat(129)}).to_string(),
            422,
        ),
        (
            "scan_id with a space",
            json!({"code": code, "direction": "in", "scan_id": "a b"}).to_string(),
            422,
        ),
        (
            "huge",
            json!({"code": "x".repeat(10_000), "direction": "in"}).to_string(),
            413,
        ),
    ];
    for (what, body, status) in bodies {
        let (s, v) = answer(
            app.client
                .post(&url)
                .bearer_auth(&scanner)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("scan"),
        )
        .await;
        if status == 0 {
            assert!((400..500).contains(&s) && s != 404, "{what}: {s} {v}");
        } else {
            assert_eq!(s, status, "{what}: {v}");
        }
        assert!(v["code"].is_string(), "{what}: {v}");
    }
    let (s, v) = answer(
        app.client
            .post(&url)
            .bearer_auth(&scanner)
            .header("content-type", "text/plain")
            .body(json!({"code": code, "direction": "in"}).to_string())
            .send()
            .await
            .expect("scan"),
    )
    .await;
    assert_eq!(s, 415, "{v}");
    assert_eq!(checkins(app).await, 0);
    assert_eq!(door_state(app, ticket).await, (false, 0));
    // And the ticket still enters afterwards, whatever the device's clock says: its time is
    // kept as information, the server's decides and orders.
    let (s, v) = answer(
        app.client
            .post(&url)
            .bearer_auth(&scanner)
            .json(&json!({"code": code, "direction": "in", "scanned_at": "2001-01-01T00:00:00Z"}))
            .send()
            .await
            .expect("scan"),
    )
    .await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    let (device, received): (
        Option<chrono::DateTime<chrono::Utc>>,
        chrono::DateTime<chrono::Utc>,
    ) = sqlx::query_as("SELECT device_time, received_at FROM checkins")
        .fetch_one(&app.pool)
        .await
        .expect("the one row");
    assert_eq!(
        device.map(|d| d.to_rfc3339()).as_deref(),
        Some("2001-01-01T00:00:00+00:00")
    );
    assert!(
        (chrono::Utc::now() - received).num_seconds().abs() < 300,
        "{received}"
    );
    assert_eq!(v["ticket"]["at"], json!(received));
    env.app.stop().await;
}
