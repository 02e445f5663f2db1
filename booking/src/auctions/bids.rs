//! `POST /api/auctions/{id}/bids`: placing a bid, cold (Postgres) or hot (Redis).
//!
//! Cold path: ONE statement decides and records. Its `UPDATE` checks status, the end (by
//! `clock_timestamp()`, re-evaluated after any row-lock wait), the minimum next bid and the
//! seller, sets price and leader, applies anti-sniping, and the same statement inserts the bid
//! row. A statement is its own transaction, so the price change and the bid log can never
//! diverge. Concurrent bids queue on the auction's row lock and each re-checks the `WHERE`
//! against the committed winner before it (READ COMMITTED re-evaluation): no lost update.
//!
//! Idempotency uses the bids table itself rather than the generic Idempotency-Key store: the
//! bid row is the stored result, and `UNIQUE (auction_id, request_id)` makes the key and the
//! price change commit together (docs/decisions.md, "Auctions"). A retry whose `UPDATE` finds
//! nothing to do (the price has moved past its own amount) or that loses the unique race then
//! finds the first attempt's row and replays it (`200`, same body). Refusals are not stored:
//! prices only rise and ends only pass, so re-deciding a refused bid refuses it again.

use super::error::{AuctionError, StatementContext};
use super::handles::Handles;
use super::model::{AuctionStatus, BidCheck, BidPath, Meta, Refusal, SNIPING_WINDOW_S, rfc3339};
use super::{AuctionsState, hot};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;

/// Stable code for a seller bidding on their own auction (`403`).
pub const SELLER_CANNOT_BID: &str = "SELLER_CANNOT_BID";

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaceBid {
    /// Minor units. A JSON number outside i64 is refused by the extractor (`422`).
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub amount: i64,
}

/// An accepted bid: what `201` answers and what a replay (`200`) answers again, byte for byte.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedBid {
    pub bid_id: String,
    pub auction_id: String,
    pub bidder: String,
    pub amount: i64,
    pub placed_at: DateTime<Utc>,
    /// The auction's end right after this bid.
    pub end_time: DateTime<Utc>,
    pub extended: bool,
}

impl AcceptedBid {
    /// What the bidder is answered (and, for a retry, answered again): the bidder appears as
    /// their handle in this auction, as other fans see them lead.
    pub fn body(&self, handles: &Handles) -> serde_json::Value {
        let handle = handles.bidder(&self.auction_id, &self.bidder);
        serde_json::json!({
            "bid_id": self.bid_id,
            "auction_id": self.auction_id,
            "bidder": handle,
            "amount": self.amount,
            "status": "ACCEPTED",
            "current_price": self.amount,
            "leader": handle,
            "you_lead": true,
            "placed_at": rfc3339(&self.placed_at),
            "end_time": rfc3339(&self.end_time),
            "extended": self.extended,
        })
    }
}

#[derive(Debug)]
pub enum BidOutcome {
    /// `201`: this request placed the bid.
    Accepted(AcceptedBid),
    /// `200`: an earlier request with the same key placed it.
    Replayed(AcceptedBid),
}

/// The key scoped to the bidder: `len:bidder:key`, unambiguous whatever the two contain.
pub fn request_id(bidder: &str, key: &str) -> String {
    format!("{}:{bidder}:{key}", bidder.len())
}

/// Decides `bidder`'s bid of `amount` on the auction `id` (whose facts are `meta`, and whose
/// event the caller has already checked) with the bidder's Idempotency-Key `key`.
pub async fn place(
    state: &AuctionsState,
    id: &str,
    meta: &Meta,
    bidder: &str,
    key: &str,
    amount: i64,
) -> Result<BidOutcome, AuctionError> {
    // The seller never changes, so refusing here is not a read-then-write race; the bid
    // statement and the Lua script check it again anyway.
    if meta.seller == bidder {
        return Err(AuctionError::SellerCannotBid);
    }
    let request_id = request_id(bidder, key);
    let outcome = if meta.hot {
        hot::place(state, id, bidder, &request_id, amount).await?
    } else {
        place_cold(state, id, bidder, &request_id, amount).await?
    };
    if let BidOutcome::Accepted(bid) = &outcome {
        let path = BidPath::of(meta.hot).as_str();
        state.metrics.bids.with_label_values(&[path]).inc();
        // After the commit (or the script), never inside it; best effort.
        super::live::publish_bid(state, bid);
    }
    Ok(outcome)
}

/// The decision and the bid row, in one statement. Returns nothing when the `UPDATE` refused.
const COLD_BID: &str = r#"
WITH upd AS (
    UPDATE auctions a
       SET current_price = $3,
           leader_id     = $2,
           bid_count     = a.bid_count + 1,
           -- One clock reading decides both whether this bid extends the end and the new end.
           (end_time, extensions, last_bid_at, last_bid_extended) = (
               SELECT CASE WHEN s.extend THEN s.now + make_interval(secs => $6)
                           ELSE a.end_time END,
                      a.extensions + s.extend::int,
                      s.now,
                      s.extend
                 FROM (SELECT t.now,
                              (a.end_time - t.now < make_interval(secs => $6)
                               AND a.extensions < a.max_extensions) AS extend
                         FROM (SELECT clock_timestamp() AS now) t) s)
     WHERE a.id = $1
       AND a.status = 'OPEN'
       AND NOT a.hot
       AND a.seller_id <> $2
       AND a.end_time > clock_timestamp()
       AND $3 >= CASE WHEN a.leader_id IS NULL THEN a.current_price
                      ELSE a.current_price + a.min_increment END
 RETURNING a.id, a.end_time, a.last_bid_at, a.last_bid_extended, a.min_increment
), ins AS (
    INSERT INTO bids (id, auction_id, bidder_id, request_id, amount, placed_at, end_time,
                      extended, path)
    SELECT $5, upd.id, $2, $4, $3, upd.last_bid_at, upd.end_time, upd.last_bid_extended, 'cold'
      FROM upd
    RETURNING id, placed_at, end_time, extended
)
SELECT ins.id, ins.placed_at, ins.end_time, ins.extended, upd.min_increment FROM ins, upd
"#;

/// What the auction looks like now, plus the bid this key already placed (if any). A plain
/// MVCC read: it never waits on the auction's row lock.
#[derive(Debug, sqlx::FromRow)]
struct Explain {
    status: AuctionStatus,
    hot: bool,
    seller_id: String,
    current_price: i64,
    min_increment: i64,
    leader_id: Option<String>,
    end_time: DateTime<Utc>,
    ended: bool,
    bid_id: Option<String>,
    bid_bidder: Option<String>,
    bid_amount: Option<i64>,
    bid_placed_at: Option<DateTime<Utc>>,
    bid_end_time: Option<DateTime<Utc>>,
    bid_extended: Option<bool>,
}

const EXPLAIN: &str = r#"
SELECT a.status, a.hot, a.seller_id, a.current_price, a.min_increment, a.leader_id, a.end_time,
       a.end_time <= clock_timestamp() AS ended,
       b.id AS bid_id, b.bidder_id AS bid_bidder, b.amount AS bid_amount,
       b.placed_at AS bid_placed_at, b.end_time AS bid_end_time, b.extended AS bid_extended
  FROM auctions a
  LEFT JOIN bids b ON b.auction_id = a.id AND b.request_id = $2
 WHERE a.id = $1
"#;

enum Verdict {
    Done(BidOutcome),
    /// The read says the bid could be accepted: let the conditional UPDATE decide.
    Decide,
}

async fn explain(
    state: &AuctionsState,
    id: &str,
    bidder: &str,
    request_id: &str,
    amount: i64,
) -> Result<Verdict, AuctionError> {
    let row: Option<Explain> = sqlx::query_as(EXPLAIN)
        .bind(id)
        .bind(request_id)
        .fetch_optional(&state.pool)
        .await
        .stmt("explain a refused bid")?;
    let Some(r) = row else {
        return Err(AuctionError::NotFound);
    };
    if let (Some(bid_id), Some(b_amount), Some(placed_at), Some(end_time), Some(extended)) = (
        r.bid_id,
        r.bid_amount,
        r.bid_placed_at,
        r.bid_end_time,
        r.bid_extended,
    ) {
        if b_amount != amount {
            return Err(AuctionError::KeyReused);
        }
        return Ok(Verdict::Done(BidOutcome::Replayed(AcceptedBid {
            bid_id,
            auction_id: id.to_owned(),
            bidder: r.bid_bidder.unwrap_or_else(|| bidder.to_owned()),
            amount: b_amount,
            placed_at,
            end_time,
            extended,
        })));
    }
    let check = BidCheck {
        open: r.status == AuctionStatus::Open && !r.ended,
        seller: &r.seller_id,
        current_price: r.current_price,
        min_increment: r.min_increment,
        has_leader: r.leader_id.is_some(),
    };
    state.runtime.raise_floor(id, check.min_next());
    let leader = || state.handles.leader(id, r.leader_id.as_deref(), bidder);
    match check.refusal(bidder, amount) {
        Some(Refusal::Seller) => Err(AuctionError::SellerCannotBid),
        Some(Refusal::Closed) => Err(AuctionError::Closed {
            current_price: r.current_price,
            leader: leader(),
            end_time: rfc3339(&r.end_time),
        }),
        Some(Refusal::TooLow { min_next }) => Err(AuctionError::TooLow {
            current_price: r.current_price,
            min_next,
            leader: leader(),
        }),
        None if r.hot => Err(AuctionError::Retry(
            "this auction moved to the hot path; retry",
        )),
        None => Ok(Verdict::Decide),
    }
}

/// `bid_id, placed_at, end_time, extended, min_increment` of an accepted cold bid.
type ColdAccepted = (String, DateTime<Utc>, DateTime<Utc>, bool, i64);

/// Unique violation on `bids (auction_id, request_id)`: a concurrent request with the same key
/// committed first.
fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23505")
}

pub async fn place_cold(
    state: &AuctionsState,
    id: &str,
    bidder: &str,
    request_id: &str,
    amount: i64,
) -> Result<BidOutcome, AuctionError> {
    // Early rejection: below a price floor this process has already seen, the bid is certainly
    // too low. Answer from a lock-free read (which also finds a replay) instead of queueing on
    // the row lock. The cache never accepts anything.
    if state.runtime.floor(id).is_some_and(|floor| amount < floor) {
        match explain(state, id, bidder, request_id, amount).await? {
            Verdict::Done(outcome) => return Ok(outcome),
            Verdict::Decide => {}
        }
    }
    // A refused UPDATE is explained by a read; the read can only say "decide again" if the
    // state it saw was older than the statement's (it never is: prices only rise), so two
    // rounds are plenty.
    for _ in 0..2 {
        let bid_id = shared::ids::new_id();
        let res: Result<Option<ColdAccepted>, _> = sqlx::query_as(COLD_BID)
            .bind(id)
            .bind(bidder)
            .bind(amount)
            .bind(request_id)
            .bind(&bid_id)
            .bind(SNIPING_WINDOW_S as f64)
            .fetch_optional(&state.pool)
            .await;
        match res {
            Ok(Some((bid_id, placed_at, end_time, extended, min_increment))) => {
                state
                    .runtime
                    .raise_floor(id, amount.saturating_add(min_increment));
                return Ok(BidOutcome::Accepted(AcceptedBid {
                    bid_id,
                    auction_id: id.to_owned(),
                    bidder: bidder.to_owned(),
                    amount,
                    placed_at,
                    end_time,
                    extended,
                }));
            }
            Ok(None) => {}
            Err(e) if is_unique_violation(&e) => {}
            Err(source) => {
                return Err(AuctionError::Db {
                    statement: "run the cold bid statement",
                    source,
                });
            }
        }
        match explain(state, id, bidder, request_id, amount).await? {
            Verdict::Done(outcome) => return Ok(outcome),
            Verdict::Decide => continue,
        }
    }
    Err(AuctionError::Retry(
        "the auction changed while deciding; retry with the same Idempotency-Key",
    ))
}

/// Used by tests and the benchmark: the cold bid statement, exactly as the handler runs it.
pub fn cold_bid_sql() -> &'static str {
    COLD_BID
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_scoped_to_the_bidder_unambiguously() {
        assert_ne!(request_id("ab", "c:d"), request_id("ab:c", "d"));
        assert_eq!(request_id("ab", "k"), "2:ab:k");
    }

    #[test]
    fn an_accepted_bid_answers_with_the_bidders_handle_as_leader() {
        let handles = Handles::new(b"test");
        let t = DateTime::from_timestamp(1_900_000_000, 0).expect("valid time");
        let bid = AcceptedBid {
            bid_id: "b1".into(),
            auction_id: "auc".into(),
            bidder: "fan@example.com".into(),
            amount: 1500,
            placed_at: t,
            end_time: t,
            extended: false,
        };
        let body = bid.body(&handles);
        assert_eq!(body["bidder"], handles.bidder("auc", "fan@example.com"));
        assert_eq!(body["leader"], body["bidder"]);
        assert_eq!(body["current_price"], 1500);
        assert_eq!(body["status"], "ACCEPTED");
        assert!(!body.to_string().contains("example.com"));
    }

    #[test]
    fn the_cold_statement_is_the_one_the_benchmark_extracts() {
        // deploy/bench/auctions.sh cuts it out of this file by its first and last lines.
        let src = include_str!("bids.rs");
        assert!(src.contains("\nconst COLD_BID: &str = r#\"\n"));
        assert!(cold_bid_sql().contains("UPDATE auctions a"));
    }
}
