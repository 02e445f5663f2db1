//! Refunds booking asks the provider for, of a whole order or of some of its lines: claim a
//! durable `order_refunds` row with its lines, call the provider outside any transaction with
//! the row's own idempotency key, then apply it.
//!
//! Why this never refunds twice:
//! - Every refund row takes order lines (`order_refund_lines`, primary key (order, line)),
//!   under the order's row lock: a line belongs to one live refund, so two requests for the
//!   same line get one row, or the second is refused (`LINE_ALREADY_REFUNDED`). The refund
//!   that takes the last lines is the order's `final` one (at most one live, partial unique
//!   index); a full refund takes whatever lines are left. Concurrent requests, the
//!   event-cancellation sweep and retries therefore share rows, hence provider keys
//!   `ops-refund-<row id>`.
//! - Amounts: a line costs unit price x quantity; a refund never asks for more than was
//!   captured minus what live refunds already asked for, and the final one asks for exactly
//!   that rest (the whole payment when nothing was refunded before).
//! - The provider refunds at most once per key and replays its answer; a crash between its
//!   answer and our commit leaves the row `pending`, and the next worker (the refund job once
//!   the lease ends) replays the same key.
//! - Applying a final row is [`reversal::apply_tx`] with a full refund, the same conditional
//!   `PAID → REFUNDED` the provider's `charge.refunded` webhook runs, so whichever of the ops
//!   answer and the webhook comes first reverses the order and the other changes nothing.
//!   Applying an earlier row returns its lines ([`reversal::lines`]) and leaves the order
//!   `PAID`; the provider's partial `charge.refunded` changes nothing. The stock choice
//!   (`release` / `kill`) is the row's, read by those statements either way.

mod record;

use self::record::{apply_tx, lock_order, mark_failed, retry_later};
use crate::payments::PaymentClients;
use crate::payments::error::{PaymentError, PaymentResult, Statement};
use crate::payments::model::already_refunded_id;
use crate::payments::provider::ProviderError;
use crate::platform::audit::Operator;
use crate::platform::db;
use crate::platform::redis::Redis;
use serde::Serialize;
use sqlx::PgConnection;
use std::time::Duration;
use utoipa::ToSchema;

/// How long a worker owns a pending row before another may take it over.
pub const LEASE_S: i64 = 60;
/// Wait before the job retries a refund whose outcome was unknown.
pub const RETRY_S: i64 = 5;

/// Where a refund row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Ops,
    EventCancel,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Ops => "ops",
            Origin::EventCancel => "event_cancel",
        }
    }
}

/// A refund row as the workers and answers see it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, ToSchema)]
#[schema(as = Refund)]
pub struct RefundRow {
    pub id: String,
    pub order_id: String,
    pub event_id: Option<String>,
    #[serde(skip)]
    pub payment_id: String,
    #[serde(skip)]
    pub provider_payment_id: String,
    /// integer minor units
    #[schema(minimum = 0)]
    pub amount: i64,
    #[schema(value_type = RefundStockWay)]
    pub stock: String,
    #[schema(value_type = RefundOrigin)]
    pub origin: String,
    #[schema(value_type = RefundStatus)]
    pub status: String,
    pub provider_refund_id: Option<String>,
    pub actor: String,
    /// The asking operator's role, credential id and note (`Operator::detail`).
    #[serde(skip)]
    pub actor_detail: Option<serde_json::Value>,
    pub reason: Option<String>,
    pub attempts: i32,
    /// Takes the order's last lines: applying it reverses the order.
    pub reverses_order: bool,
    /// The provider is asked for the whole payment (no amount).
    #[serde(skip)]
    pub whole_payment: bool,
    /// The order lines it refunds.
    pub lines: Vec<i32>,
}

/// `order_refunds.stock`: what the refund does with the seats/units.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[expect(dead_code, reason = "a schema only: the column's values")]
enum RefundStockWay {
    Release,
    Kill,
}

/// `order_refunds.origin`.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[expect(dead_code, reason = "a schema only: the column's values")]
enum RefundOrigin {
    Ops,
    EventCancel,
}

/// `order_refunds.status`.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[expect(dead_code, reason = "a schema only: the column's values")]
enum RefundStatus {
    Pending,
    Succeeded,
    Failed,
}

pub const ROW_COLUMNS: &str = "id, order_id, event_id, payment_id, provider_payment_id, amount, \
     stock, origin, status, provider_refund_id, actor, actor_detail, reason, attempts, reverses_order, whole_payment, \
     ARRAY(SELECT line FROM order_refund_lines l WHERE l.refund_id = order_refunds.id \
           ORDER BY line) AS lines";

/// What claiming a refund of an order found.
#[derive(Debug)]
pub enum Claimed {
    /// The order's live refund (new, or the one already under way or done).
    Row(Box<RefundRow>),
    /// The order is not paid (and has no refund of ours): its status.
    NotRefundable(String),
    /// Lines the order does not have.
    UnknownLines(Vec<i32>),
    /// Lines a live refund already took (refunded, or under way).
    LinesTaken(Vec<i32>),
    NotFound,
}

/// The refund request, validated.
#[derive(Debug, Clone)]
pub struct RefundAsk<'a> {
    /// `release` | `kill`; `None`: the event's `refund_stock`.
    pub stock: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub actor: &'a Operator,
    pub origin: Origin,
}

/// One line of the order as a claim sees it.
#[derive(sqlx::FromRow)]
struct LineRow {
    line: i32,
    amount: i64,
    /// A live refund has it.
    taken: bool,
}

/// Under the order's lock, a refund of `lines` (`None`: the whole order, i.e. every line
/// not taken yet). A whole-order request answers the order's live final refund if there is
/// one (new requests, retries and the event sweep share it); a line request naming a line
/// already taken is refused. The new row is leased to the caller (it calls the provider next).
///
/// A locked transaction, not one statement: the lines taken, the amounts already asked for and
/// the captured payment are read after the order's lock, which every writer of this order's
/// refunds takes first, so nothing read here can change before the insert.
pub async fn claim_tx(
    conn: &mut PgConnection,
    order_id: &str,
    lines: Option<&[i32]>,
    ask: &RefundAsk<'_>,
) -> PaymentResult<Claimed> {
    let order: Option<(String,)> =
        sqlx::query_as("SELECT status FROM orders WHERE id = $1 FOR UPDATE")
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await
            .statement("lock the order to refund")?;
    let Some((status,)) = order else {
        return Ok(Claimed::NotFound);
    };
    let items: Vec<LineRow> = sqlx::query_as(
        "SELECT i.line, i.unit_price * i.quantity AS amount,
                EXISTS (SELECT 1 FROM order_refund_lines l
                         WHERE l.order_id = i.order_id AND l.line = i.line) AS taken
           FROM order_items i WHERE i.order_id = $1 ORDER BY i.line",
    )
    .bind(order_id)
    .fetch_all(&mut *conn)
    .await
    .statement("read the order's lines")?;
    if let Some(wanted) = lines {
        let unknown: Vec<i32> = wanted
            .iter()
            .copied()
            .filter(|l| !items.iter().any(|i| i.line == *l))
            .collect();
        if !unknown.is_empty() {
            return Ok(Claimed::UnknownLines(unknown));
        }
        let taken: Vec<i32> = items
            .iter()
            .filter(|i| i.taken && wanted.contains(&i.line))
            .map(|i| i.line)
            .collect();
        if !taken.is_empty() {
            return Ok(Claimed::LinesTaken(taken));
        }
    } else {
        let live: Option<RefundRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {ROW_COLUMNS} FROM order_refunds
              WHERE order_id = $1 AND status <> 'failed' AND reverses_order"
        )))
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await
        .statement("read the order's refund")?;
        if let Some(row) = live {
            return Ok(Claimed::Row(Box::new(row)));
        }
    }
    if status != "PAID" {
        return Ok(Claimed::NotRefundable(status));
    }
    let take: Vec<&LineRow> = items
        .iter()
        .filter(|i| !i.taken && lines.is_none_or(|w| w.contains(&i.line)))
        .collect();
    let is_final = items
        .iter()
        .all(|i| i.taken || take.iter().any(|t| t.line == i.line));
    let lines_amount: i64 = take.iter().map(|t| t.amount).sum();
    let take_lines: Vec<i32> = take.iter().map(|t| t.line).collect();
    let take_amounts: Vec<i64> = take.iter().map(|t| t.amount).collect();
    // The order is locked and its live refunds read: neither insert can conflict.
    let row: Option<RefundRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH asked AS (
             SELECT COALESCE(sum(amount), 0)::bigint AS amount, count(*) AS n
               FROM order_refunds WHERE order_id = $1 AND status <> 'failed'),
         r AS (
             INSERT INTO order_refunds (id, order_id, event_id, payment_id, provider_payment_id,
                                        amount, stock, origin, actor, reason, leased_until,
                                        reverses_order, whole_payment, actor_detail)
             SELECT 'rf_' || replace(gen_random_uuid()::text, '-', ''), o.id, o.event_id, p.id,
                    p.provider_payment_id,
                    -- The final refund asks for all that is left; another for its lines'
                    -- cost, never past what is left.
                    CASE WHEN $7 THEN p.amount - a.amount
                         ELSE LEAST($8, p.amount - a.amount) END,
                    COALESCE($2, CASE e.refund_stock WHEN 'hold_back' THEN 'kill' ELSE 'release'
                                 END, 'release'),
                    $3, $4, $5, clock_timestamp() + make_interval(secs => $6),
                    $7, $7 AND a.n = 0, $11
               FROM orders o
               JOIN payments p ON p.order_id = o.id AND p.status = 'succeeded'
               LEFT JOIN events e ON e.id = o.event_id
               CROSS JOIN asked a
              WHERE o.id = $1 AND p.amount - a.amount >= 0
              LIMIT 1
             RETURNING *),
         l AS (
             INSERT INTO order_refund_lines (order_id, line, refund_id, amount)
             SELECT r.order_id, t.line, r.id, t.amount
               FROM r, unnest($9::int[], $10::bigint[]) AS t(line, amount))
         SELECT {} FROM r",
        ROW_COLUMNS.replace("order_refunds.id", "r.id")
    )))
    .bind(order_id)
    .bind(ask.stock)
    .bind(ask.origin.as_str())
    .bind(ask.actor.name())
    .bind(ask.reason)
    .bind(LEASE_S as f64)
    .bind(is_final)
    .bind(lines_amount)
    .bind(&take_lines)
    .bind(&take_amounts)
    .bind(ask.actor.detail())
    .fetch_optional(&mut *conn)
    .await
    .statement("record the refund and its lines before calling the provider")?;
    Ok(match row {
        // The lines CTE's rows are not visible to the statement's own SELECT.
        Some(mut row) => {
            row.lines = take_lines;
            Claimed::Row(Box::new(row))
        }
        // PAID without a succeeded attempt: nothing of ours to refund.
        None => Claimed::NotRefundable(status),
    })
}

/// How working a refund row ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Worked {
    /// Refunded and applied (now or before).
    Done,
    /// The provider's outcome is unknown or it was unreachable: still pending, retried with
    /// the same key.
    Retrying(String),
    /// The provider refused the refund itself (never refunded): the row is `failed`.
    Failed(String),
    /// A final refund whose order still has an earlier refund under way: it is asked for once
    /// those have settled (the refund job works it then).
    Waiting,
}

/// How soon the refund job looks again at a final refund that waits for earlier ones.
pub const WAIT_S: i64 = 1;

/// What a final refund asks the provider for, decided when it is worked, not when claimed:
/// only then are the order's earlier refunds settled, so one refused after the final was
/// claimed (its money still at the provider) is not lost.
enum FinalAsk {
    /// An earlier refund of the order is still pending.
    Wait,
    /// Everything the provider still holds of the payment (no amount): what booking's earlier
    /// refunds did not take, less anything refunded outside booking (the dashboard).
    Rest,
    /// Nothing is left (a free order, or earlier refunds took it all): no money moves.
    Nothing,
}

/// Under the order's lock (which every claim and refusal of its refunds takes), whether a final
/// refund can be asked for now. No refund of the order can start after its final one is live
/// (claims find every line taken), so once nothing else is pending the answer cannot change
/// and a retry with the same provider key asks for the same thing.
async fn settle_final(c: &PaymentClients, row: &RefundRow) -> PaymentResult<FinalAsk> {
    let mut tx = c
        .pool
        .begin()
        .await
        .statement("begin the final refund's ask")?;
    lock_order(&mut tx, &row.order_id).await?;
    let (waiting, left): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE r.status = 'pending'),
                (SELECT amount FROM payments WHERE id = $3)
                  - COALESCE(sum(r.amount) FILTER (WHERE r.status = 'succeeded'), 0)::bigint
           FROM order_refunds r WHERE r.order_id = $1 AND r.id <> $2",
    )
    .bind(&row.order_id)
    .bind(&row.id)
    .bind(&row.payment_id)
    .fetch_one(&mut *tx)
    .await
    .statement("read the order's earlier refunds")?;
    let ask = if waiting > 0 {
        sqlx::query(
            "UPDATE order_refunds SET leased_until = clock_timestamp() + make_interval(secs => $2)
              WHERE id = $1 AND status = 'pending'",
        )
        .bind(&row.id)
        .bind(WAIT_S as f64)
        .execute(&mut *tx)
        .await
        .statement("lease the waiting final refund")?;
        FinalAsk::Wait
    } else {
        // The amount is what booking expects back; the provider's answer replaces it.
        sqlx::query(
            "UPDATE order_refunds SET amount = GREATEST($2, 0), whole_payment = $2 > 0
              WHERE id = $1 AND status = 'pending'",
        )
        .bind(&row.id)
        .bind(left)
        .execute(&mut *tx)
        .await
        .statement("record what the final refund asks for")?;
        if left > 0 {
            FinalAsk::Rest
        } else {
            FinalAsk::Nothing
        }
    };
    tx.commit()
        .await
        .statement("commit the final refund's ask")?;
    Ok(ask)
}

/// Calls the provider for `row` (same key on every try) and applies the answer. Nothing here
/// holds a transaction across the provider call.
pub async fn work(c: &PaymentClients, redis: &Redis, row: &RefundRow) -> PaymentResult<Worked> {
    let actor = Operator::from_stored(&row.actor, row.actor_detail.as_ref());
    if row.status == "succeeded" {
        return Ok(Worked::Done);
    }
    if row.status == "failed" {
        return Ok(Worked::Failed(row.id.clone()));
    }
    let key = provider_key(&row.id);
    let amount = if row.reverses_order {
        match settle_final(c, row).await? {
            FinalAsk::Wait => return Ok(Worked::Waiting),
            FinalAsk::Rest => None,
            FinalAsk::Nothing => Some(0),
        }
    } else {
        Some(row.amount)
    };
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    // The provider's refund id, and the amount it refunded when it said.
    let (refund_id, refunded) = loop {
        tries += 1;
        if amount == Some(0) {
            // Free lines (or nothing left to give back): no money moves, the lines still go.
            break (format!("none:{}", row.id), Some(0));
        }
        match c
            .provider
            .refund(&key, &row.provider_payment_id, amount)
            .await
        {
            Ok(r) => break (r.id, Some(r.amount)),
            // Refunded before (in the dashboard, say): the money is back all the same.
            Err(ProviderError::Rejected { code, .. }) if code == "charge_already_refunded" => {
                break (already_refunded_id(&row.provider_payment_id), None);
            }
            // The same key still running (another worker): wait for its answer.
            Err(ProviderError::InProgress) if tries < 20 => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(ProviderError::Rejected { status, code }) => {
                let why = format!("provider refused the refund: {status} {code}");
                mark_failed(c, row, &why).await?;
                return Ok(Worked::Failed(why));
            }
            Err(e) => {
                let why = e.to_string();
                retry_later(c, row, &why).await?;
                return Ok(Worked::Retrying(why));
            }
        }
    };
    let released = db::retry(3, || async {
        let mut tx = c.pool.begin().await.statement("begin the refund apply")?;
        let released = apply_tx(&mut tx, row, &refund_id, refunded, &actor).await?;
        tx.commit().await.statement("commit the refund apply")?;
        Ok::<_, PaymentError>(released)
    })
    .await?;
    for sku in released {
        // Returned units of hot SKUs: let the flash gate admit them again.
        if let Err(e) = crate::orders::flash::reconcile(&c.pool, redis, &sku).await {
            tracing::warn!(error = ?e, sku, "flash gate reconcile after an ops refund failed");
        }
    }
    Ok(Worked::Done)
}

/// The provider idempotency key of a refund row.
pub fn provider_key(refund_id: &str) -> String {
    format!("ops-refund-{refund_id}")
}
