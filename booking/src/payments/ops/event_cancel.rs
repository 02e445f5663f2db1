//! Cancelling an event: the event is marked cancelled, its pending orders are cancelled and a
//! refund row is queued for every paid order, all in one transaction; the [`RefundJob`] then
//! refunds the rows. The progress lives in Postgres (the rows), so a crash or restart resumes
//! where it stopped, and any number of booking processes can run the job (rows are leased
//! with `FOR UPDATE SKIP LOCKED`; a row worked twice still replays one provider key).

use crate::orders::model::OrderEnd;
use crate::orders::transitions::end_orders_tx;
use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::ops::refund::{self, LEASE_S, ROW_COLUMNS, RefundRow, Worked};
use crate::payments::{PaymentClients, PaymentsState};
use crate::platform::audit::{self, Operator};
use crate::platform::jobs::Job;
use crate::platform::redis::Redis;
use async_trait::async_trait;
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;
use std::time::Duration;
use utoipa::ToSchema;

/// Rows leased per pass of the job, and refunds run at once.
const BATCH: i64 = 200;
const CONCURRENCY: usize = 16;

/// Queues a refund (stock killed: the show is off) of everything left of every paid order of
/// cancelled event `event` that has no live order-reversing refund yet, and whose event
/// refund the provider has not refused (that one waits for ops: never retried by itself): the lines no refund
/// took, for what the provider still holds. Orders that became paid after the cancellation
/// (a payment already under way) are caught by the job's next sweep.
///
/// Two statements: the orders are locked first (in id order), as every refund claim locks
/// its order, so the insert's snapshot sees every line refund committed before and none can
/// start until this commits (the amounts and lines read cannot change under it).
async fn queue_refunds_tx(conn: &mut PgConnection, event: Option<&str>) -> PaymentResult<u64> {
    let orders: Vec<String> = sqlx::query_scalar(PAID_OF_CANCELLED)
        .bind(event)
        .fetch_all(&mut *conn)
        .await
        .statement("lock the paid orders of a cancelled event")?;
    if orders.is_empty() {
        return Ok(0);
    }
    let n: i64 = sqlx::query_scalar(
        "WITH r AS (
             INSERT INTO order_refunds (id, order_id, event_id, payment_id, provider_payment_id,
                                        amount, stock, origin, actor, reason, reverses_order,
                                        whole_payment, actor_detail)
             SELECT 'rf_' || replace(gen_random_uuid()::text, '-', ''), o.id, o.event_id, p.id,
                    p.provider_payment_id, p.amount - a.amount, 'kill', 'event_cancel',
                    COALESCE(e.cancelled_by, 'floodgate'), e.cancel_reason, true, a.n = 0,
                    e.cancelled_by_detail
               FROM orders o
               JOIN events e ON e.id = o.event_id
               JOIN payments p ON p.order_id = o.id AND p.status = 'succeeded'
               CROSS JOIN LATERAL (
                   SELECT COALESCE(sum(amount), 0)::bigint AS amount, count(*) AS n
                     FROM order_refunds r WHERE r.order_id = o.id AND r.status <> 'failed') a
              WHERE o.id = ANY($1) AND o.status = 'PAID' AND p.amount - a.amount >= 0
                AND NOT EXISTS (SELECT 1 FROM order_refunds r
                                 WHERE r.order_id = o.id AND r.status <> 'failed'
                                   AND r.reverses_order)
                AND NOT EXISTS (SELECT 1 FROM order_refunds r
                                 WHERE r.order_id = o.id AND r.status = 'failed'
                                   AND r.origin = 'event_cancel')
             ON CONFLICT (order_id) WHERE status <> 'failed' AND reverses_order DO NOTHING
             RETURNING id, order_id),
         l AS (
             INSERT INTO order_refund_lines (order_id, line, refund_id, amount)
             SELECT i.order_id, i.line, r.id, i.unit_price * i.quantity
               FROM r JOIN order_items i ON i.order_id = r.order_id
              WHERE NOT EXISTS (SELECT 1 FROM order_refund_lines t
                                 WHERE t.order_id = i.order_id AND t.line = i.line))
         SELECT count(*) FROM r",
    )
    .bind(&orders)
    .fetch_one(&mut *conn)
    .await
    .statement("queue the refunds of a cancelled event")?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The ids of the orders in `$status` of cancelled events (all, or `$1`'s), as a `WITH` list
/// ending in the CTE `of_cancelled (id)`. Driven from the cancelled events (none, most of the
/// time: the jobs run every second), each event's orders read by a fenced (`OFFSET 0`) lateral
/// query, so the planner can neither walk every order's primary key looking for one of a
/// cancelled event (1.65 s per run with a million pending orders and no event cancelled) nor
/// hash every order to join them (233 ms per run in the orders bench, with statistics from
/// before the sale). `jobs::the_background_claims_read_only_what_is_due` reads both plans.
macro_rules! of_cancelled_sql {
    ($status:literal) => {
        concat!(
            "WITH cancelled AS MATERIALIZED (
                 SELECT id FROM events
                  WHERE cancelled_at IS NOT NULL AND ($1::text IS NULL OR id = $1)),
             of_cancelled AS MATERIALIZED (
                 SELECT p.id FROM cancelled e
                  CROSS JOIN LATERAL (SELECT o.id FROM orders o
                                       WHERE o.event_id = e.id AND o.status = '",
            $status,
            "' OFFSET 0) p)"
        )
    };
}

/// The pending orders of cancelled events, 1,000 at a time (`of_cancelled_sql!`).
pub const PENDING_OF_CANCELLED: &str = concat!(
    of_cancelled_sql!("PENDING_PAYMENT"),
    " SELECT id FROM of_cancelled ORDER BY id LIMIT 1000"
);

/// The paid orders of cancelled events without a refund under way (`of_cancelled_sql!`),
/// then locked by key in id order, as every refund claim locks its order.
pub const PAID_OF_CANCELLED: &str = concat!(
    of_cancelled_sql!("PAID"),
    " SELECT o.id FROM orders o
      WHERE o.id = ANY (ARRAY(SELECT id FROM of_cancelled)) AND o.status = 'PAID'
        AND NOT EXISTS (SELECT 1 FROM order_refunds r
                         WHERE r.order_id = o.id AND r.status <> 'failed' AND r.reverses_order)
        AND NOT EXISTS (SELECT 1 FROM order_refunds r
                         WHERE r.order_id = o.id AND r.status = 'failed'
                           AND r.origin = 'event_cancel')
      ORDER BY o.id
        FOR UPDATE OF o"
);

/// Cancels the pending orders of cancelled events (as an expiry does: units and holds back).
/// Returns the SKUs whose stock went back.
async fn cancel_pending_tx(
    conn: &mut PgConnection,
    event: Option<&str>,
) -> PaymentResult<Vec<String>> {
    let ids: Vec<String> = sqlx::query_scalar(PENDING_OF_CANCELLED)
        .bind(event)
        .fetch_all(&mut *conn)
        .await
        .statement("find the pending orders of a cancelled event")?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let (_, skus) = end_orders_tx(conn, &ids, OrderEnd::Cancelled)
        .await
        .map_err(|e| PaymentError::Ops(anyhow::Error::new(e).context("cancel pending orders")))?;
    Ok(skus)
}

/// Leases up to `$1` pending refunds for `$2` seconds: the locking sub-select as an `ARRAY(...)` InitPlan, run once whatever the plan
/// (docs/decisions.md, "Claims lock their batch once").
pub fn lease_sql() -> String {
    format!(
        "UPDATE order_refunds SET leased_until = clock_timestamp() + make_interval(secs => $2)
          WHERE id = ANY (ARRAY(SELECT id FROM order_refunds
                                 WHERE status = 'pending' AND leased_until <= clock_timestamp()
                                 ORDER BY leased_until, id
                                 LIMIT $1
                                 FOR UPDATE SKIP LOCKED))
         RETURNING {ROW_COLUMNS}"
    )
}

/// What `POST /admin/events/{event}/cancel` did.
#[derive(Debug)]
pub enum Cancelled {
    /// This call cancelled it; `queued` refunds.
    Now {
        queued: u64,
    },
    /// Cancelled before (the call is idempotent).
    Before,
    NotFound,
}

/// Marks `event` cancelled, cancels its pending orders and queues its refunds, with the
/// audit entry, in one transaction.
pub async fn cancel_event(
    state: &PaymentsState,
    event: &str,
    actor: &Operator,
    reason: Option<&str>,
) -> PaymentResult<Cancelled> {
    let mut tx = state
        .pool
        .begin()
        .await
        .statement("begin the event cancellation")?;
    let marked = sqlx::query(
        "UPDATE events SET cancelled_at = clock_timestamp(), cancelled_by = $2,
                           cancel_reason = $3, cancelled_by_detail = $4
          WHERE id = $1 AND cancelled_at IS NULL",
    )
    .bind(event)
    .bind(actor.name())
    .bind(reason)
    .bind(actor.detail())
    .execute(&mut *tx)
    .await
    .statement("mark the event cancelled")?
    .rows_affected();
    if marked == 0 {
        let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM events WHERE id = $1")
            .bind(event)
            .fetch_optional(&mut *tx)
            .await
            .statement("look the event up")?;
        return Ok(if exists.is_some() {
            Cancelled::Before
        } else {
            Cancelled::NotFound
        });
    }
    let skus = cancel_pending_tx(&mut tx, Some(event)).await?;
    let queued = queue_refunds_tx(&mut tx, Some(event)).await?;
    audit::record_tx(
        &mut tx,
        actor,
        "event.cancel",
        &format!("event:{event}"),
        Some(event),
        &json!({"reason": reason, "refunds_queued": queued}),
    )
    .await
    .map_err(PaymentError::Ops)?;
    tx.commit()
        .await
        .statement("commit the event cancellation")?;
    reconcile_skus(&state.pool, &state.redis, skus).await;
    Ok(Cancelled::Now { queued })
}

async fn reconcile_skus(pool: &sqlx::PgPool, redis: &Redis, skus: Vec<String>) {
    for sku in skus {
        if let Err(e) = crate::orders::flash::reconcile(pool, redis, &sku).await {
            tracing::warn!(error = ?e, sku, "flash gate reconcile after a cancellation failed");
        }
    }
}

/// `GET /admin/events/{event}/cancellation`.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
#[schema(as = CancellationProgress)]
pub struct Progress {
    pub event: String,
    pub cancelled: bool,
    pub cancelled_at: Option<chrono::DateTime<chrono::Utc>>,
    pub cancelled_by: Option<String>,
    pub reason: Option<String>,
    /// Orders still `PAID` (each has a refund queued, or will at the job's next sweep).
    pub paid_remaining: i64,
    pub refunds_queued: i64,
    pub refunded: i64,
    pub pending: i64,
    /// Pending refunds whose provider call failed at least once (retried with the same key).
    pub retrying: i64,
    /// Refunds the provider refused (never refunded; see `last_error` in `order_refunds`).
    pub failed: i64,
    pub done: bool,
}

pub async fn progress(pool: &sqlx::PgPool, event: &str) -> PaymentResult<Option<Progress>> {
    sqlx::query_as(
        "SELECT e.id AS event, e.cancelled_at IS NOT NULL AS cancelled, e.cancelled_at,
                e.cancelled_by, e.cancel_reason AS reason,
                (SELECT count(*) FROM orders o WHERE o.event_id = e.id AND o.status = 'PAID')
                    AS paid_remaining,
                r.queued AS refunds_queued, r.refunded, r.pending, r.retrying, r.failed,
                (e.cancelled_at IS NOT NULL AND r.pending = 0 AND NOT EXISTS (
                    SELECT 1 FROM orders o
                     WHERE o.event_id = e.id AND o.status IN ('PAID', 'PENDING_PAYMENT')))
                    AS done
           FROM events e,
                LATERAL (SELECT count(*) AS queued,
                                count(*) FILTER (WHERE status = 'succeeded') AS refunded,
                                count(*) FILTER (WHERE status = 'pending') AS pending,
                                count(*) FILTER (WHERE status = 'pending' AND attempts > 0)
                                    AS retrying,
                                count(*) FILTER (WHERE status = 'failed') AS failed
                           FROM order_refunds
                          WHERE event_id = e.id AND origin = 'event_cancel') r
          WHERE e.id = $1",
    )
    .bind(event)
    .fetch_optional(pool)
    .await
    .statement("read the cancellation progress")
}

/// The refund job: sweeps cancelled events (pending orders cancelled, refunds queued for
/// orders paid since), then works every pending refund row whose lease is free.
pub struct RefundJob {
    pub clients: PaymentClients,
    pub redis: Redis,
}

impl RefundJob {
    pub fn new(state: &PaymentsState) -> Self {
        Self {
            clients: state.clients(),
            redis: state.redis.clone(),
        }
    }

    /// Leases up to [`BATCH`] pending rows (one statement, `SKIP LOCKED`: two processes get
    /// disjoint rows).
    async fn lease(&self) -> PaymentResult<Vec<RefundRow>> {
        sqlx::query_as(sqlx::AssertSqlSafe(lease_sql()))
            .bind(BATCH)
            .bind(LEASE_S as f64)
            .fetch_all(&self.clients.pool)
            .await
            .statement("lease pending refunds")
    }

    /// One pass; returns (refunded, still retrying or failed).
    pub async fn pass(&self) -> PaymentResult<(usize, usize)> {
        let mut tx = self
            .clients
            .pool
            .begin()
            .await
            .statement("begin the sweep")?;
        let skus = cancel_pending_tx(&mut tx, None).await?;
        queue_refunds_tx(&mut tx, None).await?;
        tx.commit().await.statement("commit the sweep")?;
        reconcile_skus(&self.clients.pool, &self.redis, skus).await;
        let (mut done, mut not_done) = (0, 0);
        loop {
            let rows = self.lease().await?;
            if rows.is_empty() {
                break;
            }
            let (clients, redis) = (&self.clients, &self.redis);
            let results: Vec<PaymentResult<Worked>> = futures::stream::iter(rows)
                .map(|row| async move { refund::work(clients, redis, &row).await })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for r in results {
                match r {
                    Ok(Worked::Done) => done += 1,
                    Ok(_) => not_done += 1,
                    Err(e) => {
                        // The row stays pending; its lease ends and a later pass retries it.
                        tracing::warn!(error = ?e, "refund failed; will retry");
                        not_done += 1;
                    }
                }
            }
            if not_done > 0 {
                // Rows left pending are leased for a while: do not spin on them now.
                break;
            }
        }
        Ok((done, not_done))
    }
}

#[async_trait]
impl Job for RefundJob {
    fn name(&self) -> &'static str {
        "ops_refunds"
    }

    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        let (done, left) = self.pass().await?;
        if done + left > 0 {
            tracing::info!(done, left, "ops refunds worked");
        }
        Ok(())
    }
}
