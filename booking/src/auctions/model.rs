//! The auctions model: statuses, the auction as stored and as clients see it, creation input,
//! and the bidding rules as plain functions.
//!
//! The rules are decided atomically by the data store (the cold bid statement, the hot Lua
//! script); the functions here state the same rules once, explain a refusal from a read, and
//! are unit-tested: the minimum next bid is `start_price` while nobody leads and
//! `current_price + min_increment` afterwards; a bid accepted less than [`SNIPING_WINDOW_S`]
//! before the end moves the end to `now + SNIPING_WINDOW_S`, at most `max_extensions` times.

use super::error::{AuctionError, LeaderView};
use super::handles::Handles;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Largest amount (minor units) a price, increment or bid may have: 10^15.
pub const MAX_MONEY: i64 = 1_000_000_000_000_000;
/// A bid accepted this close to the end pushes the end to this far from now.
pub const SNIPING_WINDOW_S: i64 = 120;
/// Upper bound for an auction's `max_extensions` (also a CHECK in the schema).
pub const MAX_EXTENSIONS_LIMIT: i32 = 1000;

/// `auctions.status` (`CHECK (status IN ('OPEN', 'CLOSED'))`): `OPEN -> CLOSED`, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, ToSchema)]
#[sqlx(type_name = "text", rename_all = "UPPERCASE")]
#[serde(rename_all = "UPPERCASE")]
pub enum AuctionStatus {
    Open,
    Closed,
}

impl AuctionStatus {
    /// The stored (and Redis, and wire) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AuctionStatus::Open => "OPEN",
            AuctionStatus::Closed => "CLOSED",
        }
    }
}

/// `bids.path` (`CHECK (path IN ('cold', 'hot'))`): which store decided a bid. Also the
/// `path` label of `bids_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum BidPath {
    Cold,
    Hot,
}

impl BidPath {
    pub fn of(hot: bool) -> Self {
        if hot { BidPath::Hot } else { BidPath::Cold }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BidPath::Cold => "cold",
            BidPath::Hot => "hot",
        }
    }
}

/// RFC 3339 with the precision the value has (µs from Postgres, ms from Redis), UTC.
pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Both inputs are at most [`MAX_MONEY`], so the sum cannot overflow; saturate anyway.
pub fn min_next_bid(current_price: i64, min_increment: i64, has_leader: bool) -> i64 {
    if has_leader {
        current_price.saturating_add(min_increment)
    } else {
        current_price
    }
}

/// Anti-sniping: the auction's new end when a bid accepted at `now` extends it, `None` when
/// it does not (not within the window of the end, or no extension left). The cold statement
/// and the hot script apply exactly this.
pub fn extended_end(
    end: DateTime<Utc>,
    now: DateTime<Utc>,
    extensions: i32,
    max_extensions: i32,
) -> Option<DateTime<Utc>> {
    let window = chrono::Duration::seconds(SNIPING_WINDOW_S);
    (end - now < window && extensions < max_extensions).then(|| now + window)
}

/// What a bid meets, as one read of the auction saw it.
#[derive(Debug, Clone, Copy)]
pub struct BidCheck<'a> {
    /// `OPEN` and the end not yet passed.
    pub open: bool,
    pub seller: &'a str,
    pub current_price: i64,
    pub min_increment: i64,
    pub has_leader: bool,
}

/// Why a bid is refused, in the order the statement and the script check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Seller,
    Closed,
    TooLow { min_next: i64 },
}

impl BidCheck<'_> {
    pub fn min_next(&self) -> i64 {
        min_next_bid(self.current_price, self.min_increment, self.has_leader)
    }

    /// `None`: the bid can be accepted (by the atomic decision, which re-checks).
    pub fn refusal(&self, bidder: &str, amount: i64) -> Option<Refusal> {
        if self.seller == bidder {
            Some(Refusal::Seller)
        } else if !self.open {
            Some(Refusal::Closed)
        } else if amount < self.min_next() {
            Some(Refusal::TooLow {
                min_next: self.min_next(),
            })
        } else {
            None
        }
    }
}

/// A bid amount is an integer in `1..=MAX_MONEY`.
pub fn validate_amount(amount: i64) -> Result<(), AuctionError> {
    if (1..=MAX_MONEY).contains(&amount) {
        Ok(())
    } else {
        Err(AuctionError::Invalid {
            field: "amount",
            message: format!(
                "amount must be a positive integer in minor units, at most {MAX_MONEY}"
            ),
        })
    }
}

/// An auction as stored.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct AuctionRow {
    pub id: String,
    pub event_id: Option<String>,
    pub seller_id: String,
    pub title: String,
    pub start_price: i64,
    pub min_increment: i64,
    pub current_price: i64,
    pub leader_id: Option<String>,
    pub bid_count: i64,
    pub hot: bool,
    pub status: AuctionStatus,
    pub end_time: DateTime<Utc>,
    pub extensions: i32,
    pub max_extensions: i32,
    pub created_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

pub const AUCTION_COLUMNS: &str = "id, event_id, seller_id, title, start_price, min_increment, \
    current_price, leader_id, bid_count, hot, status, end_time, extensions, max_extensions, \
    created_at, closed_at";

impl AuctionRow {
    /// The smallest amount the next bid must have.
    pub fn min_next_bid(&self) -> i64 {
        min_next_bid(
            self.current_price,
            self.min_increment,
            self.leader_id.is_some(),
        )
    }

    /// The leader as `viewer` may see them.
    pub fn leader_for(&self, handles: &Handles, viewer: &str) -> LeaderView {
        handles.leader(&self.id, self.leader_id.as_deref(), viewer)
    }

    /// The auction as `viewer` (an account) sees it: other fans appear only as handles, and
    /// `you_lead` / `you_sell` say whether the viewer is the leader / the seller.
    pub fn view_for(&self, handles: &Handles, viewer: &str) -> serde_json::Value {
        let (leader, you_lead) = self.leader_for(handles, viewer);
        serde_json::json!({
            "id": self.id,
            "event": self.event_id,
            "seller": handles.seller(&self.id, &self.seller_id),
            "you_sell": self.seller_id == viewer,
            "title": self.title,
            "start_price": self.start_price,
            "min_increment": self.min_increment,
            "current_price": self.current_price,
            "min_next_bid": self.min_next_bid(),
            "leader": leader,
            "you_lead": you_lead,
            "bid_count": self.bid_count,
            "hot": self.hot,
            "status": self.status,
            "end_time": rfc3339(&self.end_time),
            "extensions": self.extensions,
            "max_extensions": self.max_extensions,
            "created_at": rfc3339(&self.created_at),
            "closed_at": self.closed_at.as_ref().map(rfc3339),
        })
    }
}

/// Immutable facts about an auction (cached per process).
#[derive(Debug, Clone)]
pub struct Meta {
    pub hot: bool,
    pub seller: String,
    /// `None` only for an auction created before events were required.
    pub event: Option<String>,
}

/// What Postgres has recorded for a hot auction: the floor its Redis state must not be
/// below (the consumer only records what Redis accepted, so Redis can only be behind it after
/// losing writes).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Recorded {
    pub current_price: i64,
    pub leader_id: Option<String>,
    pub bid_count: i64,
    pub extensions: i32,
}

impl Recorded {
    /// Keeps the newer of two records (prices, counts and extensions only grow; at
    /// equal prices the leader recorded first stays).
    pub fn merge(&mut self, other: Recorded) {
        if other.leader_id.is_some()
            && (self.leader_id.is_none() || other.current_price > self.current_price)
        {
            self.current_price = other.current_price;
            self.leader_id = other.leader_id;
        }
        self.bid_count = self.bid_count.max(other.bid_count);
        self.extensions = self.extensions.max(other.extensions);
    }
}

/// One accepted hot bid as read from the auction's stream.
#[derive(Debug, Clone)]
pub struct StreamBid {
    pub entry_id: String,
    pub bid_id: String,
    pub bidder: String,
    pub request_id: String,
    pub amount: i64,
    pub placed_at: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub extensions: i32,
    pub extended: bool,
    pub bids: i64,
}

/// `POST /api/auctions` body.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAuction {
    /// The event this auction belongs to; the seller's token must be for it.
    pub event: String,
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub title: String,
    /// integer minor units
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub start_price: i64,
    /// integer minor units
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub min_increment: i64,
    /// RFC 3339; must be in the future (by the database clock).
    #[schema(format = DateTime)]
    pub end_time: String,
    #[serde(default)]
    pub hot: bool,
    #[schema(minimum = 0, maximum = 1000)]
    pub max_extensions: Option<i32>,
}

/// Validated creation input.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuction {
    pub event: String,
    pub title: String,
    pub start_price: i64,
    pub min_increment: i64,
    pub end_time: DateTime<Utc>,
    pub hot: bool,
    pub max_extensions: i32,
}

/// Checks creation input (everything but the end against the clock, which the insert
/// statement checks with the database's).
pub fn validate(
    req: CreateAuction,
    default_max_extensions: i32,
) -> Result<NewAuction, AuctionError> {
    let title = req.title.trim().to_owned();
    if title.is_empty() || title.chars().count() > 200 {
        return Err(AuctionError::Invalid {
            field: "title",
            message: "title must be 1 to 200 characters".into(),
        });
    }
    for (field, v) in [
        ("start_price", req.start_price),
        ("min_increment", req.min_increment),
    ] {
        if !(1..=MAX_MONEY).contains(&v) {
            return Err(AuctionError::Invalid {
                field,
                message: format!(
                    "{field} must be a positive integer amount in minor units, at most {MAX_MONEY}"
                ),
            });
        }
    }
    let end_time = DateTime::parse_from_rfc3339(&req.end_time)
        .map_err(|_| AuctionError::Invalid {
            field: "end_time",
            message: "end_time must be an RFC 3339 timestamp".into(),
        })?
        .with_timezone(&Utc);
    let max_extensions = req.max_extensions.unwrap_or(default_max_extensions);
    if !(0..=MAX_EXTENSIONS_LIMIT).contains(&max_extensions) {
        return Err(AuctionError::Invalid {
            field: "max_extensions",
            message: format!("max_extensions must be between 0 and {MAX_EXTENSIONS_LIMIT}"),
        });
    }
    Ok(NewAuction {
        event: req.event,
        title,
        start_price: req.start_price,
        min_increment: req.min_increment,
        end_time,
        hot: req.hot,
        max_extensions,
    })
}

#[cfg(test)]
mod tests;
