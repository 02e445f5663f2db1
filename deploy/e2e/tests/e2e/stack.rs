//! The whole Floodgate stack, in-process, on free ports: the sandbox payment provider, booking
//! (fresh Postgres database with migrations, background jobs ON like production) and the
//! gateway (pingora, serving `static/`), all pointing at each other, with one unique Redis
//! key prefix. `TEST_LOG=1` turns logs on.
//!
//! Wiring: fans → gateway public listener → booking; booking → sandbox (payment intents);
//! sandbox → gateway `/webhooks/payments` → booking (signed webhooks take the same path as in
//! production).

#![allow(dead_code)]

use booking::app::config::BookingConfig;
use gateway::config::GatewayConfig;
use gateway::{Gateway, GatewayHandle};
use sandbox_provider::Sandbox;
use sandbox_provider::config::SandboxSettings;
use secrecy::SecretString;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Executor, PgConnection, PgPool};
use std::time::{Duration, Instant};
use testkit::free_port;

pub const ADMIN: &str = "e2e-admin-secret-0123456789";
pub const API_KEY: &str = "sk_test_e2e_0123456789";
pub const WEBHOOK_SECRET: &str = "whsec_e2e_0123456789";

pub fn database_url() -> String {
    std::env::var("FLOODGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:55432/postgres".into())
}

pub fn redis_url() -> String {
    // Booking's own Redis is one server even when the waiting room's tests use a cluster.
    std::env::var("FLOODGATE_TEST_STANDALONE_REDIS_URL")
        .or_else(|_| std::env::var("FLOODGATE_TEST_REDIS_URL"))
        .unwrap_or_else(|_| "redis://127.0.0.1:56379".into())
}

/// The waiting room's own Redis (`deploy/stack test` runs one, as `up` does; with
/// `FLOODGATE_TEST_REDIS_CLUSTER=1`, a Redis Cluster's seed nodes), else the same.
pub fn queue_redis_url() -> String {
    std::env::var("FLOODGATE_TEST_QUEUE_REDIS_URL").unwrap_or_else(|_| redis_url())
}

pub fn queue_redis_mode() -> shared::config::RedisMode {
    if std::env::var("FLOODGATE_TEST_REDIS_CLUSTER").is_ok_and(|v| v == "1") {
        shared::config::RedisMode::Cluster
    } else {
        shared::config::RedisMode::Standalone
    }
}

/// Creates an empty database with all migrations applied (same as booking's test helper).
pub async fn fresh_database() -> (String, String) {
    let admin_url = database_url();
    let name = format!("fg_test_{}", shared::ids::new_id());
    let mut conn = PgConnection::connect(&admin_url).await.expect(
        "cannot reach test Postgres; run `deploy/stack deps` or set FLOODGATE_TEST_DATABASE_URL",
    );
    conn.execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .await
        .expect("create test database");
    let url = match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("bad database url {admin_url}"),
    };
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect test database");
    booking::platform::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migrate test database");
    pool.close().await;
    (url, name)
}

pub struct Stack {
    pub gateway_url: String,
    pub gateway_admin_url: String,
    pub booking_url: String,
    pub sandbox_url: String,
    pub prefix: String,
    pub pool: PgPool,
    pub sandbox: Sandbox,
    pub http: reqwest::Client,
    gateway: Option<GatewayHandle>,
    booking_stop: Option<tokio::sync::oneshot::Sender<()>>,
    booking_task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    sandbox_stop: Option<tokio::sync::oneshot::Sender<()>>,
    sandbox_task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Stack {
    pub async fn start() -> Stack {
        Self::start_with(|_| {}, |_| {}).await
    }

    /// `start` with settings changed by the test (e.g. short order lifetimes).
    pub async fn start_with(
        tune_booking: impl FnOnce(&mut BookingConfig),
        tune_gateway: impl FnOnce(&mut GatewayConfig),
    ) -> Stack {
        shared::telemetry::init_for_tests();
        let prefix = format!("e2e{}:", shared::ids::new_id());
        let gateway_port = free_port();
        let gateway_admin_port = free_port();
        let gateway_url = format!("http://127.0.0.1:{gateway_port}");

        // Sandbox provider first: booking needs its URL. Its webhooks go through the gateway,
        // which starts last (deliveries are retried until it is up).
        let sandbox_settings = SandboxSettings {
            listen: "127.0.0.1:0".into(),
            api_key: SecretString::from(API_KEY),
            webhook_url: format!("{gateway_url}/webhooks/payments"),
            webhook_secret: SecretString::from(WEBHOOK_SECRET),
            webhook_backoff_ms: 200,
            ..SandboxSettings::default()
        };
        let sandbox_app = sandbox_provider::Application::build(sandbox_settings)
            .await
            .expect("build sandbox provider");
        let sandbox_url = format!("http://127.0.0.1:{}", sandbox_app.port());
        let sandbox = sandbox_app.sandbox();
        let (sandbox_tx, sandbox_rx) = tokio::sync::oneshot::channel::<()>();
        let sandbox_task = tokio::spawn(sandbox_app.run_until_stopped(async move {
            let _ = sandbox_rx.await;
        }));

        // Booking, on a fresh database, with its background jobs (sweeper, expiry, outbox
        // relay, delivery consumer, reconciliation) running as in production.
        let (db_url, _db_name) = fresh_database().await;
        let mut config = BookingConfig {
            admin_token: SecretString::from(ADMIN),
            ..BookingConfig::default()
        };
        config.database.url = SecretString::from(db_url);
        config.database.max_connections = 20;
        config.redis.url = SecretString::from(redis_url());
        // Revocations come from the waiting room's Redis, as in `deploy/stack up`.
        config.redis.queue_url = Some(SecretString::from(queue_redis_url()));
        config.redis.mode = queue_redis_mode();
        config.redis.key_prefix = prefix.clone();
        config.booking.listen = "127.0.0.1:0".into();
        config.booking.jobs_enabled = true;
        config.payments.provider_url = sandbox_url.clone();
        config.payments.api_key = SecretString::from(API_KEY);
        config.payments.webhook_secrets = vec![SecretString::from(WEBHOOK_SECRET)];
        // Ticket e-mail to the test run's SMTP server (deploy/stack test starts it), checked
        // often so a journey does not wait a second for its mail.
        config.mail.smtp_url = std::env::var("FLOODGATE_TEST_SMTP_URL").ok();
        config.mail.starttls = booking::tickets::mail::settings::StartTls::Off;
        config.mail.from = Some("Floodgate Tickets <tickets@e2e.floodgate.test>".into());
        config.mail.poll_ms = 100;
        tune_booking(&mut config);
        let app = booking::app::startup::Application::build(config)
            .await
            .expect("build booking");
        let booking_port = app.port();
        let pool = app.state().pool.clone();
        let (booking_tx, booking_rx) = tokio::sync::oneshot::channel::<()>();
        let booking_task = tokio::spawn(app.run_until_stopped(async move {
            let _ = booking_rx.await;
        }));

        // The gateway in front of booking, serving the real static pages.
        let mut g = GatewayConfig::default();
        g.gateway.listen = format!("127.0.0.1:{gateway_port}");
        g.gateway.admin_listen = format!("127.0.0.1:{gateway_admin_port}");
        g.gateway.upstreams = vec![format!("127.0.0.1:{booking_port}")];
        g.gateway.static_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../static").into();
        // The ticket page reads booking's listener directly, as on the local stack
        // (deploy/local.toml) until the gateway's route table exists.
        g.gateway.tickets_api_url = format!("http://127.0.0.1:{booking_port}");
        g.gateway.dev_mode = true;
        g.gateway.threads = 2;
        g.gateway.tick_ms = 100;
        g.gateway.lease_ttl_ms = 1000;
        g.gateway.refresh_ms = 100;
        g.gateway.health_check_ms = 200;
        g.gateway.upstream_read_timeout_ms = 15_000;
        g.redis.url = SecretString::from(redis_url());
        g.redis.queue_url = Some(SecretString::from(queue_redis_url()));
        g.redis.mode = queue_redis_mode();
        g.redis.key_prefix = prefix.clone();
        g.admin_token = Some(SecretString::from(ADMIN));
        tune_gateway(&mut g);
        // Booking and the gateway share the admission key set (`[tokens]` defaults).
        let gw = tokio::task::spawn_blocking(move || {
            Gateway::build(g)
                .expect("build gateway")
                .spawn()
                .expect("start gateway")
        })
        .await
        .expect("gateway start task");

        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let stack = Stack {
            gateway_url,
            gateway_admin_url: format!("http://127.0.0.1:{gateway_admin_port}"),
            booking_url: format!("http://127.0.0.1:{booking_port}"),
            sandbox_url,
            prefix,
            pool,
            sandbox,
            http,
            gateway: Some(gw),
            booking_stop: Some(booking_tx),
            booking_task: Some(booking_task),
            sandbox_stop: Some(sandbox_tx),
            sandbox_task: Some(sandbox_task),
        };
        stack.wait_upstream_healthy().await;
        stack
    }

    /// Waits until the gateway's health checker has seen booking (its `/readyz`).
    async fn wait_upstream_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(r) = self.http.get(self.gw("/readyz")).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["upstream"] == true
                && v["redis"] == true
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "gateway never saw booking healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn gw(&self, path: &str) -> String {
        format!("{}{path}", self.gateway_url)
    }

    /// Creates an event in booking (ops API) and its waiting room in the gateway (ops API).
    pub async fn create_event(&self, event: &Value, waiting_room: &Value) -> String {
        let resp = self
            .http
            .post(format!("{}/admin/events", self.booking_url))
            .bearer_auth(ADMIN)
            .json(event)
            .send()
            .await
            .expect("create event");
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.expect("event json");
        assert_eq!(status, 201, "create event: {body}");
        let id = body["id"].as_str().expect("event id").to_owned();
        self.configure_waiting_room(&id, waiting_room).await;
        id
    }

    /// `PUT /admin/events/{event}/config` on the gateway's admin listener.
    pub async fn configure_waiting_room(&self, event: &str, config: &Value) {
        let resp = self
            .http
            .put(format!(
                "{}/admin/events/{event}/config",
                self.gateway_admin_url
            ))
            .bearer_auth(ADMIN)
            .json(config)
            .send()
            .await
            .expect("configure waiting room");
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        assert!(
            (200..300).contains(&status),
            "waiting room config: {status} {body}"
        );
    }

    /// Stops booking only (graceful), leaving the gateway to answer for it.
    pub async fn stop_booking(&mut self) {
        if let Some(tx) = self.booking_stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.booking_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }

    /// Stops gateway, booking and sandbox.
    pub async fn stop(mut self) {
        if let Some(g) = self.gateway.take() {
            let _ = tokio::task::spawn_blocking(move || g.stop()).await;
        }
        if let Some(tx) = self.booking_stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.booking_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        if let Some(tx) = self.sandbox_stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.sandbox_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

/// The demo-like event both journeys buy from: two small sections and a GA tier.
pub fn demo_event(id: &str) -> Value {
    json!({
        "id": id,
        "name": "Floodgate E2E Tour — Tokyo",
        "venue": "Test Dome",
        "sale_start": "2026-01-01T10:00:00+09:00",
        "hold_ttl_s": 600,
        "max_tickets_per_account": 4,
        "price_tiers": [{"tier": "A", "price": 12000}, {"tier": "B", "price": 8000}],
        "seat_map": {"sections": [
            {"name": "S1", "rows": 8, "seats_per_row": 12, "price_tier": "A"},
            {"name": "S2", "rows": 8, "seats_per_row": 12, "price_tier": "B"}
        ]},
        "ga_tiers": [{"tier": "FLOOR", "price": 9000, "capacity": 100, "shards": 2}]
    })
}

/// Reads a response as JSON, panicking with the body text when it is not JSON.
pub async fn json(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let v =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
    (status, v)
}
