//! Best available (`{"best_available": {...}}` on `POST /api/events/{event}/holds`): the
//! request and its checks, the read of the candidate rows and the picks made on one read
//! ([`Candidates`]). The queue that batches one event's requests, and takes each pick with
//! the guarded hold statement ([`super::guard`]) and re-picks the losers, is
//! [`super::batch`].
//!
//! Also the per-process facts about events the hold paths need: an event's `no_orphans`
//! setting (it never changes after creation, so it is read once per process) and each
//! event's best-available queue.

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::batch::{self, Queues};
use crate::inventory::holds::best::{Slot, pick};
use crate::inventory::holds::http::HoldResponse;
use crate::inventory::model::Invalid;
use serde::Deserialize;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Most seats one best-available request may ask for.
pub const MAX_BEST_QUANTITY: i64 = 10;
/// Free seats (in rank order) whose rows are read as candidates; only when nothing fits in
/// them are all rows read.
pub(crate) const WINDOW: i64 = 200;

/// booking picks the best free seats (lowest rank: front rows, centre), never stranding one
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BestAvailable {
    #[schema(minimum = 1, maximum = 10)]
    pub quantity: i64,
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,32}$")]
    pub section: Option<String>,
    #[serde(default)]
    #[schema(min_items = 1, max_items = 32, value_type = Option<Vec<TierName>>)]
    pub tiers: Option<Vec<String>>,
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub adjacent: bool,
}

/// A tier or section name: 1..=32 of A-Z a-z 0-9 `-` `_`.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_-]{1,32}$")]
#[expect(dead_code, reason = "a schema only: the name's form in the document")]
pub struct TierName(String);

fn yes() -> bool {
    true
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The request's checks (no database): returns the quantity.
pub fn check_best(req: &BestAvailable, max_seats_per_hold: usize) -> Result<i32, Invalid> {
    let max = MAX_BEST_QUANTITY.min(max_seats_per_hold as i64);
    if !(1..=max).contains(&req.quantity) {
        return Err(Invalid::field(
            "best_available.quantity",
            format!("quantity must be 1..={max}"),
        ));
    }
    if req.section.as_deref().is_some_and(|s| !is_name(s)) {
        return Err(Invalid::field(
            "best_available.section",
            "section names are 1-32 of A-Z a-z 0-9 - _",
        ));
    }
    if let Some(tiers) = &req.tiers
        && (tiers.is_empty() || tiers.len() > 32 || !tiers.iter().all(|t| is_name(t)))
    {
        return Err(Invalid::field(
            "best_available.tiers",
            "tiers must be 1-32 tier names of 1-32 of A-Z a-z 0-9 - _",
        ));
    }
    i32::try_from(req.quantity).map_err(|_| Invalid::field("best_available.quantity", "range"))
}

/// Per-process event facts for the hold paths (see the module docs).
#[derive(Default)]
pub struct EventLocal {
    no_orphans: Mutex<HashMap<String, bool>>,
    /// Each event's queue of best-available requests ([`super::batch`]).
    pub(crate) queues: Queues,
}

impl EventLocal {
    /// The event's `no_orphans`, `None` for no such event (not remembered: it may be created).
    pub(crate) async fn no_orphans(
        &self,
        pool: &PgPool,
        event: &str,
    ) -> Result<Option<bool>, InventoryError> {
        if let Some(v) = self
            .no_orphans
            .lock()
            .ok()
            .and_then(|m| m.get(event).copied())
        {
            return Ok(Some(v));
        }
        let v: Option<bool> = sqlx::query_scalar("SELECT no_orphans FROM events WHERE id = $1")
            .bind(event)
            .fetch_optional(pool)
            .await
            .during("read the event's no_orphans")?;
        if let (Some(v), Ok(mut m)) = (v, self.no_orphans.lock()) {
            m.insert(event.to_owned(), v);
        }
        Ok(v)
    }
}

/// (section, row, number, seat id, rank, free, eligible, free eligible seats in the window)
type CandidateRow = (String, i32, i32, String, i32, bool, bool, i64);

/// The rows holding the `limit` best-ranked free eligible seats (all rows with one when
/// `limit` is NULL), every seat of them, in section, row, number order.
const CANDIDATES: &str = "
WITH best AS (
    SELECT s.section, s.row_no FROM seats s
    WHERE s.event_id = $1 AND ($2::text IS NULL OR s.section = $2)
      AND ($3::text[] IS NULL OR s.tier = ANY($3))
      AND (s.status = 'available' OR (s.status = 'held' AND s.held_until <= clock_timestamp()))
    ORDER BY s.rank, s.seat_id
    LIMIT $4),
picked_rows AS (SELECT DISTINCT section, row_no FROM best)
SELECT s.section, s.row_no, s.number, s.seat_id, s.rank,
       (s.status = 'available' OR (s.status = 'held' AND s.held_until <= clock_timestamp())),
       ($3::text[] IS NULL OR s.tier = ANY($3)),
       (SELECT count(*) FROM best)
FROM seats s JOIN picked_rows r ON s.section = r.section AND s.row_no = r.row_no
WHERE s.event_id = $1
ORDER BY s.section, s.row_no, s.number, s.seat_id";

/// One read of the candidate rows for one section and tiers, as segments for the pure pick,
/// and the picks made on it so far: a pick's seats are marked taken here before the next
/// pick, so the picks of one batch are disjoint and each is judged (stranding included)
/// against the state after the ones before it.
pub(crate) struct Candidates {
    segments: Vec<Vec<Slot>>,
    ids: Vec<Vec<String>>,
    /// Each segment's (section, row).
    rows: Vec<(String, i32)>,
    /// Free eligible seats in the window, as read.
    in_window: i64,
    /// The window the read used (`None`: every row with a free eligible seat).
    limit: Option<i64>,
    /// A seat that was free in the read is taken by a pick of this batch: a pick that
    /// fails now may fit in a fresh read, so it proves nothing about the hall.
    changed: bool,
}

/// A pick of one request.
pub(crate) struct Picked {
    pub seats: Vec<String>,
    /// The (section, row) of its seats, each once: its hold statement locks seats of these
    /// rows only (the guard's neighbours are row neighbours).
    pub rows: Vec<(String, i32)>,
}

/// What the candidate rows say about one request.
pub(crate) enum Fit {
    /// The seats to take (already marked taken in the candidates).
    Seats(Picked),
    /// Nothing fits in this read, which this batch's picks changed: ask a fresh read.
    Later,
    /// Nothing fits in the window although it is full: read every row.
    Widen,
    /// Nothing free matches at all (sold out, or no such seats: [`no_free_seats`]).
    NoneFree,
    /// Free seats match, but no pick of the quantity strands none.
    NotTogether { free: i64 },
}

impl Candidates {
    /// Reads the candidates (`limit`: the window, `None` for all rows); seats in `picked`
    /// (taken by earlier picks of the same batch) count as taken.
    pub(crate) async fn read(
        pool: &PgPool,
        event: &str,
        section: &Option<String>,
        tiers: &Option<Vec<String>>,
        limit: Option<i64>,
        picked: &HashSet<String>,
    ) -> Result<Self, InventoryError> {
        let rows: Vec<CandidateRow> = sqlx::query_as(CANDIDATES)
            .bind(event)
            .bind(section)
            .bind(tiers)
            .bind(limit)
            .fetch_all(pool)
            .await
            .during("read the best-available candidates")?;
        let mut c = Candidates {
            segments: Vec::new(),
            ids: Vec::new(),
            rows: Vec::new(),
            in_window: rows.first().map_or(0, |r| r.7),
            limit,
            changed: false,
        };
        // Segments: runs of consecutive numbers within one row.
        let mut prev: Option<(String, i32, i32)> = None;
        for (section, row, number, seat, rank, free, eligible, _) in rows {
            let joins = prev
                .as_ref()
                .is_some_and(|(s, r, n)| *s == section && *r == row && n + 1 == number);
            if !joins {
                c.segments.push(Vec::new());
                c.ids.push(Vec::new());
                c.rows.push((section.clone(), row));
            }
            let taken_here = free && picked.contains(&seat);
            c.changed |= taken_here;
            if let (Some(seg), Some(seg_ids)) = (c.segments.last_mut(), c.ids.last_mut()) {
                seg.push(Slot {
                    free: free && !taken_here,
                    eligible,
                    rank: i64::from(rank),
                });
                seg_ids.push(seat);
            }
            prev = Some((section, row, number));
        }
        Ok(c)
    }

    /// The best pick for `q` seats on these rows as they stand after the earlier picks; a
    /// pick is marked taken here and added to `picked`.
    pub(crate) fn fit(&mut self, q: usize, adjacent: bool, picked: &mut HashSet<String>) -> Fit {
        if let Some(p) = pick(&self.segments, q, adjacent) {
            let mut seats = Vec::with_capacity(p.seats.len());
            let mut rows: Vec<(String, i32)> = Vec::new();
            for (s, i) in p.seats {
                if let Some(row) = self.rows.get(s)
                    && !rows.contains(row)
                {
                    rows.push(row.clone());
                }
                if let (Some(slot), Some(id)) = (
                    self.segments.get_mut(s).and_then(|v| v.get_mut(i)),
                    self.ids.get(s).and_then(|v| v.get(i)),
                ) {
                    slot.free = false;
                    picked.insert(id.clone());
                    seats.push(id.clone());
                }
            }
            self.changed = true;
            return Fit::Seats(Picked { seats, rows });
        }
        match self.limit {
            _ if self.changed => Fit::Later,
            Some(w) if self.in_window >= w => Fit::Widen,
            _ if self.in_window == 0 => Fit::NoneFree,
            _ => Fit::NotTogether {
                free: self.in_window,
            },
        }
    }
}

/// Nothing free matches: sold out (`true`), or (a client error) no seat of that section or
/// tiers (`false`): whether the event has seats of the section and tiers at all.
pub(crate) async fn any_seats(
    pool: &PgPool,
    event: &str,
    section: &Option<String>,
    tiers: &Option<Vec<String>>,
) -> Result<bool, InventoryError> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM seats WHERE event_id = $1
                          AND ($2::text IS NULL OR section = $2)
                          AND ($3::text[] IS NULL OR tier = ANY($3)))",
    )
    .bind(event)
    .bind(section)
    .bind(tiers)
    .fetch_one(pool)
    .await
    .during("read whether the section and tiers have seats")
}

/// The answer when nothing free matches, from [`any_seats`].
pub(crate) fn no_free_seats(any: bool) -> InventoryError {
    if any {
        InventoryError::SeatsSoldOut
    } else {
        Invalid::field(
            "best_available",
            "no seats of this section and tiers in the event",
        )
        .into()
    }
}

/// Picks and holds: queues the request for the event's batch ([`super::batch`]) and waits
/// for its answer. The answer is a hold like an explicit one.
pub(crate) async fn hold_best(
    state: &InventoryState,
    event: &str,
    account: &str,
    req: BestAvailable,
) -> Result<(HoldResponse, i64), InventoryError> {
    let q = check_best(&req, state.settings.max_seats_per_hold)?;
    if state.events.no_orphans(&state.pool, event).await?.is_none() {
        return Err(InventoryError::UnknownEvent);
    }
    batch::hold(state, event, account, req, q).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: serde_json::Value) -> BestAvailable {
        serde_json::from_value(v).expect("a best-available request")
    }

    #[test]
    fn quantities_run_from_one_to_ten_or_the_hold_maximum() {
        let ok = req(serde_json::json!({"quantity": 10}));
        assert!(ok.adjacent, "adjacent by default");
        assert_eq!(check_best(&ok, 10), Ok(10));
        for q in [0, -1, 11, i64::MAX] {
            let e = check_best(&req(serde_json::json!({"quantity": q})), 10).unwrap_err();
            assert_eq!(e.message, "quantity must be 1..=10", "{q}");
        }
        let e = check_best(&req(serde_json::json!({"quantity": 5})), 4).unwrap_err();
        assert_eq!(e.message, "quantity must be 1..=4");
    }

    #[test]
    fn sections_and_tiers_must_be_names() {
        let e = check_best(
            &req(serde_json::json!({"quantity": 1, "section": "a b"})),
            10,
        );
        assert_eq!(
            e.unwrap_err().detail("field"),
            Some(&serde_json::Value::from("best_available.section"))
        );
        for tiers in [serde_json::json!([]), serde_json::json!(["ok", ""])] {
            let e = check_best(&req(serde_json::json!({"quantity": 1, "tiers": tiers})), 10);
            assert!(e.is_err(), "{tiers}");
        }
        let ok = req(
            serde_json::json!({"quantity": 2, "section": "S1", "tiers": ["A"],
                                        "adjacent": false}),
        );
        assert_eq!(check_best(&ok, 10), Ok(2));
        assert!(
            serde_json::from_value::<BestAvailable>(serde_json::json!(
            {"quantity": 1, "colour": "red"}))
            .is_err()
        );
    }
}
