//! The buyer model: what an admitted fan does, as `loadgen surge` does it
//! (deploy/loadgen/src/surge.rs, `Run::fan`), event by event in simulated time.
//!
//! A fan admitted by a tick learns it on their next status poll ([`super::waiting`]: the
//! claim, one Redis call moving them from `adm` to `active`); thinks; reads the seat map and
//! holds `seats_per_fan` free seats; a share vanish with the hold (the seats come back when
//! it expires); the rest think, order, think and pay. With nothing free but seats still
//! held, a fan looks again every `look_every_ms` (loadgen: 1 s; the storefront, `shop.js`:
//! 4 s, 8 s above 20,000 seats) until `hold_ttl + 15 s` after their first look, then gives
//! up; with nothing free and nothing held, they are told it is sold out. The event is sold
//! out once no fan can buy any more (every seat sold, or fewer left than one fan buys).
//! Seats of a lapsed hold show on the next seat-map refresh (once a second, as booking and
//! loadgen cache the map).
//!
//! Fans waiting for lapsed holds are parked rather than stepped every look (tens of
//! thousands of them during a long hold TTL): their map reads are counted per step, and when
//! seats show, the parked fans with the earliest deadlines wake at the expected time of the
//! first looks among them (`k · look_every / (parked + 1)`).
//!
//! The `max_active` slot follows the gateway: claimed until the token expires, extended
//! through checkout by [`crate::session::decide`] (checkout answers carry when the hold ends),
//! freed at once when the payment ends the checkout.

use super::tick::AdmissionState;
use super::timeline::Timeline;
use crate::session::{Decision, decide};
use rand::Rng;
use rand::rngs::SmallRng;
use shared::token::AdmissionClaims;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Simulated time is an offset; the session rules compare against absolute unix time, so
/// they see this base added (any positive date works).
const BASE_MS: i64 = 1_800_000_000_000;

/// What admitted fans do and how long it takes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuyerParams {
    /// Seats on sale; 0 = no inventory modelled (fans claim and leave).
    pub seats: u64,
    pub seats_per_fan: u64,
    /// Share of fans who vanish after holding (their hold lapses).
    pub vanish: f64,
    /// Share of admitted fans who never claim (tab closed while waiting).
    pub no_show: f64,
    /// Upper bound of the uniform pause before each step (loadgen `--think-ms`).
    pub think_ms: u64,
    /// Time for one booking call (hold, order, pay).
    pub booking_ms: u64,
    pub hold_ttl_s: u64,
    /// How often a fan finding nothing free looks at the map again.
    pub look_every_ms: u64,
    /// How long after a fan's first look at the map they keep looking for seats past the
    /// hold TTL (loadgen: 15 s).
    pub seat_wait_extra_ms: i64,
    pub token_ttl_s: u64,
    pub session_slack_s: u64,
    pub max_session_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Claim,
    /// A look at the seat map (`woken`: a parked fan, woken by seats showing).
    Look {
        woken: bool,
    },
    Order,
    Pay,
    /// A lapsed hold's seats, not yet on the map.
    SeatsBack(u64),
    SeatsShown(u64),
}

#[derive(Debug, Clone, Default)]
struct Fan {
    arrival_ms: i64,
    claimed_s: i64,
    exp_s: i64,
    look_until_ms: i64,
    hold_end_ms: i64,
}

/// Fan outcomes, for the summary.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BuyerTotals {
    pub admitted: u64,
    pub claimed: u64,
    pub no_show: u64,
    /// Claimed after the deadline (the place had lapsed).
    pub claim_expired: u64,
    pub holds: u64,
    pub vanished: u64,
    pub orders: u64,
    pub paid: u64,
    pub tickets: u64,
    /// Found nothing to buy (sold out at the map, or gave up waiting for lapsed holds).
    pub sold_out_at_map: u64,
    pub seat_map_reads: f64,
}

/// Seats as booking sees them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Inventory {
    pub free: u64,
    pub held: u64,
    /// Lapsed holds not yet shown on the map.
    pub returning: u64,
    pub sold: u64,
}

pub struct Buyers {
    p: BuyerParams,
    events: BinaryHeap<Reverse<(i64, u64, usize, Step)>>,
    seq: u64,
    fans: Vec<Fan>,
    /// Fans waiting for lapsed holds, by the time they give up.
    parked: BinaryHeap<Reverse<(i64, usize)>>,
    /// Woken fans whose look is still to come (seats promised to them).
    woken: u64,
    /// Up to when parked fans' map reads are counted.
    counted_to: Option<i64>,
    pub inv: Inventory,
    pub totals: BuyerTotals,
    /// Seconds each claimed fan waited, from arrival to the claim.
    pub waits_s: Vec<f32>,
    /// When the last seat that can be sold was paid for.
    pub sold_out_at_ms: Option<i64>,
}

impl Buyers {
    pub fn new(p: BuyerParams) -> Buyers {
        Buyers {
            inv: Inventory {
                free: p.seats,
                ..Inventory::default()
            },
            p,
            events: BinaryHeap::new(),
            seq: 0,
            fans: Vec::new(),
            parked: BinaryHeap::new(),
            woken: 0,
            counted_to: None,
            totals: BuyerTotals::default(),
            waits_s: Vec::new(),
            sold_out_at_ms: None,
        }
    }

    pub fn idle(&self) -> bool {
        self.events.is_empty() && self.parked.is_empty()
    }

    fn at(&mut self, ms: i64, fan: usize, step: Step) {
        self.seq += 1;
        self.events.push(Reverse((ms, self.seq, fan, step)));
    }

    fn think(&self, rng: &mut SmallRng) -> i64 {
        rng.random_range(0..=self.p.think_ms) as i64
    }

    /// A fan leaving the queue with an admission (`may_no_show`: admitted by a tick, so
    /// they may have gone meanwhile). Returns their id for the admitted sets, `None` for a
    /// no-show, who never claims.
    pub fn admit(&mut self, arrival_ms: i64, may_no_show: bool, rng: &mut SmallRng) -> Option<u64> {
        self.totals.admitted += 1;
        if may_no_show && rng.random_bool(self.p.no_show.clamp(0.0, 1.0)) {
            self.totals.no_show += 1;
            return None;
        }
        let id = self.fans.len();
        self.fans.push(Fan {
            arrival_ms,
            ..Fan::default()
        });
        Some(id as u64)
    }

    /// The fan's status poll at `at` that finds them admitted.
    pub fn claim_at(&mut self, id: u64, at: i64) {
        self.at(at, id as usize, Step::Claim);
    }

    /// Runs every step due at or before `until`.
    pub fn run_until(
        &mut self,
        until: i64,
        s: &mut AdmissionState,
        tl: &mut Timeline,
        rng: &mut SmallRng,
    ) {
        while let Some(Reverse((now, _, fan, step))) = self.events.peek().copied() {
            if now > until {
                break;
            }
            self.events.pop();
            self.give_up_before(now, tl);
            self.step(now, fan, step, s, tl, rng);
        }
        self.give_up_before(until, tl);
    }

    /// Counts parked fans' map reads up to `now` and lets those past their deadline go.
    fn give_up_before(&mut self, now: i64, tl: &mut Timeline) {
        let from = self.counted_to.unwrap_or(now);
        if now > from {
            let reads =
                self.parked.len() as f64 * (now - from) as f64 / self.p.look_every_ms.max(1) as f64;
            tl.at(from).proxied += reads;
            self.totals.seat_map_reads += reads;
        }
        self.counted_to = Some(now.max(from));
        while let Some(&Reverse((deadline, _))) = self.parked.peek() {
            if deadline > now {
                break;
            }
            self.parked.pop();
            self.totals.sold_out_at_map += 1;
        }
    }

    fn read_map(&mut self, now: i64, tl: &mut Timeline) {
        tl.at(now).proxied += 1.0;
        self.totals.seat_map_reads += 1.0;
    }

    /// Seats just showed: wake as many parked fans as there are seat groups free.
    fn wake(&mut self, now: i64) {
        let groups = (self.inv.free / self.p.seats_per_fan).saturating_sub(self.woken);
        let parked = self.parked.len() as i64;
        for j in 1..=groups.min(parked as u64) as i64 {
            let Some(Reverse((_, fan))) = self.parked.pop() else {
                break;
            };
            let at = now + j * self.p.look_every_ms as i64 / (parked + 1);
            self.woken += 1;
            self.at(at, fan, Step::Look { woken: true });
        }
    }

    fn step(
        &mut self,
        now: i64,
        fan: usize,
        step: Step,
        s: &mut AdmissionState,
        tl: &mut Timeline,
        rng: &mut SmallRng,
    ) {
        let id = fan as u64;
        let n = self.p.seats_per_fan;
        match step {
            Step::Claim => {
                // STATUS_LUA: a live admission moves to `active` until the token expires.
                tl.at(now).claims += 1;
                let passthrough = s.unclaimed.score(id).is_none() && s.active.score(id).is_some();
                if !passthrough {
                    let live = s.unclaimed.score(id).is_some_and(|dl| dl > now);
                    s.unclaimed.remove(id);
                    if !live {
                        self.totals.claim_expired += 1;
                        return;
                    }
                }
                s.active.add(id, now + self.p.token_ttl_s as i64 * 1000);
                let f = &mut self.fans[fan];
                f.claimed_s = (BASE_MS + now) / 1000;
                f.exp_s = f.claimed_s + self.p.token_ttl_s as i64;
                self.totals.claimed += 1;
                self.waits_s
                    .push(((now - f.arrival_ms) as f64 / 1000.0) as f32);
                if self.p.seats > 0 {
                    let first = now + self.think(rng);
                    self.fans[fan].look_until_ms =
                        first + self.p.hold_ttl_s as i64 * 1000 + self.p.seat_wait_extra_ms;
                    self.at(first, fan, Step::Look { woken: false });
                }
            }
            Step::Look { woken } => {
                if woken {
                    self.woken -= 1;
                }
                self.read_map(now, tl);
                if self.inv.free >= n {
                    self.hold(now, fan, s, tl, rng);
                } else if (self.inv.held + self.inv.returning > 0 || self.inv.free > 0)
                    && now < self.fans[fan].look_until_ms
                {
                    self.parked
                        .push(Reverse((self.fans[fan].look_until_ms, fan)));
                } else {
                    self.totals.sold_out_at_map += 1;
                }
            }
            Step::Order => {
                tl.at(now).proxied += 1.0;
                self.totals.orders += 1;
                let done = now + self.p.booking_ms as i64;
                let hold_end = self.fans[fan].hold_end_ms;
                self.checkout(fan, done, hold_end, s, tl);
                let paid = done + self.think(rng) + self.p.booking_ms as i64;
                self.at(paid, fan, Step::Pay);
            }
            Step::Pay => {
                tl.at(now).proxied += 1.0;
                self.inv.held -= n;
                self.inv.sold += n;
                self.totals.paid += 1;
                self.totals.tickets += n;
                // The paid order ends the checkout: `session-until: 0`.
                self.checkout(fan, now, 0, s, tl);
                let i = &self.inv;
                if self.sold_out_at_ms.is_none() && i.held == 0 && i.returning == 0 && i.free < n {
                    self.sold_out_at_ms = Some(now);
                    // Parked fans see it on their next look, spread over one interval.
                    let left = self.parked.len() as u64;
                    self.totals.sold_out_at_map += left;
                    self.totals.seat_map_reads += left as f64;
                    self.parked.clear();
                    let every = self.p.look_every_ms.max(1) as i64;
                    let mut from = now;
                    while from < now + every {
                        let to = ((from.div_euclid(1000) + 1) * 1000).min(now + every);
                        tl.at(from).proxied += left as f64 * (to - from) as f64 / every as f64;
                        from = to;
                    }
                }
            }
            Step::SeatsBack(k) => {
                self.inv.held -= k;
                self.inv.returning += k;
                let shown = (now.div_euclid(1000) + 1) * 1000;
                self.at(shown, fan, Step::SeatsShown(k));
            }
            Step::SeatsShown(k) => {
                self.inv.returning -= k;
                self.inv.free += k;
                self.wake(now);
            }
        }
    }

    /// Free seats found: the fan holds them, then vanishes or goes on to order.
    fn hold(
        &mut self,
        now: i64,
        fan: usize,
        s: &mut AdmissionState,
        tl: &mut Timeline,
        rng: &mut SmallRng,
    ) {
        let n = self.p.seats_per_fan;
        self.inv.free -= n;
        self.inv.held += n;
        self.totals.holds += 1;
        let r = tl.at(now);
        r.proxied += 1.0;
        r.holds += 1;
        let done = now + self.p.booking_ms as i64;
        let end = done + self.p.hold_ttl_s as i64 * 1000;
        self.fans[fan].hold_end_ms = end;
        self.checkout(fan, done, end, s, tl);
        if rng.random_bool(self.p.vanish.clamp(0.0, 1.0)) {
            self.totals.vanished += 1;
            self.at(end, fan, Step::SeatsBack(n));
        } else {
            let order = done + self.think(rng);
            self.at(order, fan, Step::Order);
        }
    }

    /// A checkout answer saying the fan's checkout lasts until `until_ms` (0: over), applied
    /// to the `max_active` slot as the gateway does (`proxy.rs` `checkout_session`).
    fn checkout(
        &mut self,
        fan: usize,
        now: i64,
        until_ms: i64,
        s: &mut AdmissionState,
        tl: &mut Timeline,
    ) {
        let f = &mut self.fans[fan];
        let claims = AdmissionClaims {
            sub: String::new(),
            sid: String::new(),
            evt: String::new(),
            iat: f.claimed_s,
            exp: f.exp_s,
            jti: String::new(),
            iss: String::new(),
            aud: String::new(),
            adm: Some(f.claimed_s),
        };
        let until = if until_ms > 0 { BASE_MS + until_ms } else { 0 };
        let now_s = (BASE_MS + now) / 1000;
        let id = fan as u64;
        match decide(
            &claims,
            until,
            now_s,
            self.p.session_slack_s as i64,
            self.p.max_session_s as i64,
        ) {
            Decision::Keep => {}
            Decision::Release => {
                s.active.remove(id);
                tl.at(now).session_ops += 1;
            }
            Decision::Extend { exp } => {
                f.exp_s = exp;
                s.active.extend(id, exp * 1000 - BASE_MS);
                tl.at(now).session_ops += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params(seats: u64, vanish: f64) -> BuyerParams {
        crate::sim::tests::surge_buyers(seats, vanish)
    }

    /// `fans` admitted 300 ms apart, each claiming half a second later.
    fn admit_all(b: &mut Buyers, s: &mut AdmissionState, fans: u64, rng: &mut SmallRng) {
        for i in 0..fans {
            let at = i as i64 * 300;
            let id = b.admit(0, true, rng).unwrap();
            s.unclaimed.add(id, at + 120_000);
            b.claim_at(id, at + 500);
        }
    }

    #[test]
    fn every_seat_sells_and_lapsed_holds_sell_again() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut b = Buyers::new(params(100, 0.2));
        let (mut s, mut tl) = (AdmissionState::default(), Timeline::new(0));
        admit_all(&mut b, &mut s, 400, &mut rng);
        b.run_until(3_600_000, &mut s, &mut tl, &mut rng);
        assert!(b.idle());
        assert_eq!(b.inv.sold, 100);
        assert_eq!(b.totals.paid, 50);
        assert_eq!(b.totals.holds, 50 + b.totals.vanished);
        assert_eq!(b.totals.claimed, 400);
        assert_eq!(b.totals.holds + b.totals.sold_out_at_map, 400);
        assert!(
            b.sold_out_at_ms.is_some_and(|t| t > 20_000),
            "vanished holds came back"
        );
        assert!(b.waits_s.iter().all(|w| *w >= 0.0));
        // Parked fans read the map about once a second while they wait.
        assert!(
            b.totals.seat_map_reads > 1000.0,
            "{}",
            b.totals.seat_map_reads
        );
        // Paid fans freed their slots; the others keep them until the token expires.
        assert_eq!(s.active.len(), 400 - 50);
    }

    #[test]
    fn fans_waiting_for_lapsed_holds_give_up_after_the_ttl_plus_15_s() {
        let mut rng = SmallRng::seed_from_u64(3);
        // Everyone vanishes: seats come back every 20 s, to fans still looking.
        let mut b = Buyers::new(params(10, 1.0));
        let (mut s, mut tl) = (AdmissionState::default(), Timeline::new(0));
        admit_all(&mut b, &mut s, 30, &mut rng);
        b.run_until(600_000, &mut s, &mut tl, &mut rng);
        assert!(b.idle());
        assert_eq!(b.inv.sold, 0);
        assert_eq!(b.totals.holds + b.totals.sold_out_at_map, 30);
        assert!(b.totals.holds > 5, "lapsed seats went to parked fans");
    }

    #[test]
    fn without_inventory_fans_claim_and_leave() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut b = Buyers::new(params(0, 0.1));
        let (mut s, mut tl) = (AdmissionState::default(), Timeline::new(0));
        admit_all(&mut b, &mut s, 10, &mut rng);
        b.run_until(10_000, &mut s, &mut tl, &mut rng);
        assert!(b.idle());
        assert_eq!(
            (b.totals.claimed, b.totals.holds, b.sold_out_at_ms),
            (10, 0, None)
        );
    }
}
