//! Scanners: provisioned, listed and revoked through the admin API; a scanner credential opens
//! only its own event's scans, and failed checks share the admin API's lockout.

use super::*;
use crate::events::{create_event, small_event};

#[tokio::test]
async fn scanners_are_issued_once_listed_without_secret_and_revoked_at_once() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, &small_event("ev", 1, 4, 5, 1)).await;
    let (_, code) = paid_seats(&env, "ev", "alice", &["S1-R1-1"])
        .await
        .1
        .remove(0);

    let resp = app
        .client
        .post(app.url("/admin/events/ev/scanners"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .json(&json!({"gate": " North 1 "}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let created: Value = resp.json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let credential = created["credential"]
        .as_str()
        .expect("credential")
        .to_owned();
    assert!(
        credential.starts_with("fgsc_") && credential.len() == 48,
        "{credential}"
    );
    assert_eq!(created["gate"], "North 1");
    assert_eq!(created["event"], "ev");
    let created_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["created_at"].clone()).expect("created_at");
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["expires_at"].clone()).expect("expires_at");
    let ttl = expires_at - created_at;
    assert!(
        (ttl - chrono::Duration::hours(24)).num_seconds().abs() < 60,
        "24 hours by default: {ttl}"
    );
    // Only the hash is stored.
    let stored: Vec<u8> = sqlx::query_scalar("SELECT hash FROM credentials WHERE id = $1")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .expect("row");
    assert_eq!(stored, shared::credentials::hash(&credential).to_vec());

    // A viewer lists; the list never shows a credential. A viewer cannot provision.
    let (_, viewer) = crate::operators::issue(app, "door viewer", "viewer").await;
    let (s, list) = admin(app, "GET", "/admin/events/ev/scanners", &viewer, None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["scanners"].as_array().expect("list").len(), 1);
    assert_eq!(list["scanners"][0]["status"], "active");
    assert_eq!(list["scanners"][0]["gate"], "North 1");
    assert_eq!(list["scanners"][0]["created_by"], "bootstrap");
    assert!(!list.to_string().contains(&credential[5..]));
    assert!(list["scanners"][0].get("credential").is_none());
    let (s, v) = admin(
        app,
        "POST",
        "/admin/events/ev/scanners",
        &viewer,
        Some(&json!({"gate": "X"})),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (403, Some("ROLE_FORBIDDEN")),
        "{v}"
    );
    // Unknown event, bad gate, bad expiry: refused, nothing written.
    for (path, body, status) in [
        ("/admin/events/nope/scanners", json!({"gate": "A"}), 404),
        ("/admin/events/ev/scanners", json!({"gate": "   "}), 422),
        (
            "/admin/events/ev/scanners",
            json!({"gate": "g".repeat(65)}),
            422,
        ),
        (
            "/admin/events/ev/scanners",
            json!({"gate": "A", "expires_at": "2020-01-01T00:00:00Z"}),
            422,
        ),
        (
            "/admin/events/ev/scanners",
            json!({"gate": "A", "expires_at": (chrono::Utc::now() + chrono::Duration::days(8)).to_rfc3339()}),
            422,
        ),
        (
            "/admin/events/ev/scanners",
            json!({"gate": "A", "role": "admin"}),
            422,
        ),
    ] {
        let (s, v) = admin(app, "POST", path, ADMIN_TOKEN, Some(&body)).await;
        assert!(
            s == status || (status == 422 && s == 400),
            "{path} {body}: {s} {v}"
        );
    }
    let (s, _) = admin(app, "GET", "/admin/events/nope/scanners", &viewer, None).await;
    assert_eq!(s, 404);
    let scanners: i64 =
        sqlx::query_scalar("SELECT count(*) FROM credentials WHERE kind = 'scanner'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(scanners, 1);
    let entries = audited(app, "scanner.create").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].0, "bootstrap");
    assert_eq!(entries[0].1, format!("scanner:{id}"));
    assert_eq!(entries[0].2.as_deref(), Some("ev"));
    assert!(
        !entries[0].3.to_string().contains(&credential[5..]),
        "never the secret"
    );

    // It scans; revoked, its very next scan is refused. Revoking again changes nothing.
    let (s, v) = scan(app, &credential, "ev", &code, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    let (s, _) = admin(
        app,
        "DELETE",
        &format!("/admin/events/ev/scanners/{id}"),
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 204);
    let (s, v) = scan(app, &credential, "ev", &code, "out", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (401, Some("UNAUTHORIZED"), Some("revoked")),
        "{v}"
    );
    let (s, _) = admin(
        app,
        "DELETE",
        &format!("/admin/events/ev/scanners/{id}"),
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 204);
    assert_eq!(
        audited(app, "scanner.revoke").await.len(),
        1,
        "audited once"
    );
    let (s, _) = admin(
        app,
        "DELETE",
        "/admin/events/ev/scanners/sc_nope",
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(s, 404);
    let (s, list) = admin(app, "GET", "/admin/events/ev/scanners", &viewer, None).await;
    assert_eq!(s, 200);
    assert_eq!(list["scanners"][0]["status"], "revoked");
    assert_eq!(list["scanners"][0]["revoked_by"], "bootstrap");
    // The refused scan changed nothing: the ticket is still inside.
    assert_eq!(door_state(app, &entries_ticket(app).await).await, (true, 1));
    env.app.stop().await;
}

/// The one ticket that entered.
async fn entries_ticket(app: &TestApp) -> String {
    sqlx::query_scalar("SELECT ticket_id FROM checkins WHERE result = 'ENTRY'")
        .fetch_one(&app.pool)
        .await
        .expect("one entry")
}

#[tokio::test]
async fn a_scanner_credential_opens_only_its_own_events_scans() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, &small_event("ev", 1, 4, 5, 1)).await;
    create_event(app, &small_event("other", 1, 4, 5, 1)).await;
    let (_, codes) = paid_seats(&env, "ev", "alice", &["S1-R1-1"]).await;
    let code = &codes[0].1;
    let (_, scanner) = provision(app, "ev", "A").await;
    let (expired_id, expired) = provision(app, "ev", "B").await;
    sqlx::query("UPDATE credentials SET expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(&expired_id)
        .execute(&app.pool)
        .await
        .expect("expire");
    let (_, operator) = crate::operators::issue(app, "door admin", "admin").await;
    let unknown = format!("fgsc_{}", "A".repeat(43));

    let path = "/api/checkin/ev/scans";
    let body = json!({"code": code, "direction": "in"});
    for (what, bearer, status, code_, reason) in [
        (
            "expired",
            Some(expired.as_str()),
            401,
            "UNAUTHORIZED",
            Some("expired"),
        ),
        (
            "unknown",
            Some(unknown.as_str()),
            401,
            "UNAUTHORIZED",
            Some("unknown"),
        ),
        (
            "malformed",
            Some("fgsc_short"),
            401,
            "UNAUTHORIZED",
            Some("malformed"),
        ),
        ("missing", None, 401, "UNAUTHORIZED", Some("missing")),
        (
            "operator",
            Some(operator.as_str()),
            403,
            "WRONG_CREDENTIAL_TYPE",
            None,
        ),
        (
            "bootstrap",
            Some(ADMIN_TOKEN),
            403,
            "WRONG_CREDENTIAL_TYPE",
            None,
        ),
    ] {
        let mut req = app.client.post(app.url(path)).json(&body);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        let (s, v) = answer(req.send().await.expect("scan")).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (status, Some(code_)),
            "{what}: {v}"
        );
        assert_eq!(v["reason"].as_str(), reason, "{what}: {v}");
    }
    // Another event's scan route: WRONG_EVENT, whatever the code.
    let (s, v) = scan(app, &scanner, "other", code, "in", None).await;
    assert_eq!((s, v["code"].as_str()), (403, Some("WRONG_EVENT")), "{v}");
    // A scanner credential on the admin API, even its own event's scanners.
    for p in ["/admin/events/ev/scanners", "/admin/audit"] {
        let (s, v) = admin(app, "GET", p, &scanner, None).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (403, Some("WRONG_CREDENTIAL_TYPE")),
            "{p}: {v}"
        );
    }
    // Nothing was decided, nothing logged, and the refusals are counted.
    assert_eq!(checkins(app).await, 0);
    assert_eq!(door_state(app, &codes[0].0).await, (false, 0));
    let metrics = app.metrics_text().await;
    for reason in ["expired", "unknown", "malformed", "missing", "wrong_type"] {
        assert!(
            metrics.contains(&format!(
                "scanner_auth_failures_total{{reason=\"{reason}\"}}"
            )),
            "{reason} not counted"
        );
    }
    // And the right one scans.
    let (s, v) = scan(app, &scanner, "ev", code, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    env.app.stop().await;
}

#[tokio::test]
async fn failed_scanner_checks_share_the_admin_lockout() {
    let app = TestApp::spawn_with(|c| c.booking.admin_auth_failures_per_ip_per_min = 5).await;
    crate::helpers::ensure_event(&app, "ev").await;
    let (_, scanner) = provision(&app, "ev", "A").await;
    for i in 0..5 {
        let guess = format!("fgsc_{:0>43}", i);
        let (s, _) = scan(&app, &guess, "ev", "x", "in", None).await;
        assert_eq!(s, 401);
    }
    let (s, v) = scan(&app, &scanner, "ev", "x", "in", None).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (429, Some("TOO_MANY_FAILED_LOGINS")),
        "{v}"
    );
    // The admin API from the same address waits too: one budget.
    let (s, _) = admin(&app, "GET", "/admin/audit", ADMIN_TOKEN, None).await;
    assert_eq!(s, 429);
    assert_eq!(checkins(&app).await, 0);
    app.stop().await;
}
