//! The `statements` scenario (issue 16): what each write operation costs Postgres, counted by
//! `pg_stat_statements` rather than timed, so the figures do not depend on how busy the
//! machine is. One client drives each operation `--count` times through booking's real HTTP
//! API (the payments through the sandbox provider, its webhooks flushed by hand), with the
//! statistics of the bench database reset before each operation and read after it.
//!
//! Counted: every top-level statement booking sent (`pg_stat_statements.track = all`,
//! `track_utility = on`: BEGIN, COMMIT, SET, SAVEPOINT included). Round trips: the same,
//! less the `SET LOCAL`s and `SELECT set_config(…)`s, which booking only ever sends in one simple
//! query with their `BEGIN`.
//! Needs booking with its jobs off (their statements would be counted) and the sandbox with
//! `webhook_mode = manual`.

use anyhow::{Context, bail};
use clap::Args;
use secrecy::SecretString;
use serde::Serialize;
use serde_json::{Value, json};
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use sqlx::PgPool;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

mod rate;

#[derive(Debug, Clone, Args)]
pub struct StatementsArgs {
    /// Booking base URL (direct).
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub booking: String,
    /// The sandbox provider booking pays through (webhooks flushed via `/_sandbox`).
    #[arg(long, default_value = "http://127.0.0.1:8099")]
    pub sandbox: String,
    #[arg(
        long,
        env = "FLOODGATE_SANDBOX__API_KEY",
        default_value = "sk_test_dev"
    )]
    pub sandbox_key: String,
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN")]
    pub admin_token: String,
    /// Booking's database (pg_stat_statements is read and reset for this database only).
    #[arg(long, env = "DATABASE_URL")]
    pub db: String,
    /// Requests per operation.
    #[arg(long, default_value_t = 20)]
    pub count: usize,
    /// Statements listed per operation.
    #[arg(long, default_value_t = 12)]
    pub top: usize,
    #[arg(long, env = "LOADGEN_TOKEN_SECRET")]
    pub token_secret: Option<String>,
    #[arg(long, default_value = "dev-1")]
    pub token_kid: String,
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// The markdown table of the results.
    #[arg(long)]
    pub markdown: Option<std::path::PathBuf>,
    /// After the counts, this many fans buy at once for `--purchase-seconds` (0: skip).
    #[arg(long, default_value_t = 0)]
    pub purchase_clients: usize,
    #[arg(long, default_value_t = 10)]
    pub purchase_seconds: u64,
    /// Seats of the purchase-rate event (the run stops early when they are sold).
    #[arg(long, default_value_t = 20_000)]
    pub purchase_seats: usize,
    /// Booking's process id, for its CPU per purchase (booking on this machine).
    #[arg(long)]
    pub booking_pid: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct TopStatement {
    pub per_op: f64,
    pub query: String,
}

#[derive(Debug, Serialize)]
pub struct OpCost {
    pub name: String,
    pub requests: usize,
    pub statements: i64,
    pub statements_per_op: f64,
    pub round_trips_per_op: f64,
    pub top: Vec<TopStatement>,
}

#[derive(Debug, Serialize)]
pub struct StatementsReport {
    pub count: usize,
    pub ops: Vec<OpCost>,
    pub purchase_rate: Option<rate::PurchaseRate>,
}

struct Ctx {
    args: StatementsArgs,
    http: reqwest::Client,
    tokens: AdmissionTokens,
    pg: PgPool,
    run: String,
}

impl Ctx {
    fn token(&self, account: &str, event: &str) -> anyhow::Result<String> {
        let now = chrono::Utc::now().timestamp();
        Ok(self
            .tokens
            .mint(account, account, event, now, 3600)
            .context("mint token")?
            .0)
    }

    /// POST (or PUT) with a JSON body; returns the status and body.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
        idem: bool,
        body: Value,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{path}", self.args.booking);
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(bearer)
            .json(&body);
        if idem {
            req = req.header("Idempotency-Key", shared::ids::new_id());
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("request to {url}"))?;
        let status = resp.status().as_u16();
        let v = resp.json().await.unwrap_or(Value::Null);
        Ok((status, v))
    }

    /// Like [`Ctx::send`], failing unless the status is one of `ok`.
    async fn expect(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
        idem: bool,
        body: Value,
        ok: &[u16],
    ) -> anyhow::Result<Value> {
        let (status, v) = self.send(method, path, bearer, idem, body).await?;
        if !ok.contains(&status) {
            bail!("{path}: {status} {v}");
        }
        Ok(v)
    }

    async fn reset(&self) -> anyhow::Result<()> {
        sqlx::query(
            "SELECT pg_stat_statements_reset(0::oid, d.oid, 0::bigint)
               FROM pg_database d WHERE d.datname = current_database()",
        )
        .execute(&self.pg)
        .await
        .context("pg_stat_statements_reset (is pg_stat_statements loaded?)")?;
        Ok(())
    }

    async fn cost(&self, name: &str, requests: usize) -> anyhow::Result<OpCost> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT sum(s.calls)::bigint, s.query FROM pg_stat_statements s
               JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()
              WHERE s.toplevel AND s.query NOT ILIKE '%pg_stat_statements%'
              GROUP BY s.query ORDER BY 1 DESC, 2",
        )
        .fetch_all(&self.pg)
        .await
        .context("read pg_stat_statements")?;
        let total: i64 = rows.iter().map(|r| r.0).sum();
        let set_local: i64 = rows
            .iter()
            .filter(|r| {
                let q = r.1.trim_start().to_ascii_uppercase();
                q.starts_with("SET LOCAL") || q.starts_with("SELECT SET_CONFIG(")
            })
            .map(|r| r.0)
            .sum();
        let n = requests.max(1) as f64;
        Ok(OpCost {
            name: name.to_owned(),
            requests,
            statements: total,
            statements_per_op: total as f64 / n,
            round_trips_per_op: (total - set_local) as f64 / n,
            top: rows
                .iter()
                .take(self.args.top)
                .map(|(calls, q)| TopStatement {
                    per_op: *calls as f64 / n,
                    query: abbreviate(q),
                })
                .collect(),
        })
    }

    async fn flush_webhooks(&self) -> anyhow::Result<u64> {
        let url = format!("{}/_sandbox/webhooks/flush", self.args.sandbox);
        let resp = self
            .http
            .post(&url)
            .bearer_auth(&self.args.sandbox_key)
            .send()
            .await
            .with_context(|| url.clone())?;
        if !resp.status().is_success() {
            bail!("{url}: {}", resp.status());
        }
        let v: Value = resp.json().await.context("flush JSON")?;
        // A count, or the list of deliveries.
        let d = &v["delivered"];
        Ok(d.as_u64()
            .or_else(|| d.as_array().map(|a| a.len() as u64))
            .unwrap_or(0))
    }
}

/// One line, whitespace collapsed, at most 110 characters.
fn abbreviate(q: &str) -> String {
    let one: String = q.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 110 {
        let cut: String = one.chars().take(107).collect();
        format!("{cut}...")
    } else {
        one
    }
}

pub async fn run(args: StatementsArgs) -> anyhow::Result<StatementsReport> {
    let mut settings = TokenSettings::default();
    if let Some(secret) = &args.token_secret {
        settings.keys = vec![KeySettings {
            kid: args.token_kid.clone(),
            secret: SecretString::from(secret.clone()),
        }];
        settings.current_kid = args.token_kid.clone();
    }
    let tokens = AdmissionTokens::new(&settings).context("invalid token key")?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("http client")?;
    let pg = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.db)
        .await
        .context("connect to the bench database")?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pg)
        .await
        .context("create extension pg_stat_statements")?;
    let run = shared::ids::new_id()[20..].to_ascii_lowercase();
    let ctx = Arc::new(Ctx {
        args,
        http,
        tokens,
        pg,
        run,
    });
    let mut report = measure(&ctx).await?;
    if ctx.args.purchase_clients > 0 {
        report.purchase_rate = Some(rate::measure(Arc::clone(&ctx)).await?);
    }
    Ok(report)
}

async fn measure(c: &Ctx) -> anyhow::Result<StatementsReport> {
    let n = c.args.count;
    let r = &c.run;
    let admin = c.args.admin_token.clone();
    let post = reqwest::Method::POST;
    // Setup (not measured): a seated event that also sells a product and runs a cold
    // auction, and a GA event.
    let event = format!("stm-{r}");
    let ga_event = format!("stm-{r}-ga");
    let rows = (3 * n).div_ceil(50).max(1);
    c.expect(post.clone(), "/admin/events", &admin, false, json!({
        "id": event, "name": "statements bench", "sale_start": "2020-01-01T00:00:00Z",
        "price_tiers": [{"tier": "A", "price": 5000}],
        "seat_map": {"sections": [{"name": "S", "rows": rows, "seats_per_row": 50, "price_tier": "A"}]},
    }), &[200, 201]).await?;
    c.expect(
        post.clone(),
        "/admin/events",
        &admin,
        false,
        json!({
            "id": ga_event, "name": "statements bench GA", "sale_start": "2020-01-01T00:00:00Z",
            "ga_tiers": [{"tier": "FLOOR", "price": 3000, "capacity": 1_000_000, "shards": 1}],
        }),
        &[200, 201],
    )
    .await?;
    let sku = format!("STM-{r}");
    c.expect(
        post.clone(),
        "/admin/products",
        &admin,
        false,
        json!({
            "sku": sku, "event": event, "name": "statements bench", "price": 1000,
            "stock": 1_000_000, "hot": false,
        }),
        &[200, 201],
    )
    .await?;
    let seller = c.token(&format!("stm-{r}-seller"), &event)?;
    let end = chrono::Utc::now() + chrono::Duration::hours(2);
    let auction = c
        .expect(
            post.clone(),
            "/api/auctions",
            &seller,
            true,
            json!({
                "event": event, "title": "statements bench", "start_price": 1000,
                "min_increment": 10, "end_time": end.to_rfc3339(), "hot": false,
            }),
            &[201],
        )
        .await?["id"]
        .as_str()
        .context("auction id")?
        .to_owned();
    let map = c
        .expect(
            reqwest::Method::GET,
            &format!("/api/events/{event}/seats"),
            &seller,
            false,
            Value::Null,
            &[200],
        )
        .await?;
    let seats: Vec<String> = map["seats"]
        .as_array()
        .context("seat map")?
        .iter()
        .filter_map(|s| s["seat_id"].as_str().map(str::to_owned))
        .collect();
    if seats.len() < 3 * n {
        bail!("only {} seats", seats.len());
    }
    let mut ops = Vec::new();

    // Seat holds (kept: the orders below are made from them).
    let mut holds = Vec::with_capacity(n);
    c.reset().await?;
    for (i, seat) in seats.iter().take(n).enumerate() {
        let account = format!("stm-{r}-fan-{i}");
        let tok = c.token(&account, &event)?;
        let v = c
            .expect(
                post.clone(),
                &format!("/api/events/{event}/holds"),
                &tok,
                false,
                json!({"seats": [seat]}),
                &[201],
            )
            .await?;
        holds.push((tok, v["hold_id"].as_str().context("hold id")?.to_owned()));
    }
    ops.push(c.cost("seat hold", n).await?);

    c.reset().await?;
    for i in 0..n {
        let tok = c.token(&format!("stm-{r}-ga-{i}"), &ga_event)?;
        c.expect(
            post.clone(),
            &format!("/api/events/{ga_event}/ga-holds"),
            &tok,
            false,
            json!({"tier": "FLOOR", "quantity": 1}),
            &[201],
        )
        .await?;
    }
    ops.push(c.cost("GA hold", n).await?);

    let mut orders = Vec::with_capacity(n);
    c.reset().await?;
    for (tok, hold) in &holds {
        let v = c
            .expect(
                post.clone(),
                "/api/orders",
                tok,
                true,
                json!({"hold_id": hold}),
                &[201],
            )
            .await?;
        orders.push((
            tok.clone(),
            v["id"].as_str().context("order id")?.to_owned(),
        ));
    }
    ops.push(c.cost("order from hold", n).await?);

    let mut cart_tokens = Vec::with_capacity(n);
    for i in 0..n {
        let tok = c.token(&format!("stm-{r}-cart-{i}"), &event)?;
        c.expect(
            reqwest::Method::PUT,
            &format!("/api/events/{event}/cart/items/{sku}"),
            &tok,
            false,
            json!({"quantity": 1}),
            &[200, 201, 204],
        )
        .await?;
        cart_tokens.push(tok);
    }
    c.reset().await?;
    for tok in &cart_tokens {
        c.expect(
            post.clone(),
            "/api/orders",
            tok,
            true,
            json!({"source": "cart"}),
            &[201],
        )
        .await?;
    }
    ops.push(c.cost("order from cart", n).await?);

    c.flush_webhooks().await?;
    c.reset().await?;
    for (tok, order) in &orders {
        c.expect(
            post.clone(),
            &format!("/api/orders/{order}/pay"),
            tok,
            true,
            json!({"payment_method": "pm_card_visa"}),
            &[200],
        )
        .await?;
    }
    ops.push(c.cost("pay", n).await?);

    c.reset().await?;
    let delivered = c.flush_webhooks().await?;
    ops.push(
        c.cost("webhook", usize::try_from(delivered).unwrap_or(n))
            .await?,
    );

    c.reset().await?;
    for i in 0..n {
        let tok = c.token(&format!("stm-{r}-bidder-{i}"), &event)?;
        let amount = 1000 + 10 * (i as i64 + 1);
        c.expect(
            post.clone(),
            &format!("/api/auctions/{auction}/bids"),
            &tok,
            true,
            json!({"amount": amount}),
            &[200, 201],
        )
        .await?;
    }
    ops.push(c.cost("bid (cold auction)", n).await?);

    // The whole purchase: hold -> order -> pay -> webhook.
    c.reset().await?;
    for (i, seat) in seats.iter().skip(n).take(n).enumerate() {
        rate::purchase(c, &event, seat, &format!("stm-{r}-buyer-{i}")).await?;
        c.flush_webhooks().await?;
    }
    ops.push(c.cost("whole purchase", n).await?);
    Ok(StatementsReport {
        count: n,
        ops,
        purchase_rate: None,
    })
}

pub fn print(r: &StatementsReport) {
    for o in &r.ops {
        println!(
            "statements: {:<20} {:>6.1} statements/op, {:>6.1} round trips/op ({} requests)",
            o.name, o.statements_per_op, o.round_trips_per_op, o.requests
        );
    }
    if let Some(p) = &r.purchase_rate {
        println!(
            "purchases: {} clients, {} in {:.1} s = {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, {} errors; \
             webhooks {:.0}/s",
            p.clients,
            p.purchases,
            p.seconds,
            p.per_s,
            p.p50_ms,
            p.p99_ms,
            p.errors,
            p.webhooks_per_s
        );
    }
}

/// The markdown table and, per operation, its most frequent statements.
pub fn markdown(r: &StatementsReport) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| operation | requests | statements / op | round trips / op |\n| --- | ---: | ---: | ---: |"
    );
    for o in &r.ops {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} |",
            o.name, o.requests, o.statements_per_op, o.round_trips_per_op
        );
    }
    for o in &r.ops {
        let _ = writeln!(
            md,
            "\n<details><summary>{}: top statements (calls per op)</summary>\n",
            o.name
        );
        for t in &o.top {
            let _ = writeln!(md, "- {:.1} × `{}`", t.per_op, t.query.replace('`', "'"));
        }
        let _ = writeln!(md, "\n</details>");
    }
    if let Some(p) = &r.purchase_rate {
        let ms = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"));
        let _ = writeln!(
            md,
            "\n**Purchase rate**: {} fans at once, each buying one seat after another (hold → \
             order → pay through the sandbox, a new account per purchase) for {:.1} s:\n\n\
             | purchases | per second | p50 | p99 | errors | booking CPU / purchase | Postgres CPU / purchase | webhooks after, per second |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
             | {} | **{:.0}** | {:.1} ms | {:.1} ms | {} | {} ms | {} ms | {:.0} ({} delivered) |",
            p.clients,
            p.seconds,
            p.purchases,
            p.per_s,
            p.p50_ms,
            p.p99_ms,
            p.errors,
            ms(p.booking_cpu_ms),
            ms(p.postgres_cpu_ms),
            p.webhooks_per_s,
            p.webhooks
        );
        let _ = writeln!(
            md,
            "\n<details><summary>purchase rate: Postgres time by statement</summary>\n\n\
             | calls | plans | total ms | mean ms | mean planning ms | statement |\n\
             | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for t in &p.heaviest {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.3} | {:.3} | `{}` |",
                t.calls,
                t.plans,
                t.total_ms,
                t.mean_ms,
                t.plan_mean_ms,
                t.query.replace('`', "'").replace('|', "\\|")
            );
        }
        let _ = writeln!(md, "\n</details>");
    }
    md
}
