//! The auctions domain's errors. Refusals carry what the client is told (the leader already
//! as a handle); failures name the statement or Redis operation that failed, so a `500` in
//! the log says where. [`super::http`] turns them into `ApiError`s.

use crate::platform::db::{MaybeRetryable, TxError, is_retryable};
use crate::platform::error::ApiError;

/// The leader as a refused bidder may see them: a handle, and whether it is the bidder
/// ([`super::handles::Handles::leader`]).
pub type LeaderView = (Option<String>, bool);

#[derive(Debug, thiserror::Error)]
pub enum AuctionError {
    /// Bad input (`422 VALIDATION_FAILED` naming the field).
    #[error("invalid {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no such auction")]
    NotFound,
    #[error("the bid must be at least {min_next}")]
    TooLow {
        current_price: i64,
        min_next: i64,
        leader: LeaderView,
    },
    #[error("this auction has ended")]
    Closed {
        current_price: i64,
        leader: LeaderView,
        /// RFC 3339, as the auction view shows it.
        end_time: String,
    },
    #[error("a seller cannot bid on their own auction")]
    SellerCannotBid,
    /// The bid's Idempotency-Key already placed a bid of another amount.
    #[error("this Idempotency-Key was already used for a different bid")]
    KeyReused,
    #[error("too many bids; slow down")]
    RateLimited { retry_after_s: u64 },
    /// The state moved under a decision; the client retries with the same key (`409`).
    #[error("{0}")]
    Retry(&'static str),
    #[error("failed to {statement}")]
    Db {
        statement: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("redis failed to {op}")]
    Redis {
        op: &'static str,
        #[source]
        source: redis::RedisError,
    },
    /// An error the platform already classified (Redis connection, idempotency claims).
    #[error(transparent)]
    Platform(#[from] ApiError),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl AuctionError {
    /// A transaction helper's error: a database error keeps its retryability and gets
    /// `statement` as context.
    pub fn from_tx(e: TxError, statement: &'static str) -> Self {
        match e {
            TxError::Db(source) => AuctionError::Db { statement, source },
            TxError::Api(e) => AuctionError::Platform(e),
        }
    }
}

/// Deadlocks and serialization failures inside [`crate::platform::db::retry`] run again.
impl MaybeRetryable for AuctionError {
    fn retryable(&self) -> bool {
        matches!(self, AuctionError::Db { source, .. } if is_retryable(source))
    }
}

/// `.stmt("…")` / `.redis_op("…")`: names what failed.
pub trait StatementContext<T> {
    fn stmt(self, statement: &'static str) -> Result<T, AuctionError>;
}

impl<T> StatementContext<T> for Result<T, sqlx::Error> {
    fn stmt(self, statement: &'static str) -> Result<T, AuctionError> {
        self.map_err(|source| AuctionError::Db { statement, source })
    }
}

pub trait RedisContext<T> {
    fn redis_op(self, op: &'static str) -> Result<T, AuctionError>;
}

impl<T> RedisContext<T> for Result<T, redis::RedisError> {
    fn redis_op(self, op: &'static str) -> Result<T, AuctionError> {
        self.map_err(|source| AuctionError::Redis { op, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_statement_and_keep_retryability() {
        let e = Err::<(), _>(sqlx::Error::RowNotFound)
            .stmt("load the auction")
            .expect_err("an error");
        assert_eq!(e.to_string(), "failed to load the auction");
        assert!(!e.retryable());
        let tx = AuctionError::from_tx(TxError::Db(sqlx::Error::PoolTimedOut), "commit");
        assert!(matches!(
            tx,
            AuctionError::Db {
                statement: "commit",
                ..
            }
        ));
        assert!(!AuctionError::NotFound.retryable());
    }
}
