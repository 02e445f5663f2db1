//! From simulated request rates to machines: Redis commands per second on the event's
//! busiest shard, and gateway processes needed, from per-operation costs measured on this
//! project's 2-core benchmark box (docs/benchmarks.md). Every default names its source; the
//! CLI lets each be replaced by a measurement of the production hardware.
//!
//! What each request costs Redis: a join is one script call (refused joins too: the script
//! answers "sold out"); a waiting fan's status poll is none (answered from gateway memory,
//! `progress.rs`); the poll that claims an admission is one; a checkout slot update is one;
//! and every gateway instance, per event, reads queue progress once a second, the live config
//! every `refresh_ms`, runs the tick every `tick_ms` (only the leader's admits, but every
//! instance's call reaches Redis) and publishes its health once a second.

use super::timeline::Timeline;
use serde::Serialize;

/// `bench:gateway`, "join through the gateway (new account each)": joins/s one gateway
/// process (2 threads) answered on the 2-core box, Redis and the load generator beside it.
pub const GW_JOINS_PER_S: f64 = 34_994.0;
/// `bench:gateway`, "status poll through the gateway": a poll answered with one Redis call
/// (the claims of admitted fans).
pub const GW_STATUS_PER_S: f64 = 51_358.0;
/// `bench:gateway`, "Status polls from memory", gateway-status-mem-1x2-1 (2026-12-02): a
/// waiting fan's poll answered from the gateway's queue progress, one process × 2 threads.
pub const GW_STATUS_MEMORY_PER_S: f64 = 57_260.0;
/// `bench:gateway`, "gateway-proxy-1x2-1": admitted API requests proxied per second.
pub const GW_PROXIED_PER_S: f64 = 54_761.0;
/// `bench:gateway`, "redis-benchmark: EVALSHA join script": the heaviest script a launch
/// runs, so a shard's capacity in script calls per second (every command is counted as one).
pub const REDIS_CALLS_PER_S: f64 = 45_116.0;
/// Run machines at this share of their measured peak: the surge bench's status p99 rose
/// sharply as the 2 cores neared saturation (docs/benchmarks.md, `bench:surge`).
pub const TARGET_UTILIZATION: f64 = 0.6;

/// Per-operation capacities and the deployment's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Costs {
    pub gw_joins_per_s: f64,
    pub gw_status_memory_per_s: f64,
    pub gw_claims_per_s: f64,
    pub gw_proxied_per_s: f64,
    pub redis_calls_per_s: f64,
    pub target_utilization: f64,
    /// Sub-queues the event's queue is split over (`queue_shards`): joins and claims spread
    /// evenly; per-instance reads are all counted on the busiest shard.
    pub queue_shards: u64,
    /// Gateway instances for the per-instance Redis reads; `None`: the number needed.
    pub gateways: Option<u64>,
    pub tick_ms: u64,
    pub refresh_ms: u64,
}

/// Machines needed for the simulated launch.
#[derive(Debug, Clone, Serialize)]
pub struct Sizing {
    /// Gateway processes to keep the busiest second at `target_utilization`.
    pub gateways_needed: u64,
    /// Busiest second's gateway work in processes at 100 %.
    pub peak_gateway_load: f64,
    pub peak_gateway_load_at_s: i64,
    pub gateways_counted: u64,
    /// Redis calls per second each gateway instance makes per event, load or not.
    pub per_instance_redis_per_s: f64,
    pub redis_busiest_shard_peak_per_s: f64,
    pub redis_busiest_shard_peak_at_s: i64,
    pub redis_busiest_shard_mean_per_s: f64,
    pub redis_peak_utilization: f64,
    /// Sub-queues that keep the busiest shard at `target_utilization`.
    pub queue_shards_needed: u64,
    pub costs: Costs,
}

impl Costs {
    pub fn per_instance_redis_per_s(&self) -> f64 {
        1.0 + 1000.0 / self.refresh_ms.max(1) as f64 + 1000.0 / self.tick_ms.max(1) as f64 + 1.0
    }
}

/// Fills each second's gateway load and Redis calls and sizes the deployment.
pub fn size(tl: &mut Timeline, c: &Costs) -> Sizing {
    let mut peak_load = (0.0, 0);
    for r in &mut tl.rows {
        r.gateway_load = r.joins as f64 / c.gw_joins_per_s
            + r.status_memory / c.gw_status_memory_per_s
            + r.claims as f64 / c.gw_claims_per_s
            + r.proxied / c.gw_proxied_per_s;
        if r.gateway_load > peak_load.0 {
            peak_load = (r.gateway_load, r.t);
        }
    }
    let util = c.target_utilization.clamp(0.01, 1.0);
    let needed = ((peak_load.0 / util).ceil() as u64).max(1);
    let gateways = c.gateways.unwrap_or(needed).max(1);
    let per_instance = c.per_instance_redis_per_s();
    let background = gateways as f64 * per_instance;
    let shards = c.queue_shards.max(1) as f64;
    let (mut peak, mut sum, mut n) = ((0.0, 0), 0.0, 0u64);
    let mut peak_spread = 0.0f64;
    for r in &mut tl.rows {
        let spread = (r.joins + r.claims + r.session_ops) as f64;
        r.redis_busiest_shard = spread / shards + background;
        peak_spread = peak_spread.max(spread);
        if r.redis_busiest_shard > peak.0 {
            peak = (r.redis_busiest_shard, r.t);
        }
        sum += r.redis_busiest_shard;
        n += 1;
    }
    let room = c.redis_calls_per_s * util - background;
    let queue_shards_needed = if room > 0.0 {
        ((peak_spread / room).ceil() as u64).max(1)
    } else {
        u64::MAX
    };
    Sizing {
        gateways_needed: needed,
        peak_gateway_load: peak_load.0,
        peak_gateway_load_at_s: peak_load.1,
        gateways_counted: gateways,
        per_instance_redis_per_s: per_instance,
        redis_busiest_shard_peak_per_s: peak.0,
        redis_busiest_shard_peak_at_s: peak.1,
        redis_busiest_shard_mean_per_s: if n > 0 { sum / n as f64 } else { 0.0 },
        redis_peak_utilization: peak.0 / c.redis_calls_per_s,
        queue_shards_needed,
        costs: c.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> Costs {
        Costs {
            gw_joins_per_s: GW_JOINS_PER_S,
            gw_status_memory_per_s: GW_STATUS_MEMORY_PER_S,
            gw_claims_per_s: GW_STATUS_PER_S,
            gw_proxied_per_s: GW_PROXIED_PER_S,
            redis_calls_per_s: REDIS_CALLS_PER_S,
            target_utilization: 0.6,
            queue_shards: 1,
            gateways: None,
            tick_ms: 250,
            refresh_ms: 250,
        }
    }

    #[test]
    fn busiest_second_sizes_gateways_and_redis() {
        let mut tl = Timeline::new(0);
        tl.at(0).joins = 35_000;
        tl.at(1000).status_memory = 51_358.0;
        tl.at(1000).claims = 100;
        let s = size(&mut tl, &costs());
        // One process fully busy with joins: two at 60 %.
        assert!((s.peak_gateway_load - 1.0).abs() < 0.01);
        assert_eq!(s.gateways_needed, 2);
        assert_eq!(s.per_instance_redis_per_s, 10.0);
        assert_eq!(s.redis_busiest_shard_peak_per_s, 35_000.0 + 20.0);
        // 35,000 joins/s need two sub-queues to stay under 60 % of 45,116.
        assert_eq!(s.queue_shards_needed, 2);
        assert_eq!(tl.rows[1].redis_busiest_shard, 100.0 + 20.0);
    }
}
