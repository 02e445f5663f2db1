//! The reads that explain a refused hold (after the statement wrote nothing, for the answer's
//! message only) and a release that changed nothing. Each returns [`InventoryError`] naming the
//! statement that failed.

use crate::inventory::error::{During, InventoryError};
use crate::inventory::model::{HoldStatus, missing_from};
use crate::platform::kept::KeptPool;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashSet;

type Result<T> = std::result::Result<T, InventoryError>;

/// The refusal for a refused usage upsert: no such event, or LIMIT_EXCEEDED with the numbers
/// (read after the rollback, for the message only).
pub(crate) async fn limit_refusal(
    pool: &KeptPool,
    event: &str,
    account: &str,
    requested: i32,
) -> InventoryError {
    let row: Result<Option<(i32, i32)>> = sqlx::query_as(
        "SELECT e.max_tickets_per_account, COALESCE(u.tickets, 0)
         FROM events e
         LEFT JOIN account_event_usage u ON u.event_id = e.id AND u.account_id = $2
         WHERE e.id = $1",
    )
    .bind(event)
    .bind(account)
    .fetch_optional(pool)
    .await
    .during("read the ticket limit and usage");
    match row {
        Err(e) => e,
        Ok(None) => InventoryError::UnknownEvent,
        Ok(Some((limit, held))) => InventoryError::LimitExceeded {
            limit,
            held,
            requested,
        },
    }
}

/// The refusal for a hold the statement found not on sale: no such event, the event was
/// cancelled (EVENT_CANCELLED), or SALE_NOT_STARTED.
pub(crate) async fn sale_not_started(pool: &KeptPool, event: &str) -> InventoryError {
    let start: Result<Option<(DateTime<Utc>, bool)>> =
        sqlx::query_as("SELECT sale_start, cancelled_at IS NOT NULL FROM events WHERE id = $1")
            .bind(event)
            .fetch_optional(pool)
            .await
            .during("read the sale start");
    match start {
        Err(e) => e,
        Ok(None) => InventoryError::UnknownEvent,
        Ok(Some((_, true))) => InventoryError::EventCancelled,
        Ok(Some((sale_start, false))) => InventoryError::SaleNotStarted { sale_start },
    }
}

/// The refusal for a seat statement that came up short (`free`: the requested seats it found
/// free): unknown seat ids (listed), or the seats we could not take (SEAT_TAKEN, listed).
pub(crate) async fn seat_refusal(
    pool: &KeptPool,
    event: &str,
    requested: &[String],
    free: Vec<String>,
) -> InventoryError {
    let existing: Result<Vec<String>> =
        sqlx::query_scalar("SELECT seat_id FROM seats WHERE event_id = $1 AND seat_id = ANY($2)")
            .bind(event)
            .bind(requested)
            .fetch_all(pool)
            .await
            .during("read which requested seats exist");
    let existing = match existing {
        Ok(v) => v,
        Err(e) => return e,
    };
    let existing: HashSet<&str> = existing.iter().map(String::as_str).collect();
    let unknown = missing_from(requested, &existing);
    if !unknown.is_empty() {
        return InventoryError::UnknownSeats {
            seats: unknown.into_iter().map(str::to_owned).collect(),
        };
    }
    let got: HashSet<&str> = free.iter().map(String::as_str).collect();
    InventoryError::SeatTaken {
        seats: missing_from(requested, &got)
            .into_iter()
            .map(str::to_owned)
            .collect(),
    }
}

/// A hold's status and owner (to explain why a release changed nothing).
pub(crate) async fn hold_status(pool: &PgPool, hold: &str) -> Result<Option<(HoldStatus, String)>> {
    sqlx::query_as("SELECT status, account_id FROM holds WHERE id = $1")
        .bind(hold)
        .fetch_optional(pool)
        .await
        .during("read the hold's status")
}
