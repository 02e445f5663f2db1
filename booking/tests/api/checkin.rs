//! The door (issue 44, first part): scanners provisioned, listed and revoked through the
//! admin API; online scans answered ENTRY/EXIT or refused with their codes; each ticket enters
//! exactly once under hundreds of simultaneous scans at many gates (checked in the database);
//! a replayed `scan_id` answers the first answer and writes nothing; bad input changes
//! nothing. Real booking, real sandbox provider, real Postgres, real HTTP; tickets are bought
//! and paid through the API and their codes fetched as a fan does.
//!
//! Layout: `scanners` (provisioning and the credential), `answers` (each answer of the door,
//! rotating codes, re-entry, bad input), `races` (hundreds of simultaneous scans, replays);
//! offline: `snapshot` (contents, access, the cursor under concurrent writers), `offline`
//! (batch uploads: conflicts, replays, revoked scanners, bad input, races with online scans),
//! `offline_kit` (their helpers).

mod answers;
mod offline;
mod offline_kit;
mod races;
mod scanners;
mod snapshot;

use crate::helpers::{ADMIN_TOKEN, TestApp, json};
use crate::payments::{PayEnv, pay};
use crate::tickets::login;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};

/// Provisions a scanner of `event` at `gate` with the bootstrap secret; (id, credential).
pub(super) async fn provision(app: &TestApp, event: &str, gate: &str) -> (String, String) {
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
pub(super) async fn admin(
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
pub(super) async fn answer(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    if text.is_empty() {
        return (status, Value::Null);
    }
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON ({status}): {text}"));
    (status, v)
}

/// `POST /api/checkin/{event}/scans` with `credential`.
pub(super) async fn scan(
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
pub(super) async fn scan_raw(
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
pub(super) async fn order_codes(
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
pub(super) async fn paid_seats(
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
pub(super) async fn paid_ga(
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
pub(super) async fn checkins(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM checkins")
        .fetch_one(&app.pool)
        .await
        .expect("checkins")
}

/// A ticket's door state: (inside, entries).
pub(super) async fn door_state(app: &TestApp, ticket: &str) -> (bool, i32) {
    sqlx::query_as("SELECT inside, entries FROM tickets WHERE id = $1")
        .bind(ticket)
        .fetch_one(&app.pool)
        .await
        .expect("ticket")
}

/// Audit entries of `action`.
pub(super) async fn audited(
    app: &TestApp,
    action: &str,
) -> Vec<(String, String, Option<String>, Value)> {
    sqlx::query_as(
        "SELECT actor, target, event_id, detail FROM ops_audit WHERE action = $1 ORDER BY id",
    )
    .bind(action)
    .fetch_all(&app.pool)
    .await
    .expect("audit")
}
