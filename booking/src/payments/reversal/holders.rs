//! Ticket usage given back to whoever holds the tickets now. A transfer (`tickets::transfer`)
//! moves one ticket of per-account usage from the sender to the receiver, so a refund after
//! a transfer releases the receiver's count, not the buyer's (which no longer includes that
//! ticket: releasing it there would take the buyer below zero and fail the refund).
//!
//! The order's still-valid tickets are locked first (ticket rows before usage rows, the lock
//! order of a transfer's accept), so an accept racing the refund either finished before —
//! and its receiver is released here — or waits and then finds the ticket voided.

use crate::payments::error::{PaymentResult, Statement};
use sqlx::PgConnection;

/// Which of the order's tickets are given back: all, or the refunded lines' (their seats,
/// and every GA ticket when the GA line is refunded).
pub enum Which<'a> {
    All,
    Lines { seats: &'a [&'a str], ga: bool },
}

/// Gives back `quantity` tickets of usage of `order_id` in `event`: one per transferred
/// ticket to its holder, the rest to the buyer.
pub async fn release_usage_tx(
    conn: &mut PgConnection,
    order_id: &str,
    event: &str,
    buyer: &str,
    quantity: i32,
    which: Which<'_>,
) -> PaymentResult<()> {
    let (all, seats, ga) = match which {
        Which::All => (true, &[][..], false),
        Which::Lines { seats, ga } => (false, seats, ga),
    };
    let moved: Vec<(String, i32)> = sqlx::query_as(
        "SELECT holder_account, count(*)::int4
           FROM (SELECT holder_account FROM tickets
                  WHERE order_id = $1 AND voided_at IS NULL
                    AND ($3 OR seat_id = ANY($4) OR ($5 AND ga_tier IS NOT NULL))
                  ORDER BY id
                    FOR UPDATE) held
          WHERE holder_account <> $2
          GROUP BY holder_account
          ORDER BY holder_account",
    )
    .bind(order_id)
    .bind(buyer)
    .bind(all)
    .bind(seats)
    .bind(ga)
    .fetch_all(&mut *conn)
    .await
    .statement("lock the order's tickets and find their holders")?;
    let mut buyers = quantity;
    for (holder, n) in &moved {
        sqlx::query(
            "UPDATE account_event_usage SET tickets = greatest(tickets - $3, 0)
              WHERE event_id = $1 AND account_id = $2",
        )
        .bind(event)
        .bind(holder)
        .bind(n)
        .execute(&mut *conn)
        .await
        .statement("give a receiver's ticket usage back")?;
        buyers -= n;
    }
    if buyers > 0 {
        sqlx::query(
            "UPDATE account_event_usage SET tickets = tickets - $3
              WHERE event_id = $1 AND account_id = $2",
        )
        .bind(event)
        .bind(buyer)
        .bind(buyers)
        .execute(&mut *conn)
        .await
        .statement("give the account's ticket usage back")?;
    }
    Ok(())
}
