//! How long an address is kept: `[tickets] email_retention_days` after the event starts
//! (the order's payment when the event has no date; its creation when it was never paid),
//! then the retention job erases it. Ops can erase one at once ([`forget_tx`], audited
//! without the address). Erasing keeps the row (`email` NULL, `erased_at` set), so the ops
//! page can say the address existed and was erased; a queued e-mail for an erased address
//! goes `dead` ("no address") instead of being sent.
//!
//! Transfer addresses (`ticket_transfers`) are erased by the same date and the same forget
//! as the order their ticket came from.
//!
//! The job also deletes address rows whose order never committed (`orders::contacts`), an
//! hour after they were written: longer than any order request can take.

use crate::platform::audit::{self, Operator};
use crate::platform::jobs::Job;
use crate::tickets::mail::MailState;
use anyhow::Context;
use async_trait::async_trait;
use sqlx::PgConnection;
use std::time::Duration;

/// Addresses erased per statement.
const BATCH: i64 = 500;

/// Erases up to `$2` addresses past retention (`$1` days), one statement, `SKIP LOCKED`.
pub const ERASE_EXPIRED: &str = "UPDATE order_contacts c
    SET email = NULL, erased_at = clock_timestamp()
  WHERE c.order_id = ANY (ARRAY(
        SELECT x.order_id FROM order_contacts x
          JOIN orders o ON o.id = x.order_id
          LEFT JOIN events e ON e.id = o.event_id
         WHERE x.erased_at IS NULL
           AND COALESCE(e.starts_at, o.paid_at, o.created_at) + make_interval(days => $1)
               <= clock_timestamp()
         LIMIT $2
         FOR UPDATE OF x SKIP LOCKED))
  RETURNING c.order_id";

/// Erases the transfer addresses (`ticket_transfers`) of orders past retention, by the same
/// date as the order's own address; `$2` rows per statement.
pub const ERASE_TRANSFERS_EXPIRED: &str = "UPDATE ticket_transfers x
    SET from_email = NULL, to_email = NULL, receiver_email = NULL,
        erased_at = clock_timestamp()
  WHERE x.id = ANY (ARRAY(
        SELECT y.id FROM ticket_transfers y
          JOIN orders o ON o.id = y.order_id
          LEFT JOIN events e ON e.id = o.event_id
         WHERE y.erased_at IS NULL
           AND COALESCE(e.starts_at, o.paid_at, o.created_at) + make_interval(days => $1)
               <= clock_timestamp()
         LIMIT $2
         FOR UPDATE OF y SKIP LOCKED))
  RETURNING x.id";

/// Deletes address rows left by orders that never committed.
pub const DELETE_ORPHANS: &str = "DELETE FROM order_contacts c
  WHERE c.order_id = ANY (ARRAY(
        SELECT x.order_id FROM order_contacts x
         WHERE x.created_at < clock_timestamp() - interval '1 hour'
           AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = x.order_id)
         LIMIT $1
         FOR UPDATE OF x SKIP LOCKED))";

pub struct Retention(pub MailState);

#[async_trait]
impl Job for Retention {
    fn name(&self) -> &'static str {
        "ticket-mail-retention"
    }

    fn period(&self) -> Duration {
        Duration::from_secs(600)
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        erase_expired(&self.0).await?;
        Ok(())
    }
}

/// One retention pass; returns how many addresses were erased and orphans deleted.
pub async fn erase_expired(state: &MailState) -> anyhow::Result<(u64, u64)> {
    let mut erased = 0;
    loop {
        let ids: Vec<String> = sqlx::query_scalar(ERASE_EXPIRED)
            .persistent(false)
            .bind(i32::try_from(state.retention_days).unwrap_or(i32::MAX))
            .bind(BATCH)
            .fetch_all(&state.pool)
            .await
            .context("failed to erase addresses past retention")?;
        erased += ids.len() as u64;
        if (ids.len() as i64) < BATCH {
            break;
        }
    }
    loop {
        let ids: Vec<String> = sqlx::query_scalar(ERASE_TRANSFERS_EXPIRED)
            .persistent(false)
            .bind(i32::try_from(state.retention_days).unwrap_or(i32::MAX))
            .bind(BATCH)
            .fetch_all(&state.pool)
            .await
            .context("failed to erase transfer addresses past retention")?;
        erased += ids.len() as u64;
        if (ids.len() as i64) < BATCH {
            break;
        }
    }
    let orphans = sqlx::query(DELETE_ORPHANS)
        .persistent(false)
        .bind(BATCH)
        .execute(&state.pool)
        .await
        .context("failed to delete addresses of orders never made")?
        .rows_affected();
    if erased > 0 {
        tracing::info!(erased, "e-mail addresses past retention erased");
        state
            .metrics
            .erased
            .with_label_values(&["retention"])
            .inc_by(erased);
    }
    Ok((erased, orphans))
}

/// Erases one order's address in the caller's transaction and audits it (`order.forget_email`,
/// never the address). Returns whether there was an address to erase; `None` when there is no
/// such order.
pub async fn forget_tx(
    conn: &mut PgConnection,
    actor: &Operator,
    order_id: &str,
) -> anyhow::Result<Option<bool>> {
    let event: Option<Option<String>> =
        sqlx::query_scalar("SELECT event_id FROM orders WHERE id = $1")
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await
            .context("failed to read the order")?;
    let Some(event) = event else {
        return Ok(None);
    };
    let erased = sqlx::query(
        "UPDATE order_contacts SET email = NULL, erased_at = clock_timestamp()
          WHERE order_id = $1 AND erased_at IS NULL",
    )
    .bind(order_id)
    .execute(&mut *conn)
    .await
    .context("failed to erase the order's address")?
    .rows_affected()
        == 1;
    // The order's transfers' addresses go with it (offers of its tickets, their receivers).
    let transfers = sqlx::query(
        "UPDATE ticket_transfers
            SET from_email = NULL, to_email = NULL, receiver_email = NULL,
                erased_at = clock_timestamp()
          WHERE order_id = $1 AND erased_at IS NULL",
    )
    .bind(order_id)
    .execute(&mut *conn)
    .await
    .context("failed to erase the order's transfer addresses")?
    .rows_affected();
    audit::record_tx(
        conn,
        actor,
        "order.forget_email",
        &format!("order:{order_id}"),
        event.as_deref(),
        &serde_json::json!({ "erased": erased, "transfers_erased": transfers }),
    )
    .await?;
    Ok(Some(erased))
}
