//! A new event's seats are found by their seat ids, not by walking the event: booking keeps
//! generic plans, and the hold, order and pay statements must not read every seat of the
//! event when the planner's statistics of `seats` predate it (a young deployment's first
//! big event, analysed while empty).

use crate::helpers::{TestApp, json};
use crate::plans::rows_read_by;

/// Seats analysed while empty, then a 5,000-seat event created through the admin API (which
/// refreshes them: `inventory::events::repo::analyze_new_seats`); the seat hold statement and
/// the pin of its hold (whose seat lookup the pay statements share), under generic plans as
/// booking runs them, each read a handful of rows; so does the batched seat hold statement. Before, the plans made from the empty
/// table's statistics looked seats up by `event_id` alone: the hold's write read all 5,000
/// seats of the event and the pin every seat too (the purchase benchmark measured twice the
/// Postgres CPU per purchase, 5.3 ms against 3.2 ms, whenever autovacuum had not analysed the
/// table before the run).
#[tokio::test]
async fn a_new_events_seats_are_read_by_seat_under_generic_plans() {
    let app = TestApp::spawn().await;
    sqlx::query("ANALYZE seats")
        .execute(&app.pool)
        .await
        .expect("analyse the empty table");
    let (status, body) = json(
        app.admin_post(
            "/admin/events",
            &serde_json::json!({
                "id": "big", "name": "Big", "sale_start": "2026-01-01T00:00:00Z",
                "price_tiers": [{"tier": "A", "price": 5000}],
                "seat_map": {"sections": [
                    {"name": "R", "rows": 100, "seats_per_row": 50, "price_tier": "A"}]},
            }),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let mut conn = app.pool.acquire().await.expect("conn");
    let (read, plan) = rows_read_by(
        &mut conn,
        "generic",
        "hold_seats",
        booking::inventory::holds::HOLD_SEATS,
        "('big', 'fan-1', 'hold-1', ARRAY['R-R7-25'], 1)",
    )
    .await;
    assert!(read < 100.0, "the seat hold read {read} rows: {plan:#}");
    let held: (String, String) = sqlx::query_as(
        "SELECT status, hold_id FROM seats WHERE event_id = 'big' AND seat_id = 'R-R7-25'",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the held seat");
    assert_eq!(held, ("held".to_owned(), "hold-1".to_owned()));

    // The same holds, batched (`holds::grouped`): two requests, three seats, one statement.
    let (_, plan) = rows_read_by(
        &mut conn,
        "generic",
        "hold_seats_grouped",
        booking::inventory::holds::grouped::HOLD_SEATS_GROUPED,
        "('big', ARRAY['fan-2', 'fan-3'], ARRAY['hold-2', 'hold-3'], ARRAY[2, 1],
          ARRAY['R-R8-1', 'R-R8-2', 'R-R9-9'], ARRAY[1, 1, 2])",
    )
    .await;
    // Its answer reads the statement's own parts many times over, so count the seat rows:
    // the three asked for, each read once to lock it and once to write it.
    let seats = rows_read_of(&plan[0]["Plan"], "seats");
    assert!(
        seats <= 6.0,
        "the batch of seat holds read {seats} seat rows: {plan:#}"
    );
    let held: Vec<(String, String)> = sqlx::query_as(
        "SELECT seat_id, hold_id FROM seats
          WHERE event_id = 'big' AND status = 'held' AND hold_id <> 'hold-1' ORDER BY seat_id",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("the held seats");
    let held: Vec<(&str, &str)> = held.iter().map(|(s, h)| (s.as_str(), h.as_str())).collect();
    assert_eq!(
        held,
        [
            ("R-R8-1", "hold-2"),
            ("R-R8-2", "hold-2"),
            ("R-R9-9", "hold-3")
        ]
    );

    let (read, plan) = rows_read_by(
        &mut conn,
        "generic",
        "pin_hold",
        booking::inventory::holds::repo::PIN_HOLD,
        "('hold-1', 'fan-1', 600)",
    )
    .await;
    assert!(read < 100.0, "the pin read {read} rows: {plan:#}");
    let pinned: String = sqlx::query_scalar("SELECT status FROM holds WHERE id = 'hold-1'")
        .fetch_one(&mut *conn)
        .await
        .expect("the pinned hold");
    assert_eq!(pinned, "ordered");
}

/// Rows a plan read from `table`: its scan nodes' rows out (times their loops) and the rows
/// their filters threw away.
fn rows_read_of(node: &serde_json::Value, table: &str) -> f64 {
    let n = |k: &str| node[k].as_f64().unwrap_or(0.0);
    let own = if node["Relation Name"] == table && node["Node Type"] != "ModifyTable" {
        n("Actual Rows") * n("Actual Loops").max(1.0) + n("Rows Removed by Filter")
    } else {
        0.0
    };
    own + node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(|p| rows_read_of(p, table)).sum())
        .unwrap_or(0.0)
}
