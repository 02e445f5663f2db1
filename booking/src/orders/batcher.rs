//! Group commit for a hot SKU (issue 16): one-line cart orders of the same SKU that arrive
//! while earlier ones are in Postgres go together, as ONE statement
//! (`repo::create_cart_orders_batched`), with one row lock and one commit for all of them.
//!
//! No timer: an order waits only for the statements already running on its SKU; if fewer run
//! than the SKU may have, it starts one at once. So at low load every batch is one order (the
//! one-order statement's cost), and under a rush the batches grow with the queue, up to
//! `[orders] batch_max` orders.
//!
//! A SKU may have `[orders] batch_concurrency` statements running, but never more than its
//! stock has rows: every statement locks one row, so a second statement on a one-row SKU
//! only waits for the first one's lock and commit, and takes half the queue with it (smaller
//! batches, more statements and commits for the same orders). On the 2-core box this served
//! a one-row SKU 10 % more orders at 64 buyers and 17 % more at 16, against +8 % and +5 % for
//! the unchanged split SKU in the same runs (docs/benchmarks.md, session 31).
//!
//! Every order of a batch is still all or nothing, with its own key and answer (the statement's
//! docs). An order the batch did not serve (its units were not on the batch's row, its key was
//! stored, the statement was undone) goes on to the one-order statement and the full
//! transaction, exactly as an order that was never batched; its key makes sure it is created
//! at most once.
//!
//! The queues, their runners (spawned tasks, so a client that goes away cannot cut a batch
//! off midway) and their recovery from a panic are `platform::lanes`'.

use crate::orders::model::PricedSku;
use crate::orders::repo::{BatchOrder, OneStatement, create_cart_orders_batched};
use crate::orders::{CommerceMetrics, OrderSettings, stock};
use crate::platform::kept::KeptPool;
use crate::platform::lanes::{Lane, Lanes};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The batches of this process, per SKU (and the price its orders were built with).
pub struct Batcher {
    lanes: Arc<Lanes<Shared>>,
}

struct Shared {
    pool: KeptPool,
    settings: Arc<OrderSettings>,
    metrics: Arc<CommerceMetrics>,
}

/// Orders batch together only with orders of the same event and SKU priced alike: the
/// statement checks the product against one name and price. (A product whose stock rows
/// change starts a new queue; both are served, each with its own number of statements.)
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct QueueKey {
    event: String,
    sku: String,
    priced: PricedSku,
}

struct Waiting {
    order: BatchOrder,
    reply: oneshot::Sender<OneStatement>,
}

/// What an order gets when its batch could not answer it: the one-order path runs.
fn not_served() -> OneStatement {
    OneStatement::NotServed {
        stale_prices: false,
        busy: false,
    }
}

impl Batcher {
    pub fn new(
        pool: KeptPool,
        settings: Arc<OrderSettings>,
        metrics: Arc<CommerceMetrics>,
    ) -> Self {
        Self {
            lanes: Lanes::new(Shared {
                pool,
                settings,
                metrics,
            }),
        }
    }

    /// False when `[orders] batch_max` is below 2: every order runs on its own.
    pub fn enabled(&self) -> bool {
        self.lanes.lane().settings.batch_max >= 2
    }

    /// Orders `order` (one line of `sku` at `priced`) in the next batch of its SKU and waits
    /// for that batch's answer.
    pub async fn order(
        &self,
        event: &str,
        sku: &str,
        priced: &PricedSku,
        order: BatchOrder,
    ) -> OneStatement {
        let key = QueueKey {
            event: event.to_owned(),
            sku: sku.to_owned(),
            priced: priced.clone(),
        };
        let (reply, answer) = oneshot::channel();
        let runners = self.lanes.lane().concurrency(key.priced.stock_rows);
        self.lanes.push(key, Waiting { order, reply }, runners);
        // A dropped sender (the task panicked): the one-order path decides.
        answer.await.unwrap_or_else(|_| not_served())
    }
}

impl Lane for Shared {
    type Key = QueueKey;
    type Waiting = Waiting;

    /// The oldest orders, up to `batch_max`.
    fn pick(&self, waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
        let max = usize::try_from(self.settings.batch_max.max(1)).unwrap_or(1);
        let take = waiting.len().min(max);
        waiting.drain(..take).collect()
    }

    fn serve(&self, key: &QueueKey, batch: Vec<Waiting>) -> impl Future<Output = ()> + Send {
        self.serve_batch(key, batch)
    }
}

impl Shared {
    fn concurrency(&self, stock_rows: i32) -> usize {
        statements_at_once(self.settings.batch_concurrency, stock_rows)
    }

    /// Runs one batch and answers each of its orders.
    async fn serve_batch(&self, key: &QueueKey, batch: Vec<Waiting>) {
        // Copies of one request (account and key) in one statement would both insert the key
        // and undo the whole batch: every copy after the first goes the one-order way (where
        // it waits for the first on the key's lock, then replays its answer).
        let mut keys = HashSet::with_capacity(batch.len());
        let mut orders = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for Waiting { order, reply } in batch {
            if keys.insert((order.account.clone(), order.key.clone())) {
                orders.push(order);
                replies.push(reply);
            } else {
                let _ = reply.send(not_served());
            }
        }
        self.metrics.order_db_transactions.inc();
        self.metrics.order_batches.inc();
        self.metrics.batched_orders.inc_by(orders.len() as u64);
        let mut conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = ?e, sku = key.sku, "no connection for a batch of orders");
                for reply in replies {
                    let _ = reply.send(not_served());
                }
                return;
            }
        };
        let result = create_cart_orders_batched(
            &mut conn,
            &self.settings,
            &key.event,
            &key.sku,
            &key.priced,
            &orders,
        )
        .await;
        let emptied = match result {
            Ok(outcome) => {
                conn.ended_if(true);
                for (reply, answer) in replies.into_iter().zip(outcome.orders) {
                    let _ = reply.send(answer);
                }
                outcome.emptied
            }
            Err(e) => {
                if let Some(answered) = e.answered() {
                    conn.ended_if(answered);
                }
                let n = orders.len();
                tracing::warn!(error = ?e, sku = key.sku, n, "batch of orders failed; each alone");
                for reply in replies {
                    let _ = reply.send(not_served());
                }
                None
            }
        };
        if let Some(shard) = emptied {
            stock::refill_emptied_after_order(&mut conn, &key.sku, shard).await;
        }
    }
}

/// How many statements a SKU whose stock has `stock_rows` rows may have running at once:
/// `batch_concurrency`, but at least one and never more than the rows (see the module docs).
fn statements_at_once(batch_concurrency: u32, stock_rows: i32) -> usize {
    let rows = u32::try_from(stock_rows).unwrap_or(1).max(1);
    usize::try_from(batch_concurrency.clamp(1, rows)).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::statements_at_once;

    #[test]
    fn a_sku_runs_at_most_one_statement_per_stock_row() {
        // One row: a second statement would only queue on the first one's lock.
        assert_eq!(statements_at_once(2, 1), 1);
        assert_eq!(statements_at_once(8, 1), 1);
        // Split stock: up to the setting, never more than the rows.
        assert_eq!(statements_at_once(2, 8), 2);
        assert_eq!(statements_at_once(8, 3), 3);
        // Nonsense never stops a SKU's orders.
        assert_eq!(statements_at_once(0, 8), 1);
        assert_eq!(statements_at_once(2, 0), 1);
        assert_eq!(statements_at_once(2, -5), 1);
    }
}
