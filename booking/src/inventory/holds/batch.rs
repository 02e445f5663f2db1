//! Best available, batched per event. A booking process queues one event's best-available
//! requests, and one task at a time (the event's *drain*) serves the queue in batches of up to
//! [`MAX_BATCH`] requests:
//!
//! 1. ONE read of the candidate rows per section and tiers asked for in the batch;
//! 2. the pure pick ([`super::best`]) of each request in turn, in arrival order, on that read,
//!    each pick's seats marked taken before the next pick: the picks of a batch are disjoint,
//!    and each is checked for stranding against the state after the picks before it, so the
//!    batch picks exactly what the same requests one after the other would (on that read);
//! 3. every pick's guarded hold statement ([`super::guard`]), each its own statement exactly
//!    as for a request on its own: picks that touch the same row in pick order (so each
//!    statement sees the state its pick was checked against), different rows at once. Each
//!    request gets its own answer through a oneshot channel.
//!
//! The read decides nothing; the statement does. It re-checks, under its locks, every seat it
//! takes and the stranding rule on the latest committed rows, so a stale read (a release, an
//! explicit hold, another booking process) costs a lost round, never a shared or stranded
//! seat. Seat statements of one batch do not wait for each other (each locks seats of its own
//! rows only, and one row's run one after the other); a deadlock with other statements,
//! should Postgres report one, is a lost round like a taken seat. A loser is queued ahead of
//! newer requests for the next batch (which reads after this batch's holds are committed),
//! with its lost rounds counted: [`ROUNDS`] lost rounds answer `503`, as before batching.
//!
//! A request whose pick fails on a read that the batch's earlier picks changed has learnt
//! nothing about the hall: it waits for the next batch's fresh read (not a lost round), ahead
//! of newer requests, so `SOLD_OUT` and `NO_SEATS_TOGETHER` are only ever answered from a read
//! as the database gave it. The oldest request of each batch always gets a pick or an answer,
//! so every request is served.
//!
//! Without the queue, N concurrent requests would read the same rows, pick the same block,
//! and N−1 would lose and read again; one read per batch instead of one per request is what
//! makes best available scale.

use crate::inventory::InventoryState;
use crate::inventory::error::InventoryError;
use crate::inventory::holds::http::{HoldResponse, taken_response};
use crate::inventory::holds::pick::{
    BestAvailable, Candidates, Fit, Picked, WINDOW, any_seats, no_free_seats,
};
use crate::inventory::holds::refusal::{limit_refusal, sale_not_started};
use crate::inventory::holds::take::{Attempt, expire_account_holds, take_seats_tx};
use crate::platform::db::MaybeRetryable;
use crate::platform::error::is_transient;
use futures::future::join_all;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// Most requests one batch serves.
pub(crate) const MAX_BATCH: usize = 64;
/// Hold statements per request before giving up with a `503` (each lost round means another
/// hold got a seat of the pick, or a neighbour, meanwhile).
const ROUNDS: usize = 8;

type Answer = Result<(HoldResponse, i64), InventoryError>;

/// One queued request.
struct Waiter {
    /// Arrival order in this process: losers go back in this order, ahead of newer requests.
    seq: u64,
    account: String,
    req: BestAvailable,
    q: i32,
    /// Hold statements that did not hold (seat taken, stranding, deadlock, own limit healed).
    rounds: usize,
    /// The account's own expired holds were expired once after a limit refusal.
    healed: bool,
    tx: oneshot::Sender<Answer>,
}

impl Waiter {
    fn answer(self, answer: Answer) {
        // The fan may have gone; their hold (if any) expires like any unpaid hold.
        if self.tx.send(answer).is_err() {
            tracing::debug!("a best-available request went away before its answer");
        }
    }

    /// A round that did not hold: back in the queue, or `503` after [`ROUNDS`].
    fn lost(mut self) -> Option<Self> {
        self.rounds += 1;
        if self.rounds >= ROUNDS {
            self.answer(Err(InventoryError::Contended));
            return None;
        }
        Some(self)
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
}

/// Every event's queue in this process. An event has an entry exactly while its drain runs.
#[derive(Default)]
pub(crate) struct Queues {
    events: Mutex<HashMap<String, Queue>>,
    seq: AtomicU64,
}

impl Queues {
    /// The map stays consistent under a panic (each critical section is one push or pop), so
    /// a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a request; `true` when no drain runs for the event (the caller starts one).
    fn push(&self, event: &str, w: Waiter) -> bool {
        let mut map = self.lock();
        let start = !map.contains_key(event);
        map.entry(event.to_owned())
            .or_default()
            .waiting
            .push_back(w);
        start
    }

    /// The next batch, oldest first; empty when the queue is: then the drain ends, under the
    /// same lock as [`Self::push`], so a request queued after that starts a new one.
    fn next_batch(&self, event: &str) -> Vec<Waiter> {
        let mut map = self.lock();
        let Some(queue) = map.get_mut(event) else {
            return Vec::new();
        };
        let n = queue.waiting.len().min(MAX_BATCH);
        let batch: Vec<Waiter> = queue.waiting.drain(..n).collect();
        if batch.is_empty() {
            map.remove(event);
        }
        batch
    }

    /// Puts requests back ahead of every newer one, in arrival order.
    fn requeue(&self, event: &str, mut back: Vec<Waiter>) {
        if back.is_empty() {
            return;
        }
        back.sort_by_key(|w| w.seq);
        let mut map = self.lock();
        let queue = map.entry(event.to_owned()).or_default();
        for w in back.into_iter().rev() {
            queue.waiting.push_front(w);
        }
    }

    /// The drain died (a panic): its queued requests are dropped (each answers `503`) and the
    /// next request starts a new drain.
    fn abandon(&self, event: &str) {
        self.lock().remove(event);
    }
}

/// Queues the request (`q`: its checked quantity) and waits for its answer.
pub(crate) async fn hold(
    state: &InventoryState,
    event: &str,
    account: &str,
    req: BestAvailable,
    q: i32,
) -> Answer {
    let queues = &state.events.queues;
    let (tx, rx) = oneshot::channel();
    let w = Waiter {
        seq: queues.seq.fetch_add(1, Ordering::Relaxed),
        account: account.to_owned(),
        req,
        q,
        rounds: 0,
        healed: false,
        tx,
    };
    if queues.push(event, w) {
        // Its own task: a fan who hangs up must not stop the batch the others wait for.
        tokio::spawn(drain(state.clone(), event.to_owned()));
    }
    // No answer only when the drain panicked: "try again shortly".
    rx.await.unwrap_or(Err(InventoryError::Contended))
}

/// Ends the event's queue if the drain stops without emptying it (a panic unwinding).
struct DrainGuard<'a> {
    queues: &'a Queues,
    event: &'a str,
    done: bool,
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.queues.abandon(self.event);
        }
    }
}

/// Serves the event's queue, batch by batch, until it is empty.
#[tracing::instrument(skip_all, fields(event = %event))]
async fn drain(state: InventoryState, event: String) {
    let queues = &state.events.queues;
    let mut guard = DrainGuard {
        queues,
        event: &event,
        done: false,
    };
    loop {
        let batch = queues.next_batch(&event);
        if batch.is_empty() {
            guard.done = true;
            return;
        }
        let back = run_batch(&state, &event, batch).await;
        queues.requeue(&event, back);
    }
}

/// The requests of one batch that asked for one section and tiers, and their read.
struct Group {
    section: Option<String>,
    tiers: Option<Vec<String>>,
    /// Read at the group's first request, after the picks of the groups before it.
    read: Option<Result<Candidates, InventoryError>>,
    /// Whether the event has seats of the section and tiers at all (read when nothing is
    /// free, once per batch).
    any: Option<bool>,
}

impl Group {
    fn of(req: &BestAvailable) -> Self {
        Self {
            section: req.section.clone(),
            tiers: req.tiers.clone(),
            read: None,
            any: None,
        }
    }

    fn serves(&self, req: &BestAvailable) -> bool {
        self.section == req.section && self.tiers == req.tiers
    }

    /// The group's candidate rows (`limit`: the window, `None` for every row).
    async fn candidates(
        &self,
        state: &InventoryState,
        event: &str,
        limit: Option<i64>,
        picked: &HashSet<String>,
    ) -> Result<Candidates, InventoryError> {
        Candidates::read(
            &state.pool,
            event,
            &self.section,
            &self.tiers,
            limit,
            picked,
        )
        .await
    }

    /// The seats to take for `w`, `None` to wait for the next batch's read, or its answer.
    async fn fit(
        &mut self,
        state: &InventoryState,
        event: &str,
        w: &Waiter,
        picked: &mut HashSet<String>,
    ) -> Result<Option<Picked>, InventoryError> {
        let q = usize::try_from(w.q).unwrap_or(0);
        loop {
            let fit = match &mut self.read {
                None => {
                    self.read = Some(self.candidates(state, event, Some(WINDOW), picked).await);
                    continue;
                }
                Some(Err(e)) => return Err(same_failure(e)),
                Some(Ok(c)) => c.fit(q, w.req.adjacent, picked),
            };
            match fit {
                Fit::Seats(p) => return Ok(Some(p)),
                Fit::Later => return Ok(None),
                Fit::Widen => {
                    self.read = Some(self.candidates(state, event, None, picked).await);
                }
                Fit::NoneFree => {
                    let any = match self.any {
                        Some(any) => any,
                        None => any_seats(&state.pool, event, &self.section, &self.tiers).await?,
                    };
                    self.any = Some(any);
                    return Err(no_free_seats(any));
                }
                Fit::NotTogether { free } => {
                    return Err(InventoryError::NoSeatsTogether {
                        quantity: w.q,
                        free,
                    });
                }
            }
        }
    }
}

/// Picks whose hold statements lock seats of the same rows, in pick order.
#[derive(Default)]
struct Chain {
    rows: Vec<(String, i32)>,
    takes: Vec<(Waiter, Vec<String>)>,
}

/// Puts a pick in a chain: after every earlier pick that touches one of its rows (merging
/// the chains it joins), so picks of one row run in pick order and other rows at once.
///
/// Why: each pick was checked for stranding against the state after the picks before it,
/// not without them. Run in pick order, each statement sees exactly that state and its guard
/// agrees; a later pick that ran first could be refused for a seat an earlier pick was about
/// to take (a lost round for nothing), and statements of one row would wait for each other's
/// locks anyway. Statements never lock seats of other rows, so chains do not wait for each
/// other.
fn chain(chains: &mut Vec<Chain>, w: Waiter, p: Picked) {
    let mut joined = Chain::default();
    let mut i = 0;
    while i < chains.len() {
        let touches = chains
            .get(i)
            .is_some_and(|c| c.rows.iter().any(|r| p.rows.contains(r)));
        if touches {
            let c = chains.remove(i);
            joined.rows.extend(c.rows);
            joined.takes.extend(c.takes);
        } else {
            i += 1;
        }
    }
    for r in p.rows {
        if !joined.rows.contains(&r) {
            joined.rows.push(r);
        }
    }
    joined.takes.push((w, p.seats));
    chains.push(joined);
}

/// One batch: the picks on one read per section and tiers, then the hold statements, every
/// chain at once. Returns the requests for the next batch (losers and those waiting for a
/// fresh read).
async fn run_batch(state: &InventoryState, event: &str, batch: Vec<Waiter>) -> Vec<Waiter> {
    state
        .metrics
        .best_available_batch
        .observe(batch.len() as f64);
    let mut picked: HashSet<String> = HashSet::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut chains: Vec<Chain> = Vec::new();
    let mut back: Vec<Waiter> = Vec::new();
    for w in batch {
        if w.tx.is_closed() {
            // The fan has gone: hold nothing for them.
            continue;
        }
        let i = match groups.iter().position(|g| g.serves(&w.req)) {
            Some(i) => i,
            None => {
                groups.push(Group::of(&w.req));
                groups.len() - 1
            }
        };
        let Some(group) = groups.get_mut(i) else {
            continue;
        };
        match group.fit(state, event, &w, &mut picked).await {
            Ok(Some(p)) => chain(&mut chains, w, p),
            Ok(None) => back.push(w),
            Err(e) => w.answer(Err(e)),
        }
    }
    let lost = join_all(chains.into_iter().map(|c| async move {
        let mut lost = Vec::new();
        for (w, seats) in c.takes {
            lost.extend(settle(state, event, w, seats).await);
        }
        lost
    }))
    .await;
    back.extend(lost.into_iter().flatten());
    back
}

/// One request's guarded hold statement and what follows from it: the answer, or the request
/// back for another round.
async fn settle(
    state: &InventoryState,
    event: &str,
    mut w: Waiter,
    seats: Vec<String>,
) -> Option<Waiter> {
    let pool = &state.hold_pool;
    let answer = match take_seats_tx(pool, event, &w.account, &seats, w.q, true).await {
        Ok(Attempt::Done(taken)) => Ok(taken_response(state, event, taken, seats)),
        Ok(Attempt::Limit) if !w.healed => {
            // The account's own expired holds still count until swept: expire them now (as
            // the sweeper would) and try once more.
            w.healed = true;
            match expire_account_holds(pool, event, &w.account).await {
                Ok(_) => return w.lost(),
                Err(e) => Err(e),
            }
        }
        Ok(Attempt::Limit) => Err(limit_refusal(pool, event, &w.account, w.q).await),
        Ok(Attempt::NotOnSale) => Err(sale_not_started(pool, event).await),
        // Another hold got a seat of the pick, or a neighbour, since the read; or two
        // statements deadlocked (none took anything): pick again on a fresh read.
        Ok(Attempt::Short(_)) => return w.lost(),
        Err(e) if e.retryable() => return w.lost(),
        Err(e) => Err(e),
    };
    w.answer(answer);
    None
}

/// A failed read answers every request of its group; `sqlx::Error` is not `Clone`, so each
/// gets the same statement and the same kind of failure (`503` for a database that is
/// unreachable or busy, `500` otherwise), with the original's text.
fn same_failure(e: &InventoryError) -> InventoryError {
    let InventoryError::Db { statement, source } = e else {
        // Reads fail with database errors only.
        return InventoryError::Contended;
    };
    let text = source.to_string();
    let busy = is_transient(source);
    let source = match source {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), text)),
        sqlx::Error::Protocol(_) => sqlx::Error::Protocol(text),
        _ if busy => sqlx::Error::Protocol(text),
        _ => sqlx::Error::Decode(text.into()),
    };
    InventoryError::Db { statement, source }
}

#[cfg(test)]
mod tests;
