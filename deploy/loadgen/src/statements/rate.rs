//! The purchase rate (issue 16's last row): `--purchase-clients` fans at once, each buying one
//! seat after another (hold → order → pay through the sandbox) for `--purchase-seconds`, every
//! purchase a new account. Reports purchases per second, the latency of a whole purchase, and
//! the CPU that booking and Postgres spent per purchase (from `/proc`, so booking must run on
//! this machine: `--booking-pid`). The webhooks the purchases caused are then delivered in one
//! flush and timed on their own (the sandbox queues them by hand, as in the statement counts).

use super::Ctx;
use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct PurchaseRate {
    pub clients: usize,
    pub seconds: f64,
    pub purchases: usize,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Purchases that failed (any step answered other than expected); none expected.
    pub errors: usize,
    /// CPU milliseconds per purchase; `None` without `--booking-pid` or `/proc`.
    pub booking_cpu_ms: Option<f64>,
    pub postgres_cpu_ms: Option<f64>,
    /// The webhooks of those purchases, delivered in one flush afterwards.
    pub webhooks: u64,
    pub webhooks_per_s: f64,
    /// Where Postgres' time went during the run: the statements by total execution time.
    pub heaviest: Vec<TimedStatement>,
}

#[derive(Debug, Serialize)]
pub struct TimedStatement {
    pub calls: i64,
    pub total_ms: f64,
    pub mean_ms: f64,
    /// Mean planning time (0 unless `pg_stat_statements.track_planning` is on).
    pub plan_mean_ms: f64,
    /// How many times Postgres planned it: a cached generic plan is planned once per
    /// connection, so plans close to calls means the plan cache is not doing its job.
    pub plans: i64,
    pub query: String,
}

/// The statements of the run by total execution time (`pg_stat_statements`, reset at its start).
async fn heaviest(c: &Ctx) -> anyhow::Result<Vec<TimedStatement>> {
    let rows: Vec<(i64, f64, f64, i64, String)> = sqlx::query_as(
        "SELECT sum(s.calls)::bigint, sum(s.total_exec_time)::float8,
                sum(s.total_plan_time)::float8, sum(s.plans)::bigint, s.query
           FROM pg_stat_statements s
           JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()
          WHERE s.toplevel AND s.query NOT ILIKE '%pg_stat%'
          GROUP BY s.query ORDER BY 2 DESC LIMIT 8",
    )
    .fetch_all(&c.pg)
    .await
    .context("read pg_stat_statements")?;
    Ok(rows
        .into_iter()
        .map(|(calls, total_ms, plan_ms, plans, q)| TimedStatement {
            calls,
            total_ms,
            mean_ms: total_ms / calls.max(1) as f64,
            plan_mean_ms: plan_ms / calls.max(1) as f64,
            plans,
            query: super::abbreviate(&q),
        })
        .collect())
}

/// Linux reports process CPU in clock ticks of 1/100 s (`USER_HZ`, fixed by the kernel ABI on
/// the architectures we run on).
const TICKS_PER_S: f64 = 100.0;

/// CPU seconds used so far by `pid` (user + system), `None` when it is gone.
fn proc_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3, so utime and stime (fields 14, 15) are the 12th and 13th there.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let utime: f64 = f.next()?.parse().ok()?;
    let stime: f64 = f.next()?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_S)
}

/// The bench database's backends (booking's pools) other than ours.
async fn backends(c: &Ctx) -> anyhow::Result<Vec<u32>> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&c.pg)
    .await
    .context("list the bench database's backends")?;
    Ok(pids
        .into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .collect())
}

/// CPU seconds `pids` used since `before` (a process absent from it started during the run
/// and counts whole; a process gone since counts nothing).
fn cpu_since(pids: &[u32], before: &std::collections::HashMap<u32, f64>) -> f64 {
    pids.iter()
        .filter_map(|p| Some(proc_cpu_s(*p)? - before.get(p).copied().unwrap_or(0.0)))
        .sum()
}

/// One purchase of `seat` by `account` (hold → order → pay); its latency. The statement
/// counts' whole purchase runs it too.
pub(super) async fn purchase(
    c: &Ctx,
    event: &str,
    seat: &str,
    account: &str,
) -> anyhow::Result<Duration> {
    let post = reqwest::Method::POST;
    let tok = c.token(account, event)?;
    let t0 = Instant::now();
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
    let hold = v["hold_id"].as_str().context("hold id")?;
    let v = c
        .expect(
            post.clone(),
            "/api/orders",
            &tok,
            true,
            json!({"hold_id": hold}),
            &[201],
        )
        .await?;
    let order = v["id"].as_str().context("order id")?;
    c.expect(
        post,
        &format!("/api/orders/{order}/pay"),
        &tok,
        true,
        json!({"payment_method": "pm_card_visa"}),
        &[200],
    )
    .await?;
    Ok(t0.elapsed())
}

pub(super) async fn measure(c: Arc<Ctx>) -> anyhow::Result<PurchaseRate> {
    let clients = c.args.purchase_clients.max(1);
    let seconds = c.args.purchase_seconds.max(1);
    // Setup (not measured): an event with more seats than the run can sell.
    let event = format!("stm-{}-rate", c.run);
    let rows = c.args.purchase_seats.div_ceil(50).max(1);
    c.expect(reqwest::Method::POST, "/admin/events", &c.args.admin_token, false, json!({
        "id": event, "name": "purchase rate bench", "sale_start": "2020-01-01T00:00:00Z",
        "price_tiers": [{"tier": "A", "price": 5000}],
        "seat_map": {"sections": [{"name": "R", "rows": rows, "seats_per_row": 50, "price_tier": "A"}]},
    }), &[200, 201]).await?;
    let reader = c.token(&format!("stm-{}-rate-reader", c.run), &event)?;
    let map = c
        .expect(
            reqwest::Method::GET,
            &format!("/api/events/{event}/seats"),
            &reader,
            false,
            serde_json::Value::Null,
            &[200],
        )
        .await?;
    let seats: Arc<Vec<String>> = Arc::new(
        map["seats"]
            .as_array()
            .context("seat map")?
            .iter()
            .filter_map(|s| s["seat_id"].as_str().map(str::to_owned))
            .collect(),
    );
    c.flush_webhooks().await?;

    let booking_pid = c.args.booking_pid;
    let pg_pids = backends(&c).await?;
    let mut before = std::collections::HashMap::new();
    for p in pg_pids.iter().copied().chain(booking_pid) {
        if let Some(s) = proc_cpu_s(p) {
            before.insert(p, s);
        }
    }
    c.reset().await?;
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (c, seats, next, event) = (
            Arc::clone(&c),
            Arc::clone(&seats),
            Arc::clone(&next),
            event.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0usize;
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(seat) = seats.get(i) else { break };
                let account = format!("stm-{}-rate-{i}", c.run);
                match purchase(&c, &event, seat, &account).await {
                    Ok(d) => latencies.push(d),
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("purchase rate: {e:#}");
                        }
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.context("purchase client")?;
        latencies.extend(l);
        errors += e;
    }
    let wall = started.elapsed().as_secs_f64();
    // Backends opened during the run (lazily filled pools) count from zero.
    let mut pg_now = backends(&c).await?;
    pg_now.extend(pg_pids.iter().copied());
    pg_now.sort_unstable();
    pg_now.dedup();
    let pg_cpu = cpu_since(&pg_now, &before);
    let booking_cpu = booking_pid.and_then(|p| Some(proc_cpu_s(p)? - before.get(&p)?));

    let heaviest = heaviest(&c).await?;
    latencies.sort_unstable();
    let pct = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    let n = latencies.len();
    let per = |cpu_s: f64| (n > 0).then(|| cpu_s * 1000.0 / n as f64);
    let t0 = Instant::now();
    let webhooks = c.flush_webhooks().await?;
    let hook_s = t0.elapsed().as_secs_f64().max(1e-6);
    Ok(PurchaseRate {
        clients,
        seconds: wall,
        purchases: n,
        per_s: n as f64 / wall.max(1e-6),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
        booking_cpu_ms: booking_cpu.and_then(per),
        postgres_cpu_ms: if pg_now.is_empty() { None } else { per(pg_cpu) },
        webhooks,
        webhooks_per_s: webhooks as f64 / hook_s,
        heaviest,
    })
}
