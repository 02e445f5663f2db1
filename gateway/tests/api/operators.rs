//! Operator credentials on the admin listener (issue 42): each documented operation's role,
//! revocation and expiry through the list booking publishes to Redis (written here exactly as
//! booking writes it: `shared::credentials::Published` as JSON at `operators_key`), refused
//! credential shapes, the failed-check limit per address, the bootstrap secret's note, and
//! what a stale list does.

use crate::helpers::*;
use crate::redis_outage::PrivateRedis;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shared::credentials::{
    Kind, Published, PublishedOperator, Role, hash_hex, issue, operators_key,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// An operator credential as booking hands it out (the secret) and publishes it.
#[derive(Clone)]
struct Operator {
    secret: String,
    published: PublishedOperator,
}

fn operator(name: &str, role: Role, expires_ms: i64) -> Operator {
    let secret = issue(Kind::Operator).expect("random").secret;
    Operator {
        published: PublishedOperator {
            id: shared::ids::new_id(),
            name: name.into(),
            role,
            hash: hash_hex(&secret),
            expires_ms,
        },
        secret,
    }
}

fn in_a_day() -> i64 {
    chrono::Utc::now().timestamp_millis() + 86_400_000
}

/// Writes the live operators as booking does (`SET` of the JSON).
async fn publish(app: &TestApp, generation: i64, ops: &[&Operator]) {
    let list = Published {
        generation,
        published_ms: chrono::Utc::now().timestamp_millis(),
        operators: ops.iter().map(|o| o.published.clone()).collect(),
    };
    set_raw(app, &serde_json::to_string(&list).unwrap()).await;
}

async fn set_raw(app: &TestApp, value: &str) {
    let mut c = app.redis.clone();
    let _: () = redis::cmd("SET")
        .arg(operators_key(&app.prefix))
        .arg(value)
        .query_async(&mut c)
        .await
        .unwrap();
}

/// A room that takes every operation the admin document names: registered (uploads), paused,
/// its sale a day away (scheduled changes).
async fn room(app: &TestApp, event: &str) {
    let now = chrono::Utc::now();
    let r = app
        .put_config(
            event,
            json!({
                "sale_start": (now + chrono::Duration::days(1)).to_rfc3339(),
                "registration_closes": (now + chrono::Duration::hours(12)).to_rfc3339(),
                "access": "registered",
                "admit_per_minute": 600,
                "mode": "paused",
            }),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
}

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    actor: Option<&str>,
    body: Option<(&str, String)>,
) -> (StatusCode, Value) {
    let mut req = app.http.request(method, app.admin_url(path));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    if let Some(a) = actor {
        req = req.header("x-floodgate-actor", a);
    }
    if let Some((ctype, body)) = body {
        req = req.header("content-type", ctype).body(body);
    }
    let r = req.send().await.unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// Entries in `event`'s config audit log (straight from Redis).
async fn audit_len(app: &TestApp, event: &str) -> u64 {
    let mut c = app.redis.clone();
    redis::cmd("XLEN")
        .arg(app.key(event, "cfglog"))
        .query_async(&mut c)
        .await
        .unwrap()
}

/// The newest audit entry of `event`.
async fn newest_entry(app: &TestApp, event: &str) -> Value {
    let path = format!("/admin/events/{event}/audit?limit=1");
    let (s, v) = call(app, Method::GET, &path, Some(ADMIN), None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["entries"][0].clone()
}

/// Polls `GET /admin/events/{event}/config` with `bearer` until it answers `want` (or
/// panics after `within`); returns how long it took.
async fn until_status(
    app: &TestApp,
    event: &str,
    bearer: &str,
    want: StatusCode,
    within: Duration,
) -> Duration {
    let t0 = Instant::now();
    let path = format!("/admin/events/{event}/config");
    loop {
        let (s, v) = call(app, Method::GET, &path, Some(bearer), None, None).await;
        if s == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "still {s} after {within:?}, not {want}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis time plus `secs`, RFC 3339 (the schedule runs on Redis time).
async fn redis_in(app: &TestApp, secs: i64) -> String {
    let mut c = app.redis.clone();
    let (s, _us): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    chrono::DateTime::from_timestamp(s + secs, 0)
        .unwrap()
        .to_rfc3339()
}

/// A pending change of `event`, scheduled with the bootstrap secret (a fixture's setup).
async fn pending_change(app: &TestApp, event: &str) -> String {
    let body = json!({"at": redis_in(app, 3600).await, "set": {"admit_per_minute": 61}});
    let (s, v) = call(
        app,
        Method::POST,
        &format!("/admin/events/{event}/schedule"),
        Some(ADMIN),
        Some("setup"),
        Some(("application/json", body.to_string())),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// A request for one mutating operation of the admin document, ready to send: its concrete
/// path, body, and the audit action a success writes.
struct Prepared {
    path: String,
    body: Option<(&'static str, String)>,
    action: &'static str,
}

/// The request fixtures, one per mutating operation (`METHOD /path` as the document names
/// it). The test fails when this table and the document differ in either direction.
const FIXTURES: [&str; 7] = [
    "PUT /admin/events/{event}/config",
    "POST /admin/events/{event}/revoke",
    "PUT /admin/events/{event}/sold_out",
    "PUT /admin/events/{event}/registrations",
    "POST /admin/events/{event}/schedule",
    "PUT /admin/events/{event}/schedule/{id}",
    "DELETE /admin/events/{event}/schedule/{id}",
];

async fn prepare(app: &TestApp, op: &str, event: &str) -> Prepared {
    let json_body = |v: Value| Some(("application/json", v.to_string()));
    let at = |p: &str| p.replace("{event}", event);
    let (_, template) = op.split_once(' ').unwrap();
    match op {
        "PUT /admin/events/{event}/config" => {
            let now = chrono::Utc::now();
            Prepared {
                path: at(template),
                body: json_body(json!({
                    "sale_start": (now + chrono::Duration::days(1)).to_rfc3339(),
                    "registration_closes": (now + chrono::Duration::hours(12)).to_rfc3339(),
                    "access": "registered",
                    "admit_per_minute": 600,
                    "mode": "paused",
                })),
                action: "config.put",
            }
        }
        "POST /admin/events/{event}/revoke" => Prepared {
            path: at(template),
            body: json_body(json!({"account": "fan-1"})),
            action: "revoke",
        },
        "PUT /admin/events/{event}/sold_out" => Prepared {
            path: at(template),
            body: json_body(json!({"sold_out": true})),
            action: "sold_out",
        },
        "PUT /admin/events/{event}/registrations" => Prepared {
            path: at(template),
            body: Some(("text/plain", "fan-1\nfan-2\n".into())),
            action: "registrations.add",
        },
        "POST /admin/events/{event}/schedule" => Prepared {
            path: at(template),
            body: json_body(
                json!({"at": redis_in(app, 3600).await, "set": {"admit_per_minute": 62}}),
            ),
            action: "schedule.add",
        },
        "PUT /admin/events/{event}/schedule/{id}" => {
            let id = pending_change(app, event).await;
            Prepared {
                path: at(template).replace("{id}", &id),
                body: json_body(
                    json!({"at": redis_in(app, 7200).await, "set": {"admit_per_minute": 63}}),
                ),
                action: "schedule.edit",
            }
        }
        "DELETE /admin/events/{event}/schedule/{id}" => {
            let id = pending_change(app, event).await;
            Prepared {
                path: at(template).replace("{id}", &id),
                body: None,
                action: "schedule.cancel",
            }
        }
        other => panic!("no fixture for {other}"),
    }
}

/// Every mutating operation of the served admin document (`METHOD /path`) with the role its
/// security requirement names.
async fn documented_mutations(app: &TestApp) -> BTreeMap<String, Role> {
    let (s, doc) = call(app, Method::GET, "/openapi.json", None, None, None).await;
    assert_eq!(s, StatusCode::OK);
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/admin/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            if method == "get" {
                continue;
            }
            let scopes = op["security"][0]["admin"].as_array();
            let role = scopes
                .and_then(|s| s.first())
                .and_then(Value::as_str)
                .and_then(Role::parse)
                .unwrap_or_else(|| panic!("{method} {path} names no role: {op}"));
            out.insert(format!("{} {path}", method.to_uppercase()), role);
        }
    }
    out
}

#[tokio::test]
async fn every_mutating_operation_needs_its_documented_role_and_is_audited_once() {
    let app = TestApp::spawn().await;
    let viewer = operator("Vera Viewer", Role::Viewer, in_a_day());
    let support = operator("Sam Support", Role::Support, in_a_day());
    let admin = operator("Ada Admin", Role::Admin, in_a_day());
    publish(&app, 1, &[&viewer, &support, &admin]).await;
    room(&app, "rl0").await;
    until_status(
        &app,
        "rl0",
        &viewer.secret,
        StatusCode::OK,
        Duration::from_secs(5),
    )
    .await;

    let documented = documented_mutations(&app).await;
    let fixtures: BTreeSet<String> = FIXTURES.iter().map(|s| (*s).to_owned()).collect();
    let names: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(
        names, fixtures,
        "the admin document's mutating operations and this test's fixtures differ"
    );
    // Every mutation needs more than reading; some need less than admin.
    assert!(documented.values().all(|r| *r > Role::Viewer));
    assert_eq!(
        documented["POST /admin/events/{event}/revoke"],
        Role::Support
    );

    // (credential, its role, operator name and id; None: the bootstrap secret)
    let callers: Vec<(&str, Role, Option<&PublishedOperator>)> = vec![
        (&viewer.secret, Role::Viewer, Some(&viewer.published)),
        (&support.secret, Role::Support, Some(&support.published)),
        (&admin.secret, Role::Admin, Some(&admin.published)),
        (ADMIN, Role::Admin, None),
    ];
    for (i, (op, required)) in documented.iter().enumerate() {
        let event = format!("rl{}", i + 1);
        room(&app, &event).await;
        let method = Method::from_bytes(op.split_once(' ').unwrap().0.as_bytes()).unwrap();
        for (secret, role, who) in &callers {
            let p = prepare(&app, op, &event).await;
            let before = audit_len(&app, &event).await;
            // Operators send a name too: it must be ignored (never trusted).
            let (s, v) = call(
                &app,
                method.clone(),
                &p.path,
                Some(*secret),
                Some("Mallory"),
                p.body.clone(),
            )
            .await;
            let label = format!("{op} as {role}");
            if role < required {
                assert_eq!(s, StatusCode::FORBIDDEN, "{label}: {v}");
                assert_eq!(v["code"], "ROLE_FORBIDDEN", "{label}");
                assert_eq!(v["role"], role.as_str(), "{label}");
                assert_eq!(v["required_role"], required.as_str(), "{label}");
                assert_eq!(audit_len(&app, &event).await, before, "{label} wrote");
                continue;
            }
            assert!(s.is_success(), "{label}: {s} {v}");
            assert_eq!(audit_len(&app, &event).await, before + 1, "{label}");
            let e = newest_entry(&app, &event).await;
            assert_eq!(e["action"], p.action, "{label}: {e}");
            assert_eq!(e["role"], role.as_str(), "{label}: {e}");
            match who {
                Some(o) => {
                    assert_eq!(e["actor"], o.name.as_str(), "{label}: {e}");
                    assert_eq!(e["operator_id"], o.id.as_str(), "{label}: {e}");
                    assert!(e.get("note").is_none(), "{label}: {e}");
                }
                None => {
                    assert_eq!(e["actor"], "bootstrap", "{label}: {e}");
                    assert_eq!(e["note"], "Mallory", "{label}: {e}");
                    assert!(e.get("operator_id").is_none(), "{label}: {e}");
                }
            }
        }
    }
    // Reads are every role's, and write nothing.
    for (secret, ..) in &callers {
        let before = audit_len(&app, "rl1").await;
        for path in [
            "/admin/events/rl1/config",
            "/admin/events/rl1/audit",
            "/admin/events/rl1/schedule",
            "/admin/events/rl1/registrations",
        ] {
            let (s, v) = call(&app, Method::GET, path, Some(*secret), None, None).await;
            assert_eq!(s, StatusCode::OK, "{path}: {v}");
        }
        assert_eq!(audit_len(&app, "rl1").await, before);
    }
    let text = app.gw().metrics_text();
    assert!(
        testkit::promtext::value(&text, "admin_auth_failures_total", Some("reason=\"role\""))
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
}

#[tokio::test]
async fn a_revoked_operator_is_refused_within_two_seconds_and_an_expired_one_at_once() {
    let app = TestApp::spawn().await;
    room(&app, "rv").await;
    let ann = operator("Ann", Role::Admin, in_a_day());
    let bob = operator("Bob", Role::Admin, in_a_day());
    let old = operator(
        "Old",
        Role::Admin,
        chrono::Utc::now().timestamp_millis() - 1,
    );
    let soon = operator(
        "Soon",
        Role::Admin,
        chrono::Utc::now().timestamp_millis() + 1500,
    );
    publish(&app, 1, &[&ann, &bob, &old, &soon]).await;
    until_status(
        &app,
        "rv",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(5),
    )
    .await;

    // Booking revokes Ann: the next snapshot leaves her out.
    publish(&app, 2, &[&bob, &old, &soon]).await;
    let took = until_status(
        &app,
        "rv",
        &ann.secret,
        StatusCode::UNAUTHORIZED,
        Duration::from_secs(2),
    )
    .await;
    assert!(took < Duration::from_secs(2), "revocation took {took:?}");
    let before = audit_len(&app, "rv").await;
    let sold_out = Some(("application/json", json!({"sold_out": true}).to_string()));
    let (s, v) = call(
        &app,
        Method::PUT,
        "/admin/events/rv/sold_out",
        Some(&ann.secret),
        None,
        sold_out.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["code"], "UNAUTHORIZED");
    assert_eq!(audit_len(&app, "rv").await, before);
    // Bob still works.
    until_status(
        &app,
        "rv",
        &bob.secret,
        StatusCode::OK,
        Duration::from_secs(1),
    )
    .await;

    // Expired (even though still published): 401 with the reason, nothing changed.
    let (s, v) = call(
        &app,
        Method::PUT,
        "/admin/events/rv/sold_out",
        Some(&old.secret),
        None,
        sold_out.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["reason"], "expired");
    assert_eq!(audit_len(&app, "rv").await, before);
    // One that expires while listed is refused from its expiry on.
    let left = until_status(
        &app,
        "rv",
        &soon.secret,
        StatusCode::UNAUTHORIZED,
        Duration::from_secs(4),
    )
    .await;
    let (_, v) = call(
        &app,
        Method::GET,
        "/admin/events/rv/config",
        Some(&soon.secret),
        None,
        None,
    )
    .await;
    assert_eq!(v["reason"], "expired", "after {left:?}: {v}");
    let (_, cfg) = call(
        &app,
        Method::GET,
        "/admin/events/rv/config",
        Some(ADMIN),
        None,
        None,
    )
    .await;
    assert_eq!(cfg["sold_out"], false, "a refused call changed the flag");
}

#[tokio::test]
async fn malformed_scanner_and_unknown_credentials_change_nothing() {
    let app = TestApp::spawn().await;
    room(&app, "bad").await;
    let ann = operator("Ann", Role::Admin, in_a_day());
    publish(&app, 1, &[&ann]).await;
    until_status(
        &app,
        "bad",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(5),
    )
    .await;
    let before = audit_len(&app, "bad").await;
    let scanner = issue(Kind::Scanner).expect("random").secret;
    let stranger = issue(Kind::Operator).expect("random").secret;
    let sold_out = || Some(("application/json", json!({"sold_out": true}).to_string()));
    for (bearer, status, code) in [
        ("fgop_short", 401, "UNAUTHORIZED"),
        (&scanner, 403, "WRONG_CREDENTIAL_TYPE"),
        (&stranger, 401, "UNAUTHORIZED"),
        ("not-the-bootstrap-secret", 401, "UNAUTHORIZED"),
    ] {
        let (s, v) = call(
            &app,
            Method::PUT,
            "/admin/events/bad/sold_out",
            Some(bearer),
            Some("ops"),
            sold_out(),
        )
        .await;
        assert_eq!(s.as_u16(), status, "{v}");
        assert_eq!(v["code"], code);
    }
    // Not a bearer at all.
    let r = app
        .http
        .put(app.admin_url("/admin/events/bad/sold_out"))
        .header("authorization", format!("Basic {}", ann.secret))
        .json(&json!({"sold_out": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(audit_len(&app, "bad").await, before);
    let (_, cfg) = call(
        &app,
        Method::GET,
        "/admin/events/bad/config",
        Some(ADMIN),
        None,
        None,
    )
    .await;
    assert_eq!(cfg["sold_out"], false);
    let text = app.gw().metrics_text();
    let n = |reason: &str| {
        testkit::promtext::value(
            &text,
            "admin_auth_failures_total",
            Some(&format!("reason=\"{reason}\"")),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(n("malformed"), 2.0, "{text}");
    assert_eq!(n("wrong_type"), 1.0);
    assert_eq!(n("unknown"), 2.0);
}

#[tokio::test]
async fn too_many_failed_checks_from_one_address_lock_out_every_credential() {
    const N: u32 = 5;
    let app =
        TestApp::spawn_with(|c| c.gateway.limits.admin_auth_failures_per_ip_per_min = N).await;
    room(&app, "bf").await;
    let ann = operator("Ann", Role::Admin, in_a_day());
    publish(&app, 1, &[&ann]).await;
    until_status(
        &app,
        "bf",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(5),
    )
    .await;
    for _ in 0..N {
        let guess = issue(Kind::Operator).expect("random").secret;
        let (s, _) = call(
            &app,
            Method::GET,
            "/admin/events/bf/config",
            Some(&guess),
            None,
            None,
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let guess = issue(Kind::Operator).expect("random").secret;
    for bearer in [guess.as_str(), ann.secret.as_str(), ADMIN] {
        let r = app
            .http
            .get(app.admin_url("/admin/events/bf/config"))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!(json(r).await["code"], "TOO_MANY_FAILED_LOGINS");
    }
    // Health and the document stay open; a call without credentials is still only a 401.
    let (s, _) = call(&app, Method::GET, "/healthz", None, None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(
        &app,
        Method::GET,
        "/admin/events/bf/config",
        None,
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let text = app.gw().metrics_text();
    assert_eq!(
        testkit::promtext::value(
            &text,
            "admin_auth_failures_total",
            Some("reason=\"rate_limited\"")
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        testkit::promtext::value(
            &text,
            "admin_auth_failures_total",
            Some("reason=\"unknown\"")
        ),
        Some(f64::from(N))
    );
}

#[tokio::test]
async fn the_bootstrap_secret_is_recorded_as_bootstrap_with_its_name_as_a_note() {
    let app = TestApp::spawn().await;
    room(&app, "bs").await;
    let ann = operator("Ann", Role::Admin, in_a_day());
    publish(&app, 1, &[&ann]).await;
    let sold_out = |v: bool| Some(("application/json", json!({"sold_out": v}).to_string()));
    // Without a name where none is required: actor bootstrap, no note.
    let (s, v) = call(
        &app,
        Method::PUT,
        "/admin/events/bs/sold_out",
        Some(ADMIN),
        None,
        sold_out(true),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let e = newest_entry(&app, "bs").await;
    assert_eq!(
        (&e["actor"], &e["role"]),
        (&json!("bootstrap"), &json!("admin"))
    );
    assert!(
        e.get("note").is_none() && e.get("operator_id").is_none(),
        "{e}"
    );
    // With a name: kept as the note.
    let (s, _) = call(
        &app,
        Method::PUT,
        "/admin/events/bs/sold_out",
        Some(ADMIN),
        Some("  Rie Ops "),
        sold_out(false),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let e = newest_entry(&app, "bs").await;
    assert_eq!(
        (&e["actor"], &e["note"]),
        (&json!("bootstrap"), &json!("Rie Ops"))
    );
    // Scheduling still requires the name from the bootstrap secret (nothing written without
    // it), never from an operator.
    let before = audit_len(&app, "bs").await;
    let change = json!({"at": redis_in(&app, 3600).await, "set": {"admit_per_minute": 61}});
    let body = || Some(("application/json", change.to_string()));
    let path = "/admin/events/bs/schedule";
    let (s, v) = call(&app, Method::POST, path, Some(ADMIN), None, body()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["code"], "ACTOR_REQUIRED");
    assert_eq!(audit_len(&app, "bs").await, before);
    until_status(
        &app,
        "bs",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(5),
    )
    .await;
    let (s, v) = call(&app, Method::POST, path, Some(&ann.secret), None, body()).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["scheduled_by"], "Ann");
    let (s, v) = call(&app, Method::POST, path, Some(ADMIN), Some("Rie"), body()).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["scheduled_by"], "bootstrap");
    assert_eq!(newest_entry(&app, "bs").await["note"], "Rie");
    assert_eq!(audit_len(&app, "bs").await, before + 2);
}

#[tokio::test]
async fn operators_wait_for_a_list_and_a_malformed_one_keeps_the_last_good_list() {
    let app = TestApp::spawn().await;
    room(&app, "ml").await;
    let ann = operator("Ann", Role::Admin, in_a_day());
    // Nothing published yet: operator credentials cannot be checked; the bootstrap secret can.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = call(
        &app,
        Method::GET,
        "/admin/events/ml/config",
        Some(&ann.secret),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["code"], "UNAVAILABLE");
    let (s, _) = call(
        &app,
        Method::GET,
        "/admin/events/ml/config",
        Some(ADMIN),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    publish(&app, 1, &[&ann]).await;
    until_status(
        &app,
        "ml",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(2),
    )
    .await;
    // A value that is not a list: Ann keeps working on the last good list...
    set_raw(&app, "{\"generation\": 2, \"operators\": \"oops\"}").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = app.gw().metrics_text();
        if testkit::promtext::value(&text, "fg_operators_list_malformed_total", None)
            .is_some_and(|n| n >= 1.0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "malformed list not counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, _) = call(
        &app,
        Method::GET,
        "/admin/events/ml/config",
        Some(&ann.secret),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    // ...until it is older than five seconds: then operators get 503, bootstrap still works.
    let took = until_status(
        &app,
        "ml",
        &ann.secret,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(8),
    )
    .await;
    assert!(took >= Duration::from_secs(4), "stale after only {took:?}");
    let (s, _) = call(
        &app,
        Method::GET,
        "/admin/events/ml/config",
        Some(ADMIN),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    // A good list again: back at once.
    publish(&app, 3, &[&ann]).await;
    until_status(
        &app,
        "ml",
        &ann.secret,
        StatusCode::OK,
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test]
async fn with_redis_down_the_last_list_holds_for_five_seconds_then_operators_get_503() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fg-redis-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut redis = PrivateRedis::start(port, &dir);
    let url = format!("redis://127.0.0.1:{port}");
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(url.clone());
        c.redis.mode = shared::config::RedisMode::Standalone;
        c.redis.response_timeout_ms = FAIL_FAST_REDIS_TIMEOUT_MS;
    })
    .await;
    let vera = operator("Vera", Role::Viewer, in_a_day());
    let list = Published {
        generation: 1,
        published_ms: 0,
        operators: vec![vera.published.clone()],
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(operators_key(&app.prefix))
        .arg(serde_json::to_string(&list).unwrap())
        .query_async(&mut c)
        .await
        .unwrap();
    // A viewer's config PUT is refused by role before any Redis call: 403 while the list is
    // in force, 503 once it is stale.
    let put = || {
        app.http
            .put(app.admin_url("/admin/events/rd/config"))
            .bearer_auth(&vera.secret)
            .json(&json!({"sale_start": "2030-01-01T00:00:00Z", "admit_per_minute": 1}))
            .send()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while put().await.unwrap().status() != StatusCode::FORBIDDEN {
        assert!(Instant::now() < deadline, "list never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.stop();
    let stopped = Instant::now();
    assert_eq!(put().await.unwrap().status(), StatusCode::FORBIDDEN);
    loop {
        let s = put().await.unwrap().status();
        if s == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert!(stopped.elapsed() < Duration::from_secs(10), "never stale");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(4),
        "stale after only {:?}",
        stopped.elapsed()
    );
    // The bootstrap secret still gets past the check (to a refusal that needs no Redis).
    let r = app
        .http
        .get(app.admin_url("/admin/events/NOT_AN_ID/config"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = app
        .http
        .get(app.admin_url("/admin/events/NOT_AN_ID/config"))
        .bearer_auth(&vera.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
}
