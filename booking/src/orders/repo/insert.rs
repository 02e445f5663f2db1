//! The order's insert: the order row, its items, `order.created` and the stored answer of its
//! `Idempotency-Key`, in ONE statement.

use super::{During, KeyAnswer, OrderError};
use crate::orders::model::{
    AccountId, EventId, HoldId, OrderId, OrderItemView, OrderKey, OrderSource, OrderStatus,
    OrderView,
};
use crate::platform::idempotency::Claim;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

pub(super) struct NewOrder<'a> {
    pub(super) id: OrderId<'a>,
    pub(super) account: AccountId<'a>,
    pub(super) key: OrderKey<'a>,
    pub(super) source: OrderSource,
    pub(super) hold_id: Option<HoldId<'a>>,
    pub(super) event_id: Option<EventId<'a>>,
    pub(super) total: i64,
    pub(super) currency: &'a str,
    /// The hold's pinned expiry; cart orders expire `ttl_s` from now (database clock).
    pub(super) expires_at: DateTime<Utc>,
    /// `expires_at - ttl_s`: the database clock when the expiry was read, so the response
    /// (with this `created_at`) is known before the statement that stores it.
    pub(super) created_at: DateTime<Utc>,
}

/// The order row, its items, its `order.created` outbox row and, with a `claim`, the stored
/// response of its `Idempotency-Key` (the UPDATE [`Claim::complete_tx`] runs) in ONE statement
/// (the items, the event and the response are only written when the order row is). Returns the
/// view, its JSON (the response body) and the account's checkout end.
pub(super) async fn insert_order(
    conn: &mut PgConnection,
    o: &NewOrder<'_>,
    items: Vec<OrderItemView>,
    answer: KeyAnswer<'_>,
) -> Result<(OrderView, Vec<u8>, i64), OrderError> {
    let status = OrderStatus::PendingPayment;
    let view = OrderView {
        id: o.id.as_str().to_owned(),
        status,
        source: o.source,
        hold_id: o.hold_id.map(|h| h.as_str().to_owned()),
        event_id: o.event_id.map(|e| e.as_str().to_owned()),
        total: o.total,
        currency: o.currency.to_owned(),
        items,
        expires_at: o.expires_at,
        created_at: o.created_at,
        paid_at: None,
    };
    let n = view.items.len();
    let mut line = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut sku = Vec::with_capacity(n);
    let mut seat = Vec::with_capacity(n);
    let mut tier = Vec::with_capacity(n);
    let mut name = Vec::with_capacity(n);
    let mut qty = Vec::with_capacity(n);
    let mut price = Vec::with_capacity(n);
    for (i, it) in view.items.iter().enumerate() {
        line.push(i32::try_from(i + 1).unwrap_or(i32::MAX));
        kind.push(it.kind.as_str());
        sku.push(it.sku.as_deref());
        seat.push(it.seat_id.as_deref());
        tier.push(it.ga_tier.as_deref());
        name.push(it.name.as_str());
        qty.push(it.quantity);
        price.push(it.unit_price);
    }
    let payload = serde_json::json!({
        "order_id": o.id.as_str(),
        "account_id": o.account.as_str(),
        "status": status,
        "source": o.source,
        "hold_id": o.hold_id.map(HoldId::as_str),
        "event_id": o.event_id.map(EventId::as_str),
        "total": o.total,
        "currency": o.currency,
        "items": &view.items,
        "expires_at": o.expires_at,
    });
    let body = serde_json::to_vec(&view).map_err(OrderError::Serialize)?;
    let sql = match answer {
        KeyAnswer::Insert { .. } => INSERT_ORDER_AND_KEY,
        KeyAnswer::Claimed(_) | KeyAnswer::None => INSERT_ORDER_COMPLETING_CLAIM,
    };
    let q = sqlx::query_as(sql)
        .bind(o.id.as_str())
        .bind(o.account.as_str())
        .bind(o.key.as_str())
        .bind(o.source.as_str())
        .bind(o.hold_id.map(HoldId::as_str))
        .bind(o.event_id.map(EventId::as_str))
        .bind(o.total)
        .bind(o.currency)
        .bind(o.expires_at)
        .bind(&line)
        .bind(&kind)
        .bind(&sku)
        .bind(&seat)
        .bind(&tier)
        .bind(&name)
        .bind(&qty)
        .bind(&price)
        .bind(shared::ids::new_id())
        .bind(&payload)
        .bind(o.created_at)
        .bind(&body);
    let q = match answer {
        KeyAnswer::Claimed(claim) => q.bind(Some(claim.key())).bind(claim.claim_id()),
        KeyAnswer::Insert { key, fingerprint } => q.bind(Some(key)).bind(fingerprint.as_bytes()),
        KeyAnswer::None => q.bind(None::<&str>).bind(None::<&str>),
    };
    let created: Option<(i64, bool)> = q
        .fetch_optional(&mut *conn)
        .await
        .during("insert the order, its items, order.created and the response")?;
    let Some((live_until_ms, completed)) = created else {
        // No row: the event was cancelled, or the idempotency row was purged (older than the
        // retention) while an order still carries this key, so the key cannot be used for a
        // new order. The statement decided; this read only words the refusal.
        return Err(refusal(conn, o.event_id).await);
    };
    match answer {
        // This attempt lost its claim to a takeover: the caller rolls everything back.
        KeyAnswer::Claimed(_) if !completed => Err(OrderError::ClaimLost(Claim::lost())),
        // The key is stored already: the caller rolls back and answers from it.
        KeyAnswer::Insert { .. } if !completed => Err(OrderError::KeyTaken),
        _ => Ok((view, body, live_until_ms)),
    }
}

/// Why the order's statement wrote nothing: its event is cancelled, or its key was used before.
async fn refusal(conn: &mut PgConnection, event: Option<EventId<'_>>) -> OrderError {
    let Some(event) = event else {
        return OrderError::KeyReused;
    };
    let cancelled: Result<Option<bool>, _> =
        sqlx::query_scalar("SELECT cancelled_at IS NOT NULL FROM events WHERE id = $1")
            .bind(event.as_str())
            .fetch_optional(&mut *conn)
            .await
            .during("read whether the order's event is cancelled");
    match cancelled {
        Ok(Some(true)) => OrderError::EventCancelled,
        Ok(_) => OrderError::KeyReused,
        Err(e) => e,
    }
}

/// The order row, its items, its `order.created` outbox row (`$1`..`$20`, `$21` the answer),
/// then the key's part (`$22` the key, `$23` the claim id or the fingerprint): see
/// [`insert_order`].
macro_rules! insert_order_sql {
    ($key_part:literal) => {
        concat!(
            "WITH o AS (
             INSERT INTO orders (id, account_id, idempotency_key, source, hold_id, event_id,
                                 total, currency, expires_at, created_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $20
              -- A cancelled event takes no new orders, decided here rather than by an
              -- earlier read (holds and carts of the event may outlive its cancellation).
              WHERE NOT EXISTS (SELECT 1 FROM events e
                                 WHERE e.id = $6 AND e.cancelled_at IS NOT NULL)
             ON CONFLICT (account_id, idempotency_key) DO NOTHING
             RETURNING id, expires_at),
         i AS (
             INSERT INTO order_items (order_id, line, kind, sku, seat_id, ga_tier, name,
                                      quantity, unit_price)
             SELECT o.id, l.line, l.kind, l.sku, l.seat_id, l.ga_tier, l.name, l.quantity,
                    l.unit_price
               FROM o, unnest($10::int[], $11::text[], $12::text[], $13::text[], $14::text[],
                              $15::text[], $16::int[], $17::bigint[])
                    AS l(line, kind, sku, seat_id, ga_tier, name, quantity, unit_price)),
         e AS (
             -- The row outbox::write_tx writes.
             INSERT INTO outbox (event_id, topic, aggregate_id, payload)
             SELECT $18, 'order.created', o.id, $19 FROM o),
         k AS (",
            $key_part,
            ")
         SELECT ",
            crate::live_until_ms_sql!("$2", "$6", "(SELECT expires_at FROM o)", "NULL"),
            ", EXISTS (SELECT 1 FROM k) FROM o"
        )
    };
}

/// [`insert_order_sql!`] completing this attempt's claim (`$23`: the claim id): the UPDATE
/// [`Claim::complete_tx`] runs, only this attempt's live claim.
const INSERT_ORDER_COMPLETING_CLAIM: &str = insert_order_sql!(
    "UPDATE idempotency_keys
        SET state = 'done', response_status = 201, response_body = $21,
            completed_at = clock_timestamp()
      WHERE account_id = $2 AND key = $22 AND claim_id = $23
        AND state = 'in_flight' AND EXISTS (SELECT 1 FROM o)
     RETURNING 1"
);

/// [`insert_order_sql!`] inserting the key with its answer (`$23`: the fingerprint), its
/// claim id the order's id; nothing when the key is there already (a concurrent duplicate
/// waits here for the first to end).
const INSERT_ORDER_AND_KEY: &str = insert_order_sql!(
    "INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id,
                                   response_status, response_body, completed_at)
     SELECT $2, $22, $23, 'done', o.id, 201, $21, clock_timestamp() FROM o
     ON CONFLICT (account_id, key) DO NOTHING
     RETURNING 1"
);
