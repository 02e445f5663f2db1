//! Seat kills and hold-backs (issue 18): all or nothing, refused on held or sold seats, never
//! both killed and held under racing holds, released back on sale, audited, actor required.

use crate::events::{create_event, small_event};
use crate::helpers::{ADMIN_TOKEN, TestApp, json, who};
use serde_json::{Value, json};

async fn ops_post(app: &TestApp, path: &str, actor: Option<&str>, body: &Value) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(body);
    if let Some(a) = actor {
        req = req.header("X-Floodgate-Actor", a);
    }
    json(req.send().await.expect("request")).await
}

/// Every seat's status and kill reason, for "nothing changed" checks.
async fn seats(app: &TestApp, event: &str) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT seat_id, status, kill_reason FROM seats WHERE event_id = $1 ORDER BY seat_id",
    )
    .bind(event)
    .fetch_all(&app.pool)
    .await
    .expect("seats")
}

async fn audit_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ops_audit WHERE action LIKE 'seats.%'")
        .fetch_one(&app.pool)
        .await
        .expect("audit")
}

#[tokio::test]
async fn kills_are_all_or_nothing_audited_and_released() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let token = app.admission("ann", "ev");
    let (status, hold) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-3"]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    let before = seats(&app, "ev").await;
    let kill = json!({"seats": ["S1-R1-1", "S1-R1-2"], "reason": "production"});

    // Refusals change nothing and write no audit entry.
    let resp = app
        .client
        .post(app.url("/admin/events/ev/seat-kills"))
        .json(&kill)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let (status, v) = ops_post(&app, "/admin/events/ev/seat-kills", None, &kill).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("ACTOR_REQUIRED")),
        "{v}"
    );
    for (bad, want) in [
        (
            json!({"seats": ["S1-R1-1"], "reason": "production", "colour": "red"}),
            422,
        ),
        (json!({"seats": ["S1-R1-1"], "reason": "lunch"}), 422),
        (json!({"seats": [], "reason": "production"}), 422),
        (
            json!({"seats": ["S1-R1-1", "nope"], "reason": "production"}),
            422,
        ),
        (
            json!({"seats": ["S1-R1-1", "S1-R1-3"], "reason": "production"}),
            409,
        ),
    ] {
        let (status, v) = ops_post(&app, "/admin/events/ev/seat-kills", Some("alice"), &bad).await;
        assert_eq!(status, want, "{bad}: {v}");
        if want == 409 {
            assert_eq!(v["code"], "SEATS_NOT_FREE");
            assert_eq!(v["seats"], json!(["S1-R1-3"]));
        }
    }
    let (status, _) = ops_post(&app, "/admin/events/nope/seat-kills", Some("alice"), &kill).await;
    assert_eq!(status, 404);
    assert_eq!(seats(&app, "ev").await, before);
    assert_eq!(audit_count(&app).await, 0);

    let (status, v) = ops_post(&app, "/admin/events/ev/seat-kills", Some("alice"), &kill).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-1"]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 409, "a killed seat was held: {v}");
    // The seat map (JSON and compact, which agree) shows killed seats as sold.
    let map = crate::seat_map::compact_equals_json(&app, "ev").await;
    for seat in ["S1-R1-1", "S1-R1-2"] {
        let shown = map
            .iter()
            .find(|s| s["seat_id"] == seat)
            .expect("seat in map");
        assert_eq!(shown["status"], "sold", "{seat}");
    }

    // Release refuses seats that are not held back, then puts the killed ones back.
    let (status, v) = ops_post(
        &app,
        "/admin/events/ev/seat-kills/release",
        Some("bob"),
        &json!({"seats": ["S1-R1-1", "S1-R1-4"]}),
    )
    .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("SEATS_NOT_HELD_BACK")),
        "{v}"
    );
    let (status, v) = ops_post(
        &app,
        "/admin/events/ev/seat-kills/release",
        Some("bob"),
        &json!({"seats": ["S1-R1-1", "S1-R1-2"]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(seats(&app, "ev").await, before);
    let (status, _) = json(
        app.post(
            "/api/events/ev/holds",
            &token,
            &json!({"seats": ["S1-R1-1"]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201);

    let (status, log) = json(app.admin_get("/admin/audit?event=ev&target=event:ev").await).await;
    assert_eq!(status, 200, "{log}");
    let actions: Vec<(String, String)> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (who(e), e["action"].as_str().expect("action").to_owned()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("bootstrap/bob".into(), "seats.release".into()),
            ("bootstrap/alice".into(), "seats.kill".into()),
            ("bootstrap".into(), "event.create".into())
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn kills_racing_holds_leave_each_seat_killed_or_held_never_both() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("race", 10, 10, 10, 1)).await;
    let seat_ids: Vec<String> = (1..=10)
        .flat_map(|r| (1..=10).map(move |n| format!("S1-R{r}-{n}")))
        .collect();
    let mut tasks = Vec::new();
    for (i, seat) in seat_ids.iter().enumerate() {
        let (client, base) = (app.client.clone(), app.url(""));
        let token = app.admission(&format!("fan-{i}"), "race");
        let seat = seat.clone();
        tasks.push(tokio::spawn(async move {
            let kill = client
                .post(format!("{base}/admin/events/race/seat-kills"))
                .bearer_auth(ADMIN_TOKEN)
                .header("X-Floodgate-Actor", "racer")
                .json(&json!({"seats": [seat], "reason": "production"}))
                .send();
            let hold = client
                .post(format!("{base}/api/events/race/holds"))
                .bearer_auth(&token)
                .json(&json!({"seats": [seat]}))
                .send();
            let (k, h) = tokio::join!(kill, hold);
            (
                seat,
                k.expect("kill").status().as_u16(),
                h.expect("hold").status().as_u16(),
            )
        }));
    }
    for t in tasks {
        let (seat, kill, hold) = t.await.expect("task");
        let (status, reason): (String, Option<String>) = sqlx::query_as(
            "SELECT status, kill_reason FROM seats WHERE event_id = 'race' AND seat_id = $1",
        )
        .bind(&seat)
        .fetch_one(&app.pool)
        .await
        .expect("seat");
        match (kill, hold) {
            (200, 409) => assert_eq!(
                (status.as_str(), reason.as_deref()),
                ("held_back", Some("production")),
                "{seat}"
            ),
            (409, 201) => assert_eq!((status.as_str(), reason), ("held", None), "{seat}"),
            other => panic!("{seat}: kill and hold answered {other:?}"),
        }
    }
    let kills: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ops_audit WHERE action = 'seats.kill'")
            .fetch_one(&app.pool)
            .await
            .expect("audit");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats WHERE event_id = 'race' AND status = 'held_back'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("killed");
    assert_eq!(kills, killed, "one audit entry per kill that committed");
    app.stop().await;
}

/// A kill or release with an `Idempotency-Key`: the same key and body replay the first answer
/// (not `409 SEATS_NOT_FREE` for a kill that went through), another body under the key is
/// `422`, and a refused change stores nothing, so the key works once the seats are free.
#[tokio::test]
async fn kills_and_releases_replay_under_their_idempotency_key() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 2, 5, 10, 1)).await;
    let keyed = |method: reqwest::Method, path: &str, key: &str, body: &Value| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Floodgate-Actor", "ops")
            .header("Idempotency-Key", key)
            .json(body)
    };
    async fn send(req: reqwest::RequestBuilder) -> (u16, Value, bool) {
        let resp = req.send().await.expect("request");
        let replayed = resp.headers().get("idempotent-replayed").is_some();
        let (s, v) = json(resp).await;
        (s, v, replayed)
    }
    let kill =
        json!({"seats": ["S1-R1-2", "S1-R1-1"], "reason": "accessibility", "note": "wheelchair"});
    let path = "/admin/events/ev/seat-kills";
    let (s, first, replayed) = send(keyed(reqwest::Method::POST, path, "kill-1", &kill)).await;
    assert_eq!((s, replayed), (200, false), "{first}");
    let after = seats(&app, "ev").await;
    // 20 retries at once: every one the stored answer, nothing changes.
    let retries = futures::future::join_all(
        (0..20).map(|_| send(keyed(reqwest::Method::POST, path, "kill-1", &kill))),
    )
    .await;
    for (s, v, replayed) in retries {
        assert_eq!((s, replayed), (200, true), "{v}");
        assert_eq!(v, first);
    }
    // Without the key a retry is refused: the seats are killed already.
    let (s, v) = ops_post(&app, path, Some("ops"), &kill).await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("SEATS_NOT_FREE")),
        "{v}"
    );
    // The same key with another body.
    let other = json!({"seats": ["S1-R1-3"], "reason": "production"});
    let (s, v, _) = send(keyed(reqwest::Method::POST, path, "kill-1", &other)).await;
    assert_eq!(
        (s, v["code"].clone()),
        (422, json!("IDEMPOTENCY_KEY_REUSED")),
        "{v}"
    );
    assert_eq!(
        seats(&app, "ev").await,
        after,
        "a replay or a refusal wrote"
    );
    assert_eq!(audit_count(&app).await, 1);

    // Releases, by POST .../release and by DELETE, each under its own key.
    let release = json!({"seats": ["S1-R1-1"]});
    let (s, v, replayed) = send(keyed(
        reqwest::Method::POST,
        "/admin/events/ev/seat-kills/release",
        "rel-1",
        &release,
    ))
    .await;
    assert_eq!(
        (s, v["status"].clone(), replayed),
        (200, json!("available"), false),
        "{v}"
    );
    let (s, again, replayed) = send(keyed(
        reqwest::Method::POST,
        "/admin/events/ev/seat-kills/release",
        "rel-1",
        &release,
    ))
    .await;
    assert_eq!((s, replayed), (200, true));
    assert_eq!(again, v);
    // The same key on DELETE is another request.
    let (s, v, _) = send(keyed(reqwest::Method::DELETE, path, "rel-1", &release)).await;
    assert_eq!(
        (s, v["code"].clone()),
        (422, json!("IDEMPOTENCY_KEY_REUSED")),
        "{v}"
    );
    // A refused release (S1-R1-1 is on sale again) keeps no answer under its key...
    let (s, v, _) = send(keyed(reqwest::Method::DELETE, path, "rel-2", &release)).await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("SEATS_NOT_HELD_BACK")),
        "{v}"
    );
    // ...so the key works for the same request once it can succeed.
    let (s, _, _) = send(keyed(
        reqwest::Method::POST,
        path,
        "kill-2",
        &json!({"seats": ["S1-R1-1"], "reason": "other"}),
    ))
    .await;
    assert_eq!(s, 200);
    let (s, v, replayed) = send(keyed(reqwest::Method::DELETE, path, "rel-2", &release)).await;
    assert_eq!(
        (s, v["status"].clone(), replayed),
        (200, json!("available"), false),
        "{v}"
    );
    assert_eq!(audit_count(&app).await, 4);
    // A key too long is refused before anything runs.
    let (s, v, _) = send(keyed(reqwest::Method::POST, path, &"k".repeat(300), &kill)).await;
    assert_eq!(s, 422, "{v}");
}
