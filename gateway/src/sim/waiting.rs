//! The waiting room's side of every fan: their place in the queue and their status polls.
//!
//! The queue is what Redis orders by score: pre-sale joins first, in the order of their
//! draw score (uniformly random), then FIFO joins in arrival order. A fan's rank is
//! arithmetic on their position, as the gateway's in-memory status answer is. Each fan's
//! next poll sits on a timing wheel at exactly the `poll_after_ms` the gateway told them at
//! their join or last poll (`queue::poll_after_ms`, with its ±20 % jitter), so a poll costs
//! O(1) and two million fans simulate in seconds; an admitted fan learns it — claims — on
//! that next poll, and a fan still waiting when the event sells out is told on theirs.

use super::polls::PollModel;
use rand::Rng;
use rand::rngs::SmallRng;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Waiting,
    /// Popped by a tick; `pos` now holds the buyer id.
    Admitted,
    /// Gone: claimed, told it is over, or never coming back.
    Left,
}

/// What a poll needs of a fan, in one record (one cache line touched per poll).
#[derive(Debug, Clone, Copy)]
struct Fan {
    /// FIFO: the join's sequence number; drawn: position in the draw; admitted: buyer id.
    pos: u32,
    /// Pre-sale fans' draw score in [0, 1) (lower goes first); FIFO fans: -1.
    score: f32,
    state: State,
}

pub struct WaitingRoom {
    arrival_ms: Vec<i64>,
    fans: Vec<Fan>,
    draws: Vec<u32>,
    next_draw: usize,
    drawn: bool,
    fifo: VecDeque<u32>,
    fifo_joined: u64,
    fifo_popped: u64,
    /// Poll wheel: slot `k % len` holds the polls of step `k` (times in `(k−1, k]` steps).
    wheel: Vec<Vec<(u32, i64)>>,
    spare: Vec<(u32, i64)>,
    step_ms: i64,
    origin_ms: i64,
    scheduled: u64,
    polling: u64,
    pub polls: PollModel,
}

impl WaitingRoom {
    pub fn new(polls: PollModel, origin_ms: i64, step_ms: i64) -> WaitingRoom {
        // The longest interval is the cap plus jitter; a few spare slots.
        let span = (polls.cap_ms as f64 * 1.2) as i64 + 2 * step_ms;
        let slots = (span / step_ms.max(1) + 2) as usize;
        WaitingRoom {
            arrival_ms: Vec::new(),
            fans: Vec::new(),
            draws: Vec::new(),
            next_draw: 0,
            drawn: false,
            fifo: VecDeque::new(),
            fifo_joined: 0,
            fifo_popped: 0,
            wheel: vec![Vec::new(); slots],
            spare: Vec::new(),
            step_ms: step_ms.max(1),
            origin_ms,
            scheduled: 0,
            polling: 0,
            polls,
        }
    }

    /// Fans in the Redis queue (told "sold out" or not).
    pub fn len(&self) -> u64 {
        (self.draws.len() - self.next_draw + self.fifo.len()) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fans still polling.
    pub fn polling(&self) -> u64 {
        self.polling
    }

    /// Polls (and claims) not yet made.
    pub fn scheduled(&self) -> u64 {
        self.scheduled
    }

    pub fn arrival_ms(&self, fan: u32) -> i64 {
        self.arrival_ms[fan as usize]
    }

    pub fn state(&self, fan: u32) -> State {
        self.fans[fan as usize].state
    }

    /// The buyer id of an admitted fan.
    pub fn buyer(&self, fan: u32) -> u32 {
        self.fans[fan as usize].pos
    }

    /// Fans ahead of a waiting fan.
    pub fn rank(&self, fan: u32) -> u64 {
        let f = self.fans[fan as usize];
        let draws_left = (self.draws.len() - self.next_draw) as u64;
        if f.score >= 0.0 {
            if self.drawn {
                u64::from(f.pos).saturating_sub(self.next_draw as u64)
            } else {
                // Before the draw: the share of current draws scoring lower.
                (f64::from(f.score) * self.draws.len() as f64) as u64
            }
        } else {
            draws_left + u64::from(f.pos).saturating_sub(self.fifo_popped)
        }
    }

    /// The interval the gateway gives a fan `ahead` of the queue at `now`.
    pub fn interval_ms(&self, ahead: u64, now: i64, sale_start_ms: i64, rng: &mut SmallRng) -> u64 {
        let until_start = u64::try_from(sale_start_ms - now).unwrap_or(0);
        let jitter = rng.random::<f64>() * 2.0 - 1.0;
        self.polls.interval_ms(ahead, until_start, jitter)
    }

    fn schedule(&mut self, fan: u32, at: i64) {
        let step = (at - self.origin_ms).div_euclid(self.step_ms) + 1;
        let slot = step.rem_euclid(self.wheel.len() as i64) as usize;
        self.wheel[slot].push((fan, at));
        self.scheduled += 1;
    }

    /// A join at `now` that queues the fan (`presale`: drawn). Schedules the first poll at
    /// the `poll_after_ms` of the join's answer.
    pub fn join(&mut self, now: i64, presale: bool, sale_start_ms: i64, rng: &mut SmallRng) -> u32 {
        let fan = self.arrival_ms.len() as u32;
        self.arrival_ms.push(now);
        self.polling += 1;
        let rec = if presale {
            self.draws.push(fan);
            Fan {
                pos: (self.draws.len() - 1) as u32,
                score: rng.random::<f32>(),
                state: State::Waiting,
            }
        } else {
            self.fifo.push_back(fan);
            self.fifo_joined += 1;
            Fan {
                pos: (self.fifo_joined - 1) as u32,
                score: -1.0,
                state: State::Waiting,
            }
        };
        self.fans.push(rec);
        let iv = self.interval_ms(self.rank(fan), now, sale_start_ms, rng);
        self.schedule(fan, now + iv as i64);
        fan
    }

    /// A fan admitted at the join (passthrough): never queued, claims at once.
    pub fn admitted_at_join(&mut self, now: i64, buyer: u32) -> u32 {
        let fan = self.arrival_ms.len() as u32;
        self.arrival_ms.push(now);
        self.fans.push(Fan {
            pos: buyer,
            score: -1.0,
            state: State::Admitted,
        });
        self.schedule(fan, now);
        fan
    }

    /// The draw: pre-sale fans in score order (once, before the first pop).
    pub fn draw(&mut self) {
        if self.drawn {
            return;
        }
        let fans = &self.fans;
        self.draws
            .sort_unstable_by(|a, b| fans[*a as usize].score.total_cmp(&fans[*b as usize].score));
        for (i, f) in self.draws.iter().enumerate() {
            self.fans[*f as usize].pos = i as u32;
        }
        self.drawn = true;
    }

    /// `ZPOPMIN`: the lowest score leaves the queue.
    pub fn pop(&mut self) -> Option<u32> {
        self.draw();
        let fan = if let Some(&f) = self.draws.get(self.next_draw) {
            self.next_draw += 1;
            f
        } else {
            let f = self.fifo.pop_front()?;
            self.fifo_popped += 1;
            f
        };
        let f = &mut self.fans[fan as usize];
        if f.state == State::Waiting {
            self.polling -= 1;
        }
        f.state = State::Admitted;
        Some(fan)
    }

    /// Records the buyer of an admitted fan (`None`: a no-show, who never polls again).
    pub fn set_buyer(&mut self, fan: u32, buyer: Option<u32>) {
        let f = &mut self.fans[fan as usize];
        match buyer {
            Some(b) => f.pos = b,
            None => f.state = State::Left,
        }
    }

    /// The polls due in step `k` (times in `(origin + (k−1)·step, origin + k·step]`).
    /// Hand the vector back with [`WaitingRoom::recycle`] to keep its capacity.
    pub fn take_due(&mut self, k: i64) -> Vec<(u32, i64)> {
        let slot = k.rem_euclid(self.wheel.len() as i64) as usize;
        let spare = std::mem::take(&mut self.spare);
        let due = std::mem::replace(&mut self.wheel[slot], spare);
        self.scheduled -= due.len() as u64;
        due
    }

    pub fn recycle(&mut self, mut due: Vec<(u32, i64)>) {
        due.clear();
        self.spare = due;
    }

    /// A waiting fan's poll at `at` answered "waiting": the next one is scheduled.
    pub fn polled(&mut self, fan: u32, at: i64, sale_start_ms: i64, rng: &mut SmallRng) {
        let iv = self.interval_ms(self.rank(fan), at, sale_start_ms, rng);
        self.schedule(fan, at + iv as i64);
    }

    /// The fan is gone (claimed, or told the queue is over).
    pub fn left(&mut self, fan: u32) {
        let f = &mut self.fans[fan as usize];
        if f.state == State::Waiting {
            self.polling -= 1;
        }
        f.state = State::Left;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn draws_go_first_in_score_order_then_fifo() {
        let mut rng = SmallRng::seed_from_u64(5);
        let mut w = WaitingRoom::new(PollModel::new(600, 120, true), 0, 250);
        let pre: Vec<u32> = (0..100).map(|i| w.join(i, true, 1000, &mut rng)).collect();
        let late: Vec<u32> = (0..10)
            .map(|i| w.join(2000 + i, false, 1000, &mut rng))
            .collect();
        assert_eq!(w.len(), 110);
        assert_eq!(w.rank(late[0]), 100);
        w.draw();
        let order: Vec<u32> = (0..100).filter_map(|_| w.pop()).collect();
        let mut sorted = pre.clone();
        sorted.sort_by(|a, b| {
            let s = |f: &u32| w.fans[*f as usize].score;
            s(a).total_cmp(&s(b))
        });
        assert_eq!(order, sorted);
        assert_ne!(order, pre, "the draw is not arrival order");
        assert_eq!(w.rank(late[3]), 3);
        assert_eq!(w.pop(), Some(late[0]));
        assert_eq!(w.polling(), 9);
    }

    #[test]
    fn polls_come_back_at_the_interval_told() {
        let mut rng = SmallRng::seed_from_u64(6);
        let mut w = WaitingRoom::new(PollModel::new(600, 120, true), 0, 250);
        let f = w.join(100, false, 0, &mut rng);
        // Rank 0: every second ± 20 %.
        let mut seen = None;
        for k in 1..=8 {
            for (fan, at) in w.take_due(k) {
                assert_eq!(fan, f);
                seen = Some(at);
            }
        }
        let at = seen.expect("polled within 2 s");
        assert!((900..=1300).contains(&at), "{at}");
        assert_eq!(w.scheduled(), 0);
    }
}
