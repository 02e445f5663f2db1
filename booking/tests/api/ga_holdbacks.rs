//! GA hold-backs by ops (issue 18): units of a GA tier out of sale and back, all or nothing,
//! released once, idempotent under a key, audited, and never overselling while hundreds of
//! fans hold the same tier.

use crate::events::{create_event, small_event};
use crate::ga_shards::thin_shards_with_a_refund_open;
use crate::helpers::{ADMIN_TOKEN, TestApp, json};
use serde_json::{Value, json};

async fn ops(
    app: &TestApp,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value, bool) {
    let mut req = app
        .client
        .post(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "ops");
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("request");
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let (s, v) = json(resp).await;
    (s, v, replayed)
}

/// (available, held_back) of tier FLOOR, as the event counts show them.
async fn floor(app: &TestApp, event: &str) -> (i64, i64) {
    let (s, ev) = json(app.admin_get(&format!("/admin/events/{event}")).await).await;
    assert_eq!(s, 200, "{ev}");
    let t = &ev["ga_tiers"][0];
    (
        t["available"].as_i64().expect("available"),
        t["held_back"].as_i64().expect("held_back"),
    )
}

#[tokio::test]
async fn holdbacks_take_units_out_and_release_them_once() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 2, 10, 2)).await;
    let path = "/admin/events/ev/ga-holdbacks";
    let body = json!({"tier": "FLOOR", "quantity": 7, "reason": "sponsor", "note": "label guests"});
    let (s, hb, _) = ops(&app, path, Some("hb-1"), Some(&body)).await;
    assert_eq!(s, 201, "{hb}");
    assert_eq!(
        (hb["status"].clone(), hb["quantity"].clone()),
        (json!("active"), json!(7))
    );
    let id = hb["id"].as_str().expect("id").to_owned();
    assert_eq!(floor(&app, "ev").await, (3, 7));
    // The same key and body: the first answer, nothing more held back.
    let (s, again, replayed) = ops(&app, path, Some("hb-1"), Some(&body)).await;
    assert_eq!((s, replayed), (200, true));
    assert_eq!(again, hb);
    assert_eq!(floor(&app, "ev").await, (3, 7));
    // Refusals change nothing.
    let bad = [
        (
            json!({"tier": "FLOOR", "quantity": 4, "reason": "sponsor"}),
            409,
            "SOLD_OUT",
        ),
        (
            json!({"tier": "NOPE", "quantity": 1, "reason": "sponsor"}),
            422,
            "UNKNOWN_TIER",
        ),
        (
            json!({"tier": "FLOOR", "quantity": 0, "reason": "sponsor"}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            json!({"tier": "FLOOR", "quantity": 1, "reason": "whim"}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            json!({"tier": "FLOOR", "quantity": 1}),
            422,
            "VALIDATION_FAILED",
        ),
        (
            json!({"tier": "FLOOR", "quantity": 1, "reason": "other", "x": 1}),
            422,
            "VALIDATION_FAILED",
        ),
    ];
    for (i, (b, status, code)) in bad.iter().enumerate() {
        let (s, v, _) = ops(&app, path, Some(&format!("bad-{i}")), Some(b)).await;
        assert_eq!((s, v["code"].clone()), (*status, json!(code)), "{b} -> {v}");
    }
    let (s, v, _) = ops(&app, path, Some("hb-1"), Some(&bad[0].0)).await;
    assert_eq!(
        (s, v["code"].clone()),
        (422, json!("IDEMPOTENCY_KEY_REUSED")),
        "{v}"
    );
    let (s, v, _) = ops(&app, "/admin/events/nope/ga-holdbacks", None, Some(&body)).await;
    assert_eq!((s, v["code"].clone()), (404, json!("UNKNOWN_EVENT")), "{v}");
    assert_eq!(floor(&app, "ev").await, (3, 7));
    // Fans get only what is on sale.
    let token = app.admission("fan", "ev");
    let (s, v) = json(
        app.post(
            "/api/events/ev/ga-holds",
            &token,
            &json!({"tier": "FLOOR", "quantity": 4}),
        )
        .await,
    )
    .await;
    assert_eq!((s, v["code"].clone()), (409, json!("SOLD_OUT")), "{v}");

    let (s, list) = json(app.admin_get(path).await).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(
        list["holdbacks"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    // Release: all of it, once.
    let rel = format!("{path}/{id}/release");
    let (s, v, _) = ops(&app, &rel, Some("rel-1"), None).await;
    assert_eq!((s, v["status"].clone()), (200, json!("released")), "{v}");
    assert_eq!(floor(&app, "ev").await, (10, 0));
    let (s, again, replayed) = ops(&app, &rel, Some("rel-1"), None).await;
    assert_eq!((s, replayed, again), (200, true, v));
    let (s, v, _) = ops(&app, &rel, Some("rel-2"), None).await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("HOLDBACK_RELEASED")),
        "{v}"
    );
    let (s, v, _) = ops(&app, &format!("{path}/hb_nope/release"), None, None).await;
    assert_eq!((s, v["code"].clone()), (404, json!("NOT_FOUND")), "{v}");
    assert_eq!(floor(&app, "ev").await, (10, 0));
    let audits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ops_audit WHERE action IN ('ga.holdback', 'ga.holdback.release')",
    )
    .fetch_one(&app.pool)
    .await
    .expect("audit");
    assert_eq!(audits, 2);
}

/// 200 fans holding 2 units each and 20 hold-backs of 10, all at once, on a tier of 300 units
/// over 4 shards (600 asked): every unit ends on sale, held or held back, never two of them.
#[tokio::test]
async fn two_hundred_ga_holds_racing_holdbacks_never_oversell() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 1, 300, 4)).await;
    let holds = futures::future::join_all((0..200).map(|i| {
        let app = &app;
        async move {
            let token = app.admission(&format!("fan-{i}"), "ev");
            let (s, v) = json(
                app.post(
                    "/api/events/ev/ga-holds",
                    &token,
                    &json!({"tier": "FLOOR", "quantity": 2}),
                )
                .await,
            )
            .await;
            (s, v)
        }
    }));
    let holdbacks = futures::future::join_all((0..20).map(|i| {
        let app = &app;
        async move {
            let (s, v, _) = ops(
                app,
                "/admin/events/ev/ga-holdbacks",
                Some(&format!("race-{i}")),
                Some(&json!({"tier": "FLOOR", "quantity": 10, "reason": "production"})),
            )
            .await;
            (s, v)
        }
    }));
    let (holds, holdbacks) = tokio::join!(holds, holdbacks);
    let mut held = 0;
    for (s, v) in &holds {
        match s {
            201 => held += 2,
            409 => assert_eq!(v["code"], "SOLD_OUT", "{v}"),
            _ => panic!("hold: {s} {v}"),
        }
    }
    let mut held_back = 0;
    for (s, v) in &holdbacks {
        match s {
            201 => held_back += 10,
            409 => assert_eq!(v["code"], "SOLD_OUT", "{v}"),
            _ => panic!("hold-back: {s} {v}"),
        }
    }
    let (available, counted_back) = floor(&app, "ev").await;
    let in_holds: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(i.quantity), 0)::bigint FROM hold_ga_items i
           JOIN holds h ON h.id = i.hold_id WHERE h.status = 'active'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("held units");
    let recorded_back: i64 =
        sqlx::query_scalar("SELECT COALESCE(sum(quantity), 0)::bigint FROM ga_holdback_items")
            .fetch_one(&app.pool)
            .await
            .expect("held-back units");
    assert_eq!(
        (in_holds, counted_back, recorded_back),
        (held, held_back, held_back)
    );
    assert_eq!(
        available + in_holds + counted_back,
        300,
        "on sale {available} + held {in_holds} + held back {counted_back}"
    );
    assert!(
        held + held_back > 0 && available < 10,
        "the tier was fought over: {available} left"
    );
}

/// A hold-back that waits for a shard which a return refills meanwhile takes the units it
/// finds there (the hold-back statement used to compute the shard's new count from the
/// statement's snapshot, which failed `CHECK (available >= 0)`: `500`).
#[tokio::test]
async fn a_holdback_waiting_for_a_shard_a_return_refills_takes_what_it_finds() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("refill", 1, 1, 16, 8)).await;
    // One unit on shards 0 and 1, none elsewhere: the hold-back locks them in shard order.
    let refund = thin_shards_with_a_refund_open(&app, "refill").await;
    let holdback = tokio::spawn({
        let client = app.client.clone();
        let url = app.url("/admin/events/refill/ga-holdbacks");
        async move {
            let resp = client
                .post(url)
                .bearer_auth(ADMIN_TOKEN)
                .header("X-Floodgate-Actor", "ops")
                .json(&json!({"tier": "FLOOR", "quantity": 2, "reason": "sponsor"}))
                .send()
                .await
                .expect("hold-back request");
            json(resp).await
        }
    });
    app.until_a_request_waits_for_a_lock().await;
    refund.commit().await.expect("commit the refund");
    let (status, hb) = holdback.await.expect("hold-back task");
    assert_eq!((status, hb["quantity"].as_i64()), (201, Some(2)), "{hb}");
    let shards: Vec<(i32, i32, i32)> = sqlx::query_as(
        "SELECT shard, available, held_back FROM ga_counters
          WHERE event_id = 'refill' AND shard < 2 ORDER BY shard",
    )
    .fetch_all(&app.pool)
    .await
    .expect("shards");
    assert_eq!(
        shards,
        vec![(0, 0, 2), (1, 1, 0)],
        "both units from shard 0"
    );
    app.stop().await;
}
