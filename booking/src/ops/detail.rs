//! `GET /admin/orders/{id}`: one order with its items, payment attempts (status, amounts,
//! provider ids, refund and dispute fields: every column of `payments`, so fields added
//! later show without a change here), the provider events received for them
//! (`payment_webhook_events`), its refunds as recorded today (attempts `refund_pending` or
//! `refunded`, and `order.refunded` outbox events), the refunds ops or an event cancellation
//! asked for (`order_refunds`: status, amount, provider refund id, who), its tickets (valid or voided) and its
//! audit entries, its ticket e-mails, and its e-mail address masked (`a***@example.com`). Read in one `REPEATABLE READ READ ONLY` transaction: one consistent picture.

use crate::ops::OpsState;
use crate::orders::load_order;
use crate::platform::audit::Viewer;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::json::ApiJson;
use crate::platform::openapi::{self as doc, tags};
use anyhow::Context;
use axum::extract::{Path, State};
use serde_json::{Value, json};
use shared::error::codes;
use utoipa::ToSchema;

/// One order with everything known about it (built by one statement, `json!` at the end).
#[derive(ToSchema)]
#[expect(
    dead_code,
    reason = "a schema only: the answer's shape in the document"
)]
struct OrderDetail {
    #[schema(value_type = Object)]
    order: Value,
    #[schema(value_type = Vec<Object>)]
    payments: Value,
    #[schema(value_type = Vec<Object>)]
    provider_events: Value,
    #[schema(value_type = Vec<Object>)]
    refunds: Value,
    #[schema(value_type = Vec<Object>)]
    ops_refunds: Value,
    #[schema(value_type = Vec<Object>)]
    tickets: Value,
    #[schema(value_type = Vec<Object>)]
    audit: Value,
    /// Ticket e-mail deliveries (state, attempts, last error; never the address).
    #[schema(value_type = Vec<Object>)]
    mail: Value,
}

/// Every part of the detail but the order itself, as JSON built by Postgres (one statement).
const PARTS: &str = "
SELECT
  (SELECT COALESCE(jsonb_agg(to_jsonb(p) ORDER BY p.attempt), '[]'::jsonb)
     FROM payments p WHERE p.order_id = $1) AS payments,
  (SELECT COALESCE(jsonb_agg(to_jsonb(w) ORDER BY w.received_at, w.provider_event_id),
                   '[]'::jsonb)
     FROM payment_webhook_events w
    WHERE w.payment_id IN (SELECT id FROM payments WHERE order_id = $1)) AS provider_events,
  (SELECT COALESCE(jsonb_agg(jsonb_build_object(
              'payment_id', p.id, 'status', p.status, 'amount', p.amount,
              'currency', p.currency, 'refund_id', p.refund_id,
              'updated_at', p.updated_at) ORDER BY p.attempt), '[]'::jsonb)
     FROM payments p
    WHERE p.order_id = $1 AND (p.status IN ('refund_pending', 'refunded')
                               OR p.refund_id IS NOT NULL)) AS refunds,
  (SELECT COALESCE(jsonb_agg(to_jsonb(r) - 'leased_until' ORDER BY r.created_at, r.id),
                   '[]'::jsonb)
     FROM order_refunds r WHERE r.order_id = $1) AS ops_refunds,
  (SELECT COALESCE(jsonb_agg(jsonb_build_object(
              'id', t.id, 'seat_id', t.seat_id, 'ga_tier', t.ga_tier,
              'issued_at', t.issued_at, 'valid', t.voided_at IS NULL,
              'voided_at', t.voided_at, 'void_reason', t.void_reason)
              ORDER BY t.seat_id, t.id), '[]'::jsonb)
     FROM tickets t WHERE t.order_id = $1) AS tickets,
  (SELECT COALESCE(jsonb_agg(to_jsonb(a) ORDER BY a.id), '[]'::jsonb)
     FROM ops_audit a WHERE a.target = 'order:' || $1) AS audit,
  (SELECT COALESCE(jsonb_agg(jsonb_build_object(
              'id', m.id, 'kind', m.kind, 'state', m.state, 'attempts', m.attempts,
              'next_attempt_at', m.next_attempt_at, 'last_error', m.last_error,
              'created_at', m.created_at, 'sent_at', m.sent_at) ORDER BY m.id), '[]'::jsonb)
     FROM mail_deliveries m WHERE m.order_id = $1) AS mail,
  (SELECT jsonb_build_object('account_id', o.account_id, 'updated_at', o.updated_at,
                             'reversed_at', o.reversed_at,
                             -- Masked as platform::email::mask does: never the address.
                             'email', left(c.email, 1) || '***@'
                                      || substring(c.email FROM '@([^@]*)$'),
                             'email_erased_at', c.erased_at)
     FROM orders o LEFT JOIN order_contacts c ON c.order_id = o.id
    WHERE o.id = $1) AS extra";

#[derive(sqlx::FromRow)]
struct Parts {
    payments: Value,
    provider_events: Value,
    refunds: Value,
    ops_refunds: Value,
    tickets: Value,
    audit: Value,
    mail: Value,
    extra: Option<Value>,
}

/// One order with its payment attempts, provider events, refunds, tickets and audit entries
#[utoipa::path(get, path = "/admin/orders/{id}", tag = tags::OPS, security(("admin" = ["viewer"])),
    params(doc::IdPath),
    responses(
        (status = 200, description = "OK", body = inline(OrderDetail)),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
    ))]
pub async fn order_detail(
    _caller: Viewer,
    State(state): State<OpsState>,
    Path(id): Path<String>,
) -> ApiResult<ApiJson<Value>> {
    let not_found = || ApiError::not_found(codes::NOT_FOUND, "no such order");
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let mut tx = state
        .pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .context("failed to begin reading the order")?;
    let Some((_, view)) = load_order(&mut tx, &id, None).await? else {
        return Err(not_found());
    };
    let parts: Parts = sqlx::query_as(PARTS)
        .bind(&id)
        .fetch_one(&mut *tx)
        .await
        .context("failed to read the order's payments, events, tickets and audit")?;
    tx.commit()
        .await
        .context("failed to finish reading the order")?;
    let mut order = serde_json::to_value(&view).context("failed to render the order")?;
    if let (Some(Value::Object(extra)), Value::Object(o)) = (parts.extra, &mut order) {
        o.extend(extra);
    }
    Ok(ApiJson(json!({
        "order": order,
        "payments": parts.payments,
        "provider_events": parts.provider_events,
        "refunds": parts.refunds,
        "ops_refunds": parts.ops_refunds,
        "tickets": parts.tickets,
        "audit": parts.audit,
        "mail": parts.mail,
    })))
}
