//! Reconciliation: for attempts nobody heard back about (the provider charged, but neither
//! its response nor its webhook arrived) and for refunds that failed, ask the provider and
//! finish the job with the same transitions as the pay request and the webhook.
//!
//! Safe on many instances: due attempts are claimed by one statement (`FOR UPDATE SKIP
//! LOCKED` inside an `UPDATE` that pushes `next_check_at` forward, a lease), and the provider
//! is called after that commit, never inside a transaction.

use super::flow::{self, Success};
use super::provider::PaymentStatus;
use crate::db;
use crate::state::AppState;
use anyhow::Context;

#[derive(Debug, Clone, sqlx::FromRow)]
struct Due {
    id: String,
    order_id: String,
    attempt: i32,
    status: String,
    provider_payment_id: Option<String>,
}

/// One pass over due attempts. Returns how many were looked at.
pub async fn run_once(state: &AppState) -> anyhow::Result<usize> {
    let settings = &state.config.payments;
    let due: Vec<Due> = sqlx::query_as(
        "UPDATE payments p
            SET next_check_at = clock_timestamp() + make_interval(secs => $2)
          WHERE p.id IN (
                SELECT id FROM payments
                 WHERE status IN ('pending', 'refund_pending')
                   AND next_check_at <= clock_timestamp()
                 ORDER BY next_check_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
         RETURNING p.id, p.order_id, p.attempt, p.status, p.provider_payment_id",
    )
    .bind(settings.reconcile_batch.max(1))
    .bind(settings.reconcile_after_s.max(1) as f64)
    .fetch_all(&state.pool)
    .await
    .context("failed to claim payments to reconcile")?;
    for d in &due {
        match reconcile_one(state, d, true).await {
            Ok(outcome) => {
                state
                    .metrics
                    .payments
                    .reconciled
                    .with_label_values(&[outcome])
                    .inc();
                tracing::info!(payment_id = %d.id, order_id = %d.order_id, outcome, "payment reconciled");
            }
            // The lease already moved next_check_at: it is retried on a later pass.
            Err(e) => tracing::warn!(payment_id = %d.id, error = ?e, "reconciliation failed"),
        }
    }
    Ok(due.len())
}

/// Resolves one pending attempt right now by asking the provider (no new charge is ever
/// made). Used by the pay request when the order turned out unpayable while an attempt of it
/// was still open. An attempt the provider does not know is left for the job.
pub async fn resolve_pending(state: &AppState, payment_id: &str) -> anyhow::Result<&'static str> {
    let due: Option<Due> = sqlx::query_as(
        "SELECT id, order_id, attempt, status, provider_payment_id FROM payments
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(&state.pool)
    .await?;
    match due {
        Some(d) => reconcile_one(state, &d, false).await,
        None => Ok("unchanged"),
    }
}

/// `abandon`: close an attempt the provider does not know (only when it is older than any
/// provider request can run, i.e. from the job).
async fn reconcile_one(state: &AppState, d: &Due, abandon: bool) -> anyhow::Result<&'static str> {
    if d.status == "refund_pending" {
        let Some(provider_id) = &d.provider_payment_id else {
            anyhow::bail!("refund_pending payment without a provider payment id");
        };
        return Ok(if flow::refund(state, &d.id, provider_id).await {
            "refunded"
        } else {
            "refund_pending"
        });
    }
    let found = state
        .payments
        .find_by_order(&d.order_id)
        .await
        .context("provider search failed")?;
    let attempt = d.attempt.to_string();
    let mine = found.into_iter().find(|p| {
        p.meta("payment_id") == Some(d.id.as_str()) || p.meta("attempt") == Some(attempt.as_str())
    });
    let Some(p) = mine else {
        if !abandon {
            return Ok("unknown_to_provider");
        }
        // The provider never created a payment for this attempt, and the attempt is older
        // than any request to the provider can run: close it so the next pay starts afresh.
        let closed = sqlx::query(
            "UPDATE payments SET status = 'failed', updated_at = clock_timestamp()
              WHERE id = $1 AND status = 'pending'",
        )
        .bind(&d.id)
        .execute(&state.pool)
        .await?
        .rows_affected();
        return Ok(if closed == 1 {
            "abandoned"
        } else {
            "unchanged"
        });
    };
    match &p.status {
        PaymentStatus::Succeeded => {
            let outcome = db::retry(3, || async {
                let mut tx = state.pool.begin().await?;
                let o = flow::apply_success_tx(&mut tx, &d.id, &p.id).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(o)
            })
            .await?;
            Ok(match outcome {
                Success::Paid { .. } => "completed",
                Success::AlreadyPaid | Success::Unknown => "unchanged",
                Success::RefundNeeded {
                    payment_id,
                    provider_payment_id,
                } => {
                    if flow::refund(state, &payment_id, &provider_payment_id).await {
                        "refunded"
                    } else {
                        "refund_pending"
                    }
                }
            })
        }
        PaymentStatus::Declined { decline_code } => {
            let mut conn = state.pool.acquire().await?;
            flow::apply_decline_tx(&mut conn, &d.id, &p.id, decline_code).await?;
            Ok("declined")
        }
        PaymentStatus::Other(_) => Ok("still_processing"),
    }
}
