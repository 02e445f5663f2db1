//! Reconciliation: for attempts nobody heard back about (the provider charged, but neither
//! its response nor its webhook arrived) and for refunds that failed, ask the provider and
//! finish the job with the same transitions as the pay request and the webhook.
//!
//! An attempt's outcome is only ever settled by proof, never by absence: the provider's
//! search trails its writes (Stripe's by up to a minute, an hour during incidents), so "not
//! found by search" proves nothing. An attempt search does not show is settled by its own
//! idempotency key: while its order can still be paid, the create request is replayed with
//! the same key and parameters, which returns the payment the provider made for it (no new
//! charge) or, if the provider never saw it, makes it now — exactly what the fan's own retry
//! would do. For an order that can no longer be paid nothing is replayed (that could charge
//! for nothing); the attempt stays `pending` until search can be trusted
//! (`search_horizon_s`) and is closed as `failed` only then. While an attempt is `pending`, no
//! other attempt of its order can start (`payments_one_pending_per_order`): the fan's next
//! pay reuses it, so a lagging search can no longer let a second charge through.
//!
//! Safe on many instances: due attempts are claimed by one statement (`FOR UPDATE SKIP
//! LOCKED` inside an `UPDATE` that pushes `next_check_at` forward, a lease), and the provider
//! is called after that commit, never inside a transaction.

use super::flow::{self, Attempt, Success};
use super::provider::{PaymentStatus, ProviderError, ProviderPayment};
use crate::app::state::AppState;
use crate::platform::db;
use anyhow::Context;

#[derive(Debug, Clone, sqlx::FromRow)]
struct Due {
    id: String,
    order_id: String,
    attempt: i32,
    status: String,
    provider_payment_id: Option<String>,
}

/// What reconciliation may do with an attempt search did not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unseen {
    /// Leave it pending (the pay request settling an unpayable order).
    Keep,
    /// The job: replay it by its key while the order is payable, close it once search can be
    /// trusted otherwise.
    Settle,
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
                   -- Disputed money goes back through the card network, not a refund.
                   AND (status = 'pending' OR dispute_id IS NULL)
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
        match reconcile_one(state, d, Unseen::Settle).await {
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
        Some(d) => reconcile_one(state, &d, Unseen::Keep).await,
        None => Ok("unchanged"),
    }
}

/// Settles one claimed attempt (see the module docs for what `unseen` allows).
async fn reconcile_one(state: &AppState, d: &Due, unseen: Unseen) -> anyhow::Result<&'static str> {
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
    // Search is only a shortcut: when it fails, the attempt's key still settles it.
    let found = match state.payments.find_by_order(&d.order_id).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(payment_id = %d.id, error = %e, "provider search failed");
            Vec::new()
        }
    };
    let attempt = d.attempt.to_string();
    let mine = found.into_iter().find(|p| {
        p.meta("payment_id") == Some(d.id.as_str()) || p.meta("attempt") == Some(attempt.as_str())
    });
    let p = match mine {
        Some(p) => p,
        None if unseen == Unseen::Keep => return Ok("unknown_to_provider"),
        None => match settle_unseen(state, d).await? {
            Settled::Payment(p) => p,
            Settled::Outcome(outcome) => return Ok(outcome),
        },
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

enum Settled {
    /// The provider's answer for the attempt's key.
    Payment(ProviderPayment),
    /// Nothing to apply (still unknown, or closed).
    Outcome(&'static str),
}

/// An attempt the provider's search did not show (see the module docs).
async fn settle_unseen(state: &AppState, d: &Due) -> anyhow::Result<Settled> {
    let row: Option<(Attempt, bool, f64)> = sqlx::query_as::<_, AttemptAge>(
        "SELECT p.id, p.order_id, p.account_id, p.attempt, p.provider_key, p.amount,
                p.currency, p.payment_method, p.status,
                (o.status = 'PENDING_PAYMENT' AND o.expires_at > clock_timestamp()) AS payable,
                EXTRACT(EPOCH FROM clock_timestamp() - p.created_at)::float8 AS age_s
           FROM payments p JOIN orders o ON o.id = p.order_id
          WHERE p.id = $1 AND p.status = 'pending'",
    )
    .bind(&d.id)
    .fetch_optional(&state.pool)
    .await
    .context("failed to load the attempt to settle")?
    .map(|r| (r.attempt, r.payable, r.age_s));
    let Some((attempt, payable, age_s)) = row else {
        // Settled meanwhile (the pay request or a webhook).
        return Ok(Settled::Outcome("unchanged"));
    };
    if payable {
        // Ask about the attempt's own key: the provider replays what it did for it.
        return match flow::call_provider(state, &attempt).await {
            Ok(p) => Ok(Settled::Payment(p)),
            // Unreachable now: the key is still unused or replayable, ask again later.
            Err(ProviderError::NotSent(_)) => Ok(Settled::Outcome("provider_unreachable")),
            // Refused before anything happened: proven not charged.
            Err(e @ ProviderError::Rejected { .. }) => {
                tracing::error!(payment_id = %d.id, error = %e, "provider refused the replay of an attempt");
                Ok(Settled::Outcome(close_failed(state, &d.id).await?))
            }
            Err(e) => {
                tracing::warn!(payment_id = %d.id, error = %e, "attempt still unknown after asking by its key");
                Ok(Settled::Outcome("unknown"))
            }
        };
    }
    // The order cannot take money any more: never replay (it could charge for nothing).
    // Search lags, so only once it can be trusted is the attempt closed.
    if age_s < state.config.payments.search_horizon_s as f64 {
        return Ok(Settled::Outcome("unknown"));
    }
    Ok(Settled::Outcome(close_failed(state, &d.id).await?))
}

#[derive(sqlx::FromRow)]
struct AttemptAge {
    #[sqlx(flatten)]
    attempt: Attempt,
    payable: bool,
    age_s: f64,
}

/// `pending → failed`: the provider provably never charged this attempt.
async fn close_failed(state: &AppState, payment_id: &str) -> anyhow::Result<&'static str> {
    let closed = sqlx::query(
        "UPDATE payments SET status = 'failed', updated_at = clock_timestamp()
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .execute(&state.pool)
    .await
    .context("failed to close an attempt")?
    .rows_affected();
    Ok(if closed == 1 {
        "abandoned"
    } else {
        "unchanged"
    })
}
