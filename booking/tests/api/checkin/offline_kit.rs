//! Helpers of the offline tests: tickets written straight into Postgres (thousands, without
//! paying for each) with codes signed by the app's own keys, the snapshot and batch calls, and
//! a scanner's local copy of the snapshot that applies increments by ticket id.

use super::*;
use booking::tickets::code::TicketClaims;
use std::collections::BTreeMap;
use std::io::Read;

/// Issues `n` GA tickets (`FLOOR`) of `event` with ids `{prefix}{i}` in one statement; their
/// codes, signed as booking signs them (version 1).
pub(super) async fn seed(
    app: &TestApp,
    event: &str,
    prefix: &str,
    n: usize,
) -> Vec<(String, String)> {
    let ids = seed_rows(&app.pool, event, prefix, n).await;
    let rotating: bool =
        sqlx::query_scalar("SELECT ticket_code = 'rotating' FROM events WHERE id = $1")
            .bind(event)
            .fetch_one(&app.pool)
            .await
            .expect("event");
    ids.into_iter()
        .map(|id| {
            let code = sign(app, event, &id, 1, rotating);
            (id, code)
        })
        .collect()
}

/// Inserts the ticket rows only (no codes); their ids. Ids look like booking's (`tkt_` and 26
/// characters), so byte counts are realistic.
pub(super) async fn seed_rows(
    pool: &sqlx::PgPool,
    event: &str,
    prefix: &str,
    n: usize,
) -> Vec<String> {
    let ids: Vec<String> = (0..n)
        .map(|i| format!("tkt_{prefix}{i:0>w$}", w = 26 - prefix.len()))
        .collect();
    sqlx::query(
        "INSERT INTO tickets (id, event_id, ga_tier, order_id, account_id, holder_account)
         SELECT id, $2, 'FLOOR', 'ord_seed', 'seed', 'seed' FROM unnest($1::text[]) AS id",
    )
    .bind(&ids)
    .bind(event)
    .execute(pool)
    .await
    .expect("seed tickets");
    ids
}

/// A code of `ticket` at `ver`, signed with the app's keys.
pub(super) fn sign(app: &TestApp, event: &str, ticket: &str, ver: i32, rot: bool) -> String {
    let keys = app.config.tickets.keys().expect("ticket keys");
    keys.sign(&TicketClaims {
        tid: ticket.into(),
        evt: event.into(),
        seat: None,
        tier: Some("FLOOR".into()),
        hnd: "h".into(),
        ver,
        iat: 1_800_000_000,
        rot: rot.then_some(true),
    })
}

/// Voids `ticket` as a refund does (reason, time, a new version).
pub(super) async fn void(pool: &sqlx::PgPool, ticket: &str) {
    sqlx::query(
        "UPDATE tickets SET voided_at = now(), void_reason = 'refunded', version = version + 1
          WHERE id = $1",
    )
    .bind(ticket)
    .execute(pool)
    .await
    .expect("void");
}

/// `GET /api/checkin/{event}/snapshot[?since=]`: status, JSON (decoded from gzip when asked
/// for it), the bytes on the wire and the response headers.
pub(super) async fn snapshot_raw(
    app: &TestApp,
    credential: &str,
    event: &str,
    since: Option<&str>,
    gzip: bool,
) -> (u16, Value, usize, reqwest::header::HeaderMap) {
    let mut req = app
        .client
        .get(app.url(&format!("/api/checkin/{event}/snapshot")))
        .bearer_auth(credential);
    if let Some(c) = since {
        req = req.query(&[("since", c)]);
    }
    if gzip {
        req = req.header("Accept-Encoding", "gzip");
    }
    let resp = req.send().await.expect("snapshot");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("body");
    let plain = if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .expect("gunzip");
        out
    } else {
        bytes.to_vec()
    };
    let v = serde_json::from_slice(&plain).unwrap_or(Value::Null);
    (status, v, bytes.len(), headers)
}

/// The snapshot as JSON, asserting `200`.
pub(super) async fn snapshot(
    app: &TestApp,
    credential: &str,
    event: &str,
    since: Option<&str>,
) -> Value {
    let (s, v, _, _) = snapshot_raw(app, credential, event, since, false).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// One offline decision as the scanner uploads it.
pub(super) fn offline(scan_id: &str, code: &str, direction: &str, decided: &str) -> Value {
    json!({"scan_id": scan_id, "code": code, "direction": direction,
           "scanned_at": chrono::Utc::now(), "decided": decided})
}

/// `POST /api/checkin/{event}/scans:batch`.
pub(super) async fn upload(
    app: &TestApp,
    credential: &str,
    event: &str,
    scans: &[Value],
) -> (u16, Value) {
    upload_body(app, credential, event, &json!({ "scans": scans })).await
}

pub(super) async fn upload_body(
    app: &TestApp,
    credential: &str,
    event: &str,
    body: &Value,
) -> (u16, Value) {
    let resp = app
        .client
        .post(app.url(&format!("/api/checkin/{event}/scans:batch")))
        .bearer_auth(credential)
        .json(body)
        .send()
        .await
        .expect("upload");
    answer(resp).await
}

/// A scanner's local copy: ticket id → its latest row (`tickets` row, or `["voided", reason]`).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Local(pub BTreeMap<String, Value>);

impl Local {
    /// Applies a snapshot: a full one replaces, an increment overwrites by id.
    pub(super) fn apply(&mut self, snap: &Value) {
        if snap["full"] == true {
            self.0.clear();
        }
        for row in snap["tickets"].as_array().expect("tickets") {
            let id = row[0].as_str().expect("id").to_owned();
            self.0.insert(id, row.clone());
        }
        for row in snap["voided"].as_array().expect("voided") {
            let id = row[0].as_str().expect("id").to_owned();
            self.0.insert(id, json!(["voided", row[1]]));
        }
    }
}
