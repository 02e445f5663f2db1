//! The reads of reconciliation: which attempts are due, and an attempt the provider has not
//! been asked about yet.

use super::*;

/// An attempt reconciliation looks at.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Due {
    pub id: String,
    pub order_id: String,
    pub attempt: i32,
    pub status: AttemptStatus,
    pub provider_payment_id: Option<String>,
    pub amount: i64,
    pub currency: String,
}

/// Claims up to `$1` attempts due for reconciliation, leased for `$2` seconds:
/// the locking sub-select as an `ARRAY(...)` InitPlan, run once whatever the plan
/// (docs/decisions.md, "Claims lock their batch once").
pub const CLAIM_DUE: &str = "UPDATE payments p
            SET next_check_at = clock_timestamp() + make_interval(secs => $2)
          WHERE p.id = ANY (ARRAY(
                SELECT id FROM payments
                 WHERE status IN ('pending', 'refund_pending')
                   AND next_check_at <= clock_timestamp()
                   -- Disputed money goes back through the card network, not a refund.
                   AND (status = 'pending' OR dispute_id IS NULL)
                 ORDER BY next_check_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED))
         RETURNING p.id, p.order_id, p.attempt, p.status, p.provider_payment_id, p.amount,
                   p.currency";

/// Claims up to `batch` attempts due for reconciliation: one statement (`FOR UPDATE SKIP
/// LOCKED` inside an `UPDATE` that pushes `next_check_at` forward by `lease_s`, a lease), so
/// any number of instances can run it ([`CLAIM_DUE`]).
pub async fn claim_due(pool: &PgPool, batch: i64, lease_s: f64) -> PaymentResult<Vec<Due>> {
    sqlx::query_as(CLAIM_DUE)
        .bind(batch.max(1))
        .bind(lease_s)
        .fetch_all(pool)
        .await
        .statement("claim payments to reconcile")
}

/// Attempt `payment_id` if it is still pending.
pub async fn pending_due(pool: &PgPool, payment_id: &str) -> PaymentResult<Option<Due>> {
    sqlx::query_as(
        "SELECT id, order_id, attempt, status, provider_payment_id, amount, currency
           FROM payments WHERE id = $1 AND status = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(pool)
    .await
    .statement("read a pending attempt")
}

/// A pending attempt with what settling it needs: can its order still take money, and how
/// long ago did it start.
#[derive(Debug, sqlx::FromRow)]
pub struct UnseenAttempt {
    #[sqlx(flatten)]
    pub attempt: Attempt,
    pub payable: bool,
    pub age_s: f64,
}

pub async fn unseen_attempt(
    pool: &PgPool,
    payment_id: &str,
) -> PaymentResult<Option<UnseenAttempt>> {
    sqlx::query_as(
        "SELECT p.id, p.order_id, p.account_id, p.attempt, p.provider_key, p.amount,
                p.currency, p.payment_method, p.status,
                (o.status = 'PENDING_PAYMENT' AND o.expires_at > clock_timestamp()) AS payable,
                EXTRACT(EPOCH FROM clock_timestamp() - p.created_at)::float8 AS age_s
           FROM payments p JOIN orders o ON o.id = p.order_id
          WHERE p.id = $1 AND p.status = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(pool)
    .await
    .statement("load the attempt to settle")
}
