//! The simulation's results: `summary.json` (machine-readable, what the bench script reads),
//! a text summary, `timeline.csv` and `report.html` (the summary plus inline SVG charts).

use super::buyers::{BuyerParams, BuyerTotals, Inventory};
use super::costs::Sizing;
use super::engine::{Invariants, SimInput, SimOutput};
use super::svg::{Series, esc, line_chart};
use super::timeline::{Second, Timeline};
use serde::Serialize;
use std::fmt::Write;

#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub total: f64,
    pub peak_per_s: f64,
    pub peak_at_s: i64,
    /// Over the run: from the curve's second 0 to the end of the simulation.
    pub mean_per_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Quantiles {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Quantiles {
    /// Nearest-rank quantiles.
    pub fn of(values: &mut [f32]) -> Quantiles {
        if values.is_empty() {
            return Quantiles::default();
        }
        values.sort_unstable_by(f32::total_cmp);
        let n = values.len();
        let q = |p: f64| f64::from(values[((p * n as f64).ceil() as usize).clamp(1, n) - 1]);
        Quantiles {
            count: n as u64,
            p50: q(0.5),
            p95: q(0.95),
            p99: q(0.99),
            max: q(1.0),
            mean: values.iter().map(|v| f64::from(*v)).sum::<f64>() / n as f64,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Fans {
    pub arrived: u64,
    pub refused_at_join: u64,
    /// Let straight through by the safety net (mode `safety_net`), never queued.
    pub passed_at_join: u64,
    pub queued: u64,
    #[serde(flatten)]
    pub buyers: BuyerTotals,
    pub told_sold_out_in_queue: u64,
    pub still_waiting_at_end: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Checks {
    #[serde(flatten)]
    pub invariants: Invariants,
    /// Seats the arrivals would buy if every fan bought.
    pub demand_seats: u64,
    pub seats: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub curve: String,
    pub room: serde_json::Value,
    pub admit_per_minute_used: u64,
    pub sale_start_s: f64,
    pub tick_ms: u64,
    pub buyer_model: BuyerParams,
    pub seed: u64,
    pub simulated_s: f64,
    /// Wall-clock time the simulation took (filled by the CLI).
    pub wall_ms: u64,
    pub fans: Fans,
    pub wait_s: Quantiles,
    pub sold_out_at_s: Option<f64>,
    pub sold_out_flag_at_s: Option<f64>,
    pub queue_peak: u64,
    pub queue_peak_at_s: i64,
    pub joins: Rate,
    pub admitted: Rate,
    /// Every status poll: answered from memory, and claims.
    pub status_polls: Rate,
    pub status_from_memory_total: f64,
    pub claims_total: u64,
    pub proxied: Rate,
    pub inventory: Inventory,
    pub sizing: Sizing,
    pub checks: Checks,
}

fn rate(tl: &Timeline, window_s: f64, f: impl Fn(&Second) -> f64) -> Rate {
    let (mut total, mut peak) = (0.0, (0.0, 0));
    for r in &tl.rows {
        let v = f(r);
        total += v;
        if v > peak.0 {
            peak = (v, r.t);
        }
    }
    Rate {
        total,
        peak_per_s: peak.0,
        peak_at_s: peak.1,
        mean_per_s: total / window_s.max(1e-3),
    }
}

pub fn summarize(input: &SimInput, out: &mut SimOutput, sizing: Sizing) -> Summary {
    let tl = &out.timeline;
    let window_s = (out.end_ms - out.start_ms.max(0)) as f64 / 1000.0;
    let queue_peak = tl.rows.iter().fold((0, 0), |m, r| {
        if r.queue_length > m.0 {
            (r.queue_length, r.t)
        } else {
            m
        }
    });
    let b = &input.buyers;
    Summary {
        curve: input.curve.name.clone(),
        room: serde_json::to_value(&input.room).unwrap_or_default(),
        admit_per_minute_used: input.rate_per_min(),
        sale_start_s: input.sale_start_ms as f64 / 1000.0,
        tick_ms: input.tick_ms,
        buyer_model: input.buyers.clone(),
        seed: input.seed,
        simulated_s: (out.end_ms - out.start_ms) as f64 / 1000.0,
        wall_ms: 0,
        fans: Fans {
            arrived: out.arrived,
            refused_at_join: out.refused,
            passed_at_join: out.passed,
            queued: out.queued,
            buyers: out.buyers.clone(),
            told_sold_out_in_queue: out.told_sold_out,
            still_waiting_at_end: out.still_waiting,
        },
        wait_s: Quantiles::of(&mut out.waits_s),
        sold_out_at_s: out.sold_out_at_ms.map(|t| t as f64 / 1000.0),
        sold_out_flag_at_s: out.sold_out_flag_ms.map(|t| t as f64 / 1000.0),
        queue_peak: queue_peak.0,
        queue_peak_at_s: queue_peak.1,
        joins: rate(tl, window_s, |r| r.joins as f64),
        admitted: rate(tl, window_s, |r| r.admitted as f64),
        status_polls: rate(tl, window_s, Second::status_total),
        status_from_memory_total: tl.rows.iter().map(|r| r.status_memory).sum(),
        claims_total: tl.rows.iter().map(|r| r.claims).sum(),
        proxied: rate(tl, window_s, |r| r.proxied),
        inventory: out.inventory.clone(),
        sizing,
        checks: Checks {
            invariants: out.invariants.clone(),
            demand_seats: out.arrived.saturating_mul(b.seats_per_fan),
            seats: b.seats,
        },
    }
}

fn opt_s(v: Option<f64>) -> String {
    v.map_or_else(|| "never".to_owned(), |s| format!("{s:.1} s"))
}

/// The human summary (stdout).
pub fn text(s: &Summary) -> String {
    let mut o = String::new();
    let f = &s.fans;
    let z = &s.sizing;
    let _ = writeln!(o, "floodgate-sim: {}", s.curve);
    let _ = writeln!(
        o,
        "  room: admit {}/min, mode {}, max_active {}, sale start at {:.0} s; {:.0} s simulated in {} ms",
        s.admit_per_minute_used,
        s.room["mode"].as_str().unwrap_or("?"),
        s.room["max_active"],
        s.sale_start_s,
        s.simulated_s,
        s.wall_ms
    );
    let _ = writeln!(
        o,
        "  fans: {} arrived, {} refused at the join, {} passed straight through by the safety net, {} admitted, {} claimed; {} told sold out in the queue, {} still waiting at the end",
        f.arrived,
        f.refused_at_join,
        f.passed_at_join,
        f.buyers.admitted,
        f.buyers.claimed,
        f.told_sold_out_in_queue,
        f.still_waiting_at_end
    );
    let _ = writeln!(
        o,
        "  waits (arrival → claim): p50 {:.1} s, p95 {:.1} s, p99 {:.1} s, max {:.1} s",
        s.wait_s.p50, s.wait_s.p95, s.wait_s.p99, s.wait_s.max
    );
    let _ = writeln!(
        o,
        "  queue: peak {} at {} s; admitted/s peak {:.0}, mean {:.1}; sold out: {} ({} holds, {} vanished, {} paid, {} seats sold)",
        s.queue_peak,
        s.queue_peak_at_s,
        s.admitted.peak_per_s,
        s.admitted.mean_per_s,
        opt_s(s.sold_out_at_s),
        f.buyers.holds,
        f.buyers.vanished,
        f.buyers.paid,
        s.inventory.sold
    );
    let _ = writeln!(
        o,
        "  requests/s: joins peak {:.0} (mean {:.0}), status polls peak {:.0} (mean {:.0}; {:.0} claims in all), proxied API peak {:.0}",
        s.joins.peak_per_s,
        s.joins.mean_per_s,
        s.status_polls.peak_per_s,
        s.status_polls.mean_per_s,
        s.claims_total,
        s.proxied.peak_per_s
    );
    let _ = writeln!(
        o,
        "  Redis, busiest shard of the event ({} sub-queue(s)): peak {:.0} calls/s at {} s ({:.0} % of {:.0}/s), mean {:.0}; sub-queues needed at {:.0} %: {}",
        z.costs.queue_shards,
        z.redis_busiest_shard_peak_per_s,
        z.redis_busiest_shard_peak_at_s,
        z.redis_peak_utilization * 100.0,
        z.costs.redis_calls_per_s,
        z.redis_busiest_shard_mean_per_s,
        z.costs.target_utilization * 100.0,
        z.queue_shards_needed
    );
    let _ = writeln!(
        o,
        "  gateway processes needed: {} (busiest second {} s = {:.2} processes at 100 %, run at {:.0} %)",
        z.gateways_needed,
        z.peak_gateway_load_at_s,
        z.peak_gateway_load,
        z.costs.target_utilization * 100.0
    );
    let c = &s.checks.invariants;
    let _ = writeln!(
        o,
        "  checks: admission within rate·W + burst: {} (max excess {:.2}, burst {:.2}); within max_active: {} (peak holding {}); admitted before the sale start: {}",
        c.admission_within_rate,
        c.max_window_excess,
        c.burst,
        c.within_max_active,
        c.peak_holding,
        c.admitted_before_sale_start
    );
    o
}

/// `report.html`: the summary and the charts.
pub fn html(s: &Summary, tl: &Timeline) -> String {
    let pts = |f: &dyn Fn(&Second) -> f64| -> Vec<(f64, f64)> {
        tl.rows.iter().map(|r| (r.t as f64, f(r))).collect()
    };
    let mut markers = vec![(s.sale_start_s, "sale start".to_owned())];
    if let Some(t) = s.sold_out_at_s {
        markers.push((t, "sold out".to_owned()));
    }
    let charts = [
        line_chart(
            "Queue length",
            "fans",
            &[
                Series {
                    name: "queue (Redis)",
                    points: pts(&|r| r.queue_length as f64),
                },
                Series {
                    name: "still polling",
                    points: pts(&|r| r.waiting as f64),
                },
                Series {
                    name: "seats sold",
                    points: pts(&|r| r.sold as f64),
                },
            ],
            &markers,
        ),
        line_chart(
            "Admitted per second",
            "fans/s",
            &[Series {
                name: "admitted/s",
                points: pts(&|r| r.admitted as f64),
            }],
            &markers,
        ),
        line_chart(
            "Status polls per second",
            "polls/s",
            &[
                Series {
                    name: "all status polls",
                    points: pts(&Second::status_total),
                },
                Series {
                    name: "claims (Redis)",
                    points: pts(&|r| r.claims as f64),
                },
            ],
            &markers,
        ),
        line_chart(
            "Joins per second",
            "joins/s",
            &[Series {
                name: "joins/s",
                points: pts(&|r| r.joins as f64),
            }],
            &markers,
        ),
        line_chart(
            "Redis calls per second, busiest shard",
            "calls/s",
            &[Series {
                name: "Redis calls/s",
                points: pts(&|r| r.redis_busiest_shard),
            }],
            &markers,
        ),
        line_chart(
            "Gateway load (processes at 100 %)",
            "processes",
            &[Series {
                name: "gateway load",
                points: pts(&|r| r.gateway_load),
            }],
            &markers,
        ),
    ];
    let json = serde_json::to_string_pretty(s).unwrap_or_default();
    let mut o = String::new();
    let _ = write!(
        o,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>floodgate-sim</title>\n<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style></head><body>\n<h1>Launch dry run</h1>\n<pre>{}</pre>\n",
        esc(&text(s))
    );
    for c in charts {
        o.push_str(&c);
    }
    let _ = write!(
        o,
        "<h2>summary.json</h2>\n<pre>{}</pre>\n</body></html>\n",
        esc(&json)
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f32> = (1..=100).rev().map(|x| x as f32).collect();
        let q = Quantiles::of(&mut v);
        assert_eq!(
            (q.count, q.p50, q.p95, q.p99, q.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        assert!((q.mean - 50.5).abs() < 1e-9);
        assert_eq!(Quantiles::of(&mut []).count, 0);
    }
}
