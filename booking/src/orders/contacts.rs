//! The order's e-mail address (`order_contacts`), written before the order itself.
//!
//! Why before: an order is made by one of three writers (the batched statement, the one
//! statement, the full transaction), each a single round trip; threading the address through
//! all of them would slow the hot path for every order. The order id is chosen first, the
//! address row commits under it, then the order. An order that never commits (a refusal, a
//! replay of an earlier order, a crash) leaves a row without an order: [`discard`] removes it
//! at once where the request sees the outcome, and the retention job removes any left behind
//! (`tickets::mail::retention`). The ticket-delivery consumer mails only orders that are
//! paid, so such a row is never mailed.
//!
//! The address is written here and read only by the mail sender and the ops page (masked).

use crate::platform::email::Email;
use sqlx::PgPool;

/// Stores `email` for the order about to be created as `order_id`.
pub async fn store(pool: &PgPool, order_id: &str, email: &Email) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO order_contacts (order_id, email) VALUES ($1, $2)")
        .bind(order_id)
        .bind(email.as_str())
        .execute(pool)
        .await?;
    Ok(())
}

/// Removes the address row of an order id that did not become an order (best effort: the
/// retention job removes what this misses).
pub async fn discard(pool: &PgPool, order_id: &str) {
    let r = sqlx::query(
        "DELETE FROM order_contacts c WHERE c.order_id = $1
            AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = c.order_id)",
    )
    .bind(order_id)
    .execute(pool)
    .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, order_id, "failed to discard the address of an order not made");
    }
}
