//! The waiting room's side of every fan: their place in the queue and their status polls.
//!
//! The queue is what Redis orders by score: pre-sale joins first, in the order of their
//! draw score (uniformly random), then FIFO joins in arrival order. A fan's rank is
//! arithmetic on their position, as the gateway's in-memory status answer is. Each fan's
//! next poll sits on a timing wheel at exactly the `poll_after_ms` the gateway told them at
//! their join or last poll (`queue::poll_after_ms`, with its ±20 % jitter), so a poll costs
//! O(1) and two million fans simulate in seconds; an admitted fan learns it — claims — on
//! that next poll, and a fan still waiting when the event sells out is told on theirs.
//!
//! A poll entry carries the fan's queue position, so a waiting fan's poll reads nothing else
//! (admission pops positions in order: position below the pop cursor = admitted); the fan's
//! own record is read only around their admission.

use super::polls::PollModel;
use rand::Rng;
use rand::rngs::SmallRng;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    /// Popped by a tick; `pos` now holds the buyer id.
    Admitted,
    /// Gone: claimed, told it is over, or never coming back.
    Left,
}

/// A fan's record, read at the join, the draw and the admission.
#[derive(Debug, Clone, Copy)]
struct Fan {
    /// FIFO: the join's sequence number; drawn: position in the draw; admitted: buyer id.
    pos: u32,
    /// Pre-sale fans' draw score in [0, 1) (lower goes first); FIFO fans: -1.
    score: f32,
    state: State,
}

/// `Poll::key` bits: a drawn fan; with [`POSITION`], the low bits are their position in the
/// draw, without it (entry made before the draw) their score as a 30-bit fraction. FIFO
/// fans' keys are their join sequence number.
const DRAWN: u32 = 1 << 31;
const POSITION: u32 = 1 << 30;
const LOW: u32 = POSITION - 1;
/// A fan admitted at the join (passthrough): their one poll claims.
const AT_JOIN: u32 = u32::MAX;

/// A scheduled status poll.
#[derive(Debug, Clone, Copy)]
pub struct Poll {
    pub at: i64,
    fan: u32,
    key: u32,
}

/// What a due poll finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Still queued, this many ahead.
    Waiting(u64),
    /// Admitted: the poll claims (buyer id).
    Admitted(u32),
    Gone,
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
    wheel: Vec<Vec<Poll>>,
    spare: Vec<Poll>,
    step_ms: i64,
    origin_ms: i64,
    /// The last step whose polls were handed out.
    taken: i64,
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
            taken: -1,
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

    /// The key a poll of `fan` carries now.
    fn key(&self, fan: u32) -> u32 {
        let f = self.fans[fan as usize];
        match (f.score >= 0.0, self.drawn) {
            (false, _) => f.pos,
            (true, true) => DRAWN | POSITION | f.pos,
            (true, false) => DRAWN | ((f64::from(f.score) * f64::from(LOW)) as u32 & LOW),
        }
    }

    /// An admitted (or gone) fan's poll.
    fn admitted(&self, fan: u32) -> Due {
        let f = self.fans[fan as usize];
        match f.state {
            State::Admitted => Due::Admitted(f.pos),
            State::Waiting | State::Left => Due::Gone,
        }
    }

    /// What the poll finds, from its key alone while the fan waits.
    pub fn due(&self, p: &Poll) -> Due {
        if p.key == AT_JOIN {
            return self.admitted(p.fan);
        }
        let draws_left = (self.draws.len() - self.next_draw) as u64;
        if p.key & DRAWN == 0 {
            let seq = u64::from(p.key);
            if seq < self.fifo_popped {
                return self.admitted(p.fan);
            }
            return Due::Waiting(draws_left + seq - self.fifo_popped);
        }
        let pos = if p.key & POSITION != 0 {
            p.key & LOW
        } else if self.drawn {
            // Scheduled before the draw: the fan's drawn position, once.
            self.fans[p.fan as usize].pos
        } else {
            // Before the draw: the share of current draws scoring lower.
            let share = f64::from(p.key & LOW) / f64::from(LOW);
            return Due::Waiting((share * self.draws.len() as f64) as u64);
        };
        if (pos as usize) < self.next_draw {
            return self.admitted(p.fan);
        }
        Due::Waiting(u64::from(pos) - self.next_draw as u64)
    }

    fn schedule(&mut self, p: Poll) {
        // A poll due in a step already handed out (a passthrough claim, or a tick longer than
        // the shortest interval) goes to the next step; its time stays exact.
        let step = (p.at - self.origin_ms + self.step_ms - 1)
            .div_euclid(self.step_ms)
            .max(self.taken + 1);
        let slot = step.rem_euclid(self.wheel.len() as i64) as usize;
        self.wheel[slot].push(p);
        self.scheduled += 1;
    }

    /// The next poll of a fan `ahead` of the queue who just polled (or joined) at `now`;
    /// `key` is what the poll carries (see [`Poll`]).
    fn poll_again(
        &mut self,
        fan: u32,
        key: u32,
        ahead: u64,
        now: i64,
        start: i64,
        rng: &mut SmallRng,
    ) {
        let until_start = u64::try_from(start - now).unwrap_or(0);
        let jitter = rng.random::<f64>() * 2.0 - 1.0;
        let iv = self.polls.interval_ms(ahead, until_start, jitter);
        self.schedule(Poll {
            at: now + iv as i64,
            fan,
            key,
        });
    }

    /// A join at `now` that queues the fan (`presale`: drawn). Schedules the first poll at
    /// the `poll_after_ms` of the join's answer.
    pub fn join(&mut self, now: i64, presale: bool, sale_start_ms: i64, rng: &mut SmallRng) -> u32 {
        let fan = self.arrival_ms.len() as u32;
        self.arrival_ms.push(now);
        self.polling += 1;
        let (rec, ahead) = if presale {
            let score = rng.random::<f32>();
            let ahead = (f64::from(score) * self.draws.len() as f64) as u64;
            self.draws.push(fan);
            let pos = (self.draws.len() - 1) as u32;
            let state = State::Waiting;
            (Fan { pos, score, state }, ahead)
        } else {
            let ahead = self.len();
            self.fifo.push_back(fan);
            self.fifo_joined += 1;
            let pos = (self.fifo_joined - 1) as u32;
            let state = State::Waiting;
            (
                Fan {
                    pos,
                    score: -1.0,
                    state,
                },
                ahead,
            )
        };
        self.fans.push(rec);
        let key = self.key(fan);
        self.poll_again(fan, key, ahead, now, sale_start_ms, rng);
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
        self.schedule(Poll {
            at: now,
            fan,
            key: AT_JOIN,
        });
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
    pub fn take_due(&mut self, k: i64) -> Vec<Poll> {
        self.taken = k;
        let slot = k.rem_euclid(self.wheel.len() as i64) as usize;
        let spare = std::mem::take(&mut self.spare);
        let due = std::mem::replace(&mut self.wheel[slot], spare);
        self.scheduled -= due.len() as u64;
        due
    }

    pub fn recycle(&mut self, mut due: Vec<Poll>) {
        due.clear();
        self.spare = due;
    }

    /// A waiting fan's poll answered "waiting" (`ahead` in front): the next is scheduled.
    pub fn polled(&mut self, p: &Poll, ahead: u64, sale_start_ms: i64, rng: &mut SmallRng) {
        // The same key, unless it was made before the draw and the draw has happened since.
        let stale = p.key & (DRAWN | POSITION) == DRAWN && self.drawn;
        let key = if stale { self.key(p.fan) } else { p.key };
        self.poll_again(p.fan, key, ahead, p.at, sale_start_ms, rng);
    }

    /// The fan is gone (claimed, or told the queue is over).
    pub fn left(&mut self, p: &Poll) {
        let f = &mut self.fans[p.fan as usize];
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
        w.draw();
        let order: Vec<u32> = (0..100).filter_map(|_| w.pop()).collect();
        let mut sorted = pre.clone();
        let score = |f: &u32| w.fans[*f as usize].score;
        sorted.sort_by(|a, b| score(a).total_cmp(&score(b)));
        assert_eq!(order, sorted);
        assert_ne!(order, pre, "the draw is not arrival order");
        let p = Poll {
            at: 0,
            fan: late[3],
            key: w.key(late[3]),
        };
        assert_eq!(w.due(&p), Due::Waiting(3));
        // A poll scheduled while waiting finds the fan admitted once popped.
        let p = Poll {
            at: 0,
            fan: late[0],
            key: w.key(late[0]),
        };
        assert_eq!(w.pop(), Some(late[0]));
        assert_eq!(w.polling(), 9);
        w.set_buyer(late[0], Some(7));
        assert_eq!(w.due(&p), Due::Admitted(7));
    }

    #[test]
    fn a_poll_made_before_the_draw_finds_its_drawn_place() {
        let mut rng = SmallRng::seed_from_u64(9);
        let mut w = WaitingRoom::new(PollModel::new(600, 120, true), 0, 250);
        let fans: Vec<u32> = (0..50).map(|i| w.join(i, true, 1000, &mut rng)).collect();
        let early: Vec<Poll> = fans
            .iter()
            .map(|f| Poll {
                at: 0,
                fan: *f,
                key: w.key(*f),
            })
            .collect();
        w.draw();
        let mut ranks: Vec<u64> = early
            .iter()
            .map(|p| match w.due(p) {
                Due::Waiting(r) => r,
                other => panic!("{other:?}"),
            })
            .collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn polls_come_back_at_the_interval_told() {
        let mut rng = SmallRng::seed_from_u64(6);
        let mut w = WaitingRoom::new(PollModel::new(600, 120, true), 0, 250);
        let f = w.join(100, false, 0, &mut rng);
        // Rank 0: every second ± 20 %.
        let mut seen = None;
        for k in 1..=8 {
            for p in w.take_due(k) {
                assert_eq!(p.fan, f);
                seen = Some(p.at);
            }
        }
        let at = seen.expect("polled within 2 s");
        assert!((900..=1300).contains(&at), "{at}");
        assert_eq!(w.scheduled(), 0);
    }
}
