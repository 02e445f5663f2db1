//! Waiting, in a test, for something that another task, process or service does: poll, and
//! fail with a message naming what was awaited once the deadline passes, rather than hang or
//! sleep a fixed time and hope.
//!
//! Deadlines are read from tokio's clock, so they also hold in a test that pauses time.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How often [`eventually`] polls: often enough for a test not to wait long after the fact,
/// rarely enough not to load the service it asks.
const EVENTUALLY_EVERY: Duration = Duration::from_millis(100);

/// Polls `f` every 100 ms until it returns `Some`, and returns the value; panics with
/// "timed out waiting for {what}" after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(EVENTUALLY_EVERY).await;
    }
}

/// Polls `check` every `every` until it holds; panics with `what` (phrased as the failure,
/// e.g. "booking never waited for the lock") after `timeout`. For conditions polled tightly
/// (a counter in the test's own process, a quick SQL count), where [`eventually`]'s 100 ms
/// would let the moment pass.
pub async fn until<F, Fut>(timeout: Duration, every: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} (within {timeout:?})");
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn eventually_returns_the_first_value() {
        let calls = AtomicU32::new(0);
        let v = eventually(Duration::from_secs(5), "the third call", || async {
            (calls.fetch_add(1, Ordering::SeqCst) == 2).then_some("three")
        })
        .await;
        assert_eq!(v, "three");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for a value that never comes")]
    async fn eventually_fails_naming_what_it_awaited() {
        eventually(
            Duration::from_millis(250),
            "a value that never comes",
            || async { None::<()> },
        )
        .await;
    }

    #[tokio::test]
    async fn until_returns_once_the_check_holds() {
        let calls = AtomicU32::new(0);
        until(
            Duration::from_secs(5),
            Duration::from_millis(1),
            "never reached five",
            || async { calls.fetch_add(1, Ordering::SeqCst) >= 4 },
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    #[should_panic(expected = "the flag was never set (within 50ms)")]
    async fn until_fails_naming_what_it_awaited() {
        until(
            Duration::from_millis(50),
            Duration::from_millis(5),
            "the flag was never set",
            || async { false },
        )
        .await;
    }
}
