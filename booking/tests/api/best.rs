//! Best available and `no_orphans` through the real service: the pick's order (front rows,
//! centre, the seat map's ranks), the stranding rule, refusals that change nothing.

use crate::events::{create_event, db_state};
use crate::helpers::{TestApp, json};
use serde_json::{Value, json};

/// An event of one section `S1` (`rows` x `per_row`, tier A) and a second one `S2` (tier B).
pub fn hall(id: &str, rows: i32, per_row: i32, no_orphans: bool, limit: i32) -> Value {
    json!({
        "id": id,
        "name": "Hall",
        "sale_start": "2020-01-01T00:00:00Z",
        "max_tickets_per_account": limit,
        "no_orphans": no_orphans,
        "price_tiers": [{"tier": "A", "price": 1000}, {"tier": "B", "price": 500}],
        "seat_map": {"sections": [
            {"name": "S1", "rows": rows, "seats_per_row": per_row, "price_tier": "A"},
            {"name": "S2", "rows": 1, "seats_per_row": per_row, "price_tier": "B"}
        ]},
    })
}

pub async fn best(app: &TestApp, event: &str, account: &str, body: Value) -> (u16, Value) {
    let token = app.admission(account, event);
    json(
        app.post(
            &format!("/api/events/{event}/holds"),
            &token,
            &json!({ "best_available": body }),
        )
        .await,
    )
    .await
}

pub async fn explicit(app: &TestApp, event: &str, account: &str, seats: &[&str]) -> (u16, Value) {
    let token = app.admission(account, event);
    json(
        app.post(
            &format!("/api/events/{event}/holds"),
            &token,
            &json!({ "seats": seats }),
        )
        .await,
    )
    .await
}

fn seats(v: &Value) -> Vec<&str> {
    v["seats"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn best_available_takes_the_front_row_centre_first() {
    let app = TestApp::spawn().await;
    create_event(&app, &hall("ev", 3, 10, false, 10)).await;
    let (s, h) = best(&app, "ev", "a", json!({"quantity": 2})).await;
    assert_eq!(s, 201, "{h}");
    assert_eq!(seats(&h), ["S1-R1-5", "S1-R1-6"]);
    assert_eq!(
        (h["kind"].as_str(), h["total"].as_i64()),
        (Some("seats"), Some(2000))
    );
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM seats WHERE hold_id = $1")
        .bind(h["hold_id"].as_str().expect("hold id"))
        .fetch_one(&app.pool)
        .await
        .expect("test query");
    assert_eq!(held, 2);
    // Next to them, on the left (ties go to the lower seat); seats 1-2 stay a pair.
    let (s, h) = best(&app, "ev", "b", json!({"quantity": 2, "section": "S1"})).await;
    assert_eq!((s, seats(&h)), (201, vec!["S1-R1-3", "S1-R1-4"]));
    // Only tier B: the other section (its row 1 ranks like S1's).
    let (s, h) = best(&app, "ev", "c", json!({"quantity": 3, "tiers": ["B"]})).await;
    assert_eq!((s, seats(&h)), (201, vec!["S2-R1-4", "S2-R1-5", "S2-R1-6"]));
    // Row 1 has 1, 2 and 7..=10 free: 4 together only as 7..=10.
    let (s, h) = best(&app, "ev", "d", json!({"quantity": 4, "section": "S1"})).await;
    assert_eq!(
        (s, seats(&h)),
        (201, vec!["S1-R1-7", "S1-R1-8", "S1-R1-9", "S1-R1-10"])
    );
    let (s, h) = best(&app, "ev", "e", json!({"quantity": 3, "section": "S1"})).await;
    assert_eq!(
        (s, seats(&h)),
        (201, vec!["S1-R2-4", "S1-R2-5", "S1-R2-6"]),
        "{h}"
    );
    app.stop().await;
}

#[tokio::test]
async fn best_available_never_strands_a_seat_and_says_why_nothing_fits() {
    let app = TestApp::spawn().await;
    create_event(&app, &hall("ev", 1, 4, false, 10)).await;
    // 3 of a row of 4 always leaves one alone; the other section is tier B, excluded.
    let (s, e) = best(&app, "ev", "a", json!({"quantity": 3, "tiers": ["A"]})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (409, Some("NO_SEATS_TOGETHER")),
        "{e}"
    );
    assert_eq!(
        (e["quantity"].as_i64(), e["free"].as_i64()),
        (Some(3), Some(4))
    );
    // Not adjacent: still no way to take 3 of 4 without stranding one.
    let (s, _) = best(
        &app,
        "ev",
        "a",
        json!({"quantity": 3, "tiers": ["A"], "adjacent": false}),
    )
    .await;
    assert_eq!(s, 409);
    let (s, h) = best(&app, "ev", "a", json!({"quantity": 4, "section": "S1"})).await;
    assert_eq!((s, seats(&h).len()), (201, 4), "{h}");
    let before = db_state(&app.pool).await;
    let (s, e) = best(&app, "ev", "b", json!({"quantity": 1, "section": "S1"})).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("SOLD_OUT")), "{e}");
    assert_eq!(db_state(&app.pool).await, before);
    // S2's row of 4: the centre pair would strand both ends, so an end pair (either).
    let (s, h) = best(&app, "ev", "c", json!({"quantity": 2, "adjacent": false})).await;
    assert_eq!(s, 201, "{h}");
    let got = seats(&h);
    assert!(
        got == ["S2-R1-1", "S2-R1-2"] || got == ["S2-R1-3", "S2-R1-4"],
        "{h}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_seat_map_can_rank_seats() {
    let app = TestApp::spawn().await;
    let mut ev = hall("ev", 3, 10, false, 10);
    ev["seat_map"]["ranks"] = json!({"S1-R3-1": 0, "S1-R3-2": 0});
    ev["seat_map"]["seats"] = json!([{"seat_id": "BOX-1", "section": "BOX", "row": 1,
        "number": 1, "price_tier": "A", "rank": 0}]);
    create_event(&app, &ev).await;
    let (s, h) = best(&app, "ev", "a", json!({"quantity": 2})).await;
    assert_eq!((s, seats(&h)), (201, vec!["S1-R3-1", "S1-R3-2"]), "{h}");
    let (s, h) = best(&app, "ev", "b", json!({"quantity": 1})).await;
    assert_eq!((s, seats(&h)), (201, vec!["BOX-1"]), "{h}");
    // Ranks must name seats of the map: nothing of the event is written otherwise.
    let before = db_state(&app.pool).await;
    let mut bad = hall("ev2", 1, 2, false, 4);
    bad["seat_map"]["ranks"] = json!({"S9-R1-1": 3});
    let (s, e) = json(app.admin_post("/admin/events", &bad).await).await;
    assert_eq!(
        (s, e["field"].as_str()),
        (422, Some("seat_map.ranks")),
        "{e}"
    );
    assert_eq!(db_state(&app.pool).await, before);
    app.stop().await;
}

#[tokio::test]
async fn bad_best_available_requests_change_nothing() {
    let app = TestApp::spawn().await;
    create_event(&app, &hall("ev", 2, 10, false, 10)).await;
    let before = db_state(&app.pool).await;
    let token = app.admission("a", "ev");
    let cases = [
        json!({"best_available": {"quantity": 0}}),
        json!({"best_available": {"quantity": -1}}),
        json!({"best_available": {"quantity": 11}}),
        json!({"best_available": {"quantity": "2"}}),
        json!({"best_available": {}}),
        json!({"best_available": {"quantity": 2, "colour": "red"}}),
        json!({"best_available": {"quantity": 2, "section": "no such"}}),
        json!({"best_available": {"quantity": 2, "section": "S9"}}),
        json!({"best_available": {"quantity": 2, "tiers": []}}),
        json!({"best_available": {"quantity": 2, "tiers": ["Z"]}}),
        json!({"best_available": {"quantity": 2, "adjacent": "yes"}}),
        json!({"best_available": {"quantity": 2}, "seats": ["S1-R1-1"]}),
        json!({"best_available": null}),
        json!({}),
    ];
    for body in cases {
        let (s, e) = json(app.post("/api/events/ev/holds", &token, &body).await).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (422, Some("VALIDATION_FAILED")),
            "{body}: {e}"
        );
    }
    assert_eq!(db_state(&app.pool).await, before);
    let (s, e) = best(&app, "nope", "a", json!({"quantity": 1})).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("UNKNOWN_EVENT")), "{e}");
    // Over the account's limit (10): refused by the hold statement, nothing written.
    create_event(&app, &hall("lim", 2, 10, false, 2)).await;
    let before_lim = db_state(&app.pool).await;
    let (s, e) = best(&app, "lim", "a", json!({"quantity": 3})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (409, Some("LIMIT_EXCEEDED")),
        "{e}"
    );
    assert_eq!(db_state(&app.pool).await, before_lim);
    app.stop().await;
}

#[tokio::test]
async fn no_orphans_refuses_explicit_holds_that_strand_a_seat() {
    let app = TestApp::spawn().await;
    let created = create_event(&app, &hall("strict", 1, 5, true, 10)).await;
    assert_eq!(created["no_orphans"], true);
    create_event(&app, &hall("loose", 1, 5, false, 10)).await;
    let (s, read) = json(app.admin_get("/admin/events/strict").await).await;
    assert_eq!((s, &read["no_orphans"]), (200, &json!(true)), "{read}");
    let before = db_state(&app.pool).await;
    let (s, e) = explicit(&app, "strict", "a", &["S1-R1-2"]).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("ORPHAN_SEAT")), "{e}");
    assert_eq!(e["seats"], json!(["S1-R1-1"]));
    assert_eq!(
        db_state(&app.pool).await,
        before,
        "a refused hold writes nothing"
    );
    let (s, _) = explicit(&app, "strict", "a", &["S1-R1-1", "S1-R1-2"]).await;
    assert_eq!(s, 201);
    // 4 would strand 3 (between 2 and 4) and 5 (against the row end).
    let (s, e) = explicit(&app, "strict", "b", &["S1-R1-4"]).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("ORPHAN_SEAT")), "{e}");
    assert_eq!(e["seats"], json!(["S1-R1-3", "S1-R1-5"]));
    // A seat that is alone already may be taken, and so may the rest.
    let (s, _) = explicit(&app, "strict", "b", &["S1-R1-3", "S1-R1-4", "S1-R1-5"]).await;
    assert_eq!(s, 201);
    // Taken seats still answer SEAT_TAKEN first.
    let (s, e) = explicit(&app, "strict", "c", &["S1-R1-3"]).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("SEAT_TAKEN")), "{e}");
    // Without the setting, the same stranding hold is fine.
    let (s, _) = explicit(&app, "loose", "a", &["S1-R1-2"]).await;
    assert_eq!(s, 201);
    app.stop().await;
}
