//! The cart order's two ways to Postgres: one statement when this process knows every
//! line's price (`repo::one_statement`), else the full transaction, one per way of taking the
//! stock, retried from the top on deadlock.

use super::Created;
use crate::orders::OrdersState;
use crate::orders::model::{AccountId, EventId, OrderId, OrderKey, Shortage};
use crate::orders::repo::{
    BatchOrder, During, OneStatement, OrderError, Take, claim_key_tx,
    create_cart_order_one_statement, create_cart_order_tx, order_text, read_prices,
    wait_for_copies,
};
use crate::orders::stock::{self, StockWay};
use crate::platform::db;
use crate::platform::idempotency::{Begin, Fingerprint, IdempotencyKey};
use std::collections::BTreeMap;

/// The cart order as one statement, when this process knows every line's price. `None`:
/// nothing was written, run the full transaction. The stock rows the order emptied are
/// refilled afterwards, best effort (a row left empty only makes later orders skip it until
/// the next order that empties a row refills, or the slow path spreads the stock).
pub(super) async fn one_statement_order(
    state: &OrdersState,
    order_id: &str,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: OrderKey<'_>,
    fingerprint: &Fingerprint,
    lines: &BTreeMap<String, i64>,
) -> Result<Option<Created>, OrderError> {
    let outcomes = &state.metrics.one_statement_orders;
    if lines.is_empty() {
        return Ok(None);
    }
    // A one-line cart of a SKU whose price this process knows: with the SKU's other orders.
    match batched_order(state, order_id, account, event, key, fingerprint, lines).await? {
        Some(
            done @ (OneStatement::Created { .. }
            | OneStatement::Short { .. }
            | OneStatement::NotServed {
                stale_prices: true, ..
            }),
        ) => return answer(state, lines, done),
        // Not served by the batch: this order on its own.
        Some(OneStatement::NotServed { .. }) | None => {}
    }
    // Back to the kept stack only once Postgres answered the statement (`platform::kept`).
    let mut conn = state
        .statements
        .acquire()
        .await
        .during("acquire a connection for the order")?;
    let prices = match state.catalog.order_prices(lines.keys()) {
        Some(prices) => prices,
        None => {
            // First order of these SKUs in this process: one read, then the statement.
            outcomes.with_label_values(&["read_prices"]).inc();
            let prices = read_prices(&mut conn, lines).await?;
            if prices.len() != lines.len() {
                // An unknown SKU: the full transaction words the refusal.
                return Ok(None);
            }
            state.catalog.learn_order_prices(&prices);
            prices
        }
    };
    state.metrics.order_db_transactions.inc();
    let done = create_cart_order_one_statement(
        &mut conn,
        &state.settings,
        OrderId::new(order_id),
        account,
        event,
        key,
        fingerprint,
        lines,
        &prices,
        Take::for_lines(lines.len()),
    )
    .await?;
    conn.ended_if(true);
    if let OneStatement::Created { emptied, .. } = &done {
        for (sku, shard) in emptied {
            stock::refill_emptied_after_order(&mut conn, sku, *shard).await;
        }
    }
    answer(state, lines, done)
}

/// A one-line cart order through the SKU's batches (`orders::batcher`); `None` when it cannot
/// go there (batching off, several lines, prices this process has not read).
async fn batched_order(
    state: &OrdersState,
    order_id: &str,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: OrderKey<'_>,
    fingerprint: &Fingerprint,
    lines: &BTreeMap<String, i64>,
) -> Result<Option<OneStatement>, OrderError> {
    let batcher = &state.batcher;
    if !batcher.enabled() || lines.len() != 1 {
        return Ok(None);
    }
    let Some((sku, &quantity)) = lines.iter().next() else {
        return Ok(None);
    };
    let Some(prices) = state.catalog.order_prices(lines.keys()) else {
        return Ok(None);
    };
    let Some(priced) = prices.get(sku) else {
        return Ok(None);
    };
    let id = OrderId::new(order_id);
    let Some(text) = order_text(&state.settings, id, account, event, lines, &prices)? else {
        return Ok(None);
    };
    let order = BatchOrder {
        order_id: order_id.to_owned(),
        account: account.as_str().to_owned(),
        key: key.as_str().to_owned(),
        fingerprint: fingerprint.as_bytes().to_vec(),
        quantity,
        head: text.head,
        tail: text.tail,
        outbox_id: shared::ids::new_id(),
        payload: text.payload,
    };
    let done = batcher.order(event.as_str(), sku, priced, order).await;
    if matches!(done, OneStatement::Created { .. }) {
        state
            .metrics
            .one_statement_orders
            .with_label_values(&["batched"])
            .inc();
    }
    Ok(Some(done))
}

/// The answer of a one-statement order (alone or batched) that ran: the order, its `409`, or
/// `None` for the full transaction.
fn answer(
    state: &OrdersState,
    lines: &BTreeMap<String, i64>,
    done: OneStatement,
) -> Result<Option<Created>, OrderError> {
    let outcomes = &state.metrics.one_statement_orders;
    match done {
        OneStatement::Created {
            body,
            live_until_ms,
            ..
        } => {
            outcomes.with_label_values(&["created"]).inc();
            Ok(Some(Created::Order(body, live_until_ms, None)))
        }
        OneStatement::Short {
            sku,
            requested,
            available,
        } => {
            outcomes.with_label_values(&["short"]).inc();
            Err(OrderError::Shortage {
                sku,
                requested,
                shortage: Shortage::of(available),
            })
        }
        OneStatement::NotServed { stale_prices, busy } => {
            let outcome = if stale_prices {
                state.catalog.forget_order_prices(lines.keys());
                "stale_prices"
            } else if busy {
                "busy"
            } else {
                "not_served"
            };
            outcomes.with_label_values(&[outcome]).inc();
            Ok(None)
        }
    }
}

/// The cart order as the full transaction: each way of taking the stock is its own
/// transaction (`stock::StockWay`); the first serves the order unless every row with enough
/// units is busy at that instant.
pub(super) async fn transaction_order(
    state: &OrdersState,
    order_id: &str,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lines: &BTreeMap<String, i64>,
) -> Result<Created, OrderError> {
    let mut way = StockWay::FreeRow;
    loop {
        let attempt = create_cart_order(
            state,
            order_id,
            account,
            event,
            key,
            fingerprint,
            lines,
            way,
        );
        match attempt.await {
            Err(OrderError::StockBusy) if way != StockWay::AcrossInOrder => way = way.next(),
            other => return other,
        }
    }
}

/// One cart order transaction taking the stock `way`, retried from the top on deadlock: the
/// idempotency claim first (a duplicate waits on it, then replays), then the order.
#[expect(
    clippy::too_many_arguments,
    reason = "one order's whole input, each a distinct typed value"
)]
async fn create_cart_order(
    state: &OrdersState,
    order_id: &str,
    account: AccountId<'_>,
    event: EventId<'_>,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lines: &BTreeMap<String, i64>,
    way: StockWay,
) -> Result<Created, OrderError> {
    let settings = &*state.settings;
    let order_key = OrderKey::new(key.as_str());
    db::retry(settings.deadlock_retries, || async {
        state.metrics.order_db_transactions.inc();
        let mut tx = if settings.async_commit {
            state
                .pool
                .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
                .await
        } else {
            state.pool.begin().await
        }
        .during("begin the order transaction")?;
        wait_for_copies(&mut tx, account, order_key).await?;
        let claim = match claim_key_tx(
            &mut tx,
            &state.idempotency.settings,
            account,
            key,
            fingerprint,
        )
        .await?
        {
            Begin::Started(claim) => claim,
            Begin::Replay(stored) => return Ok(Created::Replay(stored)),
        };
        let order = create_cart_order_tx(
            &mut tx,
            settings,
            OrderId::new(order_id),
            account,
            event,
            order_key,
            lines,
            Some(&claim),
            way,
        )
        .await?;
        tx.commit().await.during("commit the order transaction")?;
        Ok::<_, OrderError>(Created::Order(
            order.body,
            order.live_until_ms,
            Some(order.prices),
        ))
    })
    .await
}
