//! The simulation's per-second record: what each second of the launch cost and produced.

use std::fmt::Write;

/// One simulated second. Rates are per second; `queue_length`, `waiting` and `holding` are
/// sampled at the second's last tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Second {
    /// Seconds on the curve's axis (0 = the curve's first second).
    pub t: i64,
    /// `POST /join` requests (each one join script call, refused ones included).
    pub joins: u64,
    /// Joins refused because the event was sold out or closed.
    pub refused: u64,
    pub admitted: u64,
    /// Status polls that claim an admission (one Redis script call each).
    pub claims: u64,
    /// Status polls answered from gateway memory (waiting fans; fractional: an expectation).
    pub status_memory: f64,
    /// Redis `ZCARD` of the queue (fans told "sold out" stay in it, as in Redis).
    pub queue_length: u64,
    /// Fans still polling.
    pub waiting: u64,
    /// `|adm| + |active|`: what `max_active` caps.
    pub holding: u64,
    pub holds: u64,
    /// Seats sold so far (cumulative).
    pub sold: u64,
    /// Admitted fans' API requests through the gateway (seat map, hold, order, pay;
    /// fractional: parked fans' map reads are an expectation).
    pub proxied: f64,
    /// Checkout slot updates (`ZADD XX GT` / `ZREM` on `active`).
    pub session_ops: u64,
    /// Filled in by the cost model: Redis commands on the event's busiest shard.
    pub redis_busiest_shard: f64,
    /// Filled in by the cost model: gateway load in process-equivalents at 100 %.
    pub gateway_load: f64,
}

impl Second {
    pub fn status_total(&self) -> f64 {
        self.status_memory + self.claims as f64
    }
}

/// Seconds from the simulation's start, growing as time advances.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Curve-axis second of row 0.
    pub origin_s: i64,
    pub rows: Vec<Second>,
}

impl Timeline {
    pub fn new(origin_ms: i64) -> Timeline {
        Timeline {
            origin_s: origin_ms.div_euclid(1000),
            rows: Vec::new(),
        }
    }

    /// The row of the second containing `ms` (curve axis).
    pub fn at(&mut self, ms: i64) -> &mut Second {
        let i = usize::try_from(ms.div_euclid(1000) - self.origin_s).unwrap_or(0);
        while self.rows.len() <= i {
            let t = self.origin_s + self.rows.len() as i64;
            let sold = self.rows.last().map_or(0, |r| r.sold);
            self.rows.push(Second {
                t,
                sold,
                ..Second::default()
            });
        }
        &mut self.rows[i]
    }

    pub fn csv(&self) -> String {
        let mut out = String::from(
            "t,joins,refused,admitted,claims,status_memory,status_total,queue_length,waiting,holding,holds,sold,proxied,session_ops,redis_busiest_shard,gateway_load\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{:.1},{:.1},{},{},{},{},{},{:.1},{},{:.1},{:.4}",
                r.t,
                r.joins,
                r.refused,
                r.admitted,
                r.claims,
                r.status_memory,
                r.status_total(),
                r.queue_length,
                r.waiting,
                r.holding,
                r.holds,
                r.sold,
                r.proxied,
                r.session_ops,
                r.redis_busiest_shard,
                r.gateway_load
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_time_and_carry_sold_forward() {
        let mut tl = Timeline::new(-60_000);
        tl.at(-59_500).joins += 1;
        tl.at(-58_000).sold = 4;
        let r = tl.at(1_999);
        assert_eq!((r.t, r.sold), (1, 4));
        assert_eq!(tl.rows.len(), 62);
        assert_eq!(tl.rows[0].joins, 1);
        assert!(tl.csv().lines().nth(1).unwrap().starts_with("-60,1,"));
    }
}
