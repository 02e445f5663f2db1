//! Admission stepped by the test: the gateway's own ticker ([`Ticker::tick_once`]), one tick
//! at a time, instead of waiting for its timer.

use crate::helpers::{TestApp, redis_conn, redis_settings};
use gateway::admission::{TickReport, Ticker, TickerState};
use gateway::config::GatewaySettings;
use gateway::live::Live;
use gateway::metrics::Metrics;
use gateway::store::{Store, TickOutcome};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a leader's tick did, as plain counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Led {
    pub admitted: u64,
    pub expired_unclaimed: u64,
    pub queue_len: u64,
    pub active: u64,
    pub rate: u64,
}

/// The counts of a leader's tick; panics on any other outcome.
pub fn led(o: &TickOutcome) -> Led {
    match *o {
        TickOutcome::Leader {
            admitted,
            expired_unclaimed,
            queue_len,
            active,
            rate,
            ..
        } => Led {
            admitted,
            expired_unclaimed,
            queue_len,
            active,
            rate,
        },
        ref other => panic!("expected to lead the tick, got {other:?}"),
    }
}

/// Lets Redis time move between stepped ticks, so the token bucket refills (the bucket runs on
/// Redis `TIME`). Pacing only: no test waits on it for an outcome.
pub async fn pace() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// An admission ticker the test steps by hand ([`Ticker::tick_once`]) instead of waiting for
/// the timer: the gateway's own ticker, one tick at a time. It ticks the events it was told
/// to [`Stepper::watch`] (a gateway's refresher does that for its ticker).
pub struct Stepper {
    pub ticker: Ticker,
    pub state: TickerState,
}

impl Stepper {
    /// A ticker on `prefix` named `instance`, with the test gateways' tick (100 ms) and a
    /// lease long enough to outlast any test.
    pub fn new(prefix: &str, instance: &str) -> Stepper {
        let defaults = GatewaySettings::default();
        Stepper {
            ticker: Ticker {
                store: Store::new(&redis_settings(prefix)).unwrap(),
                live: Arc::new(Live::default()),
                metrics: Arc::new(Metrics::new().unwrap()),
                instance: instance.into(),
                tick: Duration::from_millis(100),
                lease_ttl_ms: 60_000,
                passthrough_batch: defaults.passthrough_batch,
                window_s: defaults.auto_window_s,
            },
            state: TickerState::new(Instant::now()),
        }
    }

    /// A stepper that holds `event`'s admission lease before `app`'s gateway can tick the
    /// event, so the gateway's ticker stays a follower and only the test's steps admit. Call
    /// it before the event is configured.
    pub async fn take_lease(app: &TestApp, event: &str) -> Stepper {
        let s = Stepper::new(&app.prefix, &format!("stepper-{}", shared::ids::new_id()));
        let set: Option<String> = redis::cmd("SET")
            .arg(app.key(event, "lease"))
            .arg(&s.ticker.instance)
            .arg("NX")
            .arg("PX")
            .arg(s.ticker.lease_ttl_ms)
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        assert_eq!(
            set.as_deref(),
            Some("OK"),
            "someone already holds the lease"
        );
        s
    }

    /// Loads `event`'s config from Redis into this ticker's view.
    pub async fn watch(&self, event: &str) {
        let snap = self
            .ticker
            .store
            .load_event(event)
            .await
            .unwrap()
            .expect("the event is configured");
        self.ticker.live.upsert(event, snap);
    }

    /// One tick, now.
    pub async fn tick(&mut self) -> TickReport {
        self.ticker.tick_once(&mut self.state, Instant::now()).await
    }

    /// One tick, now; what it did for `event` (a Redis error fails the test).
    pub async fn tick_event(&mut self, event: &str) -> TickOutcome {
        let r = self.tick().await;
        assert!(r.error.is_none(), "tick failed: {:?}", r.error);
        r.outcome(event).cloned().expect("the event was ticked")
    }

    /// One tick, now, that must lead `event`.
    pub async fn lead(&mut self, event: &str) -> Led {
        led(&self.tick_event(event).await)
    }

    /// Paced ticks until one admits somebody to `event` (or panics after `within`).
    pub async fn lead_until_admitted(&mut self, event: &str, within: Duration) -> Led {
        let deadline = Instant::now() + within;
        loop {
            let l = self.lead(event).await;
            if l.admitted > 0 {
                return l;
            }
            assert!(Instant::now() < deadline, "nobody admitted: {l:?}");
            pace().await;
        }
    }

    /// Admissions left in `event`'s token bucket after the last tick.
    pub async fn bucket_tokens(&self, event: &str) -> f64 {
        let key = self.ticker.store.key(event, "bucket");
        let v: Option<String> = redis::cmd("HGET")
            .arg(key)
            .arg("tokens")
            .query_async(&mut redis_conn().await)
            .await
            .unwrap();
        v.map_or(0.0, |t| t.parse().unwrap())
    }
}
