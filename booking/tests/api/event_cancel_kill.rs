//! Event cancellation across a real crash (issue 18): the `booking` binary and the
//! `sandbox-provider` binary run as their own processes (one config file, as
//! `deploy/stack up` runs them), an event with [`ORDERS`] paid orders is cancelled, booking is
//! killed with SIGKILL while its refund job is part way through, then started again; every
//! paid order ends refunded exactly once, at the provider (its own per-order counts) and in
//! Postgres.

use crate::helpers::{ADMIN_TOKEN, free_port, fresh_database, json, redis_url};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::child::{Service, binary_beside};
use tokio::process::Command;

const ORDERS: usize = 2000;
const API_KEY: &str = "sk_test_kill_suite";

/// A service as `deploy/stack up` runs it: its one config file.
fn start(name: &'static str, config: &Path) -> Service {
    let mut cmd = Command::new(binary_beside(env!("CARGO_BIN_EXE_booking"), name));
    cmd.env("FLOODGATE_CONFIG", config);
    Service::spawn(name, cmd)
}

async fn progress(client: &reqwest::Client, booking: &str) -> Value {
    let resp = client
        .get(format!("{booking}/admin/events/ev/cancellation"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("progress");
    json(resp).await.1
}

#[tokio::test]
async fn a_killed_booking_process_resumes_the_event_refunds_and_refunds_each_once() {
    let (db_url, _) = fresh_database().await;
    let (booking_port, sandbox_port) = (free_port(), free_port());
    let booking = format!("http://127.0.0.1:{booking_port}");
    let sandbox = format!("http://127.0.0.1:{sandbox_port}");
    let config = std::env::temp_dir().join(format!("fg-kill-{}.toml", shared::ids::new_id()));
    // Provider latency keeps the job's 16 concurrent refunds slow enough to kill it midway.
    let toml = format!(
        r#"admin_token = "{ADMIN_TOKEN}"
[dev]
enabled = true
[log]
level = "warn"
[database]
url = "{db_url}"
max_connections = 10
[redis]
url = "{redis}"
key_prefix = "kill{prefix}:"
[booking]
listen = "127.0.0.1:{booking_port}"
jobs_enabled = true
[payments]
provider_url = "{sandbox}"
api_key = "{API_KEY}"
webhook_secrets = ["whsec_kill_suite"]
[sandbox]
listen = "127.0.0.1:{sandbox_port}"
api_key = "{API_KEY}"
webhook_url = "{booking}/webhooks/payments"
webhook_secret = "whsec_kill_suite"
webhook_mode = "manual"
latency_ms = 60
"#,
        redis = redis_url(),
        prefix = shared::ids::new_id(),
    );
    std::fs::write(&config, toml).expect("write the config");
    let client = reqwest::Client::new();
    let mut provider = start("sandbox-provider", &config);
    provider
        .wait_up(&client, &format!("{sandbox}/_sandbox/stats"), Some(API_KEY))
        .await;
    let mut booking_proc = start("booking", &config);
    booking_proc
        .wait_up(&client, &format!("{booking}/readyz"), None)
        .await;

    // An event of 2,000 seats; 2,000 fans buy one each (tokens minted with the dev key set the
    // booking process also uses in dev mode).
    let event = crate::events::small_event("ev", 100, 10, 10, 1);
    let resp = client
        .post(format!("{booking}/admin/events"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&event)
        .send()
        .await
        .expect("create event");
    assert_eq!(resp.status(), 201);
    let tokens = booking::app::config::BookingConfig::default().tokens;
    let tokens = shared::token::AdmissionTokens::new(&tokens).expect("dev token keys");
    let now = chrono::Utc::now().timestamp();
    let seats: Vec<String> = (1..=100)
        .flat_map(|row| {
            (1..=10).flat_map(move |n| [format!("S1-R{row}-{n}"), format!("S2-R{row}-{n}")])
        })
        .collect();
    assert_eq!(seats.len(), ORDERS);
    let bought = futures::StreamExt::collect::<Vec<String>>(futures::StreamExt::buffer_unordered(
        futures::stream::iter(seats.iter().enumerate().map(|(i, seat)| {
            let (client, booking, tokens) = (&client, &booking, &tokens);
            async move {
                let account = format!("fan-{i}");
                let token = tokens
                    .mint(&account, &format!("sess-{i}"), "ev", now, 600)
                    .expect("mint")
                    .0;
                let post = |path: String, key: Option<String>, body: Value| {
                    let mut req = client.post(format!("{booking}{path}")).bearer_auth(&token);
                    if let Some(k) = key {
                        req = req.header("Idempotency-Key", k);
                    }
                    req.json(&body).send()
                };
                let (s, hold) = json(
                    post(
                        "/api/events/ev/holds".into(),
                        None,
                        json!({"seats": [seat]}),
                    )
                    .await
                    .expect("hold"),
                )
                .await;
                assert_eq!(s, 201, "{hold}");
                let (s, order) = json(
                    post(
                        "/api/orders".into(),
                        Some(format!("o-{i}")),
                        json!({"hold_id": hold["hold_id"]}),
                    )
                    .await
                    .expect("order"),
                )
                .await;
                assert_eq!(s, 201, "{order}");
                let id = order["id"].as_str().expect("id").to_owned();
                let (s, paid) = json(
                    post(
                        format!("/api/orders/{id}/pay"),
                        Some(format!("p-{i}")),
                        json!({"payment_method": "pm_card_visa"}),
                    )
                    .await
                    .expect("pay"),
                )
                .await;
                assert_eq!(s, 200, "{paid}");
                id
            }
        })),
        16,
    ))
    .await;

    let resp = client
        .post(format!("{booking}/admin/events/ev/cancel"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "ops")
        .json(&json!({"reason": "storm"}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(resp.status(), 202);
    // Kill -9 as soon as part of the refunds are done.
    let deadline = Instant::now() + Duration::from_secs(60);
    let at_kill = loop {
        let p = progress(&client, &booking).await;
        if p["refunded"].as_i64().unwrap_or(0) >= 200 {
            booking_proc.child.start_kill().expect("SIGKILL booking");
            break p;
        }
        assert!(Instant::now() < deadline, "refunds never started: {p}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let status = booking_proc.child.wait().await.expect("reap booking");
    assert!(
        !status.success(),
        "booking was killed, not stopped: {status}"
    );
    let pool = sqlx::PgPool::connect(&db_url).await.expect("connect");
    let (succeeded, pending): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'),
                count(*) FILTER (WHERE status = 'pending')
           FROM order_refunds",
    )
    .fetch_one(&pool)
    .await
    .expect("rows");
    assert!(
        succeeded >= 200 && pending > 0,
        "killed midway: {succeeded} done, {pending} pending ({at_kill})"
    );
    // The dead process's leases would end after 60 s; end them now instead of waiting.
    sqlx::query(
        "UPDATE order_refunds SET leased_until = clock_timestamp() WHERE status = 'pending'",
    )
    .execute(&pool)
    .await
    .expect("expire leases");

    let mut booking_again = start("booking", &config);
    booking_again
        .wait_up(&client, &format!("{booking}/readyz"), None)
        .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = progress(&client, &booking).await;
        if p["done"] == true {
            assert_eq!(
                (p["refunded"].clone(), p["failed"].clone()),
                (json!(ORDERS), json!(0)),
                "{p}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never finished: {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every order: one charge and one refund of all of it at the provider; refunded once here.
    for order in &bought {
        let (s, summary) = json(
            client
                .get(format!("{sandbox}/_sandbox/orders/{order}"))
                .bearer_auth(API_KEY)
                .send()
                .await
                .expect("summary"),
        )
        .await;
        assert_eq!(s, 200, "{summary}");
        assert_eq!(
            (summary["charges"].clone(), summary["refunds"].clone()),
            (json!(1), json!(1)),
            "{order}: {summary}"
        );
        assert_eq!(
            summary["amount_refunded"], summary["amount_charged"],
            "{summary}"
        );
    }
    let (refunded, rows, events): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE status = 'REFUNDED'),
                (SELECT count(*) FROM order_refunds WHERE status = 'succeeded'),
                (SELECT count(*) FROM outbox WHERE topic = 'order.refunded')",
    )
    .fetch_one(&pool)
    .await
    .expect("end state");
    assert_eq!(
        (refunded, rows, events),
        (ORDERS as i64, ORDERS as i64, ORDERS as i64)
    );
    let _ = std::fs::remove_file(&config);
}
