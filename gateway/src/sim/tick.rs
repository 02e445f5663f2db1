//! The admission tick as a pure function over a small state struct: a line-by-line mirror of
//! `TICK_LUA` in `store/scripts.rs`, so the simulator admits exactly as the gateway does.
//!
//! **This must change whenever `TICK_LUA` changes** (same order of operations, same
//! rounding: Lua numbers are doubles, so the bucket is `f64` here too). What is left out: the
//! lease (the simulator has one leader and no failover), the admission stream (`XADD`) and
//! the progress record (`prog`), which decide nothing about who is admitted when.
//!
//! Guarantees (unit-tested below): in `queue` mode no window of length W admits more than
//! `rate·W/60000 + burst`; `|adm| + |active|` never exceeds `max_active` when it is set;
//! nothing is admitted before the sale start; paused (or sold-out, or pre-sale) time adds no
//! admission budget.

use crate::event_config::Mode;
use std::collections::{BTreeSet, HashMap};

/// At most this many expired entries leave each admitted set per tick (`LIMIT 0 1000`).
pub const EXPIRE_LIMIT: usize = 1000;

/// A Redis sorted set of fans (by id) with their scores (ms), as the tick sees `adm` and
/// `active`.
#[derive(Debug, Default, Clone)]
pub struct ZSet {
    by_score: BTreeSet<(i64, u64)>,
    score: HashMap<u64, i64>,
}

impl ZSet {
    pub fn len(&self) -> u64 {
        self.score.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.score.is_empty()
    }

    pub fn score(&self, id: u64) -> Option<i64> {
        self.score.get(&id).copied()
    }

    /// `ZADD key score id`.
    pub fn add(&mut self, id: u64, score: i64) {
        if let Some(old) = self.score.insert(id, score) {
            self.by_score.remove(&(old, id));
        }
        self.by_score.insert((score, id));
    }

    /// `ZADD key XX GT score id`: only a member, only later (the checkout extension).
    pub fn extend(&mut self, id: u64, score: i64) {
        if self.score(id).is_some_and(|old| score > old) {
            self.add(id, score);
        }
    }

    /// `ZREM key id`; true when it was a member.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.score.remove(&id) {
            Some(s) => self.by_score.remove(&(s, id)),
            None => false,
        }
    }

    /// `ZRANGEBYSCORE key -inf (now LIMIT 0 limit` followed by `ZREM` of each.
    fn expire_before(&mut self, now: i64, limit: usize) -> Vec<u64> {
        let gone: Vec<u64> = self
            .by_score
            .iter()
            .take_while(|(s, _)| *s < now)
            .take(limit)
            .map(|(_, id)| *id)
            .collect();
        for id in &gone {
            self.remove(*id);
        }
        gone
    }
}

/// What the tick reads from the event config and the ticker's arguments.
#[derive(Debug, Clone, Copy)]
pub struct TickConfig {
    pub mode: Mode,
    /// `admit_per_minute` (or the auto rate), fans per minute.
    pub rate_per_min: f64,
    /// 0 = no cap.
    pub max_active: u64,
    pub claim_deadline_ms: i64,
    pub sale_start_ms: i64,
    /// `ARGV[4]`: the tick interval, which sizes the burst.
    pub tick_ms: u64,
    /// `ARGV[5]`: largest passthrough batch.
    pub passthrough_batch: u64,
}

impl TickConfig {
    /// One tick's refill.
    fn refill(&self) -> f64 {
        self.rate_per_min * self.tick_ms as f64 / 60000.0
    }

    /// The most one tick admits, as the script computes it: a tick's refill rounded up.
    pub fn batch(&self) -> u64 {
        // A valid rate and tick interval make this a small whole number.
        self.refill().ceil().max(1.0) as u64
    }

    /// The bucket's cap, as the script computes it: one fan more than a tick's refill, so
    /// the fraction of a fan a tick leaves is carried, not lost to the cap. It is also the
    /// most any window of time admits above `rate·W`.
    pub fn burst(&self) -> f64 {
        self.refill() + 1.0
    }
}

/// One event's admission state in Redis.
#[derive(Debug, Default, Clone)]
pub struct AdmissionState {
    /// The bucket hash's `tokens` and `ts` fields (`None`: field absent).
    pub tokens: Option<f64>,
    pub ts: Option<i64>,
    /// `adm`: admitted, not yet claimed, scored by claim deadline.
    pub unclaimed: ZSet,
    /// `active`: claimed, scored by when the admission ends.
    pub active: ZSet,
    /// The sold-out flag key exists.
    pub sold_out: bool,
}

impl AdmissionState {
    /// Fans holding an admission (what `max_active` caps).
    pub fn holding(&self) -> u64 {
        self.unclaimed.len() + self.active.len()
    }
}

/// What one tick did. The caller pops `admit` fans from the head of its queue (lowest score
/// first) and records each with [`AdmissionState::unclaimed`] at `deadline_ms`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TickOutcome {
    pub admit: u64,
    pub deadline_ms: i64,
    /// Admissions never claimed before their deadline, removed this tick.
    pub gone: Vec<u64>,
    /// Claimed admissions that ended, removed this tick.
    pub done: Vec<u64>,
}

/// One run of `TICK_LUA` by the lease holder at Redis time `now` with `qlen` fans queued.
pub fn tick(s: &mut AdmissionState, c: &TickConfig, now: i64, qlen: u64) -> TickOutcome {
    let gone = s.unclaimed.expire_before(now, EXPIRE_LIMIT);
    let done = s.active.expire_before(now, EXPIRE_LIMIT);
    let rate = c.rate_per_min;
    let mut n: u64 = 0;
    if c.mode == Mode::Passthrough {
        n = qlen.min(c.passthrough_batch);
        s.tokens = None;
        s.ts = None;
    } else if matches!(c.mode, Mode::Queue | Mode::SafetyNet)
        && now >= c.sale_start_ms
        && !s.sold_out
    {
        let mut tokens = s.tokens.unwrap_or(0.0);
        let ts = s.ts.unwrap_or(now);
        let cap = c.burst();
        if now > ts {
            tokens += (now - ts) as f64 * rate / 60000.0;
        }
        if tokens > cap {
            tokens = cap;
        }
        // `math.floor` of a double that is at most `cap`: fits a u64 for any valid rate.
        let mut m = (tokens.floor().max(0.0) as u64).min(c.batch());
        if c.max_active > 0 {
            m = m.min(c.max_active.saturating_sub(s.holding()));
        }
        n = m.min(qlen);
        s.tokens = Some(tokens - n as f64);
        s.ts = Some(now);
    } else {
        // Paused, closed, sold out or before the sale start: time adds no budget.
        s.ts = Some(now);
    }
    TickOutcome {
        admit: n,
        deadline_ms: now + c.claim_deadline_ms,
        gone,
        done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn cfg(rate: f64, max_active: u64) -> TickConfig {
        TickConfig {
            mode: Mode::Queue,
            rate_per_min: rate,
            max_active,
            claim_deadline_ms: 120_000,
            sale_start_ms: 0,
            tick_ms: 250,
            passthrough_batch: 5000,
        }
    }

    /// Ticks at jittered times with an endless queue; returns (time, admitted) per tick.
    fn run(s: &mut AdmissionState, c: &TickConfig, from: i64, to: i64, rng: &mut SmallRng) {
        let mut id = 1_000_000;
        let mut t = from;
        while t < to {
            let o = tick(s, c, t, u64::MAX / 2);
            for _ in 0..o.admit {
                s.unclaimed.add(id, o.deadline_ms);
                id += 1;
            }
            t += rng.random_range(1..=2 * c.tick_ms as i64);
        }
    }

    #[test]
    fn no_window_admits_more_than_rate_times_window_plus_one_burst() {
        let mut rng = SmallRng::seed_from_u64(7);
        for rate in [1.0, 7.0, 600.0, 6000.0, 123_457.0] {
            let c = cfg(rate, 0);
            let mut s = AdmissionState::default();
            let mut log = Vec::new();
            let mut t = -5_000;
            while t < 120_000 {
                let o = tick(&mut s, &c, t, u64::MAX / 2);
                log.push((t, o.admit));
                // Late and early ticks (a busy leader, a failover) must not break the bound.
                t += rng.random_range(1..=1500);
            }
            for (i, &(a, _)) in log.iter().enumerate() {
                let mut sum = 0u64;
                for &(b, n) in &log[i + 1..] {
                    sum += n;
                    let bound = rate * (b - a) as f64 / 60000.0 + c.burst();
                    assert!(
                        sum as f64 <= bound + 1e-9,
                        "rate {rate}: {sum} in ({a},{b}]"
                    );
                }
            }
        }
    }

    #[test]
    fn a_full_queue_is_admitted_at_the_configured_rate_whatever_its_batch_fraction() {
        // 1000/min with 100 ms ticks is 1.67 fans a tick: the bucket must carry the fraction
        // (it used to be capped at 1.67 and lose it, admitting 1 a tick = 600/min).
        for tick_ms in [100u64, 250] {
            for rate in [7.0, 600.0, 900.0, 1000.0, 1500.0, 2500.0, 6000.0, 123_457.0] {
                let mut c = cfg(rate, 0);
                c.tick_ms = tick_ms;
                let mut s = AdmissionState::default();
                let mut admitted = 0u64;
                let end = 600_000i64;
                for t in (0..=end).step_by(tick_ms as usize) {
                    admitted += tick(&mut s, &c, t, u64::MAX / 2).admit;
                }
                let due = rate * end as f64 / 60000.0;
                assert!(
                    (admitted as f64 - due).abs() <= c.burst(),
                    "{rate}/min, {tick_ms} ms ticks: {admitted} admitted in 10 min, {due} due"
                );
            }
        }
    }

    #[test]
    fn never_more_than_max_active_holding_admissions() {
        let mut rng = SmallRng::seed_from_u64(3);
        let c = cfg(60_000.0, 50);
        let mut s = AdmissionState::default();
        run(&mut s, &c, 0, 2_000, &mut rng);
        assert_eq!(s.holding(), 50);
        // Claims move fans to `active`, still counted; ends free slots.
        for id in 1_000_000..1_000_030 {
            assert!(s.unclaimed.remove(id));
            s.active.add(id, 3_000);
        }
        run(&mut s, &c, 2_000, 2_900, &mut rng);
        assert_eq!(s.holding(), 50);
        let o = tick(&mut s, &c, 3_001, 100);
        assert_eq!(o.done.len(), 30);
        assert_eq!(o.admit, 30);
        for id in 0..o.admit {
            s.unclaimed.add(id, o.deadline_ms);
        }
        assert_eq!(s.holding(), 50);
        assert_eq!(tick(&mut s, &c, 3_500, 100).admit, 0);
    }

    #[test]
    fn nothing_before_the_sale_start_and_no_budget_saved_up() {
        let mut c = cfg(6000.0, 0);
        c.sale_start_ms = 60_000;
        let mut s = AdmissionState::default();
        let mut t = 0;
        while t < 60_000 {
            assert_eq!(tick(&mut s, &c, t, 1_000_000).admit, 0, "at {t}");
            t += 250;
        }
        // The first tick after the start has one tick's refill at most.
        assert!(tick(&mut s, &c, 60_000, 1_000_000).admit <= c.batch());
    }

    #[test]
    fn paused_accumulates_nothing() {
        let mut c = cfg(6000.0, 0);
        let mut s = AdmissionState::default();
        assert_eq!(tick(&mut s, &c, 0, 10).admit, 0);
        // 10 s of queue with an empty queue: the bucket fills to one burst, no more.
        assert_eq!(tick(&mut s, &c, 10_000, 0).admit, 0);
        c.mode = Mode::Paused;
        for t in (10_250..600_000).step_by(250) {
            assert_eq!(tick(&mut s, &c, t, 1_000_000).admit, 0);
        }
        c.mode = Mode::Queue;
        // Ten minutes paused add nothing: the saved bucket plus one tick's refill, one batch.
        let n = tick(&mut s, &c, 600_250, 1_000_000).admit;
        assert_eq!(n, c.batch());
        let n2 = tick(&mut s, &c, 600_500, 1_000_000).admit;
        assert_eq!(n2, 25);
    }

    #[test]
    fn sold_out_stops_admission_and_passthrough_drains_in_batches() {
        let mut c = cfg(6000.0, 0);
        let mut s = AdmissionState::default();
        tick(&mut s, &c, 0, 100);
        s.sold_out = true;
        assert_eq!(tick(&mut s, &c, 250, 100).admit, 0);
        c.mode = Mode::Passthrough;
        assert_eq!(tick(&mut s, &c, 500, 12_000).admit, 5000);
        assert_eq!((s.tokens, s.ts), (None, None));
        assert_eq!(tick(&mut s, &c, 750, 7).admit, 7);
    }

    #[test]
    fn expiry_takes_at_most_a_thousand_per_set_per_tick() {
        let c = cfg(0.5, 0);
        let mut s = AdmissionState::default();
        for id in 0..2500 {
            s.unclaimed.add(id, 10);
        }
        s.unclaimed.add(9999, 10_000);
        assert_eq!(tick(&mut s, &c, 100, 0).gone.len(), 1000);
        assert_eq!(tick(&mut s, &c, 100, 0).gone.len(), 1000);
        assert_eq!(tick(&mut s, &c, 100, 0).gone.len(), 500);
        assert_eq!(s.unclaimed.len(), 1);
        // A score equal to now is not yet expired (`(now` is exclusive).
        assert!(tick(&mut s, &c, 10_000, 0).gone.is_empty());
    }

    #[test]
    fn rounding_follows_the_script() {
        // 7/min with 250 ms ticks: burst max(1, 0.029) = 1, a fan every ~8.6 s.
        let c = cfg(7.0, 0);
        let mut s = AdmissionState::default();
        let mut admitted = Vec::new();
        for t in (0..60_000).step_by(250) {
            if tick(&mut s, &c, t, 100).admit > 0 {
                admitted.push(t);
            }
        }
        assert_eq!(admitted.len(), 6, "{admitted:?}");
        assert_eq!(admitted[0], 8750);
    }
}
