//! `TestApp`: starts booking exactly as `main` does, against a fresh database.

#![allow(dead_code)]

use booking::app::config::BookingConfig;
use booking::app::startup::Application;
use booking::app::state::AppState;
use secrecy::SecretString;
use serde_json::Value;
use shared::token::AdmissionTokens;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;
use testkit::ChaosProxy;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

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

pub struct TestApp {
    pub addr: String,
    pub port: u16,
    pub client: reqwest::Client,
    /// The test's own view of the database (booking's pool, or a direct one when booking
    /// talks to Postgres through a [`Chaos`] proxy).
    pub pool: PgPool,
    /// The fault proxies in front of Postgres and Redis, when started with them.
    pub chaos: Option<Chaos>,
    pub state: AppState,
    pub db_name: String,
    pub config: BookingConfig,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// Fault proxies between booking and its Postgres and Redis (`faults.rs`).
pub struct Chaos {
    pub db: ChaosProxy,
    pub redis: ChaosProxy,
}

/// The `application_name` of the test's direct connections, so a test can tell booking's
/// backends from its own in `pg_stat_activity`.
pub const DIRECT_APP_NAME: &str = "floodgate-test-direct";

/// Creates an empty database with all migrations applied and returns its URL and name.
pub async fn fresh_database() -> (String, String) {
    let (url, name) = empty_database().await;
    let pool = small_pool(&url).await;
    booking::platform::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migrate test database");
    pool.close().await;
    (url, name)
}

/// Creates an empty database, no migrations applied, and returns its URL and name (`deploy/stack
/// test` drops every `fg_test_*` database afterwards).
pub async fn empty_database() -> (String, String) {
    let admin_url = database_url();
    let name = format!("fg_test_{}", shared::ids::new_id());
    let mut conn = PgConnection::connect(&admin_url).await.expect(
        "cannot reach test Postgres; run `deploy/stack test` or set FLOODGATE_TEST_DATABASE_URL",
    );
    conn.execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .await
        .expect("create test database");
    let url = match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("bad database url {admin_url}"),
    };
    (url, name)
}

/// A two-connection pool on a test database (setup and inspection, not the app's pool).
pub async fn small_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect test database")
}

pub fn test_config(db_url: &str) -> BookingConfig {
    let defaults = BookingConfig::default();
    BookingConfig {
        admin_token: SecretString::from(ADMIN_TOKEN),
        database: shared::config::DatabaseSettings {
            url: SecretString::from(db_url.to_owned()),
            max_connections: 40,
            // Tests assert counts and invariants, not speed: on a loaded 2-core machine a
            // burst of hundreds of requests may wait seconds for a connection.
            acquire_timeout_ms: 20_000,
            // The same reason: a statement may wait longer than it would in production.
            statement_timeout_ms: 60_000,
            ..Default::default()
        },
        redis: shared::config::RedisSettings {
            url: SecretString::from(redis_url()),
            key_prefix: format!("t{}:", shared::ids::new_id()),
            // As for the pool: a loaded machine must not turn a slow reply into a 503.
            response_timeout_ms: 10_000,
            ..Default::default()
        },
        booking: booking::app::config::BookingSettings {
            listen: "127.0.0.1:0".into(),
            jobs_enabled: false,
            ..defaults.booking.clone()
        },
        ..defaults
    }
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// Starts the app after letting the test adjust its configuration.
    pub async fn spawn_with(adjust: impl FnOnce(&mut BookingConfig)) -> TestApp {
        Self::spawn_opts(false, adjust).await
    }

    /// Starts the app with its Postgres and Redis connections through fault proxies
    /// ([`TestApp::chaos`]); [`TestApp::pool`] stays a direct connection.
    pub async fn spawn_through_proxies(adjust: impl FnOnce(&mut BookingConfig)) -> TestApp {
        Self::spawn_opts(true, adjust).await
    }

    pub async fn spawn_opts(proxied: bool, adjust: impl FnOnce(&mut BookingConfig)) -> TestApp {
        shared::telemetry::init_for_tests();
        let (db_url, db_name) = fresh_database().await;
        let mut config = test_config(&db_url);
        let mut direct = None;
        let mut chaos = None;
        if proxied {
            let (db, db_via) = ChaosProxy::in_front_of(&db_url)
                .await
                .expect("database proxy");
            let (redis, redis_via) = ChaosProxy::in_front_of(&redis_url())
                .await
                .expect("redis proxy");
            config.database.url = SecretString::from(db_via);
            config.redis.url = SecretString::from(redis_via);
            let options = PgConnectOptions::from_str(&db_url)
                .expect("database url")
                .application_name(DIRECT_APP_NAME);
            direct = Some(
                PgPoolOptions::new()
                    .max_connections(4)
                    .connect_lazy_with(options),
            );
            chaos = Some(Chaos { db, redis });
        }
        adjust(&mut config);
        let app = Application::build(config.clone()).await.expect("build app");
        let port = app.port();
        let state = app.state();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(app.run_until_stopped(async move {
            let _ = rx.await;
        }));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(512)
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        TestApp {
            addr: format!("http://127.0.0.1:{port}"),
            port,
            client,
            pool: direct.unwrap_or_else(|| state.pool.clone()),
            chaos,
            state,
            db_name,
            config,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// A second booking instance on the same database and Redis key prefix (another process
    /// of the same deployment), after letting the test adjust its configuration.
    pub async fn spawn_peer(&self, adjust: impl FnOnce(&mut BookingConfig)) -> TestApp {
        let mut config = self.config.clone();
        // Its own consumer name, as a separate process would pick.
        config.auctions.consumer_name = String::new();
        adjust(&mut config);
        let app = Application::build(config.clone())
            .await
            .expect("build peer app");
        let port = app.port();
        let state = app.state();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(app.run_until_stopped(async move {
            let _ = rx.await;
        }));
        TestApp {
            addr: format!("http://127.0.0.1:{port}"),
            port,
            client: self.client.clone(),
            pool: state.pool.clone(),
            chaos: None,
            state,
            db_name: self.db_name.clone(),
            config,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }

    /// Stops the server, closes its connections, and returns how many deadlocks Postgres
    /// detected in the test's database while it ran. A backend reports its counts when it
    /// exits, so this waits (a bounded wait for a condition, not a sleep) until none is left.
    pub async fn stop_counting_deadlocks(self) -> i64 {
        let (pool, db_name) = (self.pool.clone(), self.db_name.clone());
        let booking_pool = self.state.pool.clone();
        let hold_pool = self.state.inventory.hold_pool.clone();
        let checkout_pool = self.state.payments.pool.clone();
        let order_statements = self.state.orders.statements.clone();
        self.stop().await;
        booking_pool.close().await;
        hold_pool.close().await;
        checkout_pool.close().await;
        order_statements.close().await;
        pool.close().await;
        let mut admin = PgConnection::connect(&database_url())
            .await
            .expect("connect to count deadlocks");
        for _ in 0..200 {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
                    .bind(&db_name)
                    .fetch_one(&mut admin)
                    .await
                    .expect("count the test database's backends");
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = $1")
            .bind(&db_name)
            .fetch_one(&mut admin)
            .await
            .expect("read the test database's deadlock count")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.addr, path)
    }

    /// Returns once a backend of this test's database waits for a lock: a request the test
    /// expects to queue behind a row it holds open has reached that row (decided by Postgres,
    /// not by a clock).
    pub async fn until_a_request_waits_for_a_lock(&self) {
        testkit::wait::until(
            Duration::from_secs(60),
            Duration::from_millis(10),
            "no request ever waited for the test's lock",
            || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&self.pool)
                .await
                .expect("read pg_stat_activity");
                waiting > 0
            },
        )
        .await;
    }

    /// Booking's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("the /metrics text")
    }

    pub fn tokens(&self) -> &AdmissionTokens {
        self.state.auth.tokens()
    }

    /// A valid admission token for `account` on `event`.
    pub fn admission(&self, account: &str, event: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        self.tokens()
            .mint(account, &format!("sess-{account}"), event, now, 600)
            .expect("mint")
            .0
    }

    pub async fn admin_post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("request")
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str, token: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("request")
    }
}

/// Reads a response as JSON, panicking with the body text when it is not JSON.
pub async fn json(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let v =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
    (status, v)
}

/// Creates an auction of event `auction-day` through the API (seller `seller`, start price
/// 1000, increment 10, ending `end_in_s` from now), asserts `201` and returns its id.
pub async fn open_auction(app: &TestApp, seller: &str, hot: bool, end_in_s: i64) -> String {
    let end = (chrono::Utc::now() + chrono::Duration::seconds(end_in_s)).to_rfc3339();
    let (status, body) = create_auction(
        app,
        "auction-day",
        seller,
        serde_json::json!({"title": "Antique watch", "start_price": 1000,
                           "min_increment": 10, "end_time": end, "hot": hot}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

/// Creates event `event` in booking unless it exists: the smallest event (no seats, no GA) a
/// product or an auction can belong to.
pub async fn ensure_event(app: &TestApp, event: &str) {
    let (status, body) = json(
        app.admin_post(
            "/admin/events",
            &serde_json::json!({"id": event, "name": format!("Event {event}"),
                                "sale_start": "2026-01-01T00:00:00Z"}),
        )
        .await,
    )
    .await;
    assert!(
        status == 201 || (status == 409 && body["code"] == "EVENT_EXISTS"),
        "creating event {event}: {status} {body}"
    );
}

/// Creates a product of `event` (creating the event if needed) through the admin API and
/// asserts `201`.
pub async fn create_product(
    app: &TestApp,
    event: &str,
    sku: &str,
    price: i64,
    stock: i64,
    hot: bool,
) {
    ensure_event(app, event).await;
    let (status, body) = json(
        app.admin_post(
            "/admin/products",
            &serde_json::json!({"sku": sku, "event": event, "name": format!("Product {sku}"),
                                "price": price, "stock": stock, "hot": hot}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// `POST /api/auctions` by `seller` with an admission of `event` (created if needed); `body`
/// gets `"event": event` unless it names one itself. Returns status and body.
pub async fn create_auction(app: &TestApp, event: &str, seller: &str, body: Value) -> (u16, Value) {
    ensure_event(app, event).await;
    let mut body = body;
    if let Some(obj) = body.as_object_mut() {
        obj.entry("event").or_insert_with(|| event.into());
    }
    let token = app.admission(seller, event);
    json(
        app.client
            .post(app.url("/api/auctions"))
            .bearer_auth(token)
            .header("Idempotency-Key", shared::ids::new_id())
            .json(&body)
            .send()
            .await
            .expect("request"),
    )
    .await
}

/// `PUT /api/events/{event}/cart/items/{sku}` with `token`.
pub async fn put_cart_line(
    app: &TestApp,
    token: &str,
    event: &str,
    sku: &str,
    quantity: i64,
) -> reqwest::Response {
    app.client
        .put(app.url(&format!("/api/events/{event}/cart/items/{sku}")))
        .bearer_auth(token)
        .json(&serde_json::json!({ "quantity": quantity }))
        .send()
        .await
        .expect("request")
}

// ---------------------------------------------------------------------------------------------
// Events, products and orders for payment tests. Create them only through these helpers, so
// a change of the admin API is made here once.
// ---------------------------------------------------------------------------------------------

/// Creates the small test event (two sections of `rows` × 5 seats, a 10-unit GA tier) with
/// the given `refund_stock` (`"release"` or `"hold_back"`).
pub async fn create_refund_event(app: &TestApp, event: &str, refund_stock: &str) {
    let mut body = crate::events::small_event(event, 2, 5, 10, 2);
    body["refund_stock"] = serde_json::json!(refund_stock);
    crate::events::create_event(app, &body).await;
}

/// Holds `seats` of an existing event for `account` and orders them (`PENDING_PAYMENT`).
pub async fn order_seats(
    app: &TestApp,
    event: &str,
    account: &str,
    seats: &[&str],
) -> crate::payments::SeatOrder {
    crate::payments::seat_order(app, event, false, account, seats).await
}

/// Holds `quantity` GA units of tier FLOOR for `account` and orders them. Returns
/// (admission token, order id).
pub async fn order_ga(
    app: &TestApp,
    event: &str,
    account: &str,
    quantity: i32,
) -> (String, String) {
    let token = app.admission(account, event);
    let (status, hold) = json(
        app.post(
            &format!("/api/events/{event}/ga-holds"),
            &token,
            &serde_json::json!({"tier": "FLOOR", "quantity": quantity}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let (status, order) = json(
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("ga-order-{account}"))
            .json(&serde_json::json!({"hold_id": hold["hold_id"]}))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 201, "{order}");
    let id = order["id"].as_str().expect("order id").to_owned();
    (token, id)
}

/// Creates a product of `event` with `stock` units.
pub async fn create_event_product(
    app: &TestApp,
    event: &str,
    sku: &str,
    price: i64,
    stock: i64,
    hot: bool,
) {
    create_product(app, event, sku, price, stock, hot).await;
}

/// Puts `quantity` of `sku` in `account`'s cart of `event` and orders the cart. Returns
/// (admission token, order id).
pub async fn order_cart(
    app: &TestApp,
    event: &str,
    account: &str,
    sku: &str,
    quantity: i64,
) -> (String, String) {
    let token = app.admission(account, event);
    let resp = put_cart_line(app, &token, event, sku, quantity).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    let (status, order) = json(
        crate::products::post_order(
            app,
            &token,
            &format!("cart-order-{account}"),
            &serde_json::json!({"source": "cart"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{order}");
    let id = order["id"].as_str().expect("order id").to_owned();
    (token, id)
}

/// A port for a child process to listen on: below the ephemeral range, so no outgoing
/// connection can be sitting on it between this pick and the child's bind (a `:0` port let go
/// of can be).
pub use testkit::free_port;

/// Who an audit entry names: the actor, and for the bootstrap secret the `X-Floodgate-Actor`
/// note it sent (`bootstrap/alice`).
pub fn who(entry: &Value) -> String {
    let actor = entry["actor"].as_str().unwrap_or("?");
    match entry["note"].as_str() {
        Some(note) => format!("{actor}/{note}"),
        None => actor.to_owned(),
    }
}
