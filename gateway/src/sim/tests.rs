//! Whole simulations: the invariants, and the numbers that can be worked out by hand.

use super::arrivals::shape;
use super::buyers::BuyerParams;
use super::costs::{self, Costs};
use super::*;

fn room(json: &str) -> EventConfig {
    parse_room(json, 600, 120).unwrap()
}

fn input(curve: &str, room_json: &str, seats: u64) -> SimInput {
    SimInput {
        curve: shape(curve).unwrap(),
        room: room(room_json),
        sale_start_ms: -60_000,
        tick_ms: 250,
        passthrough_batch: 5000,
        buyers: surge_buyers(seats, 0.1),
        sold_out_flag_delay_ms: 500,
        stop_after_sold_out_ms: None,
        max_duration_ms: 3_600_000,
        seed: 1,
    }
}

fn costs() -> Costs {
    Costs {
        gw_joins_per_s: costs::GW_JOINS_PER_S,
        gw_status_memory_per_s: costs::GW_STATUS_PER_S,
        gw_claims_per_s: costs::GW_STATUS_PER_S,
        gw_proxied_per_s: costs::GW_PROXIED_PER_S,
        redis_calls_per_s: costs::REDIS_CALLS_PER_S,
        target_utilization: 0.6,
        queue_shards: 1,
        gateways: None,
        tick_ms: 250,
        refresh_ms: 250,
    }
}

const SURGE_ROOM: &str = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":6000}"#;

#[test]
fn the_surge_profile_admits_at_the_rate_and_sells_out() {
    let (s, tl) = run(&input("ramp", SURGE_ROOM, 6000), &costs());
    assert_eq!(s.fans.arrived, 200_000);
    let c = &s.checks.invariants;
    assert!(c.admission_within_rate && c.within_max_active, "{c:?}");
    assert!(c.min_wait_s.is_some_and(|w| w >= 0.0));
    assert_eq!(s.inventory.sold, 6000);
    let sold_out = s.sold_out_at_s.unwrap();
    // ~3,000 buyers at 100/s, then vanished holds come back 20 s at a time.
    assert!((50.0..140.0).contains(&sold_out), "{sold_out}");
    // Fan k arrives at √(0.012 k) s and is admitted at ~k/100 s: the median admitted fan
    // waits about 35–45 s, whatever the sell-out's exact second.
    assert!((30.0..50.0).contains(&s.wait_s.p50), "{:?}", s.wait_s);
    // Admission stops with the flag: about 100/s until then.
    let admitted = s.fans.buyers.admitted as f64;
    assert!(
        (admitted / (sold_out * 100.0) - 1.0).abs() < 0.03,
        "{admitted}"
    );
    // Per-second rows add up to the totals.
    assert_eq!(tl.rows.iter().map(|r| r.joins).sum::<u64>(), 200_000);
    assert_eq!(s.claims_total, s.fans.buyers.claimed);
    // After the flag nobody else gets in and the queue is told within the poll cap.
    assert!(s.fans.still_waiting_at_end == 0);
    assert_eq!(
        s.fans.told_sold_out_in_queue + s.fans.buyers.admitted + s.fans.refused_at_join,
        200_000
    );
}

#[test]
fn nothing_admitted_before_the_sale_start_and_presale_fans_are_drawn() {
    let mut i = input("flat:rate=100,duration=20", SURGE_ROOM, 0);
    i.sale_start_ms = 10_000;
    let (s, tl) = run(&i, &costs());
    assert_eq!(s.checks.invariants.admitted_before_sale_start, 0);
    assert!(tl.rows.iter().filter(|r| r.t < 10).all(|r| r.admitted == 0));
    // 1,000 pre-sale fans wait for the start; then 100/s, in random order among them.
    assert_eq!(s.fans.buyers.claimed, 2000);
    assert!(s.wait_s.max > 15.0);
}

#[test]
fn max_active_caps_fans_holding_admissions() {
    let room = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":60000,"max_active":300}"#;
    let (s, _) = run(&input("flat:rate=500,duration=30", room, 2000), &costs());
    let c = &s.checks.invariants;
    assert!(c.within_max_active, "{c:?}");
    assert_eq!(c.peak_holding, 300);
    // The cap, not the rate, sets the pace: paid fans free slots at once.
    assert!(s.admitted.peak_per_s < 1000.0);
}

#[test]
fn passthrough_admits_at_the_join_and_paused_admits_nobody() {
    let pass =
        r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":60,"mode":"passthrough"}"#;
    let (s, _) = run(&input("flat:rate=50,duration=10", pass, 0), &costs());
    assert_eq!(s.fans.buyers.claimed, 500);
    assert_eq!(s.wait_s.max, 0.0);
    let paused = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":600,"mode":"paused"}"#;
    let mut i = input("flat:rate=50,duration=10", paused, 0);
    i.max_duration_ms = 120_000;
    let (s, _) = run(&i, &costs());
    assert_eq!(s.fans.buyers.admitted, 0);
    assert_eq!(s.fans.still_waiting_at_end, 500);
    // Paused fans still poll (by position), from memory.
    assert!(s.status_polls.total > 500.0);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let a = run(&input("ramp:peak=500", SURGE_ROOM, 600), &costs()).0;
    let b = run(&input("ramp:peak=500", SURGE_ROOM, 600), &costs()).0;
    assert_eq!(a.sold_out_at_s, b.sold_out_at_s);
    assert_eq!(a.wait_s.p99, b.wait_s.p99);
}

#[test]
fn room_errors_name_the_field() {
    let e = parse_room(
        r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":-1}"#,
        600,
        120,
    )
    .unwrap_err();
    assert!(e.contains("admit_per_minute"), "{e}");
    let e = parse_room(
        r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minut":1}"#,
        600,
        120,
    )
    .unwrap_err();
    assert!(e.contains("admit_per_minut") && e.contains("line 1"), "{e}");
}

#[test]
fn per_fan_polls_settle_on_the_steady_state_rate() {
    // 20,000 fans in 10 s, admitted at 1/s: after a couple of cap intervals the queue polls
    // at the closed-form rate of its ranks (jitter adds ~1.4 %: E[1/x] over ±20 %).
    let room = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":60}"#;
    let mut i = input("flat:rate=2000,duration=10", room, 0);
    i.max_duration_ms = 260_000;
    let (_, tl) = run(&i, &costs());
    let rows: Vec<_> = tl
        .rows
        .iter()
        .filter(|r| (150..250).contains(&r.t))
        .collect();
    let simulated = rows.iter().map(|r| r.status_memory).sum::<f64>() / rows.len() as f64;
    let model = super::polls::PollModel::new(60, 120, true);
    let steady = rows
        .iter()
        .map(|r| model.steady_per_second(r.queue_length, 0))
        .sum::<f64>()
        / rows.len() as f64;
    assert!(
        (simulated / steady - 1.014).abs() < 0.03,
        "{simulated} vs {steady}"
    );
}

/// The surge bench's buyers (2 seats each, 20 s holds), for the unit tests.
pub(super) fn surge_buyers(seats: u64, vanish: f64) -> BuyerParams {
    BuyerParams {
        seats,
        seats_per_fan: 2,
        vanish,
        no_show: 0.0,
        think_ms: 200,
        booking_ms: 30,
        hold_ttl_s: 20,
        look_every_ms: 1000,
        seat_wait_extra_ms: 15_000,
        token_ttl_s: 600,
        session_slack_s: 30,
        max_session_s: 1800,
    }
}

const NET_ROOM: &str = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":600,
    "mode":"safety_net","safety_net":{"arrivals_per_minute":300}}"#;

#[test]
fn a_calm_room_under_the_safety_net_lets_everyone_straight_through() {
    let (s, tl) = run(&input("flat:rate=4,duration=120", NET_ROOM, 0), &costs());
    // 240 arrivals a minute against a threshold of 300: nobody queues.
    assert_eq!(s.fans.arrived, 480);
    assert_eq!((s.fans.passed_at_join, s.fans.queued), (480, 0));
    assert!(tl.rows.iter().all(|r| r.queue_length == 0));
    assert_eq!(s.fans.buyers.admitted, 480);
}

#[test]
fn a_surge_through_the_safety_net_queues_drains_at_the_rate_and_passes_again() {
    // 20 s at 5/s, a 10 s spike at 100/s, then 150 s at 1/s.
    let mut i = input("flat:rate=1,duration=1", NET_ROOM, 0);
    i.curve = super::arrivals::Curve {
        per_second: [vec![5; 20], vec![100; 10], vec![1; 150]].concat(),
        name: "spike".into(),
        sale_start_s: -60.0,
    };
    let (s, tl) = run(&i, &costs());
    let c = &s.checks.invariants;
    assert!(c.admission_within_rate && c.within_max_active, "{c:?}");
    // The first 100, then 200 of the spike (300 in the minute), pass; the rest of the spike
    // queues, and so does everyone behind the backlog.
    let row = |t: i64| tl.rows.iter().find(|r| r.t == t).unwrap();
    let spike_queued: u64 = (20..30).map(|t| row(t).joins).sum::<u64>() - 200;
    assert!(s.fans.queued >= spike_queued, "{} queued", s.fans.queued);
    // The backlog drains at the admit rate (10/s, one tick's burst at most above it) ...
    assert!(row(60).queue_length > 0);
    let drained = tl
        .rows
        .iter()
        .find(|r| r.t > 30 && r.queue_length == 0)
        .map(|r| r.t)
        .unwrap();
    assert!(
        (105..=115).contains(&drained),
        "drained at {drained} s (from 22 s, 800 + 1/s drained at 10/s: 110 s)"
    );
    // ... and then the net is calm again: the last minute's fans all pass at the join.
    let late: Vec<&super::timeline::Second> =
        tl.rows.iter().filter(|r| r.t >= 150 && r.t < 180).collect();
    assert!(late.iter().all(|r| r.queue_length == 0));
    assert_eq!(
        late.iter().map(|r| r.admitted).sum::<u64>(),
        late.iter().map(|r| r.joins).sum::<u64>()
    );
    assert_eq!(
        s.fans.passed_at_join + s.fans.queued + s.fans.refused_at_join,
        s.fans.arrived
    );
    assert!(
        s.fans.passed_at_join >= 300 + 30,
        "{}",
        s.fans.passed_at_join
    );
}

#[test]
fn the_safety_net_never_passes_more_than_max_active() {
    let room = r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":600,"max_active":50,
        "mode":"safety_net","safety_net":{"arrivals_per_minute":100000}}"#;
    let (s, _) = run(&input("flat:rate=20,duration=30", room, 6000), &costs());
    let c = &s.checks.invariants;
    assert!(c.within_max_active && c.peak_holding <= 50, "{c:?}");
    assert!(s.fans.passed_at_join >= 50, "{}", s.fans.passed_at_join);
    assert!(s.fans.queued > 0);
}
