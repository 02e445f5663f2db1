//! The `orders` scenario: carts and orders straight against booking, as fast as possible, for a
//! fixed time.
//!
//! - `--mode cart`: each client is one account editing its cart of `--event`: 90 % absolute
//!   `PUT /api/events/{event}/cart/items/{sku}` (a random one of `--skus` products `SKU-0..`,
//!   quantity 1-5), 10 % `GET /api/events/{event}/cart` (which reads current prices from
//!   Postgres). Reports cart operations/s.
//! - `--mode order`: each iteration is a fresh account that puts 1 unit of `--sku` into its
//!   cart and `POST`s `/api/orders` with a new `Idempotency-Key`. Reports successful orders/s
//!   and the latency of the order request; refusals (`409 SOLD_OUT`) are counted, so with a
//!   small stock the same loop is a flash-sale rush.
//!
//! Admission tokens are minted locally with the key booking verifies (the dev key unless
//! `--token-secret` is given), as in the `holds` scenario.

use crate::stats::{Recorder, Summary, outcome};
use anyhow::Context;
use clap::{Args, ValueEnum};
use rand::Rng;
use secrecy::SecretString;
use serde::Serialize;
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Cart,
    Order,
}

#[derive(Debug, Clone, Args)]
pub struct OrdersArgs {
    /// Booking base URL (direct, not through the gateway).
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking: String,
    #[arg(long, value_enum, default_value_t = Mode::Order)]
    pub mode: Mode,
    /// The SKU ordered (`--mode order`).
    #[arg(long, default_value = "HOT-1")]
    pub sku: String,
    /// Products `SKU-0 .. SKU-{n-1}` edited in `--mode cart` (they must exist).
    #[arg(long, default_value_t = 20)]
    pub skus: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Run time in seconds.
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// The event of the products (`evt` claim of the minted admission tokens, and the cart's
    /// event): booking sells a product only with an admission of its event.
    #[arg(long, default_value = "shop")]
    pub event: String,
    /// Admission-token signing key shared with booking (`[tokens]`); defaults to the dev key.
    #[arg(long, env = "LOADGEN_TOKEN_SECRET")]
    pub token_secret: Option<String>,
    #[arg(long, default_value = "dev-1")]
    pub token_kid: String,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct OrdersReport {
    pub mode: Mode,
    pub sku: Option<String>,
    pub clients: usize,
    pub duration_s: f64,
    /// `--mode cart`: cart operations (PUT + GET) per second.
    pub cart_ops_per_s: f64,
    /// `--mode order`: successful (`201`) orders per second.
    pub orders_per_s: f64,
    /// Order requests answered per second, whatever the answer.
    pub order_requests_per_s: f64,
    pub put: Summary,
    pub get: Option<Summary>,
    pub order: Option<Summary>,
}

pub async fn run(args: OrdersArgs) -> anyhow::Result<OrdersReport> {
    let mut settings = TokenSettings::default();
    if let Some(secret) = &args.token_secret {
        settings.keys = vec![KeySettings {
            kid: args.token_kid.clone(),
            secret: SecretString::from(secret.clone()),
        }];
        settings.current_kid = args.token_kid.clone();
    }
    let tokens = Arc::new(AdmissionTokens::new(&settings).context("invalid token key")?);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients * 2)
        .timeout(Duration::from_secs(30))
        .build()
        .context("http client")?;
    let run_id = &shared::ids::new_id()[20..];
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);
    let mut tasks = Vec::with_capacity(args.clients);
    for client in 0..args.clients {
        let (http, tokens, args) = (http.clone(), tokens.clone(), args.clone());
        let prefix = format!("lo{run_id}-{client}");
        tasks.push(tokio::spawn(async move {
            match args.mode {
                Mode::Cart => cart_loop(http, tokens, args, prefix, deadline).await,
                Mode::Order => order_loop(http, tokens, args, prefix, deadline).await,
            }
        }));
    }
    let (mut put, mut get, mut order) = (Recorder::new(), Recorder::new(), Recorder::new());
    for t in tasks {
        let (p, g, o) = t.await.context("client task panicked")?;
        put.merge(&p);
        get.merge(&g);
        order.merge(&o);
    }
    let elapsed = started.elapsed();
    let secs = elapsed.as_secs_f64().max(1e-9);
    let put_s = put.summary(elapsed);
    let get_s = get.summary(elapsed);
    let order_s = order.summary(elapsed);
    Ok(OrdersReport {
        mode: args.mode,
        sku: (args.mode == Mode::Order).then(|| args.sku.clone()),
        clients: args.clients,
        duration_s: secs,
        cart_ops_per_s: if args.mode == Mode::Cart {
            (put_s.requests + get_s.requests) as f64 / secs
        } else {
            0.0
        },
        orders_per_s: order.count("201") as f64 / secs,
        order_requests_per_s: order_s.requests as f64 / secs,
        put: put_s,
        get: (args.mode == Mode::Cart).then_some(get_s),
        order: (args.mode == Mode::Order).then_some(order_s),
    })
}

pub fn print(r: &OrdersReport) {
    match r.mode {
        Mode::Cart => println!(
            "orders/cart: {} clients, {:.1} s: {:.0} cart ops/s",
            r.clients, r.duration_s, r.cart_ops_per_s
        ),
        Mode::Order => println!(
            "orders/order {}: {} clients, {:.1} s: {:.0} orders/s ({:.0} order requests/s)",
            r.sku.as_deref().unwrap_or("?"),
            r.clients,
            r.duration_s,
            r.orders_per_s,
            r.order_requests_per_s
        ),
    }
    r.put.print("cart put");
    if let Some(g) = &r.get {
        g.print("cart get");
    }
    if let Some(o) = &r.order {
        o.print("order");
    }
}

fn mint(tokens: &AdmissionTokens, account: &str, event: &str) -> Option<String> {
    let now = chrono::Utc::now().timestamp();
    tokens
        .mint(account, account, event, now, 600)
        .ok()
        .map(|(t, _)| t)
}

/// Sends one request and records it under `rec`; returns the status (0 on transport error).
async fn send(rec: &mut Recorder, req: reqwest::RequestBuilder) -> u16 {
    let t0 = Instant::now();
    match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.unwrap_or_default();
            rec.record(t0.elapsed(), &outcome(status, &bytes));
            status
        }
        Err(_) => {
            rec.record(t0.elapsed(), "transport error");
            0
        }
    }
}

async fn cart_loop(
    http: reqwest::Client,
    tokens: Arc<AdmissionTokens>,
    args: OrdersArgs,
    account: String,
    deadline: Instant,
) -> (Recorder, Recorder, Recorder) {
    let (mut put, mut get) = (Recorder::new(), Recorder::new());
    let Some(token) = mint(&tokens, &account, &args.event) else {
        put.record(Duration::ZERO, "mint failed");
        return (put, get, Recorder::new());
    };
    let cart_url = format!("{}/api/events/{}/cart", args.booking, args.event);
    while Instant::now() < deadline {
        let (roll, sku, qty) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..10u32),
                rng.random_range(0..args.skus.max(1)),
                rng.random_range(1..=5u32),
            )
        };
        if roll == 0 {
            send(&mut get, http.get(&cart_url).bearer_auth(&token)).await;
        } else {
            let url = format!(
                "{}/api/events/{}/cart/items/SKU-{sku}",
                args.booking, args.event
            );
            let body = serde_json::json!({ "quantity": qty });
            send(&mut put, http.put(url).bearer_auth(&token).json(&body)).await;
        }
    }
    (put, get, Recorder::new())
}

async fn order_loop(
    http: reqwest::Client,
    tokens: Arc<AdmissionTokens>,
    args: OrdersArgs,
    prefix: String,
    deadline: Instant,
) -> (Recorder, Recorder, Recorder) {
    let (mut put, mut order) = (Recorder::new(), Recorder::new());
    let put_url = format!(
        "{}/api/events/{}/cart/items/{}",
        args.booking, args.event, args.sku
    );
    let order_url = format!("{}/api/orders", args.booking);
    let line = serde_json::json!({ "quantity": 1 });
    let body = serde_json::json!({ "source": "cart" });
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        n += 1;
        let account = format!("{prefix}-{n}");
        let Some(token) = mint(&tokens, &account, &args.event) else {
            order.record(Duration::ZERO, "mint failed");
            continue;
        };
        if send(&mut put, http.put(&put_url).bearer_auth(&token).json(&line)).await != 200 {
            continue;
        }
        let req = http
            .post(&order_url)
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("{account}-o"))
            .json(&body);
        send(&mut order, req).await;
    }
    (put, Recorder::new(), order)
}
