//! Best available (`{"best_available": {...}}` on `POST /api/events/{event}/holds`): the
//! request and its checks, the read of the candidate rows, and the loop that takes the pick
//! with the guarded hold statement ([`super::guard`]), re-reading when a concurrent hold got
//! a seat first, so the loser gets the next best block instead of an error.
//!
//! Also the per-process facts about events the hold paths need: an event's `no_orphans`
//! setting (it never changes after creation, so it is read once per process) and the
//! per-event turn that serialises this process's best-available picks (racing picks of one
//! process would all choose the same best block; picks of other processes still race, and
//! the guarded statement plus the re-read settle that).

use crate::inventory::InventoryState;
use crate::inventory::error::{During, InventoryError};
use crate::inventory::holds::best::{Slot, pick};
use crate::inventory::holds::http::{HoldResponse, taken_response};
use crate::inventory::holds::take::{
    Attempt, expire_account_holds, limit_refusal, sale_not_started, take_seats_tx,
};
use crate::inventory::model::Invalid;
use crate::platform::db;
use serde::Deserialize;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most seats one best-available request may ask for.
pub const MAX_BEST_QUANTITY: i64 = 10;
/// Free seats (in rank order) whose rows are read as candidates; only when nothing fits in
/// them are all rows read.
const WINDOW: i64 = 200;
/// Reads and takes per request before giving up with a `503` (each lost round means another
/// hold got a seat of the pick meanwhile).
const ROUNDS: usize = 8;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BestAvailable {
    pub quantity: i64,
    #[serde(default)]
    pub section: Option<String>,
    #[serde(default)]
    pub tiers: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub adjacent: bool,
}

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
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
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

    fn turn(&self, event: &str) -> Arc<tokio::sync::Mutex<()>> {
        match self.turns.lock() {
            Ok(mut m) => m.entry(event.to_owned()).or_default().clone(),
            // A poisoned map only loses the serialisation; the statement stays the guard.
            Err(_) => Arc::default(),
        }
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

/// Reads the candidates and picks: the seat ids to take.
async fn choose(
    pool: &PgPool,
    event: &str,
    req: &BestAvailable,
    q: usize,
) -> Result<Vec<String>, InventoryError> {
    let mut limit = Some(WINDOW);
    loop {
        let rows: Vec<CandidateRow> = sqlx::query_as(CANDIDATES)
            .bind(event)
            .bind(&req.section)
            .bind(&req.tiers)
            .bind(limit)
            .fetch_all(pool)
            .await
            .during("read the best-available candidates")?;
        let in_window = rows.first().map_or(0, |r| r.7);
        // Segments: runs of consecutive numbers within one row.
        let mut segments: Vec<Vec<Slot>> = Vec::new();
        let mut ids: Vec<Vec<&str>> = Vec::new();
        let mut prev: Option<(&str, i32, i32)> = None;
        for (section, row, number, seat, rank, free, eligible, _) in &rows {
            let joins = prev
                .is_some_and(|(s, r, n)| s == section.as_str() && r == *row && n + 1 == *number);
            if !joins {
                segments.push(Vec::new());
                ids.push(Vec::new());
            }
            prev = Some((section, *row, *number));
            if let (Some(seg), Some(seg_ids)) = (segments.last_mut(), ids.last_mut()) {
                seg.push(Slot {
                    free: *free,
                    eligible: *eligible,
                    rank: i64::from(*rank),
                });
                seg_ids.push(seat);
            }
        }
        if let Some(p) = pick(&segments, q, req.adjacent) {
            return Ok(p
                .seats
                .iter()
                .filter_map(|&(s, i)| ids.get(s).and_then(|v| v.get(i)).map(|id| id.to_string()))
                .collect());
        }
        match limit {
            Some(w) if in_window >= w => limit = None,
            _ if in_window == 0 => return Err(no_free_seats(pool, event, req).await),
            _ => {
                return Err(InventoryError::NoSeatsTogether {
                    quantity: q as i32,
                    free: in_window,
                });
            }
        }
    }
}

/// Nothing free matches: sold out, or (a client error) no seat of that section or tiers.
async fn no_free_seats(pool: &PgPool, event: &str, req: &BestAvailable) -> InventoryError {
    let any: Result<bool, InventoryError> = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM seats WHERE event_id = $1
                          AND ($2::text IS NULL OR section = $2)
                          AND ($3::text[] IS NULL OR tier = ANY($3)))",
    )
    .bind(event)
    .bind(&req.section)
    .bind(&req.tiers)
    .fetch_one(pool)
    .await
    .during("read whether the section and tiers have seats");
    match any {
        Err(e) => e,
        Ok(true) => InventoryError::SeatsSoldOut,
        Ok(false) => Invalid::field(
            "best_available",
            "no seats of this section and tiers in the event",
        )
        .into(),
    }
}

/// Picks and holds. The answer is a hold like an explicit one.
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
    let turn = state.events.turn(event);
    let _turn = turn.lock().await;
    let pool = &state.hold_pool;
    let mut healed = false;
    for _ in 0..ROUNDS {
        let seats = choose(&state.pool, event, &req, q as usize).await?;
        let attempt = db::retry(1, || take_seats_tx(pool, event, account, &seats, q, true)).await?;
        match attempt {
            Attempt::Done(taken) => return Ok(taken_response(state, event, taken, seats)),
            Attempt::Limit if !healed => {
                healed = true;
                expire_account_holds(pool, event, account).await?;
            }
            Attempt::Limit => return Err(limit_refusal(pool, event, account, q).await),
            Attempt::NotOnSale => return Err(sale_not_started(pool, event).await),
            // Another hold got a seat of the pick, or a neighbour, since the read: read again.
            Attempt::Short(_) => {}
        }
    }
    Err(InventoryError::Contended)
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
