//! Operators and their roles (issue 42): named credentials issued, listed and revoked through
//! booking's admin API on real Postgres; every mutating admin operation of the OpenAPI
//! document checked per role with exactly one audit entry; bad credentials refused, counted
//! and rate-limited; the live operators published to Redis for the gateway.

use crate::events::{create_event, small_event};
use crate::helpers::{ADMIN_TOKEN, TestApp, json};
use crate::payments::{PayEnv, pay};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Issues an operator with the bootstrap secret; answers (id, credential).
pub async fn issue(app: &TestApp, name: &str, role: &str) -> (String, String) {
    let (s, v) = json(
        app.client
            .post(app.url("/admin/operators"))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Floodgate-Actor", "lead")
            .json(&json!({"name": name, "role": role}))
            .send()
            .await
            .expect("create operator"),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    (
        v["id"].as_str().expect("id").to_owned(),
        v["credential"].as_str().expect("credential").to_owned(),
    )
}

/// A call with `credential` as the bearer.
async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    credential: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    call_as(app, method, path, credential, None, body).await
}

/// [`call`] with the bootstrap secret naming its operator (`lead`), as a change needs.
async fn call_named(app: &TestApp, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    call_as(app, method, path, ADMIN_TOKEN, Some("lead"), body).await
}

async fn call_as(
    app: &TestApp,
    method: &str,
    path: &str,
    credential: &str,
    actor: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
    let mut req = app
        .client
        .request(method, app.url(path))
        .bearer_auth(credential)
        .header("Idempotency-Key", format!("k-{}", shared::ids::new_id()));
    if let Some(a) = actor {
        req = req.header("X-Floodgate-Actor", a);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    answer(req.send().await.expect("admin call")).await
}

/// Status and JSON body (`null` for an empty one, as a `204` has).
async fn answer(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    if text.is_empty() {
        return (status, Value::Null);
    }
    let v =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
    (status, v)
}

async fn audit_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ops_audit")
        .fetch_one(&app.pool)
        .await
        .expect("audit count")
}

/// The newest audit entry: (actor, role, operator_id, action).
async fn last_entry(app: &TestApp) -> (String, Option<String>, Option<String>, String) {
    sqlx::query_as(
        "SELECT actor, role, operator_id, action FROM ops_audit ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("last audit entry")
}

#[tokio::test]
async fn an_operator_is_issued_once_listed_without_secret_and_revoked_at_once() {
    let app = TestApp::spawn().await;
    let resp = app
        .client
        .post(app.url("/admin/operators"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .json(&json!({"name": "  Ana Support ", "role": "support"}))
        .send()
        .await
        .expect("create");
    assert_eq!(
        resp.headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("no-store")
    );
    let (s, created) = json(resp).await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["name"], "Ana Support");
    assert_eq!(created["role"], "support");
    let id = created["id"].as_str().expect("id").to_owned();
    let secret = created["credential"]
        .as_str()
        .expect("credential")
        .to_owned();
    assert!(
        secret.starts_with("fgop_") && secret.len() == 48,
        "{secret}"
    );
    // Default expiry: 90 days.
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["expires_at"].clone()).expect("expires_at");
    let days = (expires - chrono::Utc::now()).num_hours() as f64 / 24.0;
    assert!((89.9..=90.0).contains(&days), "{days}");

    // Who am I: the operator, by name and role.
    let (s, me) = call(&app, "GET", "/admin/operators/me", &secret, None).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(
        (
            me["name"].clone(),
            me["role"].clone(),
            me["bootstrap"].clone()
        ),
        (json!("Ana Support"), json!("support"), json!(false))
    );
    let (s, me) = call(&app, "GET", "/admin/operators/me", ADMIN_TOKEN, None).await;
    assert_eq!(
        (s, me["name"].clone(), me["bootstrap"].clone()),
        (200, json!("bootstrap"), json!(true))
    );

    // Listed, never with the secret or its hash; the secret is nowhere in Postgres.
    let (s, list) = call(&app, "GET", "/admin/operators", ADMIN_TOKEN, None).await;
    assert_eq!(s, 200, "{list}");
    let listed = &list["operators"][0];
    assert_eq!(
        (
            listed["id"].clone(),
            listed["status"].clone(),
            listed["created_by"].clone()
        ),
        (json!(id), json!("active"), json!("bootstrap"))
    );
    assert!(!list.to_string().contains(&secret[5..]), "{list}");
    assert!(listed.get("hash").is_none() && listed.get("credential").is_none());
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM credentials c, ops_audit a
          WHERE encode(c.hash, 'escape') LIKE '%' || $1 || '%'
             OR a.detail::text LIKE '%' || $1 || '%'",
    )
    .bind(&secret[5..])
    .fetch_one(&app.pool)
    .await
    .expect("search for the secret");
    assert_eq!(stored, 0, "the secret itself is stored nowhere");
    let (actor, role, note, detail): (String, String, Option<String>, Value) = sqlx::query_as(
        "SELECT actor, role, note, detail FROM ops_audit WHERE action = 'operator.create'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("create entry");
    assert_eq!(
        (actor.as_str(), role.as_str(), note.as_deref()),
        ("bootstrap", "admin", Some("lead"))
    );
    assert_eq!(detail["role"], "support", "{detail}");

    // Revoked: refused at once, listed as revoked, audited once.
    let (s, _) = call(
        &app,
        "DELETE",
        &format!("/admin/operators/{id}"),
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(
        s, 400,
        "the bootstrap secret names its operator for a change"
    );
    let resp = app
        .client
        .delete(app.url(&format!("/admin/operators/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .send()
        .await
        .expect("revoke");
    assert_eq!(resp.status(), 204);
    let (s, v) = call(&app, "GET", "/admin/operators/me", &secret, None).await;
    assert_eq!(
        (s, v["code"].clone(), v["reason"].clone()),
        (401, json!("UNAUTHORIZED"), json!("revoked"))
    );
    let (s, list) = call(&app, "GET", "/admin/operators", ADMIN_TOKEN, None).await;
    assert_eq!(
        (s, list["operators"][0]["status"].clone()),
        (200, json!("revoked"))
    );
    let before = audit_rows(&app).await;
    let resp = app
        .client
        .delete(app.url(&format!("/admin/operators/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .send()
        .await
        .expect("revoke again");
    assert_eq!(resp.status(), 204, "a second revocation changes nothing");
    assert_eq!(audit_rows(&app).await, before);
    let resp = app
        .client
        .delete(app.url("/admin/operators/op_nope"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .send()
        .await
        .expect("revoke unknown");
    assert_eq!(resp.status(), 404);
    app.stop().await;
}

#[tokio::test]
async fn bad_credentials_and_bad_requests_are_refused_counted_and_change_nothing() {
    let app = TestApp::spawn().await;
    create_event(&app, &small_event("ev", 1, 2, 5, 1)).await;
    let (viewer_id, viewer) = issue(&app, "Vic Viewer", "viewer").await;
    let (_, expired) = issue(&app, "Old Timer", "admin").await;
    sqlx::query(
        "UPDATE credentials SET expires_at = now() - interval '1 second' WHERE name = 'Old Timer'",
    )
    .execute(&app.pool)
    .await
    .expect("expire");
    let unknown = format!("fgop_{}", "A".repeat(43));
    let scanner = format!("fgsc_{}", "B".repeat(43));
    let before = (
        audit_rows(&app).await,
        crate::events::db_state(&app.pool).await,
    );
    let kill = json!({"seats": ["S1-R1-1"], "reason": "production"});
    for (credential, status, code, reason) in [
        ("fgop_short", 401, "UNAUTHORIZED", Some("malformed")),
        (unknown.as_str(), 401, "UNAUTHORIZED", Some("unknown")),
        (expired.as_str(), 401, "UNAUTHORIZED", Some("expired")),
        ("not-the-admin-secret", 401, "UNAUTHORIZED", Some("unknown")),
        (scanner.as_str(), 403, "WRONG_CREDENTIAL_TYPE", None),
        (viewer.as_str(), 403, "ROLE_FORBIDDEN", None),
    ] {
        let (s, v) = call(
            &app,
            "POST",
            "/admin/events/ev/seat-kills",
            credential,
            Some(&kill),
        )
        .await;
        assert_eq!(
            (s, v["code"].as_str()),
            (status, Some(code)),
            "{credential}: {v}"
        );
        assert_eq!(v.get("reason").and_then(Value::as_str), reason, "{v}");
    }
    // A viewer may not refund either; it is told which role it lacks.
    let (s, v) = call(
        &app,
        "POST",
        "/admin/orders/ord_x/refund",
        &viewer,
        Some(&json!({})),
    )
    .await;
    assert_eq!(
        (
            s,
            v["code"].clone(),
            v["role"].clone(),
            v["required_role"].clone()
        ),
        (
            403,
            json!("ROLE_FORBIDDEN"),
            json!("viewer"),
            json!("support")
        )
    );
    // A header an operator's call does not need is still checked: unusable is bad input.
    let resp = app
        .client
        .get(app.url("/admin/audit?limit=1"))
        .bearer_auth(&viewer)
        .header(
            "X-Floodgate-Actor",
            reqwest::header::HeaderValue::from_bytes(b"\xc3\x97\xc2\x9b").expect("obs-text"),
        )
        .send()
        .await
        .expect("bad actor header");
    let (s, v) = json(resp).await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("ACTOR_REQUIRED")),
        "{v}"
    );
    // Reads are a viewer's.
    let (s, _) = call(&app, "GET", "/admin/audit?limit=1", &viewer, None).await;
    assert_eq!(s, 200);
    // No header at all.
    let resp = app
        .client
        .get(app.url("/admin/audit"))
        .send()
        .await
        .expect("anonymous");
    assert_eq!(resp.status(), 401);

    // Bad requests to create an operator.
    for body in [
        json!({"name": "x", "role": "root"}),
        json!({"name": "x", "role": "admin", "extra": 1}),
        json!({"name": "", "role": "admin"}),
        json!({"name": "bootstrap", "role": "admin"}),
        json!({"name": "x", "role": "admin", "expires_at": "2001-01-01T00:00:00Z"}),
        json!({"name": "x", "role": "admin", "expires_at": "2999-01-01T00:00:00Z"}),
        json!({"role": "admin"}),
    ] {
        let (s, v) = call(&app, "POST", "/admin/operators", &expired, Some(&body)).await;
        assert_eq!(s, 401, "{v}");
        let resp = app
            .client
            .post(app.url("/admin/operators"))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Floodgate-Actor", "lead")
            .json(&body)
            .send()
            .await
            .expect("bad create");
        let s = resp.status().as_u16();
        assert!(s == 400 || s == 422, "{body}: {s}");
    }
    let resp = app
        .client
        .post(app.url("/admin/operators"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .header("content-type", "application/json")
        .body("{\"name\": ")
        .send()
        .await
        .expect("malformed json");
    assert_eq!(resp.status(), 400);
    // A viewer may not issue operators, nor revoke one.
    let (s, _) = call(
        &app,
        "POST",
        "/admin/operators",
        &viewer,
        Some(&json!({"name": "me2", "role": "admin"})),
    )
    .await;
    assert_eq!(s, 403);
    let (s, _) = call(
        &app,
        "DELETE",
        &format!("/admin/operators/{viewer_id}"),
        &viewer,
        None,
    )
    .await;
    assert_eq!(s, 403);

    assert_eq!(
        (
            audit_rows(&app).await,
            crate::events::db_state(&app.pool).await
        ),
        before,
        "refusals change nothing and write no audit entry"
    );
    let live: i64 = sqlx::query_scalar("SELECT count(*) FROM credentials WHERE revoked_at IS NULL")
        .fetch_one(&app.pool)
        .await
        .expect("credentials");
    assert_eq!(live, 2, "no operator was created or revoked");
    // Counted by reason.
    let metrics = app.metrics_text().await;
    for reason in [
        "malformed",
        "unknown",
        "expired",
        "wrong_type",
        "role",
        "missing",
    ] {
        assert!(
            metrics.contains(&format!("admin_auth_failures_total{{reason=\"{reason}\"}}")),
            "{reason} not counted"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_brute_force_is_locked_out_before_its_credentials_are_checked() {
    let app = TestApp::spawn_with(|c| c.booking.admin_auth_failures_per_ip_per_min = 5).await;
    for i in 0..5 {
        let guess = format!("fgop_{:0>43}", i);
        let (s, _) = call(&app, "GET", "/admin/audit", &guess, None).await;
        assert_eq!(s, 401);
    }
    let resp = app
        .client
        .get(app.url("/admin/audit"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("after the lockout");
    assert_eq!(
        resp.status(),
        429,
        "even the right secret waits out the window"
    );
    let wait: u64 = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
    let (_, v) = json(resp).await;
    assert_eq!(v["code"], "TOO_MANY_FAILED_LOGINS");
    assert!(
        app.metrics_text()
            .await
            .contains("admin_auth_failures_total{reason=\"rate_limited\"} 1")
    );
    app.stop().await;
}

#[tokio::test]
async fn the_last_live_admin_cannot_be_revoked_however_revocations_race() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(issue(&app, &format!("admin {i}"), "admin").await.0);
    }
    let (support_id, _) = issue(&app, "helper", "support").await;
    ids.push(support_id);
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let client = app.client.clone();
            let url = app.url(&format!("/admin/operators/{id}"));
            tokio::spawn(async move {
                let resp = client
                    .delete(url)
                    .bearer_auth(ADMIN_TOKEN)
                    .header("X-Floodgate-Actor", "lead")
                    .send()
                    .await
                    .expect("revoke");
                let (status, v) = answer(resp).await;
                (status, v["code"].as_str().map(str::to_owned))
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("task"));
    }
    let revoked = outcomes.iter().filter(|(s, _)| *s == 204).count();
    let refused = outcomes
        .iter()
        .filter(|(s, c)| *s == 409 && c.as_deref() == Some("LAST_ADMIN"))
        .count();
    assert_eq!((revoked, refused), (12, 1), "{outcomes:?}");
    let live_admins: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM credentials WHERE role = 'admin' AND revoked_at IS NULL",
    )
    .fetch_one(&app.pool)
    .await
    .expect("admins");
    assert_eq!(live_admins, 1);
    let entries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ops_audit WHERE action = 'operator.revoke'")
            .fetch_one(&app.pool)
            .await
            .expect("entries");
    assert_eq!(entries, 12);
    app.stop().await;
}

#[tokio::test]
async fn the_live_operators_are_published_for_the_gateway_and_a_revocation_outdates_them() {
    let app = TestApp::spawn().await;
    let (a, secret_a) = issue(&app, "Ana", "support").await;
    let (b, _) = issue(&app, "Ben", "admin").await;
    let key = shared::credentials::operators_key(&app.state.config.redis.key_prefix);
    let mut redis = redis::Client::open(crate::helpers::redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let read = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            let raw: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            raw.map(|r| {
                serde_json::from_str::<shared::credentials::Published>(&r).expect("published")
            })
        }
    };
    // Published within the job's second (polled; no fixed sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let first = loop {
        if let Some(p) = read(&mut redis).await
            && p.operators.len() == 2
        {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "never published");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let ana = first.operators.iter().find(|o| o.id == a).expect("Ana");
    assert_eq!(
        (ana.name.as_str(), ana.role, ana.hash.clone()),
        (
            "Ana",
            shared::credentials::Role::Support,
            shared::credentials::hash_hex(&secret_a)
        )
    );
    assert!(
        !serde_json::to_string(&first)
            .expect("json")
            .contains(&secret_a[5..])
    );
    // Revoking Ana out-dates that snapshot: a stale writer can no longer put her back.
    let resp = app
        .client
        .delete(app.url(&format!("/admin/operators/{a}")))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Floodgate-Actor", "lead")
        .send()
        .await
        .expect("revoke");
    assert_eq!(resp.status(), 204);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let after = loop {
        let p = read(&mut redis).await.expect("published");
        if p.operators.iter().all(|o| o.id != a) {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Ana still published after 2 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(after.generation > first.generation);
    assert_eq!(
        after
            .operators
            .iter()
            .map(|o| o.id.clone())
            .collect::<Vec<_>>(),
        vec![b]
    );
    let stale = serde_json::to_string(&first).expect("json");
    let written: i64 = redis::Script::new(
        "local cur = redis.call('GET', KEYS[1])
         if cur and cjson.decode(cur).generation > tonumber(ARGV[1]) then return 0 end
         redis.call('SET', KEYS[1], ARGV[2]) return 1",
    )
    .key(&key)
    .arg(first.generation)
    .arg(&stale)
    .invoke_async(&mut redis)
    .await
    .expect("stale write");
    assert_eq!(written, 0);
    // And booking's own publish never goes back either.
    assert!(
        booking::platform::credentials::publish(
            &app.pool,
            &app.state.queue_redis,
            &app.state.config.redis.key_prefix
        )
        .await
        .expect("publish")
    );
    assert!(
        read(&mut redis)
            .await
            .expect("published")
            .operators
            .iter()
            .all(|o| o.id != a)
    );
    app.stop().await;
}

/// Everything a mutating admin operation needs to succeed once, made fresh per call.
struct Fixture {
    path: String,
    body: Option<Value>,
}

/// Builds a fixture for `(method, path)` of the document, or `None` for an operation this
/// test does not know (which fails the test: a new operation needs a fixture here).
async fn fixture(env: &PayEnv, n: usize, method: &str, path: &str) -> Option<Fixture> {
    let app = &env.app;
    let ev = format!("walk{n}");
    let f = |path: String, body: Value| {
        Some(Fixture {
            path,
            body: Some(body),
        })
    };
    match (method, path) {
        ("post", "/admin/events") => f("/admin/events".into(), small_event(&ev, 1, 4, 5, 1)),
        ("patch", "/admin/events/{event}") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            f(format!("/admin/events/{ev}"), json!({"name": "Renamed"}))
        }
        ("post", "/admin/events/{event}/cancel") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            f(
                format!("/admin/events/{ev}/cancel"),
                json!({"reason": "walk"}),
            )
        }
        ("post", "/admin/events/{event}/seat-kills") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            f(
                format!("/admin/events/{ev}/seat-kills"),
                json!({"seats": ["S1-R1-1"], "reason": "production"}),
            )
        }
        ("delete", "/admin/events/{event}/seat-kills")
        | ("post", "/admin/events/{event}/seat-kills/release") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            let (s, v) = call_named(
                app,
                "POST",
                &format!("/admin/events/{ev}/seat-kills"),
                Some(&json!({"seats": ["S1-R1-1"], "reason": "production"})),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            let p = if method == "delete" {
                format!("/admin/events/{ev}/seat-kills")
            } else {
                format!("/admin/events/{ev}/seat-kills/release")
            };
            f(p, json!({"seats": ["S1-R1-1"]}))
        }
        ("post", "/admin/events/{event}/ga-holdbacks") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            f(
                format!("/admin/events/{ev}/ga-holdbacks"),
                json!({"tier": "FLOOR", "quantity": 2, "reason": "sponsor"}),
            )
        }
        ("post", "/admin/events/{event}/ga-holdbacks/{id}/release") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            let (s, v) = call_named(
                app,
                "POST",
                &format!("/admin/events/{ev}/ga-holdbacks"),
                Some(&json!({"tier": "FLOOR", "quantity": 2, "reason": "sponsor"})),
            )
            .await;
            assert_eq!(s, 201, "{v}");
            let id = v["id"].as_str().expect("holdback id");
            f(
                format!("/admin/events/{ev}/ga-holdbacks/{id}/release"),
                json!({}),
            )
        }
        ("post", "/admin/products") => f(
            "/admin/products".into(),
            json!({"sku": format!("sku-{ev}"), "event": "walk-shop", "name": "Shirt", "price": 100, "stock": 5}),
        ),
        ("put", "/admin/products/{sku}") => {
            crate::helpers::create_product(app, "walk-shop", &format!("sku-{ev}"), 100, 5, false)
                .await;
            f(format!("/admin/products/sku-{ev}"), json!({"price": 150}))
        }
        ("post", "/admin/products/{sku}/flash/reconcile") => {
            crate::helpers::create_product(app, "walk-shop", &format!("hot-{ev}"), 100, 5, true)
                .await;
            f(
                format!("/admin/products/hot-{ev}/flash/reconcile"),
                json!({}),
            )
        }
        ("post", "/admin/orders/{id}/refund") | ("post", "/admin/orders/{id}/cancel") => {
            crate::helpers::create_refund_event(app, &ev, "release").await;
            let o = crate::helpers::order_seats(app, &ev, &format!("fan{n}"), &["S1-R1-1"]).await;
            let (s, v) = pay(app, &o.token, &o.order_id, "pay", "pm_card_visa").await;
            assert_eq!(s, 200, "{v}");
            let verb = if path.ends_with("refund") {
                "refund"
            } else {
                "cancel"
            };
            f(
                format!("/admin/orders/{}/{verb}", o.order_id),
                json!({"reason": "walk"}),
            )
        }
        ("post", "/admin/orders/{id}/tickets/resend")
        | ("post", "/admin/orders/{id}/forget-email") => {
            // A paid order with an e-mail address (the resend needs one).
            crate::helpers::create_refund_event(app, &ev, "release").await;
            let o = crate::helpers::order_seats(app, &ev, &format!("fan{n}"), &["S1-R1-1"]).await;
            let (s, v) = pay(app, &o.token, &o.order_id, "pay", "pm_card_visa").await;
            assert_eq!(s, 200, "{v}");
            sqlx::query("INSERT INTO order_contacts (order_id, email) VALUES ($1, $2)")
                .bind(&o.order_id)
                .bind(format!("walk{n}@example.test"))
                .execute(&app.pool)
                .await
                .expect("an address");
            let tail = if path.ends_with("resend") {
                "tickets/resend"
            } else {
                "forget-email"
            };
            Some(Fixture {
                path: format!("/admin/orders/{}/{tail}", o.order_id),
                body: None,
            })
        }
        ("post", "/admin/events/{event}/scanners") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            f(
                format!("/admin/events/{ev}/scanners"),
                json!({"gate": "walk"}),
            )
        }
        ("delete", "/admin/events/{event}/scanners/{id}") => {
            create_event(app, &small_event(&ev, 1, 4, 5, 1)).await;
            let (s, v) = call_named(
                app,
                "POST",
                &format!("/admin/events/{ev}/scanners"),
                Some(&json!({"gate": "walk"})),
            )
            .await;
            assert_eq!(s, 201, "{v}");
            let id = v["id"].as_str().expect("scanner id");
            Some(Fixture {
                path: format!("/admin/events/{ev}/scanners/{id}"),
                body: None,
            })
        }
        ("post", "/admin/operators") => f(
            "/admin/operators".into(),
            json!({"name": format!("new {n}"), "role": "viewer"}),
        ),
        ("delete", "/admin/operators/{id}") => {
            let (id, _) = issue(app, &format!("leaving {n}"), "viewer").await;
            Some(Fixture {
                path: format!("/admin/operators/{id}"),
                body: None,
            })
        }
        _ => None,
    }
}

#[tokio::test]
async fn every_mutating_admin_operation_checks_its_role_and_writes_exactly_one_entry() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    crate::helpers::ensure_event(app, "walk-shop").await;
    let (s, doc) = json(
        app.client
            .get(app.url("/openapi.json"))
            .send()
            .await
            .expect("doc"),
    )
    .await;
    assert_eq!(s, 200);
    // Every mutating admin operation and the role its document names.
    let mut ops: Vec<(String, String, shared::credentials::Role)> = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        if !path.starts_with("/admin/") {
            continue;
        }
        for (method, op) in item.as_object().expect("item") {
            if !["post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let role = op["security"][0]["admin"][0]
                .as_str()
                .and_then(shared::credentials::Role::parse)
                .unwrap_or_else(|| panic!("{method} {path} names no role"));
            ops.push((method.clone(), path.clone(), role));
        }
    }
    assert!(ops.len() >= 15, "{ops:?}");
    let mut creds = Vec::new();
    for role in shared::credentials::Role::ALL {
        let (id, secret) = issue(app, &format!("walker {role}"), role.as_str()).await;
        creds.push((role, id, secret));
    }
    let mut covered = BTreeSet::new();
    let mut n = 0;
    for (method, path, required) in &ops {
        for (role, id, secret) in &creds {
            n += 1;
            let fx = fixture(&env, n, method, path)
                .await
                .unwrap_or_else(|| panic!("no fixture for {method} {path}: add one"));
            covered.insert((method.clone(), path.clone()));
            let before = audit_rows(app).await;
            // The header never names an operator who holds a credential.
            let (s, v) = call_as(
                app,
                method,
                &fx.path,
                secret,
                Some("impostor"),
                fx.body.as_ref(),
            )
            .await;
            if role.allows(*required) {
                assert!(
                    (200..300).contains(&s),
                    "{role} {method} {}: {s} {v}",
                    fx.path
                );
                assert_eq!(
                    audit_rows(app).await,
                    before + 1,
                    "{role} {method} {}: one entry",
                    fx.path
                );
                let (actor, r, op_id, action) = last_entry(app).await;
                assert_eq!(
                    (actor, r.as_deref(), op_id.as_deref()),
                    (
                        format!("walker {role}"),
                        Some(role.as_str()),
                        Some(id.as_str())
                    ),
                    "{method} {path}: {action}"
                );
            } else {
                assert_eq!(
                    (s, v["code"].as_str()),
                    (403, Some("ROLE_FORBIDDEN")),
                    "{role} {method} {path}"
                );
                assert_eq!(
                    audit_rows(app).await,
                    before,
                    "{role} {method} {path}: no entry"
                );
            }
        }
    }
    assert_eq!(covered.len(), ops.len());
    env.app.stop().await;
}
