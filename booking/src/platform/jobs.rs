//! The one job runner. A background job is a [`Job`]: a name, a period and `run_once`, holding
//! only the clients it uses. [`spawn`] runs it every period until the stop signal flips;
//! errors are logged and the next period tries again. Tests call `run_once` directly instead
//! of waiting for a timer.
//!
//! Every job is safe to run on many instances at once: each claims its rows with
//! `FOR UPDATE SKIP LOCKED`, a lease, or a consumer group.

use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[async_trait]
pub trait Job: Send + Sync + 'static {
    /// Stable name for logs and metrics.
    fn name(&self) -> &'static str;
    /// Time between the end of one run and the start of the next.
    fn period(&self) -> Duration;
    /// One pass: does what is due now and returns.
    async fn run_once(&self) -> anyhow::Result<()>;
}

/// Runs `job` every period until `stop` is set (or its sender is dropped).
pub fn spawn(job: Arc<dyn Job>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let name = job.name();
    let every = job.period();
    spawn_periodic(name, every, stop, move || {
        let job = job.clone();
        async move { job.run_once().await }
    })
}

/// Spawns every job; the handles finish once `stop` flips.
pub fn spawn_all(jobs: Vec<Arc<dyn Job>>, stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    jobs.into_iter().map(|j| spawn(j, stop.clone())).collect()
}

/// Runs `tick` every `every` until `stop` is set; errors are logged and the loop goes on.
/// Prefer implementing [`Job`]; this is the loop underneath it.
pub fn spawn_periodic<F, Fut>(
    name: &'static str,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    mut tick: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        if *stop.borrow() {
            return;
        }
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {
                    if let Err(e) = tick().await {
                        tracing::warn!(job = name, error = ?e, "background job failed; will retry");
                    }
                }
                changed = stop.changed() => {
                    // A dropped sender means the process is going away: stop too.
                    if changed.is_err() {
                        break;
                    }
                }
            }
            if *stop.borrow() {
                break;
            }
        }
        tracing::debug!(job = name, "background job stopped");
    })
}

/// Waits at most `grace` for `jobs` to end after their stop signal, then aborts those still
/// running, and returns how many it aborted. A job stuck in a statement (a plan gone wrong)
/// must not hold the process's stop for minutes; cutting a run off is safe, as a crash is:
/// every job's work is leased or conditional in Postgres, and the next run redoes it.
pub async fn stop_within(mut jobs: Vec<JoinHandle<()>>, grace: Duration) -> usize {
    let all = futures::future::join_all(jobs.iter_mut());
    if tokio::time::timeout(grace, all).await.is_ok() {
        return 0;
    }
    let mut aborted = 0;
    for job in &jobs {
        if !job.is_finished() {
            job.abort();
            aborted += 1;
        }
    }
    aborted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);

    #[async_trait]
    impl Job for Counter {
        fn name(&self) -> &'static str {
            "counter"
        }
        fn period(&self) -> Duration {
            Duration::from_millis(10)
        }
        async fn run_once(&self) -> anyhow::Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            anyhow::ensure!(self.0.load(Ordering::SeqCst) != 2, "second run fails");
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_job_runs_every_period_survives_errors_and_stops_on_the_signal() {
        let job = Arc::new(Counter(AtomicUsize::new(0)));
        let (tx, rx) = watch::channel(false);
        let handle = spawn(job.clone(), rx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while job.0.load(Ordering::SeqCst) < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the failed second run stopped the loop"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tx.send(true).expect("runner alive");
        handle.await.expect("runner ends cleanly");
        // The task has ended: nothing can run any more.
        let after = job.0.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        assert_eq!(job.0.load(Ordering::SeqCst), after);
    }

    #[tokio::test]
    async fn a_dropped_stop_sender_ends_the_job() {
        let job = Arc::new(Counter(AtomicUsize::new(0)));
        let (tx, rx) = watch::channel(false);
        let handle = spawn(job, rx);
        drop(tx);
        tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .expect("runner ends when the sender is gone")
            .expect("runner ends cleanly");
    }

    #[tokio::test]
    async fn a_job_spawned_after_stop_never_runs() {
        let job = Arc::new(Counter(AtomicUsize::new(0)));
        let (_tx, rx) = watch::channel(true);
        spawn(job.clone(), rx).await.expect("ends at once");
        assert_eq!(job.0.load(Ordering::SeqCst), 0);
    }

    /// A job whose run never ends (stuck in a statement) is aborted after the grace; one that
    /// ends on the signal is not.
    #[tokio::test]
    async fn the_stop_aborts_only_a_job_stuck_past_the_grace() {
        /// Says when its run has started, then never ends.
        struct Stuck(Arc<tokio::sync::Notify>);
        #[async_trait]
        impl Job for Stuck {
            fn name(&self) -> &'static str {
                "stuck"
            }
            fn period(&self) -> Duration {
                Duration::from_millis(10)
            }
            async fn run_once(&self) -> anyhow::Result<()> {
                self.0.notify_one();
                std::future::pending().await
            }
        }
        let entered = Arc::new(tokio::sync::Notify::new());
        let (tx, rx) = watch::channel(false);
        let stuck = spawn(Arc::new(Stuck(entered.clone())), rx.clone());
        let counter = spawn(Arc::new(Counter(AtomicUsize::new(0))), rx);
        entered.notified().await;
        tx.send(true).expect("runners alive");
        // The outer bound only keeps a broken stop from hanging the suite.
        let aborted = tokio::time::timeout(
            Duration::from_secs(30),
            stop_within(vec![stuck, counter], Duration::from_millis(200)),
        )
        .await
        .expect("the stop returns although a job never ends");
        assert_eq!(aborted, 1, "only the stuck job");

        let (tx, rx) = watch::channel(false);
        let counter = spawn(Arc::new(Counter(AtomicUsize::new(0))), rx);
        tx.send(true).expect("runner alive");
        assert_eq!(
            stop_within(vec![counter], Duration::from_secs(30)).await,
            0,
            "a job that ends on the signal is waited for, not aborted"
        );
    }
}
