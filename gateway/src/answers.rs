//! Short-lived answers for the unauthenticated endpoints that read Redis
//! (`GET /queue/{event}/draw`, `GET /readyz`).
//!
//! Guarantee: however many calls arrive, each instance sends at most one Redis command per key
//! per [`TTL`] for them (one caller fetches while the others wait for its answer), so a flood
//! of them is not a free Redis amplifier. An answer is also refetched as soon as the caller's
//! `version` changes (the event's config version: a changed sale start or a reveal shows at
//! once on the instance that took the change, and within a refresh on the others).

use crate::respond::Reply;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an answer is reused.
pub const TTL: Duration = Duration::from_secs(1);

struct Entry {
    version: i64,
    at: Instant,
    reply: Reply,
}

type Slot = Arc<tokio::sync::Mutex<Option<Entry>>>;

/// Answers by key. Keys must come from a bounded set (known events, fixed names): the map
/// is never pruned.
#[derive(Default)]
pub struct Answers {
    slots: Mutex<HashMap<String, Slot>>,
}

impl Answers {
    fn slot(&self, key: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots.get(key) {
            return s.clone();
        }
        slots.entry(key.to_owned()).or_default().clone()
    }

    /// The answer for `key` at `version`: a fresh enough one from memory, else `fill`'s
    /// (concurrent callers of one key wait for a single `fill`).
    pub async fn get_or_fill<F, Fut>(&self, key: &str, version: i64, fill: F) -> Reply
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Reply>,
    {
        let slot = self.slot(key);
        let mut entry = slot.lock().await;
        if let Some(e) = entry.as_ref()
            && e.version == version
            && e.at.elapsed() < TTL
        {
            return e.reply.clone();
        }
        let reply = fill().await;
        *entry = Some(Entry {
            version,
            at: Instant::now(),
            reply: reply.clone(),
        });
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn one_fill_per_key_and_version() {
        let answers = Arc::new(Answers::default());
        let fills = Arc::new(AtomicU32::new(0));
        let calls = (0..100).map(|_| {
            let (answers, fills) = (answers.clone(), fills.clone());
            tokio::spawn(async move {
                answers
                    .get_or_fill("e", 1, || async move {
                        fills.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Reply::json(200, &serde_json::json!({"n": 1}))
                    })
                    .await
            })
        });
        for c in futures::future::join_all(calls).await {
            assert_eq!(c.expect("task").status, 200);
        }
        assert_eq!(
            fills.load(Ordering::SeqCst),
            1,
            "concurrent callers share one fill"
        );
        let again = |v: i64| {
            let fills = fills.clone();
            answers.get_or_fill("e", v, move || async move {
                fills.fetch_add(1, Ordering::SeqCst);
                Reply::json(200, &serde_json::json!({}))
            })
        };
        again(1).await;
        assert_eq!(fills.load(Ordering::SeqCst), 1);
        again(2).await;
        assert_eq!(
            fills.load(Ordering::SeqCst),
            2,
            "a new version is fetched at once"
        );
    }
}
