//! `POST /api/orders/{id}/pay` and the money-moving steps every payment path shares. The
//! handler is in [`crate::payments::http`], the SQL in [`crate::payments::repo`] and
//! [`crate::payments::transitions`]; this module talks to the provider.
//!
//! # The pay request
//! 1.–2. One statement claims the `Idempotency-Key` (a repeat of a finished request replays
//!    its answer and does nothing else), pins the order and its hold (`expires_at`/`held_until`
//!    moved to at least now + `pay_pin_s`, never shortened, only while the order is still
//!    `PENDING_PAYMENT`, unexpired and of the admission's event) and records the payment
//!    attempt — or reuses the order's attempt that is still pending. The attempt's provider
//!    idempotency key, `<order id>-<attempt>`, is committed before the provider is called.
//! 3. The provider is called outside any transaction ([`call_provider`]). A retry of the same
//!    attempt (same key, another click, a retry after a timeout) sends the same provider key,
//!    so the customer is charged at most once; an attempt after a decline is a new attempt
//!    with a new key.
//! 4. The answer is applied in one transaction: a hold order's success in one statement that
//!    also returns the answer ([`crate::payments::transitions::settle_hold_order_tx`]), any
//!    other success via
//!    [`crate::payments::transitions::apply_success_tx`] (the order's
//!    `PENDING_PAYMENT → PAID` transition, seats sold and tickets issued or reserved stock
//!    sold, the attempt `succeeded`, `order.paid` in the outbox); a decline marks the attempt
//!    `declined` (`402`, hold kept until its TTL); a timeout or `5xx` leaves it pending
//!    (`504`/`502`, the order stays `PENDING_PAYMENT`).
//!
//! # Money that cannot be honoured
//! When a success arrives for an order that is no longer payable — expired, cancelled, paid by
//! another attempt, or whose hold lost a seat — the attempt becomes `refund_pending` in the
//! same transaction that discovered it, and [`refund`] then refunds it at the provider with
//! the key `refund-<payment id>` and, in one conditional step, marks it `refunded` and writes
//! `order.refunded`. The order is never resurrected; a refund that fails is retried by
//! reconciliation.

use crate::payments::PaymentClients;
use crate::payments::error::{PaymentError, Statement};
use crate::payments::model::{
    self, Attempt, OpenAttempt, Reconciled, Unpayable, already_refunded_id, mismatch_refund_key,
    refund_key,
};
use crate::payments::provider::{ProviderError, ProviderPayment};
use crate::payments::{reconcile, repo, transitions};
use crate::platform::db;
use std::time::{Duration, Instant};

/// Calls the provider, waiting out a concurrent request with the same key (another click of
/// the same attempt) for up to `in_progress_wait_ms`. Every call for one attempt sends the
/// same key and parameters ([`Attempt::create_request`]), so a repeat replays the provider's
/// first outcome (reconciliation asks about an attempt this way).
pub(crate) async fn call_provider(
    c: &PaymentClients,
    a: &Attempt,
) -> Result<ProviderPayment, ProviderError> {
    let req = a.create_request();
    let deadline = Instant::now() + Duration::from_millis(c.settings.in_progress_wait_ms);
    let mut pause = model::FIRST_IN_PROGRESS_PAUSE;
    loop {
        match c.provider.create_payment(&req).await {
            Err(ProviderError::InProgress) if Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = model::next_in_progress_pause(pause);
            }
            other => return other,
        }
    }
}

/// What the fan is told when the provider gave no usable answer for attempt `attempt`.
pub(crate) fn failure_answer(e: &ProviderError, attempt: i32) -> PaymentError {
    match e {
        ProviderError::Timeout => PaymentError::ProviderTimeout { attempt },
        ProviderError::InProgress => PaymentError::InProgress {
            attempt: Some(attempt),
        },
        _ => PaymentError::ProviderFailed { attempt },
    }
}

/// Maps a provider failure to the client's answer; an attempt the provider provably never
/// charged is closed so the next pay starts a fresh attempt.
pub(crate) async fn provider_failure(
    c: &PaymentClients,
    a: &Attempt,
    e: ProviderError,
) -> PaymentError {
    if e.proves_not_charged() {
        if let ProviderError::Rejected { status, code } = &e {
            tracing::error!(payment_id = %a.id, status, code = %code, "provider refused a payment request");
        }
        if let Err(err) = repo::close_failed(&c.pool, &a.id).await {
            // Left pending: reconciliation closes it later.
            tracing::warn!(error = ?err, payment_id = %a.id, "could not close a failed attempt");
        }
    } else {
        tracing::warn!(payment_id = %a.id, error = %e, "payment outcome unknown; attempt stays pending");
    }
    failure_answer(&e, a.attempt)
}

/// An open attempt turned out to have paid the order.
pub(crate) struct Paid;

/// Before telling the fan an order cannot be paid: if one of its attempts is still open (a
/// timeout earlier), ask the provider about it — never charging anew — so money taken for it
/// is refunded now rather than by the reconciliation job, and say so.
pub(crate) async fn settle_open_attempt(
    c: &PaymentClients,
    order_id: &str,
    account: &str,
    why: Unpayable,
) -> Result<PaymentError, Paid> {
    let not_payable = |open| PaymentError::NotPayable {
        why: why.clone(),
        open,
    };
    let payment_id = match repo::open_attempt(&c.pool, order_id, account).await {
        Ok(Some(id)) => id,
        Ok(None) => return Ok(not_payable(OpenAttempt::Untouched)),
        Err(err) => {
            tracing::warn!(error = ?err, order_id, "could not look for an open attempt");
            return Ok(not_payable(OpenAttempt::Untouched));
        }
    };
    match reconcile::resolve_pending(c, &payment_id).await {
        Ok(Reconciled::Refunded) => Ok(not_payable(OpenAttempt::Refunded)),
        Ok(Reconciled::RefundPending) => Ok(not_payable(OpenAttempt::RefundPending)),
        Ok(Reconciled::Completed) => Err(Paid),
        Ok(outcome) => {
            tracing::info!(order_id, payment_id = %payment_id, outcome = outcome.label(),
                "open attempt of an unpayable order");
            Ok(not_payable(OpenAttempt::Untouched))
        }
        Err(err) => {
            tracing::warn!(error = ?err, order_id, "could not resolve an open attempt; reconciliation will");
            Ok(not_payable(OpenAttempt::Untouched))
        }
    }
}

/// Refunds a `refund_pending` attempt at the provider (key `refund-<payment id>`, so every
/// retry is the same refund) and records it. Failures are logged and left to
/// reconciliation, which calls this again. True when the money is back (now or before).
pub async fn refund(c: &PaymentClients, payment_id: &str, provider_payment_id: &str) -> bool {
    let refund_id = match c
        .provider
        .refund(&refund_key(payment_id), provider_payment_id, None)
        .await
    {
        Ok(r) => r.id,
        // Refunded already (by an operator, say): nothing left to give back.
        Err(ProviderError::Rejected { code, .. }) if code == "charge_already_refunded" => {
            already_refunded_id(provider_payment_id)
        }
        Err(e) => {
            tracing::warn!(payment_id, error = %e, "refund failed; reconciliation will retry");
            return false;
        }
    };
    let applied = db::retry(3, || async {
        let mut tx = c
            .pool
            .begin()
            .await
            .statement("begin the refund transaction")?;
        let applied = transitions::apply_refunded_tx(&mut tx, payment_id, &refund_id).await?;
        tx.commit()
            .await
            .statement("commit the refund transaction")?;
        Ok::<_, PaymentError>(applied)
    })
    .await;
    match applied {
        Ok(true) => {
            c.metrics.refunds.inc();
            tracing::info!(payment_id, "payment refunded");
            true
        }
        // Recorded by someone else (the charge.refunded webhook, another instance).
        Ok(false) => true,
        Err(e) => {
            // The provider refunded; recording it is retried (same key, replayed answer).
            tracing::warn!(payment_id, error = ?e, "could not record a refund; will retry");
            false
        }
    }
}

/// Refunds a success that named attempt `payment_id` but was not its own intent, amount or
/// currency ([`crate::payments::model::Success::Mismatch`]): the whole intent, with the key
/// `refund-mismatch-<intent>` (every path and retry is the same refund), counted in
/// `payment_mismatches_total{path}` and written to the audit log (actor `payments`). True
/// when the money is back (now or before).
pub async fn refund_mismatch(
    c: &PaymentClients,
    payment_id: &str,
    intent_id: &str,
    path: &'static str,
) -> bool {
    tracing::warn!(
        payment_id,
        intent_id,
        path,
        "a success that is not its attempt's own intent, amount or currency: refunding it"
    );
    let refund_id = match c
        .provider
        .refund(&mismatch_refund_key(intent_id), intent_id, None)
        .await
    {
        Ok(r) => r.id,
        Err(ProviderError::Rejected { code, .. }) if code == "charge_already_refunded" => {
            already_refunded_id(intent_id)
        }
        Err(e) => {
            tracing::error!(payment_id, intent_id, error = %e, "refund of a mismatching success failed");
            c.metrics
                .mismatches
                .with_label_values(&[path, "refund_failed"])
                .inc();
            return false;
        }
    };
    c.metrics
        .mismatches
        .with_label_values(&[path, "refunded"])
        .inc();
    let detail = serde_json::json!({
        "intent_id": intent_id,
        "refund_id": refund_id,
        "path": path,
    });
    let recorded = async {
        let mut tx = c.pool.begin().await?;
        crate::platform::audit::insert_tx(
            &mut tx,
            &crate::platform::audit::Operator::system("payments"),
            "payment.mismatch_refunded",
            &format!("payment:{payment_id}"),
            None,
            &detail,
        )
        .await?;
        tx.commit().await
    };
    if let Err(e) = recorded.await {
        tracing::warn!(payment_id, intent_id, error = ?e, "could not audit a mismatch refund");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(e: ProviderError) -> PaymentError {
        failure_answer(&e, 3)
    }

    #[test]
    fn provider_failures_become_the_fans_answer() {
        assert!(matches!(
            answer(ProviderError::Timeout),
            PaymentError::ProviderTimeout { attempt: 3 }
        ));
        assert!(matches!(
            answer(ProviderError::InProgress),
            PaymentError::InProgress { attempt: Some(3) }
        ));
        for e in [
            ProviderError::Unavailable { status: Some(500) },
            ProviderError::NotSent(anyhow::anyhow!("refused")),
            ProviderError::Rejected {
                status: 400,
                code: "parameter_invalid".into(),
            },
            ProviderError::Protocol(anyhow::anyhow!("garbage")),
        ] {
            assert!(matches!(
                answer(e),
                PaymentError::ProviderFailed { attempt: 3 }
            ));
        }
    }
}
