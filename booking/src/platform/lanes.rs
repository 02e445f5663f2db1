//! The queues of group commit (a hot SKU's orders, `orders/batcher.rs`; one event's explicit
//! seat holds, `inventory/holds/grouped.rs`): requests of one key that arrive while that key's
//! statements run wait, and the next statement takes them together.
//!
//! No timer: a request waits only for the statements already running on its key; if fewer run
//! than the key may have, a runner starts at once. A runner is a spawned task that serves the
//! key's batches until its queue is empty, so a client that goes away cannot cut a batch off
//! midway, and it runs only while requests wait for it (a graceful stop waits for those
//! requests, so it waits for their batch). A runner that panics is counted out of its queue
//! and replaced if requests still wait.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a kind of batch does with its queue: which waiting requests go together, and how a
/// batch is served.
pub trait Lane: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Send + Sync + 'static;
    type Waiting: Send + 'static;

    /// Takes the next batch off the front of `waiting` (never empty); the rest stay queued,
    /// in their order.
    fn pick(&self, waiting: &mut VecDeque<Self::Waiting>) -> Vec<Self::Waiting>;

    /// Runs one batch and answers each of its requests.
    fn serve(&self, key: &Self::Key, batch: Vec<Self::Waiting>) -> impl Future<Output = ()> + Send;
}

/// Every key's queue of one kind of batch. An idle key with no runner has no entry.
pub struct Lanes<L: Lane> {
    lane: L,
    queues: Mutex<HashMap<L::Key, Queue<L::Waiting>>>,
}

struct Queue<W> {
    waiting: VecDeque<W>,
    /// Runners serving this queue.
    running: usize,
}

impl<W> Default for Queue<W> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            running: 0,
        }
    }
}

impl<L: Lane> Lanes<L> {
    pub fn new(lane: L) -> Arc<Self> {
        Arc::new(Self {
            lane,
            queues: Mutex::default(),
        })
    }

    pub fn lane(&self) -> &L {
        &self.lane
    }

    /// Queues `waiting` under `key`, and starts a runner when fewer than `runners` (at least
    /// one) serve that key.
    pub fn push(self: &Arc<Self>, key: L::Key, waiting: L::Waiting, runners: usize) {
        let start = {
            let mut queues = self.queues();
            let queue = queues.entry(key.clone()).or_default();
            queue.waiting.push_back(waiting);
            let start = queue.running < runners.max(1);
            if start {
                queue.running += 1;
            }
            start
        };
        if start {
            tokio::spawn(run(self.clone(), key));
        }
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<L::Key, Queue<L::Waiting>>> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next batch of `key`'s queue, or `None` (and the calling runner is counted out)
    /// when nothing waits.
    fn next_batch(&self, key: &L::Key) -> Option<Vec<L::Waiting>> {
        let mut queues = self.queues();
        let queue = queues.get_mut(key)?;
        if queue.waiting.is_empty() {
            count_out(&mut queues, key);
            return None;
        }
        Some(self.lane.pick(&mut queue.waiting))
    }
}

/// Serves `key`'s batches until its queue is empty.
async fn run<L: Lane>(lanes: Arc<Lanes<L>>, key: L::Key) {
    let mut guard = Running {
        lanes: &lanes,
        key: &key,
        done: false,
    };
    while let Some(batch) = lanes.next_batch(&key) {
        lanes.lane.serve(&key, batch).await;
    }
    // `next_batch` already counted this runner out.
    guard.done = true;
}

/// One runner fewer serves `key`; an idle queue with none left is dropped.
fn count_out<K: Eq + Hash, W>(queues: &mut HashMap<K, Queue<W>>, key: &K) {
    if let Some(queue) = queues.get_mut(key) {
        queue.running = queue.running.saturating_sub(1);
        if queue.running == 0 && queue.waiting.is_empty() {
            queues.remove(key);
        }
    }
}

/// Counts a runner that ended without `next_batch` (a panic) out of its queue, so the queue is
/// not left with a runner that does not exist; requests still waiting get a new one.
struct Running<'a, L: Lane> {
    lanes: &'a Arc<Lanes<L>>,
    key: &'a L::Key,
    done: bool,
}

impl<L: Lane> Drop for Running<'_, L> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let restart = {
            let mut queues = self.lanes.queues();
            match queues.get(self.key) {
                Some(queue) if !queue.waiting.is_empty() => true,
                Some(_) => {
                    count_out(&mut queues, self.key);
                    false
                }
                None => false,
            }
        };
        if restart && let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(run(self.lanes.clone(), self.key.clone()));
        }
    }
}
