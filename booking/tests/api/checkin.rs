//! The door (issue 44, first part): scanners provisioned, listed and revoked through the
//! admin API; online scans answered ENTRY/EXIT or refused with their codes; each ticket enters
//! exactly once under hundreds of simultaneous scans at many gates (checked in the database);
//! a replayed `scan_id` answers the first answer and writes nothing; bad input changes
//! nothing. Real booking, real sandbox provider, real Postgres, real HTTP; tickets are bought
//! and paid through the API and their codes fetched as a fan does.

use crate::events::{create_event, small_event};
use crate::helpers::{ADMIN_TOKEN, TestApp, json};
use crate::payments::{PayEnv, pay};
use crate::tickets::login;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// Provisions a scanner of `event` at `gate` with the bootstrap secret; (id, credential).
async fn provision(app: &TestApp, event: &str, gate: &str) -> (String, String) {
    let (s, v) = admin(
        app,
        "POST",
        &format!("/admin/events/{event}/scanners"),
        ADMIN_TOKEN,
        Some(&json!({"gate": gate})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    (
        v["id"].as_str().expect("id").to_owned(),
        v["credential"].as_str().expect("credential").to_owned(),
    )
}

/// An admin call with `bearer` (the bootstrap secret names its operator, `lead`).
async fn admin(
    app: &TestApp,
    method: &str,
    path: &str,
    bearer: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = app
        .client
        .request(method, app.url(path))
        .bearer_auth(bearer)
        .header("X-Floodgate-Actor", "lead");
    if let Some(b) = body {
        req = req.json(b);
    }
    answer(req.send().await.expect("admin call")).await
}

/// Status and JSON body (`null` for an empty one).
async fn answer(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    if text.is_empty() {
        return (status, Value::Null);
    }
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON ({status}): {text}"));
    (status, v)
}

/// `POST /api/checkin/{event}/scans` with `credential`.
async fn scan(
    app: &TestApp,
    credential: &str,
    event: &str,
    code: &str,
    direction: &str,
    scan_id: Option<&str>,
) -> (u16, Value) {
    let (s, v, _) = scan_raw(app, credential, event, code, direction, scan_id).await;
    (s, v)
}

/// [`scan`], also saying whether the answer was a replay.
async fn scan_raw(
    app: &TestApp,
    credential: &str,
    event: &str,
    code: &str,
    direction: &str,
    scan_id: Option<&str>,
) -> (u16, Value, bool) {
    let mut body = json!({"code": code, "direction": direction});
    if let Some(id) = scan_id {
        body["scan_id"] = json!(id);
    }
    let resp = app
        .client
        .post(app.url(&format!("/api/checkin/{event}/scans")))
        .bearer_auth(credential)
        .json(&body)
        .send()
        .await
        .expect("scan");
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let (s, v) = answer(resp).await;
    (s, v, replayed)
}

/// The fan's tickets of `order`: (ticket id, code, rotating secret).
async fn order_codes(
    app: &TestApp,
    account: &str,
    order: &str,
) -> Vec<(String, String, Option<Vec<u8>>)> {
    let resp = app
        .client
        .get(app.url(&format!("/api/orders/{order}/tickets")))
        .bearer_auth(login(account))
        .send()
        .await
        .expect("tickets");
    let (s, v) = json(resp).await;
    assert_eq!(s, 200, "{v}");
    v["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().expect("id").to_owned(),
                t["code"]
                    .as_str()
                    .expect("a valid ticket's code")
                    .to_owned(),
                t["rotating_secret"]
                    .as_str()
                    .map(|s| B64.decode(s).expect("base64url")),
            )
        })
        .collect()
}

/// Buys `seats` of `event` for `account` and pays; (order id, [(ticket id, code)]).
async fn paid_seats(
    env: &PayEnv,
    event: &str,
    account: &str,
    seats: &[&str],
) -> (String, Vec<(String, String)>) {
    let o = crate::helpers::order_seats(&env.app, event, account, seats).await;
    let key = format!("pay-{}", o.order_id);
    let (s, v) = pay(&env.app, &o.token, &o.order_id, &key, "pm_card_visa").await;
    assert_eq!(s, 200, "{v}");
    let codes = order_codes(&env.app, account, &o.order_id)
        .await
        .into_iter()
        .map(|(id, code, _)| (id, code))
        .collect();
    (o.order_id, codes)
}

/// Buys `quantity` GA units of `event` for `account` and pays; the tickets' codes.
async fn paid_ga(
    env: &PayEnv,
    event: &str,
    account: &str,
    quantity: i32,
) -> Vec<(String, String, Option<Vec<u8>>)> {
    let (token, order) = crate::helpers::order_ga(&env.app, event, account, quantity).await;
    let (s, v) = pay(
        &env.app,
        &token,
        &order,
        &format!("pay-{event}"),
        "pm_card_visa",
    )
    .await;
    assert_eq!(s, 200, "{v}");
    order_codes(&env.app, account, &order).await
}

/// Scan rows logged, in all.
async fn checkins(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM checkins")
        .fetch_one(&app.pool)
        .await
        .expect("checkins")
}

/// A ticket's door state: (inside, entries).
async fn door_state(app: &TestApp, ticket: &str) -> (bool, i32) {
    sqlx::query_as("SELECT inside, entries FROM tickets WHERE id = $1")
        .bind(ticket)
        .fetch_one(&app.pool)
        .await
        .expect("ticket")
}

/// Audit entries of `action`.
async fn audited(app: &TestApp, action: &str) -> Vec<(String, String, Option<String>, Value)> {
    sqlx::query_as(
        "SELECT actor, target, event_id, detail FROM ops_audit WHERE action = $1 ORDER BY id",
    )
    .bind(action)
    .fetch_all(&app.pool)
    .await
    .expect("audit")
}

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
    // Another scanner's scan-1 is its own scan.
    let (s, v) = scan(app, &second, "ev", code, "in", Some("scan-1")).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    assert_eq!(door_state(app, a).await, (true, 2));
    assert_eq!(checkins(app).await, 4);
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
    // And the ticket still enters afterwards.
    let (s, v) = scan(app, &scanner, "ev", code, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");
    env.app.stop().await;
}
