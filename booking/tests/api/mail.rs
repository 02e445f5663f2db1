//! Tickets by e-mail (issue 43): real booking, the real payment sandbox, Postgres, Redis and
//! the SMTP sink (`FLOODGATE_TEST_SMTP_URL`, `FLOODGATE_TEST_MAIL_VIEW_URL`). Each test mails
//! its own random addresses, so tests sharing the one sink never see each other's mail.
//!
//! What is checked: one message per paid order, whose QR codes decode (zbarimg) to the
//! ticket's current code; the Message-ID is the same when a crash makes a message go twice;
//! racing senders send each delivery once; 4xx retries, 5xx is dead at once; no `[mail]`
//! leaves deliveries pending; the address appears nowhere but `order_contacts`; bad
//! addresses create nothing; the resend limit; retention and forget.

use crate::helpers::{ADMIN_TOKEN, TestApp, json};
use crate::payments::{PayEnv, pay};
use booking::outbox::{self, delivery};
use booking::tickets::TicketSettings;
use booking::tickets::mail::sender::{self, Attempt, Outcome};
use booking::tickets::mail::{MailSettings, StartTls};
use serde_json::{Value, json};
use shared::config::IdentitySettings;
use shared::identity::IdentityVerifier;
use std::collections::HashMap;
use std::time::Duration;
use testkit::mail::{Mailbox, Message, unique_address, zbar_decode};

const FROM_DOMAIN: &str = "floodgate.test";

/// The sink (`testkit::mail`), or `None` (after failing under CI) when the tests were not
/// given one.
fn sink() -> Option<(String, Mailbox)> {
    if std::env::var_os("FLOODGATE_TEST_SMTP_URL").is_none() {
        let msg = "FLOODGATE_TEST_SMTP_URL is not set: run the tests with `deploy/stack test` \
                   (it starts the SMTP server)";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPED a mail test: {msg}\n");
        return None;
    }
    Some((testkit::mail::smtp_url(), Mailbox::from_env()))
}

fn mail_settings(url: &str) -> MailSettings {
    MailSettings {
        smtp_url: Some(url.to_owned()),
        from: Some(format!("Floodgate Tickets <tickets@{FROM_DOMAIN}>")),
        starttls: StartTls::Off,
        timeout_ms: 5_000,
        // Retries due at once: the tests drive the sender by hand.
        backoff_base_s: 0,
        ..Default::default()
    }
}

pub(crate) async fn spawn(adjust: impl FnOnce(&mut MailSettings)) -> Option<(PayEnv, Mailbox)> {
    let (url, mailbox) = sink()?;
    let mut settings = mail_settings(&url);
    adjust(&mut settings);
    let env = PayEnv::spawn_with(move |c| c.mail = settings, |_| {}).await;
    Some((env, mailbox))
}

pub(crate) fn address(kind: &str) -> String {
    unique_address(&format!("{kind}-"))
}

fn login(account: &str) -> String {
    IdentityVerifier::new(&IdentitySettings {
        dev_login: true,
        ..IdentitySettings::default()
    })
    .expect("identity settings")
    .dev_mint(account, chrono::Utc::now().timestamp())
    .expect("dev mint")
}

async fn create_event(app: &TestApp, event: &str, extra: Value) {
    let mut body = crate::events::small_event(event, 2, 5, 10, 1);
    if let (Value::Object(b), Value::Object(x)) = (&mut body, extra) {
        b.extend(x);
    }
    crate::events::create_event(app, &body).await;
}

/// Holds `seats` and orders them with `email` (raw JSON value, so tests can send anything).
pub(crate) async fn order_with(
    app: &TestApp,
    event: &str,
    account: &str,
    seats: &[&str],
    email: Value,
) -> (u16, Value, String) {
    let token = app.admission(account, event);
    let (status, hold) = json(
        app.post(
            &format!("/api/events/{event}/holds"),
            &token,
            &json!({ "seats": seats }),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let mut body = json!({ "hold_id": hold["hold_id"] });
    if !email.is_null() {
        body["email"] = email;
    }
    let (status, order) = json(
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header(
                "Idempotency-Key",
                format!("order-{}", shared::ids::new_id()),
            )
            .json(&body)
            .send()
            .await
            .expect("request"),
    )
    .await;
    (status, order, token)
}

/// An order of `seats` with `email`, paid, its `order.paid` relayed and consumed (the mail
/// row queued). Returns the order id.
pub(crate) async fn paid_order(
    env: &PayEnv,
    event: &str,
    account: &str,
    seats: &[&str],
    email: &str,
) -> String {
    let (status, order, token) = order_with(&env.app, event, account, seats, json!(email)).await;
    assert_eq!(status, 201, "{order}");
    let id = order["id"].as_str().expect("order id").to_owned();
    let (status, v) = pay(&env.app, &token, &id, &format!("pay-{id}"), "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    deliver(&env.app).await;
    id
}

pub(crate) async fn deliver(app: &TestApp) {
    outbox::relay_all(&app.state.outbox).await.expect("relay");
    delivery::consume_once(&app.state.outbox, "mail-test")
        .await
        .expect("consume");
}

pub(crate) async fn send_until_idle(app: &TestApp) -> Vec<Outcome> {
    let mut all = Vec::new();
    loop {
        let got = sender::send_once(&app.state.mail).await.expect("send pass");
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

async fn rows(app: &TestApp, order: &str) -> Vec<(String, String, i32, Option<String>)> {
    sqlx::query_as(
        "SELECT kind, state, attempts, last_error FROM mail_deliveries WHERE order_id = $1 ORDER BY id",
    )
    .bind(order)
    .fetch_all(&app.pool)
    .await
    .expect("mail rows")
}

async fn paid_event_id(app: &TestApp, order: &str) -> String {
    sqlx::query_scalar(
        "SELECT event_id FROM outbox WHERE topic = 'order.paid' AND aggregate_id = $1",
    )
    .bind(order)
    .fetch_one(&app.pool)
    .await
    .expect("order.paid event")
}

/// The parts of a message by MIME type (`text/plain`, `text/html`, `image/png` → each
/// part's decoded bytes).
pub(crate) fn parts(m: &Message) -> HashMap<String, Vec<Vec<u8>>> {
    let parsed = m.parsed();
    let mut out: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    if let Some(text) = parsed.text {
        out.entry("text/plain".into())
            .or_default()
            .push(text.into_bytes());
    }
    if let Some(html) = parsed.html {
        out.entry("text/html".into())
            .or_default()
            .push(html.into_bytes());
    }
    for part in parsed.parts {
        out.entry(part.content_type).or_default().push(part.bytes);
    }
    out
}

async fn fan_codes(app: &TestApp, account: &str, order: &str) -> HashMap<String, String> {
    let (status, body) = json(
        app.get(&format!("/api/orders/{order}/tickets"), &login(account))
            .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().expect("id").to_owned(),
                t["code"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_paid_order_gets_one_message_whose_qr_codes_are_its_tickets() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(
        app,
        "mail-ev",
        json!({
            "starts_at": "2031-05-01T19:00:00+09:00", "timezone": "Asia/Tokyo",
            "venue_address": "1-1 Chiyoda, Tokyo"
        }),
    )
    .await;
    let to = address("fan");
    let order = paid_order(&env, "mail-ev", "alice", &["S1-R1-1", "S1-R1-2"], &to).await;
    assert_eq!(send_until_idle(app).await, vec![Outcome::Sent]);

    let got = mailbox.wait_for(&to, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    let event_id = paid_event_id(app, &order).await;
    assert_eq!(
        m.message_id.trim_matches(|c| c == '<' || c == '>'),
        format!("{event_id}.tickets@{FROM_DOMAIN}")
    );
    assert!(m.subject.contains("Test Event"), "{}", m.subject);
    let parts = parts(m);
    let text = String::from_utf8_lossy(&parts["text/plain"][0]).to_string();
    assert!(text.contains("Thursday 1 May 2031, 19:00 JST"), "{text}");
    assert!(text.contains("1-1 Chiyoda, Tokyo"), "{text}");
    let html = String::from_utf8_lossy(&parts["text/html"][0]).to_string();
    assert_eq!(html.matches("src=\"cid:").count(), 2, "{html}");
    let ics = String::from_utf8_lossy(&parts["text/calendar"][0]).to_string();
    assert!(ics.contains("DTSTART:20310501T100000Z"), "{ics}");
    assert!(ics.contains(&format!("UID:{order}@{FROM_DOMAIN}")), "{ics}");

    // Each QR decodes to the ticket's code exactly as the fan's own list shows it, and the
    // code verifies with booking's keys (the JWKS's).
    let codes = fan_codes(app, "alice", &order).await;
    assert_eq!(codes.len(), 2);
    let keys = TicketSettings::default().keys().expect("keys");
    let mut decoded = Vec::new();
    for png in &parts["image/png"] {
        let texts = zbar_decode(png);
        assert_eq!(texts.len(), 1, "one QR per image");
        let claims = keys.verify(&texts[0]).expect("a valid ticket code");
        assert_eq!(
            codes.get(&claims.tid),
            Some(&texts[0]),
            "the current code of {}",
            claims.tid
        );
        decoded.push(claims.tid);
    }
    decoded.sort();
    let mut ids: Vec<String> = codes.keys().cloned().collect();
    ids.sort();
    assert_eq!(decoded, ids);
    // Nothing more comes.
    assert!(send_until_idle(app).await.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mailbox.messages(&to).await.len(), 1);
    let r = rows(app, &order).await;
    assert_eq!(r, vec![("tickets".into(), "sent".into(), 1, None)]);
    assert!(
        app.metrics_text()
            .await
            .contains("ticket_mail_total{result=\"sent\"} 1")
    );
}

#[tokio::test]
async fn a_rotating_event_is_mailed_a_link_and_no_qr() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "rot-ev", json!({ "ticket_code": "rotating" })).await;
    let to = address("rot");
    let order = paid_order(&env, "rot-ev", "bob", &["S1-R1-1"], &to).await;
    assert_eq!(send_until_idle(app).await, vec![Outcome::Sent]);
    let got = mailbox.wait_for(&to, 1, Duration::from_secs(10)).await;
    let parts = parts(&got[0]);
    assert!(
        !parts.contains_key("image/png"),
        "no QR for a rotating event"
    );
    assert!(
        !parts.contains_key("text/calendar"),
        "no .ics without a start"
    );
    let link = format!("/e/rot-ev/tickets?order={order}");
    assert!(String::from_utf8_lossy(&parts["text/plain"][0]).contains(&link));
    assert!(String::from_utf8_lossy(&parts["text/html"][0]).contains(&link));
}

#[tokio::test]
async fn a_redelivered_event_and_a_crashed_sender_send_one_message_id() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "once-ev", json!({})).await;
    let to = address("once");
    let (status, order, token) = order_with(app, "once-ev", "carol", &["S1-R1-1"], json!(to)).await;
    assert_eq!(status, 201, "{order}");
    let order = order["id"].as_str().expect("id").to_owned();
    let (status, v) = pay(app, &token, &order, "pay-once", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    // The same order.paid entry handled twice (a consumer that died before XACK).
    outbox::relay_all(&app.state.outbox).await.expect("relay");
    let entries = delivery::read_batch(&app.state.outbox, "dies", 10)
        .await
        .expect("read");
    assert_eq!(entries.len(), 1);
    let first = delivery::handle(&app.state.outbox, "dies", &entries[0])
        .await
        .expect("handle");
    let again = delivery::handle(&app.state.outbox, "other", &entries[0])
        .await
        .expect("handle");
    assert_eq!(
        (first, again),
        (delivery::Handled::Delivered, delivery::Handled::Duplicate)
    );
    assert_eq!(rows(app, &order).await.len(), 1);

    // A sender claims it, SMTP accepts, and it dies before recording `sent`.
    let state = &app.state.mail;
    let mailer = state.mailer.clone().expect("mailer");
    let claimed = sender::claim(state, 10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let attempt = sender::send_claimed(state, &mailer, &claimed[0])
        .await
        .expect("send");
    assert!(matches!(attempt, Attempt::Accepted(_)), "{attempt:?}");
    // While its lease holds, no other sender takes the row.
    assert!(sender::send_once(state).await.expect("pass").is_empty());
    sqlx::query("UPDATE mail_deliveries SET lease_until = clock_timestamp() - interval '1 second' WHERE order_id = $1")
        .bind(&order)
        .execute(&app.pool)
        .await
        .expect("expire the lease");
    assert_eq!(send_until_idle(app).await, vec![Outcome::Sent]);
    // The dead sender's late outcome cannot overwrite the row it lost.
    let late = sender::process(state, &mailer, &claimed[0])
        .await
        .expect("late");
    assert_eq!(late, Outcome::Lost);
    let got = mailbox.wait_for(&to, 3, Duration::from_secs(10)).await;
    let event_id = paid_event_id(app, &order).await;
    assert!(
        got.iter()
            .all(|m| m.message_id.contains(&format!("{event_id}.tickets@"))),
        "every copy carries the one Message-ID: {:?}",
        got.iter().map(|m| &m.message_id).collect::<Vec<_>>()
    );
    let r = rows(app, &order).await;
    assert_eq!(r, vec![("tickets".into(), "sent".into(), 2, None)]);
}

#[tokio::test]
async fn racing_senders_send_each_of_200_deliveries_once() {
    let Some((env, mailbox)) = spawn(|s| {
        s.batch = 10;
        s.concurrency = 4;
    })
    .await
    else {
        return;
    };
    let app = &env.app;
    create_event(app, "race-ev", json!({})).await;
    let to = address("race");
    let order = paid_order(&env, "race-ev", "dave", &["S1-R1-1"], &to).await;
    // 199 more deliveries of the same order (as resends), 200 in all.
    sqlx::query(
        "INSERT INTO mail_deliveries (kind, key, order_id)
         SELECT 'resend', 'race-' || g, $1 FROM generate_series(1, 199) g",
    )
    .bind(&order)
    .execute(&app.pool)
    .await
    .expect("queue deliveries");
    let senders = (0..4).map(|_| send_until_idle(app));
    let outcomes: Vec<Outcome> = futures::future::join_all(senders)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(outcomes.len(), 200, "each row claimed once");
    assert!(outcomes.iter().all(|o| *o == Outcome::Sent), "{outcomes:?}");
    let sent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM mail_deliveries WHERE state = 'sent' AND attempts = 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(sent, 200);
    let got = mailbox.wait_for(&to, 200, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = if got.len() == 200 {
        mailbox.messages(&to).await
    } else {
        got
    };
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for m in &got {
        *by_id.entry(m.message_id.as_str()).or_default() += 1;
    }
    assert_eq!(got.len(), 200, "no message twice");
    assert_eq!(by_id.len(), 200);
    assert!(by_id.values().all(|&n| n == 1));
}

#[tokio::test]
async fn temporary_refusals_retry_and_permanent_ones_are_dead_at_once() {
    let Some((env, mailbox)) = spawn(|s| s.max_attempts = 5).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "fail-ev", json!({})).await;
    let slow = address("tempfail2");
    let slow_order = paid_order(&env, "fail-ev", "erin", &["S1-R1-1"], &slow).await;
    let gone = address("reject");
    let gone_order = paid_order(&env, "fail-ev", "frank", &["S1-R1-2"], &gone).await;

    let mut outcomes = send_until_idle(app).await;
    outcomes.sort_by_key(|o| o.label());
    // 451, 451 (pending again, due at once with no backoff), then 250; 550 dead at once.
    assert_eq!(
        outcomes,
        vec![Outcome::Dead, Outcome::Retry, Outcome::Retry, Outcome::Sent]
    );
    assert_eq!(
        rows(app, &slow_order).await,
        vec![("tickets".into(), "sent".into(), 3, None)]
    );
    let dead = rows(app, &gone_order).await;
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].1.as_str(), dead[0].2), ("dead", 1));
    let why = dead[0].3.clone().expect("last_error");
    assert!(why.starts_with("SMTP 550"), "{why}");
    assert!(!why.contains("example.test"), "never the address: {why}");
    assert_eq!(
        mailbox
            .wait_for(&slow, 1, Duration::from_secs(10))
            .await
            .len(),
        1
    );
    assert!(mailbox.messages(&gone).await.is_empty());

    let (status, list) = json(app.admin_get("/admin/mail?state=dead").await).await;
    assert_eq!(status, 200, "{list}");
    let listed = list["deliveries"].as_array().expect("deliveries");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["order_id"], gone_order.as_str());
    assert!(!list.to_string().contains("example.test"));
    let (status, _) = json(app.admin_get("/admin/mail?state=lost").await).await;
    assert_eq!(status, 422);
    // An order id no order can have (a NUL, which Postgres text refuses; too long) matches
    // nothing: an empty list, not a 500 (schemathesis found the NUL).
    for odd in ["%F2%97%8E%99%C2%A4%C2%BE%00", &"o".repeat(65)] {
        let (status, list) = json(
            app.admin_get(&format!("/admin/mail?state=sent&order_id={odd}"))
                .await,
        )
        .await;
        assert_eq!(
            (status, list["deliveries"].clone()),
            (200, json!([])),
            "{odd}"
        );
    }
    let text = app.metrics_text().await;
    assert!(
        text.contains("ticket_mail_total{result=\"dead\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ticket_mail_total{result=\"retry\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn without_mail_settings_deliveries_stay_pending() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    assert!(app.state.mail.mailer.is_none());
    create_event(app, "off-ev", json!({})).await;
    let to = address("off");
    let order = paid_order(&env, "off-ev", "gina", &["S1-R1-1"], &to).await;
    assert!(
        sender::send_once(&app.state.mail)
            .await
            .expect("pass")
            .is_empty()
    );
    assert_eq!(
        rows(app, &order).await,
        vec![("tickets".into(), "pending".into(), 0, None)]
    );
    let (status, list) = json(app.admin_get("/admin/mail?state=pending").await).await;
    assert_eq!(status, 200);
    assert_eq!(list["deliveries"].as_array().map(Vec::len), Some(1));
    // An order without an address queues nothing.
    let (status, o, token) = order_with(app, "off-ev", "hana", &["S1-R1-2"], Value::Null).await;
    assert_eq!(status, 201, "{o}");
    let id = o["id"].as_str().expect("id").to_owned();
    assert_eq!(
        pay(app, &token, &id, "pay-none", "pm_card_visa").await.0,
        200
    );
    deliver(app).await;
    assert!(rows(app, &id).await.is_empty());
}

/// Every string Redis holds under the app's prefix.
async fn redis_strings(app: &TestApp) -> String {
    let mut conn = app.state.redis.conn().await.expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", app.config.redis.key_prefix))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let mut all = String::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        let (name, extra): (&str, &[&str]) = match kind.as_str() {
            "stream" => ("XRANGE", &["-", "+"]),
            "string" => ("GET", &[]),
            "hash" => ("HGETALL", &[]),
            "set" => ("SMEMBERS", &[]),
            "zset" => ("ZRANGE", &["0", "-1"]),
            "list" => ("LRANGE", &["0", "-1"]),
            _ => continue,
        };
        let mut cmd = redis::cmd(name);
        cmd.arg(&key);
        for a in extra {
            cmd.arg(*a);
        }
        let value: redis::Value = cmd.query_async(&mut conn).await.expect("read key");
        all.push_str(&format!("{key} {value:?}\n"));
    }
    all
}

#[tokio::test]
async fn the_address_never_leaves_postgres_order_contacts() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "priv-ev", json!({})).await;
    let to = address("private");
    let order = paid_order(&env, "priv-ev", "ivan", &["S1-R1-1"], &to).await;
    send_until_idle(app).await;
    mailbox.wait_for(&to, 1, Duration::from_secs(10)).await;
    // Ops look at it, resend it, then forget it: all audited.
    let (status, detail) = json(app.admin_get(&format!("/admin/orders/{order}")).await).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["order"]["email"], "p***@example.test");
    assert!(!detail.to_string().contains(&to));
    let ops = |path: String| {
        app.client
            .post(app.url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Floodgate-Actor", "desk")
            .send()
    };
    assert_eq!(
        ops(format!("/admin/orders/{order}/tickets/resend"))
            .await
            .expect("resend")
            .status(),
        202
    );
    let local = to.split('@').next().expect("local part");
    let mut everywhere = String::new();
    for sql in [
        "SELECT COALESCE(string_agg(payload::text, ' '), '') FROM outbox",
        "SELECT COALESCE(string_agg(to_jsonb(a)::text, ' '), '') FROM ops_audit a",
        "SELECT COALESCE(string_agg(to_jsonb(d)::text, ' '), '') FROM deliveries d",
        "SELECT COALESCE(string_agg(to_jsonb(m)::text, ' '), '') FROM mail_deliveries m",
        "SELECT COALESCE(string_agg(to_jsonb(o)::text, ' '), '') FROM orders o",
        "SELECT COALESCE(string_agg(to_jsonb(k)::text, ' '), '') FROM idempotency_keys k",
    ] {
        let text: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&app.pool)
            .await
            .expect(sql);
        everywhere.push_str(&text);
    }
    everywhere.push_str(&redis_strings(app).await);
    assert!(
        everywhere.contains(&order),
        "the scan sees the order's traces"
    );
    assert!(
        !everywhere.contains(local),
        "the address leaked: {everywhere}"
    );
    let stored: Option<String> =
        sqlx::query_scalar("SELECT email FROM order_contacts WHERE order_id = $1")
            .bind(&order)
            .fetch_one(&app.pool)
            .await
            .expect("contact");
    assert_eq!(stored.as_deref(), Some(to.as_str()));
}

#[tokio::test]
async fn a_bad_address_is_refused_and_creates_nothing() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, "bad-ev", json!({})).await;
    let token = app.admission("jack", "bad-ev");
    let (status, hold) = json(
        app.post(
            "/api/events/bad-ev/holds",
            &token,
            &json!({ "seats": ["S1-R1-1"] }),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let order = |email: Value| {
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("k-{}", shared::ids::new_id()))
            .json(&json!({ "hold_id": hold["hold_id"], "email": email }))
            .send()
    };
    for bad in [
        json!("fan@example.test\r\nBcc: victim@example.test"),
        json!("fan@example.test\nX-Evil: 1"),
        json!(format!("{}@example.test", "a".repeat(250))),
        json!("not an address"),
        json!("Fan <fan@example.test>"),
        json!("fan@localhost"),
        json!(""),
        json!(42),
    ] {
        let (status, body) = json(order(bad.clone()).await.expect("order")).await;
        assert_eq!(status, 422, "{bad} -> {body}");
        assert!(
            !body.to_string().contains("victim"),
            "the refusal does not echo: {body}"
        );
    }
    let counts: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_contacts)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("counts");
    assert_eq!(counts, (0, 0), "nothing created");
    // The same hold with a good address (normalised: the domain lowercased).
    let (status, body) = json(order(json!(" Jack@Example.TEST ")).await.expect("order")).await;
    assert_eq!(status, 201, "{body}");
    let stored: String = sqlx::query_scalar("SELECT email FROM order_contacts")
        .fetch_one(&app.pool)
        .await
        .expect("row");
    assert_eq!(stored, "Jack@example.test");
}

#[tokio::test]
async fn a_fan_may_resend_three_times_an_hour_and_only_their_own_order() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "re-ev", json!({})).await;
    let to = address("again");
    let order = paid_order(&env, "re-ev", "kate", &["S1-R1-1"], &to).await;
    let resend = |token: String| {
        app.client
            .post(app.url(&format!("/api/orders/{order}/tickets/resend")))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..3 {
        let (status, body) = json(resend(login("kate")).await.expect("resend")).await;
        assert_eq!(status, 202, "{body}");
    }
    let resp = resend(login("kate")).await.expect("resend");
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((3000..=3600).contains(&wait), "{wait}");
    assert_eq!(json(resp).await.1["code"], "RATE_LIMITED");
    assert_eq!(
        resend(login("mallory")).await.expect("resend").status(),
        404
    );
    assert_eq!(
        resend(app.admission("kate", "re-ev"))
            .await
            .expect("resend")
            .status(),
        401
    );
    // Ops are not limited by the fan's budget, and are audited.
    let resp = app
        .client
        .post(app.url(&format!("/admin/orders/{order}/tickets/resend")))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "desk")
        .send()
        .await
        .expect("ops resend");
    assert_eq!(resp.status(), 202);
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ops_audit WHERE action = 'order.resend_tickets' AND target = $1",
    )
    .bind(format!("order:{order}"))
    .fetch_one(&app.pool)
    .await
    .expect("audit");
    assert_eq!(audited, 1);
    let outcomes = send_until_idle(app).await;
    assert_eq!(outcomes.len(), 5, "{outcomes:?}");
    let got = mailbox.wait_for(&to, 5, Duration::from_secs(10)).await;
    let ids: std::collections::HashSet<&str> = got.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids.len(), 5, "each resend is a message of its own");
    // An order without an address: nothing to resend.
    let (status, o, token) = order_with(app, "re-ev", "liam", &["S1-R1-2"], Value::Null).await;
    assert_eq!(status, 201, "{o}");
    let bare = o["id"].as_str().expect("id").to_owned();
    assert_eq!(
        pay(app, &token, &bare, "pay-bare", "pm_card_visa").await.0,
        200
    );
    let (status, body) = json(
        app.client
            .post(app.url(&format!("/api/orders/{bare}/tickets/resend")))
            .bearer_auth(login("liam"))
            .send()
            .await
            .expect("resend"),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (409, Some("NO_EMAIL")));
}

#[tokio::test]
async fn addresses_are_erased_after_retention_and_on_an_ops_forget() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    create_event(app, "old-ev", json!({})).await;
    create_event(
        app,
        "new-ev",
        json!({ "starts_at": "2031-05-01T19:00:00+09:00" }),
    )
    .await;
    let old = paid_order(&env, "old-ev", "mia", &["S1-R1-1"], &address("old")).await;
    let new = paid_order(&env, "new-ev", "mia", &["S1-R1-1"], &address("new")).await;
    // The dateless event's order was paid 31 days ago: past the default 30.
    sqlx::query("UPDATE orders SET paid_at = paid_at - interval '31 days' WHERE id = $1")
        .bind(&old)
        .execute(&app.pool)
        .await
        .expect("age the order");
    // An address row whose order never committed, two hours old.
    sqlx::query("INSERT INTO order_contacts (order_id, email, created_at) VALUES ('never', 'x@example.test', now() - interval '2 hours')")
        .execute(&app.pool)
        .await
        .expect("orphan");
    let (erased, orphans) = booking::tickets::mail::retention::erase_expired(&app.state.mail)
        .await
        .expect("retention");
    assert_eq!((erased, orphans), (1, 1));
    let emails: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT order_id, email FROM order_contacts ORDER BY order_id = $1")
            .bind(&old)
            .fetch_all(&app.pool)
            .await
            .expect("contacts");
    assert_eq!(emails.len(), 2);
    assert!(emails[0].1.is_some(), "the future event's address is kept");
    assert_eq!(emails[1], (old.clone(), None));
    // A queued message for an erased address is not sent (dead, with the reason).

    // Forget: support role, audited without the address.
    let forget = |actor: Option<&str>| {
        let mut req = app
            .client
            .post(app.url(&format!("/admin/orders/{new}/forget-email")))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(a) = actor {
            req = req.header("X-Floodgate-Actor", a);
        }
        req.send()
    };
    assert_eq!(
        forget(None).await.expect("forget").status(),
        400,
        "the bootstrap secret must name its operator"
    );
    let (status, body) = json(forget(Some("desk")).await.expect("forget")).await;
    assert_eq!(
        (status, body["erased"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (_, body) = json(forget(Some("desk")).await.expect("forget")).await;
    assert_eq!(body["erased"], false);
    let audit: Vec<Value> = sqlx::query_scalar(
        "SELECT to_jsonb(a) FROM ops_audit a WHERE action = 'order.forget_email'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(audit.len(), 2);
    assert!(
        !audit.iter().any(|a| a.to_string().contains("example.test")),
        "{audit:?}"
    );
    let (_, detail) = json(app.admin_get(&format!("/admin/orders/{new}")).await).await;
    assert!(detail["order"]["email"].is_null(), "{detail}");
    assert!(detail["order"]["email_erased_at"].is_string(), "{detail}");
    // Its resend is refused: there is no address any more.
    let (status, body) = json(
        app.client
            .post(app.url(&format!("/api/orders/{new}/tickets/resend")))
            .bearer_auth(login("mia"))
            .send()
            .await
            .expect("resend"),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (409, Some("NO_EMAIL")));
    let missing = app
        .client
        .post(app.url("/admin/orders/nope/forget-email"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "desk")
        .send()
        .await
        .expect("forget");
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn a_refund_sends_one_void_notice_per_voided_ticket() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    create_event(app, "void-ev", json!({})).await;
    let to = address("void");
    let order = paid_order(&env, "void-ev", "nina", &["S1-R1-1", "S1-R1-2"], &to).await;
    assert_eq!(send_until_idle(app).await, vec![Outcome::Sent]);
    let path = format!("/admin/orders/{order}/refund");
    let (status, v, _) =
        crate::ops_refunds::ops_post(app, &path, Some("desk"), Some("r1"), &json!({})).await;
    assert_eq!(status, 200, "{v}");
    // The provider's webhooks for the same refund, twice: no second void, no second notice.
    env.sandbox.flush_webhooks(false, true).await;
    env.sandbox.flush_webhooks(false, true).await;
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM mail_deliveries WHERE order_id = $1 ORDER BY id")
            .bind(&order)
            .fetch_all(&app.pool)
            .await
            .expect("kinds");
    assert_eq!(kinds, vec!["tickets", "void", "void"]);
    assert_eq!(
        send_until_idle(app).await,
        vec![Outcome::Sent, Outcome::Sent]
    );
    let got = mailbox.wait_for(&to, 3, Duration::from_secs(10)).await;
    let voids: Vec<&Message> = got
        .iter()
        .filter(|m| m.subject.starts_with("Ticket voided"))
        .collect();
    assert_eq!(
        voids.len(),
        2,
        "{:?}",
        got.iter().map(|m| &m.subject).collect::<Vec<_>>()
    );
    assert!(voids.iter().all(|m| m.message_id.contains(".void@")));
    let text = String::from_utf8_lossy(&parts(voids[0])["text/plain"][0]).to_string();
    assert!(text.contains("refunded"), "{text}");
}
