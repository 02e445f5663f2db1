//! Transfer at face value (issue 44; DESIGN section 9, "Transfer"): the holder offers a ticket
//! to an e-mail address, the receiver signs in and accepts. No money moves.
//!
//! Layout: [`repo`] (the statements: offer, cancel, accept, each in one transaction),
//! [`http`] (`POST /api/tickets/{id}/transfers`, `DELETE /api/transfers/{id}`, `POST
//! /api/transfers/{id}/accept`, class `identity`).
//!
//! Guarantees:
//! - At most one open offer per ticket (a partial unique index decides, not a read).
//! - An accept moves the ticket only if, in the same transaction and under the ticket's row
//!   lock, the offer is still open and unexpired, and the ticket is still valid, never
//!   entered, of an event that allows transfers, held by the offerer at the offered version.
//!   Any number of concurrent accepts of one offer: exactly one wins (the offer's conditional
//!   UPDATE), the others change nothing.
//! - The accept bumps the ticket's version (the sender's code is `VOIDED`, reason
//!   `reissued`, at the door) and moves one ticket of per-account usage from the sender to
//!   the receiver under the receiver's per-event limit (`LIMIT_EXCEEDED`, nothing changed).
//! - Locks are taken ticket first, then the offer, then usage rows in account order — the
//!   order a refund uses too (ticket rows before usage), so the two never deadlock.
//! - Addresses live only in `ticket_transfers` (never the audit log, the outbox or logs).

pub mod http;
pub mod repo;

use crate::platform::error::ApiError;
use axum::http::StatusCode;
use shared::error::codes;

/// Error codes of the transfer endpoints (stable; docs/api.md).
pub mod transfer_codes {
    pub const TICKET_VOIDED: &str = "TICKET_VOIDED";
    pub const TICKET_CHECKED_IN: &str = "TICKET_CHECKED_IN";
    pub const TRANSFERS_DISABLED: &str = "TRANSFERS_DISABLED";
    pub const TRANSFER_TO_SELF: &str = "TRANSFER_TO_SELF";
    pub const TRANSFER_PENDING: &str = "TRANSFER_PENDING";
    pub const TRANSFER_NOT_OPEN: &str = "TRANSFER_NOT_OPEN";
    pub const TRANSFER_EXPIRED: &str = "TRANSFER_EXPIRED";
    pub const TRANSFER_STALE: &str = "TRANSFER_STALE";
}

/// Why a transfer statement refused; each becomes one HTTP answer ([`From`] below).
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// No such ticket of the caller's (someone else's is not revealed), or no such offer.
    #[error("not found")]
    NotFound(&'static str),
    #[error("the ticket is voided")]
    Voided,
    #[error("the ticket has been checked in")]
    CheckedIn,
    #[error("the event does not allow transfers")]
    Disabled,
    /// The offer's address is the sender's own, or the sender accepts their own offer.
    #[error("transfer to oneself")]
    ToSelf { at_accept: bool },
    #[error("an offer is already open")]
    Pending { transfer_id: String },
    #[error("the offer is not open")]
    NotOpen { status: String },
    #[error("the offer expired")]
    Expired,
    /// The ticket changed since the offer (voided, checked in, transfers turned off, moved).
    #[error("the ticket changed since the offer")]
    Stale,
    #[error("the receiver's per-account limit")]
    LimitExceeded { limit: i32, held: i32 },
    /// A statement failed: `what` names it (contention stays a `503`, see `ApiError`).
    #[error("failed to {what}")]
    Db {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

/// Names the failing statement of a database call.
pub(crate) trait Statement<T> {
    fn statement(self, what: &'static str) -> Result<T, TransferError>;
}

impl<T> Statement<T> for Result<T, sqlx::Error> {
    fn statement(self, what: &'static str) -> Result<T, TransferError> {
        self.map_err(|source| TransferError::Db { what, source })
    }
}

impl From<TransferError> for ApiError {
    fn from(e: TransferError) -> Self {
        use TransferError as E;
        use transfer_codes as c;
        match e {
            E::NotFound(what) => ApiError::not_found(codes::NOT_FOUND, what),
            E::Voided => ApiError::conflict(c::TICKET_VOIDED, "the ticket is voided"),
            E::CheckedIn => ApiError::conflict(
                c::TICKET_CHECKED_IN,
                "the ticket has been checked in; it can no longer be transferred",
            ),
            E::Disabled => ApiError::new(
                StatusCode::FORBIDDEN,
                c::TRANSFERS_DISABLED,
                "this event does not allow ticket transfers",
            ),
            E::ToSelf { at_accept: false } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                c::TRANSFER_TO_SELF,
                "that is the address this ticket was sent to; offer it to someone else",
            ),
            E::ToSelf { at_accept: true } => ApiError::new(
                StatusCode::FORBIDDEN,
                c::TRANSFER_TO_SELF,
                "the sender cannot accept their own offer",
            ),
            E::Pending { transfer_id } => ApiError::conflict(
                c::TRANSFER_PENDING,
                "an offer of this ticket is already open; cancel it first",
            )
            .with("transfer_id", transfer_id),
            E::NotOpen { status } => {
                ApiError::conflict(c::TRANSFER_NOT_OPEN, "this offer is no longer open")
                    .with("status", status)
            }
            E::Expired => ApiError::conflict(c::TRANSFER_EXPIRED, "this offer has expired"),
            E::Stale => ApiError::conflict(
                c::TRANSFER_STALE,
                "the ticket changed since it was offered (voided, checked in, or transfers \
                 turned off); ask the sender for a new offer",
            ),
            E::LimitExceeded { limit, held } => ApiError::conflict(
                codes::LIMIT_EXCEEDED,
                format!("at most {limit} tickets per account for this event"),
            )
            .with("limit", limit)
            .with("held", held)
            .with("requested", 1),
            E::Db { what, source } => match ApiError::from(source) {
                ApiError::Unavailable(e) => {
                    ApiError::Unavailable(e.context(format!("failed to {what}")))
                }
                ApiError::Unexpected(e) => {
                    ApiError::Unexpected(e.context(format!("failed to {what}")))
                }
                other => other,
            },
        }
    }
}
