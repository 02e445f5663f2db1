//! The webhook's statements: the attempt of a provider payment, and the provider event ids
//! recorded so a redelivered event changes nothing.

use crate::payments::error::{PaymentResult, Statement};
use crate::payments::model::AttemptStatus;
use sqlx::{PgConnection, PgPool};

/// Our attempt behind a provider payment id we recorded.
pub async fn payment_by_provider_id(
    pool: &PgPool,
    provider_payment_id: &str,
) -> PaymentResult<Option<String>> {
    sqlx::query_scalar("SELECT id FROM payments WHERE provider_payment_id = $1")
        .bind(provider_payment_id)
        .fetch_optional(pool)
        .await
        .statement("find the attempt of a provider payment")
}

/// Inserts a provider event id; false when it was applied before. Written in the same
/// transaction as the change the event causes.
pub async fn record_event_tx(
    conn: &mut PgConnection,
    event_id: &str,
    kind: &str,
    payment_id: &str,
) -> PaymentResult<bool> {
    Ok(sqlx::query(
        "INSERT INTO payment_webhook_events (provider_event_id, event_type, payment_id)
         VALUES ($1, $2, $3) ON CONFLICT (provider_event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(kind)
    .bind(payment_id)
    .execute(conn)
    .await
    .statement("record the provider event")?
    .rows_affected()
        == 1)
}

/// What [`record_settled_success`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// The attempt had already succeeded (the pay answer applied it); the event is recorded
    /// and nothing else is left to do.
    Recorded,
    /// The event was applied before.
    Duplicate,
    /// The attempt is not `succeeded` (or does not exist): the event needs the full
    /// transaction, and nothing was written.
    Open,
}

/// The common success webhook, the one that follows a pay answer which already applied the
/// payment, in ONE autocommit statement: the event id is recorded only when its attempt is
/// `succeeded`, which is exactly the case where the full transaction would record it and
/// change nothing else ([`crate::payments::transitions::apply_success_seen_tx`] returns
/// `AlreadyPaid`). `succeeded` is final for a success (a later refund or dispute moves the
/// attempt on, but never back to open), so nothing can slip between the read and the insert.
pub async fn record_settled_success(
    pool: &PgPool,
    event_id: &str,
    kind: &str,
    payment_id: &str,
    intent_id: &str,
) -> PaymentResult<Settled> {
    // Only the success of the intent that paid the attempt: any other intent naming it is
    // money to give back (the full transaction finds it a mismatch).
    let (inserted, succeeded): (bool, bool) = sqlx::query_as(
        "WITH a AS (SELECT status = 'succeeded' AND provider_payment_id = $4 AS settled
                      FROM payments WHERE id = $3),
         ins AS (
             INSERT INTO payment_webhook_events (provider_event_id, event_type, payment_id)
             SELECT $1, $2, $3 FROM a WHERE a.settled
             ON CONFLICT (provider_event_id) DO NOTHING
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM ins),
                COALESCE((SELECT settled FROM a), false)",
    )
    .bind(event_id)
    .bind(kind)
    .bind(payment_id)
    .bind(intent_id)
    .fetch_one(pool)
    .await
    .statement("record the event of a settled payment")?;
    Ok(match (inserted, succeeded) {
        (true, _) => Settled::Recorded,
        (false, true) => Settled::Duplicate,
        (false, false) => Settled::Open,
    })
}

/// What the outcome webhook's first statement saw of its attempt: (order, account, status).
pub type SeenAttempt = (String, String, AttemptStatus);

/// [`record_event_tx`] for a payment's outcome, which also reads the attempt it names in the
/// same statement (one round trip less per webhook): `None` when the event was applied before,
/// `Some(None)` when no such attempt exists.
pub async fn record_outcome_event_tx(
    conn: &mut PgConnection,
    event_id: &str,
    kind: &str,
    payment_id: &str,
) -> PaymentResult<Option<Option<SeenAttempt>>> {
    type Row = (bool, Option<String>, Option<String>, Option<AttemptStatus>);
    let (new, order, account, status): Row = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO payment_webhook_events (provider_event_id, event_type, payment_id)
             VALUES ($1, $2, $3) ON CONFLICT (provider_event_id) DO NOTHING
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM ins), p.order_id, p.account_id, p.status
           FROM (VALUES (1)) AS one (x) LEFT JOIN payments p ON p.id = $3",
    )
    .bind(event_id)
    .bind(kind)
    .bind(payment_id)
    .fetch_one(conn)
    .await
    .statement("record the provider event and read its attempt")?;
    if !new {
        return Ok(None);
    }
    Ok(Some(match (order, account, status) {
        (Some(o), Some(a), Some(s)) => Some((o, a, s)),
        _ => None,
    }))
}
