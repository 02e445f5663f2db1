//! The simulation loop, one step per admission tick (`tick_ms`): the status polls due since
//! the last tick ([`super::waiting`]), the buyers' steps ([`super::buyers`]), the joins from
//! the arrival curve, then the tick itself (the `TICK_LUA` mirror in [`super::tick`]); the
//! invariants are checked as it goes. Every second's counts go to the [`Timeline`].

use super::arrivals::Curve;
use super::buyers::{BuyerParams, BuyerTotals, Buyers, Inventory};
use super::net::SafetyNet;
use super::polls::PollModel;
use super::tick::{AdmissionState, TickConfig, tick};
use super::timeline::Timeline;
use super::waiting::{Due, WaitingRoom};
use crate::event_config::{EventConfig, Mode};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Everything one simulation needs.
#[derive(Debug, Clone)]
pub struct SimInput {
    pub curve: Curve,
    /// The room config, validated as the admin API validates it.
    pub room: EventConfig,
    /// The sale start on the curve's axis (ms; negative: open before the first arrival).
    pub sale_start_ms: i64,
    pub tick_ms: u64,
    pub passthrough_batch: u64,
    pub buyers: BuyerParams,
    /// From the last seat sold to the sold-out flag in Redis (ops or booking's hook).
    pub sold_out_flag_delay_ms: i64,
    /// Stop this long after the sell-out (a bench run's drain), else when nothing is left.
    pub stop_after_sold_out_ms: Option<i64>,
    /// Give up after this much simulated time from the first tick.
    pub max_duration_ms: i64,
    pub seed: u64,
}

impl SimInput {
    /// The admit rate the tick and the fans' ETA use: fixed, or in auto mode the stored auto
    /// rate's starting point (the configured rate within the bounds; the simulator does not
    /// model upstream health).
    pub fn rate_per_min(&self) -> u64 {
        let r = self.room.admit_per_minute;
        match &self.room.auto {
            Some(a) => r.clamp(
                u64::try_from(a.floor).unwrap_or(1),
                u64::try_from(a.ceiling).unwrap_or(u64::MAX).max(1),
            ),
            None => r,
        }
    }
}

/// What the loop checked while it ran.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Invariants {
    /// Largest `admitted in (a, b] − rate·(b − a)` over every pair of ticks in queue mode.
    pub max_window_excess: f64,
    pub burst: f64,
    pub admission_within_rate: bool,
    /// Largest `|adm| + |active|` after a tick.
    pub peak_holding: u64,
    pub within_max_active: bool,
    pub admitted_before_sale_start: u64,
    pub min_wait_s: Option<f64>,
}

/// What came out.
pub struct SimOutput {
    pub timeline: Timeline,
    pub buyers: BuyerTotals,
    pub inventory: Inventory,
    pub waits_s: Vec<f32>,
    pub invariants: Invariants,
    pub arrived: u64,
    pub refused: u64,
    /// Let straight through by the safety net at the join.
    pub passed: u64,
    pub queued: u64,
    pub sold_out_at_ms: Option<i64>,
    pub sold_out_flag_ms: Option<i64>,
    /// Fans told "sold out" by a status poll, and fans still polling when the run stopped.
    pub told_sold_out: u64,
    pub still_waiting: u64,
    pub start_ms: i64,
    pub end_ms: i64,
}

pub fn simulate(input: &SimInput) -> SimOutput {
    let mut rng = SmallRng::seed_from_u64(input.seed);
    let room = &input.room;
    let rate = input.rate_per_min();
    let cfg = TickConfig {
        mode: room.mode,
        rate_per_min: rate as f64,
        max_active: room.max_active,
        claim_deadline_ms: room.claim_deadline_s as i64 * 1000,
        sale_start_ms: input.sale_start_ms,
        tick_ms: input.tick_ms,
        passthrough_batch: input.passthrough_batch,
    };
    let tick_ms = input.tick_ms.max(1) as i64;
    let start = input.sale_start_ms.min(0);
    // Rate-limited admission by the tick: queue mode, and the safety net's backlog.
    let ticked = matches!(room.mode, Mode::Queue | Mode::SafetyNet);
    let polls = PollModel::new(rate, room.claim_deadline_s, ticked);
    let mut net = room.safety_net.as_ref().map(|n| {
        SafetyNet::new(
            u64::try_from(n.arrivals_per_minute).unwrap_or(0),
            room.max_active,
        )
    });
    let mut w = WaitingRoom::new(polls, start, tick_ms);
    let mut tl = Timeline::new(start);
    let mut s = AdmissionState::default();
    let mut buyers = Buyers::new(input.buyers.clone());
    let mut inv = Invariants {
        burst: cfg.burst(),
        admission_within_rate: true,
        within_max_active: true,
        ..Invariants::default()
    };
    // Running minimum of `cum(a) − rate·a` over earlier ticks (the window bound's left end).
    let per_ms = rate as f64 / 60000.0;
    let mut cum = 0u64;
    let mut min_left = f64::INFINITY;

    let (mut sec, mut idx) = (0usize, 0u64);
    let (mut arrived, mut refused, mut queued, mut told) = (0u64, 0u64, 0u64, 0u64);
    let mut passed = 0u64;
    let mut flag_at: Option<i64> = None;
    let mut t = start;
    let mut k = 0i64;
    loop {
        // Polls in (t − tick, t]: the queue as the previous tick left it.
        let due = w.take_due(k);
        for p in &due {
            match w.due(p) {
                Due::Waiting(_) if flag_at.is_some_and(|f| p.at >= f) => {
                    tl.at(p.at).status_memory += 1.0;
                    told += 1;
                    w.left(p);
                }
                Due::Waiting(ahead) => {
                    tl.at(p.at).status_memory += 1.0;
                    w.polled(p, ahead, input.sale_start_ms, &mut rng);
                }
                Due::Admitted(buyer) => {
                    // Answered by the status script (counted with the claim).
                    buyers.claim_at(u64::from(buyer), p.at);
                    w.left(p);
                }
                Due::Gone => {}
            }
        }
        w.recycle(due);
        buyers.run_until(t, &mut s, &mut tl, &mut rng);
        if let (None, Some(at)) = (flag_at, buyers.sold_out_at_ms) {
            flag_at = Some(at + input.sold_out_flag_delay_ms);
        }
        let flagged = |x: i64| flag_at.is_some_and(|f| x >= f);

        // Joins up to now.
        while sec < input.curve.per_second.len() {
            let n = input.curve.per_second[sec];
            if idx >= n {
                sec += 1;
                idx = 0;
                continue;
            }
            let a = sec as i64 * 1000 + ((2 * idx + 1) * 1000 / (2 * n)) as i64;
            if a > t {
                break;
            }
            idx += 1;
            arrived += 1;
            let row = tl.at(a);
            row.joins += 1;
            if room.mode == Mode::Closed || flagged(a) {
                row.refused += 1;
                refused += 1;
            } else if room.mode == Mode::Passthrough
                || (room.mode == Mode::SafetyNet
                    && a >= input.sale_start_ms
                    && net
                        .as_mut()
                        .is_some_and(|n| n.arrive(a, w.len(), s.holding())))
            {
                // JOIN_LUA admits at once (passthrough, or the safety net while calm); the
                // fan's next poll (straight away) claims.
                if room.mode == Mode::SafetyNet {
                    passed += 1;
                }
                row.admitted += 1;
                if let Some(id) = buyers.admit(a, false, &mut rng) {
                    s.active.add(id, a + room.token_ttl_s as i64 * 1000);
                    w.admitted_at_join(a, id as u32);
                }
            } else {
                queued += 1;
                w.join(a, a < input.sale_start_ms, input.sale_start_ms, &mut rng);
            }
        }

        // The tick.
        if flagged(t) {
            s.sold_out = true;
        }
        if t >= input.sale_start_ms {
            w.draw();
        }
        let o = tick(&mut s, &cfg, t, w.len());
        for _ in 0..o.admit {
            let Some(fan) = w.pop() else { break };
            let id = buyers.admit(w.arrival_ms(fan), true, &mut rng);
            if let Some(id) = id {
                s.unclaimed.add(id, o.deadline_ms);
            }
            w.set_buyer(fan, id.map(|i| i as u32));
        }
        if t < input.sale_start_ms {
            inv.admitted_before_sale_start += o.admit;
        }
        cum += o.admit;
        if ticked {
            let right = cum as f64 - per_ms * t as f64;
            if min_left.is_finite() {
                inv.max_window_excess = inv.max_window_excess.max(right - min_left);
            }
            min_left = min_left.min(right);
        }
        inv.peak_holding = inv.peak_holding.max(s.holding());
        let row = tl.at(t);
        row.admitted += o.admit;
        row.queue_length = w.len();
        row.waiting = w.polling();
        row.holding = s.holding();
        row.sold = buyers.inv.sold;

        // Stop?
        let arrivals_done = sec >= input.curve.per_second.len();
        let stop = match (input.stop_after_sold_out_ms, buyers.sold_out_at_ms) {
            (Some(after), Some(so)) => arrivals_done && t >= so + after,
            _ => arrivals_done && w.scheduled() == 0 && buyers.idle(),
        };
        if stop || t - start >= input.max_duration_ms {
            break;
        }
        t += tick_ms;
        k += 1;
    }
    inv.admission_within_rate = inv.max_window_excess <= inv.burst + 1e-6;
    // Passthrough admits at the join without the cap, as JOIN_LUA does; the safety net's
    // passes count it.
    inv.within_max_active = room.max_active == 0 || !ticked || inv.peak_holding <= room.max_active;
    inv.min_wait_s = buyers
        .waits_s
        .iter()
        .copied()
        .reduce(f32::min)
        .map(f64::from);
    SimOutput {
        timeline: tl,
        inventory: buyers.inv.clone(),
        buyers: buyers.totals.clone(),
        waits_s: std::mem::take(&mut buyers.waits_s),
        invariants: inv,
        arrived,
        refused,
        passed,
        queued,
        sold_out_at_ms: buyers.sold_out_at_ms,
        sold_out_flag_ms: flag_at,
        told_sold_out: told,
        still_waiting: w.polling(),
        start_ms: start,
        end_ms: t + tick_ms,
    }
}
