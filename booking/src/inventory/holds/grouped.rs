//! Group commit for explicit seat holds (issue 16): holds of one event that arrive while
//! earlier ones are in Postgres go together, as ONE statement ([`HOLD_SEATS_GROUPED`]): one
//! round trip, one plan run and one commit for all of them, where each hold on its own pays
//! all three.
//!
//! No timer, as for a hot SKU's orders (`orders/batcher.rs`): a hold waits only for the
//! statements already running on its event; if fewer run than `[booking]
//! hold_batch_concurrency`, it starts one at once. So at low load every batch is one hold, run
//! as THE seat hold statement exactly as before, and under a rush the batches grow with the
//! queue, up to `hold_batch_max` holds.
//!
//! Each hold of a batch is still all or nothing, judged under the statement's locks exactly as
//! on its own (the statement's docs). Two holds go in one batch only if they name no seat in
//! common and are of different accounts: the statement cannot give one seat to two holds, and
//! one account's usage row cannot be written twice by one statement. A hold that conflicts
//! with the batch waits, ahead of newer holds, for the next one. A batch that fails (a
//! deadlock, a lost connection) answers none of its holds: each then runs THE seat hold
//! statement on its own, like a hold that was never batched.
//!
//! Events with `no_orphans` (the guarded statement) and best available (`batch.rs`) are not
//! batched here.
//!
//! The queues, their runners (spawned tasks, so a fan who goes away cannot cut a batch off
//! midway) and their recovery from a panic are `platform::lanes`', shared with the orders.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::take::{
    Attempt, SeatRow, SeatShort, SeatsTook, hold_seats_rows, seats_outcome,
};
use crate::platform::kept::KeptPool;
use crate::platform::lanes::{Lane, Lanes};
use prometheus::{Histogram, IntGauge};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::oneshot;

/// THE seat hold statement ([`super::take::HOLD_SEATS`]) for many requests of one event at
/// once. `$2`, `$3`, `$4`: each request's account, hold id and number of seats; `$5`, `$6`: the
/// requested seats, each with its request's position (1-based) in `$2`. No seat appears twice
/// in `$5` and no account twice in `$2` (the batcher makes sure).
///
/// Per request, the same steps and guarantees as on its own:
/// - `wanted` locks every requested seat of the batch in `seat_id` order (so two batches, or a
///   batch and a single hold, cannot deadlock on seats) and keeps those available or whose
///   hold has expired, re-checked after each lock;
/// - `complete`: the requests ALL of whose seats are in `wanted`;
/// - `usage` adds each complete request's seats to its account's usage only if the sale is on
///   and the limit allows it, in account order (every usage lock after every seat lock, like
///   the single statement);
/// - `hold` is inserted only with its usage, and `took` marks its wanted seats held only with
///   its hold.
///
/// So each request is written whole or not at all, whatever the others do. The answer has, for
/// each request (`i`, the last column), one row per wanted seat (or one row of NULLs) with the
/// single statement's columns ([`SeatRow`]) before it, so one request's rows read exactly like
/// its own statement's.
pub const HOLD_SEATS_GROUPED: &str = concat!(
    "
WITH req AS (
    SELECT r.account_id, r.hold_id, r.n, r.i
    FROM unnest($2::text[], $3::text[], $4::int4[]) WITH ORDINALITY AS r (account_id, hold_id, n, i)),
wanted AS (
    SELECT s.seat_id, s.hold_id AS prev_hold, p.price,
           ($6::int4[])[array_position($5::text[], s.seat_id)] AS i
    FROM seats s JOIN price_tiers p ON p.event_id = s.event_id AND p.tier = s.tier
    WHERE s.event_id = $1 AND s.seat_id = ANY($5)
      AND (s.status = 'available' OR (s.status = 'held' AND s.held_until <= clock_timestamp()))
    ORDER BY s.seat_id
    FOR UPDATE OF s),
complete AS (
    SELECT r.account_id, r.hold_id, r.n, r.i FROM req r
    WHERE (SELECT count(*) FROM wanted w WHERE w.i = r.i) = r.n),
usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, c.account_id, c.n FROM events e, complete c
    WHERE e.id = $1 AND c.n <= e.max_tickets_per_account
      AND e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
    ORDER BY c.account_id
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = $1)
    RETURNING u.account_id),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at, seat_ids)
    SELECT c.hold_id, e.id, c.account_id, 'seats', NULL, c.n,
           clock_timestamp() + make_interval(secs => e.hold_ttl_s),
           (SELECT array_agg(w.seat_id ORDER BY w.seat_id) FROM wanted w WHERE w.i = c.i)
    FROM events e, complete c JOIN usage u ON u.account_id = c.account_id
    WHERE e.id = $1
    RETURNING id, expires_at),
took AS (
    UPDATE seats s SET status = 'held', hold_id = h.id, held_until = h.expires_at
    FROM wanted w JOIN complete c ON c.i = w.i JOIN hold h ON h.id = c.hold_id
    WHERE s.event_id = $1 AND s.seat_id = ANY($5) AND s.seat_id = w.seat_id
    RETURNING s.hold_id),
took_n AS (SELECT t.hold_id, count(*) AS n FROM took t GROUP BY t.hold_id)
SELECT ans.expires_at, ans.took, w.seat_id, w.prev_hold, w.price, ans.on_sale, ans.limit_ok,
       ans.live_until_ms, NULL::text[], ans.i
FROM (
    -- Once per request (OFFSET 0 keeps the planner from running these per seat row).
    SELECT r.i, h.expires_at, COALESCE(t.n, 0) AS took,
           (SELECT e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
              FROM events e WHERE e.id = $1) AS on_sale,
           (SELECT COALESCE(a.tickets, 0) + r.n <= e.max_tickets_per_account
              FROM events e LEFT JOIN account_event_usage a
                ON a.event_id = e.id AND a.account_id = r.account_id
             WHERE e.id = $1) AS limit_ok,
           ",
    crate::live_until_ms_sql!("r.account_id", "$1", "h.expires_at", "NULL"),
    " AS live_until_ms
    FROM req r LEFT JOIN hold h ON h.id = r.hold_id LEFT JOIN took_n t ON t.hold_id = r.hold_id
    OFFSET 0) ans
LEFT JOIN wanted w ON w.i = ans.i
ORDER BY ans.i, w.seat_id"
);

/// One explicit seat hold request.
pub struct SeatRequest {
    pub account: String,
    pub hold_id: String,
    pub seats: Vec<String>,
    pub n: i32,
}

/// One row of [`HOLD_SEATS_GROUPED`]'s answer: the single statement's columns (read by
/// position), then the request's position `i`.
#[derive(sqlx::FromRow)]
struct GroupedRow {
    #[sqlx(flatten)]
    answer: SeatRow,
    i: i64,
}

/// Runs [`HOLD_SEATS_GROUPED`] for `requests` (no seat and no account twice); each request's
/// rows, in the order of `requests`.
pub async fn hold_seats_grouped_rows(
    hold_pool: &KeptPool,
    event: &str,
    requests: &[SeatRequest],
) -> Result<Vec<Vec<SeatRow>>, InventoryError> {
    let accounts: Vec<&str> = requests.iter().map(|r| r.account.as_str()).collect();
    let hold_ids: Vec<&str> = requests.iter().map(|r| r.hold_id.as_str()).collect();
    let counts: Vec<i32> = requests.iter().map(|r| r.n).collect();
    let seats: Vec<&str> = requests
        .iter()
        .flat_map(|r| r.seats.iter().map(String::as_str))
        .collect();
    let mut positions = Vec::with_capacity(seats.len());
    for (i, r) in requests.iter().enumerate() {
        let i = i32::try_from(i + 1).unwrap_or(i32::MAX);
        positions.extend(std::iter::repeat_n(i, r.seats.len()));
    }
    let rows: Vec<GroupedRow> = sqlx::query_as(HOLD_SEATS_GROUPED)
        .bind(event)
        .bind(&accounts)
        .bind(&hold_ids)
        .bind(&counts)
        .bind(&seats)
        .bind(&positions)
        .fetch_all(hold_pool)
        .await
        .during("take the requested seats of a batch of holds")?;
    let mut per_request: Vec<Vec<SeatRow>> = requests.iter().map(|_| Vec::new()).collect();
    for GroupedRow { answer, i } in rows {
        let slot = usize::try_from(i - 1)
            .ok()
            .and_then(|i| per_request.get_mut(i));
        match slot {
            Some(rows) => rows.push(answer),
            None => {
                return Err(InventoryError::Db {
                    statement: "take the requested seats of a batch of holds",
                    source: sqlx::Error::Protocol(format!("answer row for request {i}")),
                });
            }
        }
    }
    Ok(per_request)
}

/// The explicit seat holds of this process, batched per event (see the module docs).
pub(crate) struct HoldBatcher {
    lanes: Arc<Lanes<Shared>>,
}

struct Shared {
    pool: KeptPool,
    /// Holds per statement, and holds waiting (`seat_hold_batch_size`, `seat_holds_queued`).
    batch_size: Histogram,
    queued: IntGauge,
    /// Most holds per statement; below 2 nothing is batched.
    max: usize,
    /// Statements one event may have running at once.
    concurrency: usize,
}

struct Waiting {
    request: SeatRequest,
    reply: oneshot::Sender<Served>,
}

/// A batch's answer for one hold: what the statement did for it, or `None` (not served: the
/// hold runs on its own).
type Served = Option<Result<Attempt<SeatsTook, SeatShort>, InventoryError>>;

impl HoldBatcher {
    pub(crate) fn new(
        pool: KeptPool,
        max: u32,
        concurrency: u32,
        batch_size: Histogram,
        queued: IntGauge,
    ) -> Self {
        Self {
            lanes: Lanes::new(Shared {
                pool,
                batch_size,
                queued,
                max: usize::try_from(max).unwrap_or(1),
                concurrency: usize::try_from(concurrency.max(1)).unwrap_or(1),
            }),
        }
    }

    /// False when `hold_batch_max` is below 2: every hold runs on its own.
    pub(crate) fn enabled(&self) -> bool {
        self.lanes.lane().max >= 2
    }

    /// Holds `seats` for `account` in the next batch of `event` and waits for its answer.
    /// `None`: the batch could not answer (it failed); the caller runs the hold on its own.
    pub(crate) async fn take(
        &self,
        event: &str,
        account: &str,
        seats: &[String],
        n: i32,
    ) -> Served {
        let request = SeatRequest {
            account: account.to_owned(),
            hold_id: shared::ids::new_id(),
            seats: seats.to_vec(),
            n,
        };
        let (reply, answer) = oneshot::channel();
        let lane = self.lanes.lane();
        lane.queued.inc();
        self.lanes.push(
            event.to_owned(),
            Waiting { request, reply },
            lane.concurrency,
        );
        // A dropped sender (the task panicked): the hold runs on its own.
        answer.await.unwrap_or(None)
    }
}

impl Lane for Shared {
    type Key = String;
    type Waiting = Waiting;

    fn pick(&self, waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
        let batch = pick_batch(waiting, self.max);
        self.queued.sub(batch.len() as i64);
        self.batch_size.observe(batch.len() as f64);
        batch
    }

    fn serve(&self, event: &String, batch: Vec<Waiting>) -> impl Future<Output = ()> + Send {
        self.serve_batch(event, batch)
    }
}

impl Shared {
    /// Runs one batch and answers each of its holds.
    async fn serve_batch(&self, event: &str, batch: Vec<Waiting>) {
        let (requests, replies): (Vec<SeatRequest>, Vec<oneshot::Sender<Served>>) =
            batch.into_iter().map(|w| (w.request, w.reply)).unzip();
        if let [one] = requests.as_slice() {
            // On its own: THE seat hold statement, exactly as without batching.
            let rows = hold_seats_rows(
                &self.pool,
                event,
                &one.account,
                &one.hold_id,
                &one.seats,
                one.n,
                false,
            )
            .await;
            let answer = match rows {
                Ok(rows) => Some(seats_outcome(one.hold_id.clone(), one.seats.len(), rows)),
                Err(e) => {
                    tracing::debug!(error = ?e, "a seat hold failed in its batch; on its own");
                    None
                }
            };
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(answer);
            }
            return;
        }
        match hold_seats_grouped_rows(&self.pool, event, &requests).await {
            Ok(per_request) => {
                for ((reply, request), rows) in replies.into_iter().zip(requests).zip(per_request) {
                    let answer = seats_outcome(request.hold_id, request.seats.len(), rows);
                    let _ = reply.send(Some(answer));
                }
            }
            Err(e) => {
                let n = requests.len();
                tracing::warn!(error = ?e, event, n, "batch of seat holds failed; each alone");
                for reply in replies {
                    let _ = reply.send(None);
                }
            }
        }
    }
}

/// Takes the next batch off the front of `waiting`: the oldest hold, then each later one that
/// names none of the batch's seats and is of none of its accounts, up to `max`. The others
/// keep their order, ahead of holds that arrive later.
fn pick_batch(waiting: &mut VecDeque<Waiting>, max: usize) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let mut seats: HashSet<String> = HashSet::new();
    let mut accounts: HashSet<String> = HashSet::new();
    let mut rest = VecDeque::with_capacity(waiting.len());
    for w in waiting.drain(..) {
        let r = &w.request;
        let fits = batch.len() < max.max(1)
            && !accounts.contains(&r.account)
            && r.seats.iter().all(|s| !seats.contains(s));
        if fits {
            accounts.insert(r.account.clone());
            seats.extend(r.seats.iter().cloned());
            batch.push(w);
        } else {
            rest.push_back(w);
        }
    }
    *waiting = rest;
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(account: &str, seats: &[&str]) -> (Waiting, oneshot::Receiver<Served>) {
        let (reply, rx) = oneshot::channel();
        let w = Waiting {
            request: SeatRequest {
                account: account.to_owned(),
                hold_id: format!("h-{account}"),
                seats: seats.iter().map(|s| (*s).to_owned()).collect(),
                n: seats.len() as i32,
            },
            reply,
        };
        (w, rx)
    }

    fn accounts(ws: &[Waiting]) -> Vec<&str> {
        ws.iter().map(|w| w.request.account.as_str()).collect()
    }

    #[test]
    fn a_batch_never_names_a_seat_or_an_account_twice_and_keeps_the_rest_in_order() {
        let mut q = VecDeque::new();
        let mut rxs = Vec::new();
        for (a, s) in [
            ("a", &["1", "2"][..]),
            ("b", &["2", "3"]), // seat 2 is a's
            ("a", &["9"]),      // a second hold of a
            ("c", &["3", "4"]),
            ("d", &["5"]),
            ("e", &["4"]), // seat 4 is c's
        ] {
            let (w, rx) = waiting(a, s);
            q.push_back(w);
            rxs.push(rx);
        }
        let batch = pick_batch(&mut q, 64);
        assert_eq!(accounts(&batch), ["a", "c", "d"]);
        assert_eq!(accounts(q.make_contiguous()), ["b", "a", "e"]);
        // The next batch starts with the oldest of the rest.
        let batch = pick_batch(&mut q, 64);
        assert_eq!(accounts(&batch), ["b", "a", "e"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_batch_stops_at_its_size_and_always_takes_the_oldest() {
        let mut q = VecDeque::new();
        let mut rxs = Vec::new();
        for a in ["a", "b", "c", "d", "e"] {
            let (w, rx) = waiting(a, &[a]);
            q.push_back(w);
            rxs.push(rx);
        }
        assert_eq!(accounts(&pick_batch(&mut q, 2)), ["a", "b"]);
        assert_eq!(accounts(q.make_contiguous()), ["c", "d", "e"]);
        // A nonsense size still serves the oldest.
        assert_eq!(accounts(&pick_batch(&mut q, 0)), ["c"]);
        assert_eq!(accounts(&pick_batch(&mut q, 64)), ["d", "e"]);
    }
}
