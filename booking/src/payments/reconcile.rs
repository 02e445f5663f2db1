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
//! An attempt whose intent is recorded (the provider answered it as not final: 3-D Secure,
//! processing) is asked about by that id, and only that intent, for the attempt's amount and
//! currency, settles it. When its order can no longer be paid while it is still open, it is
//! canceled at the provider, so the customer can no longer complete it, and closed as
//! `failed`; one that succeeded meanwhile is applied (and, its order being over, refunded).
//!
//! Safe on many instances: due attempts are claimed by one statement (`FOR UPDATE SKIP
//! LOCKED` inside an `UPDATE` that pushes `next_check_at` forward, a lease), and the provider
//! is called after that commit, never inside a transaction.

use crate::payments::PaymentClients;
use crate::payments::error::{PaymentError, Statement};
use crate::payments::model::{
    AttemptStatus, Charge, Reconciled, Success, charge_matches, is_attempt_of,
};
use crate::payments::provider::{PaymentStatus, ProviderError, ProviderPayment};
use crate::payments::repo::{self, Due};
use crate::payments::{flow, transitions};
use crate::platform::db;
use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use std::time::Duration;

/// What reconciliation may do with an attempt search did not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unseen {
    /// Leave it pending (the pay request settling an unpayable order).
    Keep,
    /// The job: replay it by its key while the order is payable, close it once search can be
    /// trusted otherwise.
    Settle,
}

/// The reconciliation job: the database, the provider, the `[payments]` settings and the
/// counters it moves.
pub struct Reconcile(pub PaymentClients);

#[async_trait]
impl Job for Reconcile {
    fn name(&self) -> &'static str {
        "payment-reconcile"
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.0.settings.reconcile_interval_ms.max(10))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        run_once(&self.0).await?;
        Ok(())
    }
}

/// One pass over due attempts. Returns how many were looked at.
pub async fn run_once(c: &PaymentClients) -> anyhow::Result<usize> {
    let settings = &c.settings;
    let due = repo::claim_due(
        &c.pool,
        settings.reconcile_batch,
        settings.reconcile_after_s.max(1) as f64,
    )
    .await
    .context("failed to claim payments to reconcile")?;
    for d in &due {
        match reconcile_one(c, d, Unseen::Settle).await {
            Ok(outcome) => {
                c.metrics
                    .reconciled
                    .with_label_values(&[outcome.label()])
                    .inc();
                tracing::info!(payment_id = %d.id, order_id = %d.order_id,
                    outcome = outcome.label(), "payment reconciled");
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
pub async fn resolve_pending(c: &PaymentClients, payment_id: &str) -> anyhow::Result<Reconciled> {
    match repo::pending_due(&c.pool, payment_id).await? {
        Some(d) => reconcile_one(c, &d, Unseen::Keep).await,
        None => Ok(Reconciled::Unchanged),
    }
}

/// Settles one claimed attempt (see the module docs for what `unseen` allows).
async fn reconcile_one(c: &PaymentClients, d: &Due, unseen: Unseen) -> anyhow::Result<Reconciled> {
    if d.status == AttemptStatus::RefundPending {
        let Some(provider_id) = &d.provider_payment_id else {
            anyhow::bail!("refund_pending payment without a provider payment id");
        };
        return Ok(Reconciled::of_refund(
            flow::refund(c, &d.id, provider_id).await,
        ));
    }
    if let Some(intent) = &d.provider_payment_id {
        // Its intent is known: ask about that one.
        let p = c
            .provider
            .retrieve(intent)
            .await
            .context("failed to retrieve the attempt's intent")?;
        return apply_found(c, d, p, true).await;
    }
    // Search is only a shortcut: when it fails, the attempt's key still settles it.
    let found = match c.provider.find_by_order(&d.order_id).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(payment_id = %d.id, error = %e, "provider search failed");
            Vec::new()
        }
    };
    // Metadata alone proves nothing: only an intent for the attempt's amount and currency
    // is its own (another one naming it is refunded when its success event arrives).
    let mine = found.into_iter().find(|p| {
        is_attempt_of(p, &d.id, d.attempt)
            && charge_matches(d.amount, &d.currency, None, &Charge::of(p))
    });
    let p = match mine {
        Some(p) => p,
        None if unseen == Unseen::Keep => return Ok(Reconciled::UnknownToProvider),
        None => match settle_unseen(c, d).await? {
            Settled::Payment(p) => p,
            Settled::Outcome(outcome) => return Ok(outcome),
        },
    };
    apply_found(c, d, p, true).await
}

/// Applies what the provider says of attempt `d`'s payment `p`; an open one of an order that
/// can no longer be paid is canceled first (`cancel_open`, once).
async fn apply_found(
    c: &PaymentClients,
    d: &Due,
    p: ProviderPayment,
    cancel_open: bool,
) -> anyhow::Result<Reconciled> {
    match &p.status {
        PaymentStatus::Other(s) if s == "canceled" => close_canceled(c, &d.id).await,
        PaymentStatus::Other(_) if cancel_open => {
            if repo::attempt_payable(&c.pool, &d.id).await? {
                return Ok(Reconciled::StillProcessing);
            }
            let now = match c.provider.cancel(&p.id).await {
                Ok(now) => now,
                // Not cancelable any more (it succeeded or failed meanwhile): see what it is.
                Err(ProviderError::Rejected { .. }) => c
                    .provider
                    .retrieve(&p.id)
                    .await
                    .context("failed to retrieve an intent that refused its cancel")?,
                Err(e) => return Err(e).context("failed to cancel an open attempt"),
            };
            tracing::info!(payment_id = %d.id, intent = %p.id, "open attempt of an ended order canceled at the provider");
            Box::pin(apply_found(c, d, now, false)).await
        }
        PaymentStatus::Succeeded => {
            let outcome = db::retry(3, || async {
                let mut tx = c
                    .pool
                    .begin()
                    .await
                    .statement("begin the reconcile transaction")?;
                let o = transitions::apply_success_tx(&mut tx, &d.id, &Charge::of(&p)).await?;
                tx.commit()
                    .await
                    .statement("commit the reconcile transaction")?;
                Ok::<_, PaymentError>(o)
            })
            .await?;
            Ok(match outcome {
                Success::Paid { .. } => Reconciled::Completed,
                Success::AlreadyPaid | Success::Unknown => Reconciled::Unchanged,
                // Not the attempt's own payment: it pays nothing here; its success event
                // refunds it.
                Success::Mismatch { intent_id } => {
                    tracing::warn!(payment_id = %d.id, intent = %intent_id,
                        "reconciliation found a success that is not the attempt's own");
                    Reconciled::Unchanged
                }
                Success::RefundNeeded {
                    payment_id,
                    provider_payment_id,
                } => {
                    Reconciled::of_refund(flow::refund(c, &payment_id, &provider_payment_id).await)
                }
            })
        }
        PaymentStatus::Declined { decline_code } => {
            let mut conn = c.pool.acquire().await.statement("acquire a connection")?;
            transitions::apply_decline_tx(&mut conn, &d.id, &p.id, decline_code).await?;
            Ok(Reconciled::Declined)
        }
        PaymentStatus::Other(_) => Ok(Reconciled::StillProcessing),
    }
}

enum Settled {
    /// The provider's answer for the attempt's key.
    Payment(ProviderPayment),
    /// Nothing to apply (still unknown, or closed).
    Outcome(Reconciled),
}

/// An attempt the provider's search did not show (see the module docs).
async fn settle_unseen(c: &PaymentClients, d: &Due) -> anyhow::Result<Settled> {
    let Some(row) = repo::unseen_attempt(&c.pool, &d.id).await? else {
        // Settled meanwhile (the pay request or a webhook).
        return Ok(Settled::Outcome(Reconciled::Unchanged));
    };
    if row.payable {
        // Ask about the attempt's own key: the provider replays what it did for it.
        return match flow::call_provider(c, &row.attempt).await {
            Ok(p) => Ok(Settled::Payment(p)),
            // Unreachable now: the key is still unused or replayable, ask again later.
            Err(ProviderError::NotSent(_)) => Ok(Settled::Outcome(Reconciled::ProviderUnreachable)),
            // Refused before anything happened: proven not charged.
            Err(e @ ProviderError::Rejected { .. }) => {
                tracing::error!(payment_id = %d.id, error = %e, "provider refused the replay of an attempt");
                Ok(Settled::Outcome(close_failed(c, &d.id).await?))
            }
            Err(e) => {
                tracing::warn!(payment_id = %d.id, error = %e, "attempt still unknown after asking by its key");
                Ok(Settled::Outcome(Reconciled::Unknown))
            }
        };
    }
    // The order cannot take money any more: never replay (it could charge for nothing).
    // Search lags, so only once it can be trusted is the attempt closed.
    if row.age_s < c.settings.search_horizon_s as f64 {
        return Ok(Settled::Outcome(Reconciled::Unknown));
    }
    Ok(Settled::Outcome(close_failed(c, &d.id).await?))
}

/// The attempt's intent is canceled at the provider (never charged, never chargeable):
/// `pending → failed`.
async fn close_canceled(c: &PaymentClients, payment_id: &str) -> anyhow::Result<Reconciled> {
    Ok(if repo::close_failed(&c.pool, payment_id).await? {
        Reconciled::Canceled
    } else {
        Reconciled::Unchanged
    })
}

/// `pending → failed`: the provider provably never charged this attempt.
async fn close_failed(c: &PaymentClients, payment_id: &str) -> anyhow::Result<Reconciled> {
    Ok(if repo::close_failed(&c.pool, payment_id).await? {
        Reconciled::Abandoned
    } else {
        Reconciled::Unchanged
    })
}
