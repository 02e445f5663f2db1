//! The sweeper: expired active holds are ended once, with their seats, GA units and usage,
//! even with several sweepers running at the same time.

use crate::events::{create_event, db_state, small_event};
use crate::helpers::{TestApp, json};
use futures::future::join_all;
use serde_json::json;

#[tokio::test]
async fn the_sweeper_releases_expired_holds_only() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("sw", 1, 10, 20, 4)).await;
    let mut ids = Vec::new();
    for (i, seats) in [
        ["S1-R1-1", "S1-R1-2"],
        ["S1-R1-3", "S1-R1-4"],
        ["S2-R1-1", "S2-R1-2"],
    ]
    .iter()
    .enumerate()
    {
        let token = app.admission(&format!("fan-{i}"), "sw");
        let (status, h) = json(
            app.post("/api/events/sw/holds", &token, &json!({"seats": seats}))
                .await,
        )
        .await;
        assert_eq!(status, 201);
        ids.push(h["hold_id"].as_str().unwrap().to_owned());
    }
    let token = app.admission("ga-fan", "sw");
    let (status, g) = json(
        app.post(
            "/api/events/sw/ga-holds",
            &token,
            &json!({"tier": "FLOOR", "quantity": 3}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201);
    let gid = g["hold_id"].as_str().unwrap().to_owned();
    // Expire the first seat hold and the GA hold.
    for id in [&ids[0], &gid] {
        sqlx::query(
            "UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
        )
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
        sqlx::query("UPDATE seats SET held_until = clock_timestamp() - interval '1 second' WHERE hold_id = $1").bind(id).execute(&app.pool).await.unwrap();
    }
    assert_eq!(
        booking::inventory::sweeper::sweep_all(&app.state.inventory)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        booking::inventory::sweeper::sweep_all(&app.state.inventory)
            .await
            .unwrap(),
        0
    );
    let statuses: Vec<(String, String)> =
        sqlx::query_as("SELECT id, status FROM holds ORDER BY created_at")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    for (id, status) in statuses {
        let want = if id == ids[0] || id == gid {
            "expired"
        } else {
            "active"
        };
        assert_eq!(status, want, "{id}");
    }
    let state = db_state(&app.pool).await;
    assert_eq!(state["held"], 4);
    assert_eq!(state["usage"], 4);
    assert_eq!(state["ga_available"], 20);
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("floodgate_booking_holds_expired_total{kind=\"ga\"} 1"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn concurrent_sweepers_expire_each_hold_exactly_once() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("many", 10, 20, 400, 8)).await;
    // 200 seat holds and 100 GA holds from distinct accounts.
    let seat_holds = join_all((0..200).map(|i| {
        let app = &app;
        async move {
            let section = if i % 2 == 0 { "S1" } else { "S2" };
            let row = 1 + (i / 2) % 10;
            let n = 1 + 2 * ((i / 20) % 10);
            let token = app.admission(&format!("s-{i}"), "many");
            let seats = [
                format!("{section}-R{row}-{n}"),
                format!("{section}-R{row}-{}", n + 1),
            ];
            json(
                app.post("/api/events/many/holds", &token, &json!({"seats": seats}))
                    .await,
            )
            .await
        }
    }))
    .await;
    assert!(
        seat_holds.iter().all(|(s, _)| *s == 201),
        "{:?}",
        seat_holds.iter().find(|(s, _)| *s != 201)
    );
    let ga_holds = join_all((0..100).map(|i| {
        let app = &app;
        async move {
            let token = app.admission(&format!("g-{i}"), "many");
            json(
                app.post(
                    "/api/events/many/ga-holds",
                    &token,
                    &json!({"tier": "FLOOR", "quantity": 2}),
                )
                .await,
            )
            .await
        }
    }))
    .await;
    assert!(ga_holds.iter().all(|(s, _)| *s == 201));
    sqlx::query("UPDATE holds SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE seats SET held_until = clock_timestamp() - interval '1 second' WHERE status = 'held'").execute(&app.pool).await.unwrap();

    // Four sweepers, small batches, all at once.
    let sweepers = (0..4).map(|_| {
        let pool = app.pool.clone();
        tokio::spawn(async move {
            let mut total = 0;
            loop {
                let n = booking::inventory::sweeper::sweep_once(&pool, 7)
                    .await
                    .unwrap();
                if n == 0 {
                    return total;
                }
                total += n;
            }
        })
    });
    let totals: Vec<u64> = join_all(sweepers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(totals.iter().sum::<u64>(), 300, "{totals:?}");
    let active: i64 = sqlx::query_scalar("SELECT count(*) FROM holds WHERE status <> 'expired'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(active, 0);
    let state = db_state(&app.pool).await;
    assert_eq!(state["held"], 0);
    assert_eq!(state["usage"], 0, "usage must be given back exactly once");
    assert_eq!(state["ga_available"], 400);
    app.stop().await;
}
