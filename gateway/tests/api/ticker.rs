//! The admission ticker stepped one tick at a time (`Ticker::tick_once`) against real Redis:
//! batch size, `max_active`, the lease, auto mode, Redis errors. No gateway and no timer: each
//! assertion is about ticks that certainly ran.

use crate::helpers::*;
use crate::stepper::{Stepper, led, pace};
use gateway::admission::{AUTO_ADJUST_EVERY, TickerState};
use gateway::event_config::EventConfigInput;
use gateway::store::{EventSnapshot, Store, TickOutcome};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn configure(store: &Store, event: &str, cfg: Value) {
    let input: EventConfigInput = serde_json::from_value(cfg).unwrap();
    let cfg = input.validate(600, 120).unwrap();
    let (seed, seed_hash) = gateway::draw::new_seed().unwrap();
    store
        .put_config(
            event,
            &cfg,
            &seed,
            &seed_hash,
            &gateway::store::ConfigWrite::manual("test"),
        )
        .await
        .unwrap();
}

fn open(rate: u64, max_active: u64, mode: &str) -> Value {
    json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": rate,
           "max_active": max_active, "mode": mode})
}

/// Joins `n` fans in order (`{prefix}-0000`, ...).
async fn join(store: &Store, event: &str, prefix: &str, n: usize) {
    for i in 0..n {
        let a = format!("{prefix}-{i:04}");
        store
            .join(event, 1, &a, 0, &format!("s-{a}"), 600, None)
            .await
            .unwrap();
    }
}

async fn zcard(key: String) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut redis_conn().await)
        .await
        .unwrap()
}

fn gauge(s: &Stepper, event: &str) -> (i64, i64, i64, i64) {
    let m = &s.ticker.metrics;
    let l = [event];
    (
        m.queue_length.with_label_values(&l).get(),
        m.active_admitted.with_label_values(&l).get(),
        m.admit_rate.with_label_values(&l).get(),
        m.is_leader.with_label_values(&l).get(),
    )
}

#[tokio::test]
async fn each_tick_admits_exactly_one_batch_at_the_rate() {
    let prefix = unique_prefix();
    let mut s = Stepper::new(&prefix, "solo");
    // 6000/min with 100 ms ticks: a batch is 10 fans.
    configure(&s.ticker.store, "b", open(6000, 0, "queue")).await;
    join(&s.ticker.store, "b", "f", 60).await;
    s.watch("b").await;
    // A fresh bucket starts empty: opening the sale is no burst.
    let first = s.lead("b").await;
    assert_eq!(first.admitted, 0);
    assert_eq!(first.queue_len, 60);
    let mut total = 0;
    // However long between ticks (one tick's worth of time or five), one tick admits one
    // batch: the bucket holds at most a batch, so a late tick never catches up.
    for gap_ms in [200, 200, 500, 200] {
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        let l = s.lead("b").await;
        total += l.admitted;
        assert_eq!(l.admitted, 10, "after {gap_ms} ms");
        assert_eq!(l.queue_len, 60 - total);
        assert_eq!(l.rate, 6000);
    }
    // Everyone admitted is on the audit stream exactly once, by this ticker, in queue order.
    let adm = admissions(
        &mut redis_conn().await,
        &s.ticker.store.key("b", "admissions"),
    )
    .await;
    let names: Vec<String> = adm.iter().map(|(a, _, _)| a.clone()).collect();
    let expected: Vec<String> = (0..40).map(|i| format!("f-{i:04}")).collect();
    assert_eq!(names, expected);
    assert!(adm.iter().all(|(_, by, _)| by == "solo"));
    assert_eq!(zcard(s.ticker.store.key("b", "adm")).await, 40);
    // The tick's metrics: counters add up, gauges show the last tick.
    let m = &s.ticker.metrics;
    assert_eq!(m.admitted.with_label_values(&["b"]).get(), 40);
    assert_eq!(gauge(&s, "b"), (20, 40, 6000, 1));
    assert!(s.state.is_leader("b"));
}

#[tokio::test]
async fn a_rate_that_is_not_a_whole_batch_per_tick_is_admitted_in_full() {
    let prefix = unique_prefix();
    let mut s = Stepper::new(&prefix, "solo");
    // 1500/min with 100 ms ticks: 2.5 fans a tick. The bucket carries the half fan a tick
    // leaves; capped at 2.5 it lost it and admitted 2 a tick (1200/min, 20 % short).
    configure(&s.ticker.store, "frac", open(1500, 0, "queue")).await;
    join(&s.ticker.store, "frac", "f", 200).await;
    s.watch("frac").await;
    assert_eq!(s.lead("frac").await.admitted, 0);
    // Ticks at least 100 ms apart each add at least 2.5; a tick admits at most one batch of
    // 3, so a late one does not catch up. 20 ticks: at least 49 (20 × 2.5, less the half a
    // fan the bucket may still carry), at most 60.
    let mut per_tick = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        per_tick.push(s.lead("frac").await.admitted);
    }
    let total: u64 = per_tick.iter().sum();
    assert!(per_tick.iter().all(|&n| n <= 3), "{per_tick:?}");
    assert!((49..=60).contains(&total), "{total} admitted: {per_tick:?}");
}

#[tokio::test]
async fn max_active_holds_however_many_tokens_the_bucket_has() {
    let prefix = unique_prefix();
    let mut s = Stepper::new(&prefix, "capped");
    // 60000/min: 1 admission per ms, 100 per tick; the cap is the only limit.
    configure(&s.ticker.store, "cap", open(60000, 3, "queue")).await;
    join(&s.ticker.store, "cap", "f", 10).await;
    s.watch("cap").await;
    assert_eq!(s.lead("cap").await.admitted, 0);
    pace().await;
    let l = s.lead("cap").await;
    assert_eq!((l.admitted, l.active, l.queue_len), (3, 3, 7));
    for _ in 0..5 {
        pace().await;
        let l = s.lead("cap").await;
        assert_eq!((l.admitted, l.active, l.queue_len), (0, 3, 7));
    }
    // The bucket had tokens all along: the cap, not the rate, held the fans back.
    assert!(s.bucket_tokens("cap").await >= 3.0);
    // One fan misses the claim deadline: the next tick expires it and refills its slot.
    let mut c = redis_conn().await;
    let adm_key = s.ticker.store.key("cap", "adm");
    let first: Vec<String> = redis::cmd("ZRANGE")
        .arg(&adm_key)
        .arg(0)
        .arg(0)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(&adm_key)
        .arg(1)
        .arg(&first[0])
        .query_async(&mut c)
        .await
        .unwrap();
    let l = s.lead("cap").await;
    assert_eq!(
        (l.expired_unclaimed, l.admitted, l.active, l.queue_len),
        (1, 1, 3, 6)
    );
    let m = &s.ticker.metrics;
    assert_eq!(m.expired_unclaimed.with_label_values(&["cap"]).get(), 1);
    assert_eq!(m.admitted.with_label_values(&["cap"]).get(), 4);
    assert_eq!(gauge(&s, "cap"), (6, 3, 60000, 1));
}

#[tokio::test]
async fn a_paused_event_admits_nobody_however_many_ticks_run() {
    let prefix = unique_prefix();
    let mut s = Stepper::new(&prefix, "pauser");
    configure(&s.ticker.store, "p", open(60000, 0, "paused")).await;
    join(&s.ticker.store, "p", "f", 10).await;
    s.watch("p").await;
    for _ in 0..5 {
        let l = s.lead("p").await;
        assert_eq!((l.admitted, l.queue_len), (0, 10));
        pace().await;
    }
    assert_eq!(zcard(s.ticker.store.key("p", "q")).await, 10);
    // Resumed: the script reads the mode from Redis, so the very config change is enough.
    configure(&s.ticker.store, "p", open(60000, 0, "queue")).await;
    let l = s.lead_until_admitted("p", Duration::from_secs(5)).await;
    assert_eq!(l.admitted + l.queue_len, 10);
}

#[tokio::test]
async fn a_follower_admits_nothing_while_the_lease_is_held() {
    let prefix = unique_prefix();
    let mut leader = Stepper::new(&prefix, "leader");
    let mut follower = Stepper::new(&prefix, "follower");
    // 6000/min: at most 10 a tick, so the leader cannot empty the queue in one go.
    configure(&leader.ticker.store, "l", open(6000, 0, "queue")).await;
    join(&leader.ticker.store, "l", "f", 20).await;
    leader.watch("l").await;
    follower.watch("l").await;
    assert_eq!(leader.lead("l").await.admitted, 0);
    for _ in 0..5 {
        pace().await;
        assert_eq!(follower.tick_event("l").await, TickOutcome::Follower);
    }
    assert_eq!(zcard(leader.ticker.store.key("l", "q")).await, 20);
    assert!(!follower.state.is_leader("l"));
    let fm = &follower.ticker.metrics;
    assert_eq!(fm.is_leader.with_label_values(&["l"]).get(), 0);
    assert_eq!(fm.admitted.with_label_values(&["l"]).get(), 0);
    // The leader renews with a short lease, then stops (as if it died); once the lease lapses
    // the follower's next tick takes over and admits the rest.
    leader.ticker.lease_ttl_ms = 300;
    let by_leader = leader.lead("l").await.admitted;
    assert!(by_leader > 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match follower.tick_event("l").await {
            TickOutcome::Follower => {
                assert!(Instant::now() < deadline, "the lease never lapsed");
                pace().await;
            }
            o => break led(&o),
        }
    };
    assert!(follower.state.is_leader("l"));
    let mut rest = first.admitted;
    while by_leader + rest < 20 {
        pace().await;
        let l = follower.lead("l").await;
        assert!(Instant::now() < deadline, "admission stalled: {l:?}");
        rest += l.admitted;
    }
    assert!(rest > 0, "the follower never admitted");
    let adm = admissions(
        &mut redis_conn().await,
        &leader.ticker.store.key("l", "admissions"),
    )
    .await;
    assert_eq!(adm.len(), 20, "someone admitted twice or lost");
    let by = |who: &str| adm.iter().filter(|(_, b, _)| b == who).count() as u64;
    assert_eq!((by("leader"), by("follower")), (by_leader, rest));
    let mut names: Vec<_> = adm.iter().map(|(a, _, _)| a.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 20);
}

#[tokio::test]
async fn auto_mode_recomputes_the_rate_once_per_adjust_period() {
    let prefix = unique_prefix();
    let mut s = Stepper::new(&prefix, "auto");
    let store = &s.ticker.store;
    configure(
        store,
        "a",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
               "auto": {"floor": 60, "ceiling": 6000}}),
    )
    .await;
    join(store, "a", "f", 50).await;
    // Another instance reports booking failing half its calls.
    store
        .put_upstream_stats("gw-other", "100 50 40")
        .await
        .unwrap();
    s.watch("a").await;
    let t0 = Instant::now();
    s.state = TickerState::new(t0);
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let p = AUTO_ADJUST_EVERY.as_millis() as u64;
    // Due, but this instance has not led a tick yet (it does not know the queue): no change.
    let r = s.ticker.tick_once(&mut s.state, at(p)).await;
    assert!(r.adjust_due);
    assert!(r.auto_rates.is_empty());
    assert_eq!(led(r.outcome("a").unwrap()).rate, 600);
    // Not due again until a whole period after the last due tick.
    let r = s.ticker.tick_once(&mut s.state, at(p + p - 1)).await;
    assert!(!r.adjust_due);
    assert_eq!(led(r.outcome("a").unwrap()).rate, 600);
    // Due and leading: multiplicative decrease (×0.7), applied by this very tick.
    let r = s.ticker.tick_once(&mut s.state, at(2 * p)).await;
    assert!(r.adjust_due);
    assert_eq!(r.auto_rates, vec![("a".to_owned(), 420)]);
    assert_eq!(led(r.outcome("a").unwrap()).rate, 420);
    assert_eq!(gauge(&s, "a").2, 420);
    // Between adjustments the stored rate holds.
    let r = s.ticker.tick_once(&mut s.state, at(2 * p + 1)).await;
    assert!(r.auto_rates.is_empty());
    assert_eq!(led(r.outcome("a").unwrap()).rate, 420);
    // Booking recovers and fans wait: additive increase by 5 % of the ceiling.
    s.ticker
        .store
        .put_upstream_stats("gw-other", "100 0 40")
        .await
        .unwrap();
    s.watch("a").await;
    let r = s.ticker.tick_once(&mut s.state, at(3 * p)).await;
    assert_eq!(r.auto_rates, vec![("a".to_owned(), 720)]);
    assert_eq!(led(r.outcome("a").unwrap()).rate, 720);
    let snap = s.ticker.store.load_event("a").await.unwrap().unwrap();
    assert_eq!(snap.auto_rate, Some(720));
}

#[tokio::test]
async fn a_redis_error_ends_the_tick_and_is_counted() {
    let mut s = Stepper::new(&unique_prefix(), "cut-off");
    // Nothing listens there.
    let mut settings = redis_settings(&unique_prefix());
    settings.url = secrecy::SecretString::from(format!("redis://127.0.0.1:{}", free_port()));
    settings.response_timeout_ms = 200;
    s.ticker.store = Store::new(&settings).unwrap();
    let input: EventConfigInput = serde_json::from_value(open(600, 0, "queue")).unwrap();
    let cfg = input.validate(600, 120).unwrap();
    for e in ["x", "y"] {
        s.ticker.live.upsert(
            e,
            EventSnapshot {
                config: Some(cfg.clone()),
                ..EventSnapshot::default()
            },
        );
    }
    for n in 1..=2 {
        let r = s.tick().await;
        assert!(r.error.is_some());
        // The first failing event ends the tick: the other waits for the next one.
        assert!(r.outcomes.is_empty());
        assert_eq!(s.ticker.metrics.redis_errors.get(), n);
    }
    assert!(!s.state.is_leader("x") && !s.state.is_leader("y"));
}
