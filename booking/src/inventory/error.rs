//! The inventory's error: every refusal its rules and statements produce, and database
//! failures that name the statement that failed. The HTTP layer (`inventory/http.rs`) alone
//! turns it into `ApiError`, keeping the status codes, codes and messages clients rely on.

use crate::inventory::model::{HoldStatus, Invalid};
use chrono::{DateTime, Utc};

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("invalid request: {0}")]
    Invalid(#[from] Invalid),
    #[error("no such event")]
    UnknownEvent,
    #[error("event {id} already exists")]
    EventExists { id: String },
    #[error("the sale starts at {sale_start}")]
    SaleNotStarted { sale_start: DateTime<Utc> },
    /// Ops cancelled the event: nothing of it is on sale any more.
    #[error("the event was cancelled")]
    EventCancelled,
    #[error("at most {limit} tickets per account ({held} held, {requested} requested)")]
    LimitExceeded {
        limit: i32,
        held: i32,
        requested: i32,
    },
    #[error("seats not in this event: {seats:?}")]
    UnknownSeats { seats: Vec<String> },
    #[error("seats no longer available: {seats:?}")]
    SeatTaken { seats: Vec<String> },
    /// An explicit hold (event with `no_orphans`) would strand these free seats.
    #[error("the hold would strand seats {seats:?}")]
    OrphanSeat { seats: Vec<String> },
    /// Best available: free seats exist (`free` of them matching), but no pick fits.
    #[error("no {quantity} seats fit together ({free} free)")]
    NoSeatsTogether { quantity: i32, free: i64 },
    /// Best available: no free seat matches the request.
    #[error("no seats left for this request")]
    SeatsSoldOut,
    /// Best available lost every one of its bounded retries to concurrent holds.
    #[error("best available kept losing its seats to concurrent holds")]
    Contended,
    #[error("no GA tier {tier} in this event")]
    UnknownTier { tier: String },
    /// Not enough units; `available` is what is left when some, but too few, remain.
    #[error("GA tier sold out ({available:?} left)")]
    SoldOut { available: Option<i64> },
    #[error("no such hold")]
    HoldNotFound,
    #[error("the hold is {status:?}: an order owns it")]
    HoldOrdered { status: HoldStatus },
    #[error("failed to render the seat map")]
    Render(#[source] serde_json::Error),
    /// A statement failed; `statement` says which ("take the requested seats").
    #[error("failed to {statement}")]
    Db {
        statement: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl InventoryError {
    /// The database error underneath, if any.
    pub fn db_source(&self) -> Option<&sqlx::Error> {
        match self {
            InventoryError::Db { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Names the statement a database error came from: `.await.during("insert the hold row")?`.
pub(crate) trait During<T> {
    fn during(self, statement: &'static str) -> Result<T, InventoryError>;
}

impl<T> During<T> for Result<T, sqlx::Error> {
    fn during(self, statement: &'static str) -> Result<T, InventoryError> {
        self.map_err(|source| InventoryError::Db { statement, source })
    }
}

/// A deadlock or serialization failure anywhere in a transaction retries the whole of it
/// ([`crate::platform::db::retry`]).
impl crate::platform::db::MaybeRetryable for InventoryError {
    fn retryable(&self) -> bool {
        self.db_source()
            .is_some_and(crate::platform::db::is_retryable)
    }
}
