//! The ops API's reads (issue 18): order search (filters, keyset pages, bad input), one
//! order's detail, the audit log, and audit entries of the older admin mutations.

use crate::events::{create_event, small_event};
use crate::helpers::{ADMIN_TOKEN, TestApp, json, who};
use crate::payments::{PayEnv, pay, seat_order};
use serde_json::{Value, json};
use std::collections::HashSet;

/// Walks a search with `limit` per page and returns every order id in page order.
async fn walk(app: &TestApp, query: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/admin/orders?{query}&limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = json(app.admin_get(&path).await).await;
        assert_eq!(status, 200, "{page}");
        let orders = page["orders"].as_array().expect("orders");
        assert!(orders.len() <= limit);
        ids.extend(
            orders
                .iter()
                .map(|o| o["id"].as_str().expect("id").to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return ids,
        }
    }
}

#[tokio::test]
async fn order_search_filters_combine_and_pages_never_repeat_or_skip() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev1", 2, 5, 10, 1)).await;
    create_event(&app, &small_event("ev2", 2, 5, 10, 1)).await;
    let mut all = Vec::new();
    for (i, (account, event)) in [
        ("ann", "ev1"),
        ("bob", "ev1"),
        ("ann", "ev2"),
        ("cid", "ev2"),
        ("ann", "ev1"),
    ]
    .into_iter()
    .enumerate()
    {
        let seat = format!("S1-R1-{}", i + 1);
        let o = seat_order(&app, event, false, account, &[seat.as_str()]).await;
        all.push((o.order_id, account, event));
    }
    // Newest first, pages of 2 cover each order exactly once.
    let walked = walk(&app, "", 2).await;
    let expected: Vec<String> = all.iter().rev().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(walked, expected);
    let anns = walk(&app, "account=ann", 1).await;
    assert_eq!(anns.len(), 3);
    let ann_ev1 = walk(&app, "account=ann&event=ev1&status=PENDING_PAYMENT", 50).await;
    assert_eq!(ann_ev1, vec![all[4].0.clone(), all[0].0.clone()]);
    assert!(walk(&app, "status=PAID", 50).await.is_empty());
    assert!(
        walk(&app, "created_to=2000-01-01T00:00:00Z", 50)
            .await
            .is_empty()
    );
    assert_eq!(
        walk(&app, "created_from=2000-01-01T00:00:00Z", 50)
            .await
            .len(),
        5
    );

    for bad in [
        "status=SHIPPED",
        "status=paid",
        "created_from=yesterday",
        "created_from=2026-01-02T00:00:00Z&created_to=2026-01-01T00:00:00Z",
        "limit=-1",
        "limit=0",
        "limit=201",
        "limit=ten",
        "cursor=not-a-cursor",
        "colour=blue",
        "account=",
    ] {
        let (status, body) = json(app.admin_get(&format!("/admin/orders?{bad}")).await).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert_eq!(body["code"], "VALIDATION_FAILED", "{bad}");
    }
    let resp = app
        .client
        .get(app.url("/admin/orders"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let resp = app
        .client
        .get(app.url("/admin/orders/whatever"))
        .bearer_auth("not-the-secret")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let (status, _) = json(app.admin_get("/admin/orders/no-such-order").await).await;
    assert_eq!(status, 404);
    app.stop().await;
}

#[tokio::test]
async fn the_search_uses_an_index_for_each_filter() {
    let app = TestApp::spawn().await;
    // Enough rows that a sequential scan is not the cheap answer.
    sqlx::query(
        "INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, expires_at,
                             created_at, status, paid_at)
         SELECT 'o' || g, 'acct' || (g % 5000), 'k' || g, 'cart', 'ev' || (g % 50), 100,
                clock_timestamp(), clock_timestamp() - make_interval(secs => g),
                CASE WHEN g % 2 = 0 THEN 'PAID' ELSE 'EXPIRED' END,
                CASE WHEN g % 2 = 0 THEN clock_timestamp() END
           FROM generate_series(1, 50000) g",
    )
    .execute(&app.pool)
    .await
    .expect("seed orders");
    sqlx::query("ANALYZE orders")
        .execute(&app.pool)
        .await
        .expect("analyze");
    for (filter, index) in [
        ("", "orders_created"),
        ("AND status = 'PAID'", "orders_created"),
        ("AND event_id = 'ev7'", "orders_event_created"),
        ("AND account_id = 'acct42'", "orders_account"),
    ] {
        let sql = format!(
            "EXPLAIN SELECT id FROM orders WHERE true {filter}
              ORDER BY created_at DESC, id DESC LIMIT 51"
        );
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(&app.pool)
            .await
            .expect("explain");
        let plan = plan.join("\n");
        assert!(plan.contains(index), "{filter}: {plan}");
        assert!(!plan.contains("Seq Scan"), "{filter}: {plan}");
    }
    app.stop().await;
}

#[tokio::test]
async fn an_order_detail_shows_its_payment_provider_events_tickets_and_audit() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    let o = seat_order(app, "ev", true, "alice", &["S1-R1-1", "S1-R1-2"]).await;
    let (status, v) = pay(app, &o.token, &o.order_id, "pay-1", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    let (status, d) = json(
        app.admin_get(&format!("/admin/orders/{}", o.order_id))
            .await,
    )
    .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["order"]["status"], "PAID");
    assert_eq!(d["order"]["account_id"], "alice");
    assert_eq!(d["order"]["items"].as_array().expect("items").len(), 2);
    let payments = d["payments"].as_array().expect("payments");
    assert_eq!(payments.len(), 1);
    assert_eq!(payments[0]["status"], "succeeded");
    assert!(payments[0]["provider_payment_id"].is_string(), "{d}");
    let tickets = d["tickets"].as_array().expect("tickets");
    assert_eq!(tickets.len(), 2);
    assert!(tickets.iter().all(|t| t["valid"] == true));
    assert_eq!(d["refunds"], json!([]));
    assert!(d["provider_events"].is_array());
    assert!(d["audit"].is_array());
    env.app.stop().await;
}

async fn audit(app: &TestApp, query: &str) -> Value {
    let (status, v) = json(app.admin_get(&format!("/admin/audit?{query}")).await).await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn older_admin_changes_are_audited_as_bootstrap_with_the_named_actor_as_a_note() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("plain", 1, 2, 5, 1)).await;
    let resp = app
        .client
        .post(app.url("/admin/events"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "ops-desk")
        .json(&small_event("named", 1, 2, 5, 1))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 201);
    crate::helpers::create_product(&app, "named", "sku-a", 100, 5, false).await;
    let resp = app
        .client
        .put(app.url("/admin/products/sku-a"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "pricing")
        .json(&json!({"price": 150}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let log = audit(&app, "limit=200").await;
    let entries: Vec<(String, String, String)> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                who(e),
                e["action"].as_str().expect("action").to_owned(),
                e["target"].as_str().expect("target").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        vec![
            (
                "bootstrap/pricing".into(),
                "product.update".into(),
                "product:sku-a".into()
            ),
            (
                "bootstrap".into(),
                "product.create".into(),
                "product:sku-a".into()
            ),
            (
                "bootstrap/ops-desk".into(),
                "event.create".into(),
                "event:named".into()
            ),
            (
                "bootstrap".into(),
                "event.create".into(),
                "event:plain".into()
            ),
        ]
    );
    // Filters and pages.
    let named = audit(&app, "event=named").await;
    assert_eq!(named["entries"].as_array().expect("entries").len(), 2);
    let first = audit(&app, "limit=3").await;
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let rest = audit(&app, &format!("limit=3&cursor={cursor}")).await;
    assert_eq!(rest["entries"].as_array().expect("entries").len(), 1);
    assert!(rest["next_cursor"].is_null());
    let ids: HashSet<i64> = first["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .chain(rest["entries"].as_array().expect("entries"))
        .map(|e| e["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids.len(), 4);
    for bad in ["limit=-2", "cursor=zzz", "who=me", "action="] {
        let (status, _) = json(app.admin_get(&format!("/admin/audit?{bad}")).await).await;
        assert_eq!(status, 422, "{bad}");
    }
    let resp = app
        .client
        .get(app.url("/admin/audit"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    app.stop().await;
}
