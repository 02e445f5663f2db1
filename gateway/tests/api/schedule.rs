//! Scheduled config changes and the config audit log, with two gateway instances on one
//! Redis: a change applies on both near its time, exactly once; cancelled or edited first, its
//! old form never applies; an invalid change is refused and nothing is stored. Timing is
//! polled with generous deadlines, never asserted tightly.

use crate::helpers::*;
use gateway::GatewayHandle;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

struct Pair {
    a: GatewayHandle,
    b: GatewayHandle,
    http: reqwest::Client,
    _echo: Echo,
    prefix: String,
}

impl Pair {
    async fn start() -> Pair {
        let echo = Echo::start().await;
        let prefix = unique_prefix();
        let a = start(config(&prefix, vec![echo.upstream()])).await;
        let b = start(config(&prefix, vec![echo.upstream()])).await;
        Pair {
            a,
            b,
            http: client(),
            _echo: echo,
            prefix,
        }
    }

    fn admin(&self, g: &GatewayHandle, path: &str) -> String {
        format!("http://{}{path}", g.admin)
    }

    async fn put_config(&self, event: &str, cfg: Value, actor: Option<&str>) -> reqwest::Response {
        let mut r = self
            .http
            .put(self.admin(&self.a, &format!("/admin/events/{event}/config")))
            .bearer_auth(ADMIN)
            .json(&cfg);
        if let Some(a) = actor {
            r = r.header("x-floodgate-actor", a);
        }
        r.send().await.unwrap()
    }

    async fn config(&self, g: &GatewayHandle, event: &str) -> Value {
        let r = self
            .http
            .get(self.admin(g, &format!("/admin/events/{event}/config")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    async fn schedule(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        actor: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut r = self
            .http
            .request(method, self.admin(&self.b, path))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            r = r.json(&b);
        }
        if let Some(a) = actor {
            r = r.header("x-floodgate-actor", a);
        }
        let r = r.send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn audit(&self, event: &str, query: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(self.admin(&self.a, &format!("/admin/events/{event}/audit{query}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// Every audit entry, newest first (all pages).
    async fn audit_all(&self, event: &str) -> Vec<Value> {
        let (s, v) = self.audit(event, "?limit=500").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["entries"].as_array().unwrap().clone()
    }

    /// Redis time plus `secs`, RFC 3339 (the schedule runs on Redis time).
    async fn redis_in(&self, secs: i64) -> String {
        let mut conn = redis_conn().await;
        let (s, _us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        chrono::DateTime::from_timestamp(s + secs, 0)
            .unwrap()
            .to_rfc3339()
    }

    /// Polls both instances until `pred` holds for each one's view of `event`, a fan's status
    /// answer on that instance included (what the instance applies, not just what Redis holds).
    async fn wait_both(&self, event: &str, fan: &str, pred: impl Fn(&Value, &Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for g in [&self.a, &self.b] {
            let token = login(&self.http, &format!("http://{}/dev/login", g.public), fan).await;
            loop {
                let cfg = self.config(g, event).await;
                let st: Value = self
                    .http
                    .get(format!("http://{}/queue/{event}/status", g.public))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if pred(&cfg, &st) {
                    break;
                }
                assert!(Instant::now() < deadline, "not in effect: {cfg} / {st}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn join(&self, event: &str, fan: &str) -> Value {
        let url = format!("http://{}", self.a.public);
        let t = login(&self.http, &format!("{url}/dev/login"), fan).await;
        let r = self
            .http
            .post(format!("{url}/queue/{event}/join"))
            .bearer_auth(t)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        r.json().await.unwrap()
    }

    async fn stop(self) {
        stop(self.a).await;
        stop(self.b).await;
    }
}

fn paused() -> Value {
    json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600, "mode": "paused"})
}

fn applies(entries: &[Value], id: &str) -> usize {
    entries
        .iter()
        .filter(|e| e["action"] == "schedule.apply" && e["change"] == id)
        .count()
}

#[tokio::test]
async fn a_scheduled_opening_applies_on_both_instances_once_and_is_audited() {
    let p = Pair::start().await;
    let r = p.put_config("op", paused(), Some("ops-bob")).await;
    assert_eq!(r.status(), StatusCode::OK);
    p.join("op", "early-fan").await;
    let at = p.redis_in(2).await;
    let (s, change) = p
        .schedule(
            reqwest::Method::POST,
            "/admin/events/op/schedule",
            Some(json!({"at": at, "set": {"mode": "queue", "admit_per_minute": 1200}})),
            Some("ops-alice"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{change}");
    let id = change["id"].as_str().unwrap().to_owned();
    assert_eq!(change["status"], "pending");
    // The bootstrap secret is the actor; the name it sends is only a note (audit log).
    assert_eq!(change["scheduled_by"], "bootstrap");
    // Pending on both instances, and the waiting page is told when the sale opens.
    for g in [&p.a, &p.b] {
        let c = p.config(g, "op").await;
        assert_eq!(c["schedule"][0]["id"], id, "{c}");
        assert_eq!(c["config"]["mode"], "paused");
        assert!(c["opens_at"].is_string(), "{c}");
    }
    // The fan's instance learns of it on its next refresh.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = p.join("op", "early-fan").await;
        if waiting["opens_at"].is_string() {
            assert_eq!(waiting["state"], "paused");
            break;
        }
        assert!(Instant::now() < deadline, "no opening announced: {waiting}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.wait_both("op", "early-fan", |c, st| {
        c["config"]["mode"] == "queue"
            && c["config"]["admit_per_minute"] == 1200
            && c["schedule"].as_array().is_some_and(|a| a.is_empty())
            && st["state"] != "paused"
    })
    .await;
    let (s, done) = p
        .schedule(
            reqwest::Method::GET,
            &format!("/admin/events/op/schedule/{id}"),
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(done["status"], "applied", "{done}");
    let entries = p.audit_all("op").await;
    assert_eq!(
        applies(&entries, &id),
        1,
        "applied exactly once: {entries:?}"
    );
    let apply = entries
        .iter()
        .find(|e| e["action"] == "schedule.apply")
        .unwrap();
    assert_eq!(apply["actor"], "bootstrap", "who scheduled it");
    assert_eq!(apply["before"]["mode"], "paused");
    assert_eq!(apply["after"]["mode"], "queue");
    // Newest first: the apply, the add, the first PUT.
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["schedule.apply", "schedule.add", "config.put"]);
    assert_eq!(entries[1]["actor"], "bootstrap");
    assert_eq!(entries[1]["note"], "ops-alice");
    assert_eq!(entries[1]["role"], "admin");
    assert_eq!(entries[2]["actor"], "bootstrap");
    assert_eq!(entries[2]["note"], "ops-bob");
    // Cancelling an applied change is refused and changes nothing.
    let (s, v) = p
        .schedule(
            reqwest::Method::DELETE,
            &format!("/admin/events/op/schedule/{id}"),
            None,
            Some("ops-alice"),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(v["code"], "CHANGE_NOT_PENDING");
    assert_eq!(v["status"], "applied");
    p.stop().await;
}

#[tokio::test]
async fn a_cancelled_change_never_applies_and_an_edited_one_applies_as_edited() {
    let p = Pair::start().await;
    assert_eq!(
        p.put_config("cx", paused(), None).await.status(),
        StatusCode::OK
    );
    let post = |at: String, set: Value| {
        p.schedule(
            reqwest::Method::POST,
            "/admin/events/cx/schedule",
            Some(json!({"at": at, "set": set})),
            Some("ops"),
        )
    };
    let (s, doomed) = post(p.redis_in(2).await, json!({"mode": "queue"})).await;
    assert_eq!(s, StatusCode::CREATED);
    let doomed = doomed["id"].as_str().unwrap().to_owned();
    let (s, later) = post(p.redis_in(600).await, json!({"admit_per_minute": 60})).await;
    assert_eq!(s, StatusCode::CREATED);
    let later = later["id"].as_str().unwrap().to_owned();
    let (s, v) = p
        .schedule(
            reqwest::Method::DELETE,
            &format!("/admin/events/cx/schedule/{doomed}"),
            None,
            Some("ops-carol"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "cancelled");
    assert_eq!(v["done_by"], "bootstrap");
    // Edit the later change to run after the cancelled one's time: once it has applied, the
    // cancelled one (due earlier, so looked at first) would have applied too.
    let (s, v) = p
        .schedule(
            reqwest::Method::PUT,
            &format!("/admin/events/cx/schedule/{later}"),
            Some(json!({"at": p.redis_in(3).await, "set": {"admit_per_minute": 90}})),
            Some("ops-dan"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["edited_by"], "bootstrap");
    p.wait_both("cx", "fan", |c, _| {
        c["config"]["admit_per_minute"] == 90 && c["schedule"] == json!([])
    })
    .await;
    let c = p.config(&p.a, "cx").await;
    assert_eq!(
        c["config"]["mode"], "paused",
        "the cancelled change applied"
    );
    let entries = p.audit_all("cx").await;
    assert_eq!(applies(&entries, &doomed), 0);
    assert_eq!(applies(&entries, &later), 1);
    let cancel = entries
        .iter()
        .find(|e| e["action"] == "schedule.cancel")
        .unwrap();
    assert_eq!(cancel["actor"], "bootstrap");
    assert_eq!(cancel["note"], "ops-carol");
    assert_eq!(cancel["before"]["status"], "pending");
    assert_eq!(cancel["after"]["status"], "cancelled");
    let edit = entries
        .iter()
        .find(|e| e["action"] == "schedule.edit")
        .unwrap();
    assert_eq!(edit["before"]["set"]["admit_per_minute"], 60);
    assert_eq!(edit["after"]["set"]["admit_per_minute"], 90);
    // The earlier edit's record is gone; editing an applied change is refused.
    let (s, v) = p
        .schedule(
            reqwest::Method::PUT,
            &format!("/admin/events/cx/schedule/{later}"),
            Some(json!({"at": p.redis_in(60).await, "set": {"admit_per_minute": 5}})),
            Some("ops"),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = p
        .schedule(
            reqwest::Method::DELETE,
            "/admin/events/cx/schedule/nope",
            None,
            Some("ops"),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "CHANGE_NOT_FOUND");
    p.stop().await;
}

#[tokio::test]
async fn an_invalid_change_is_refused_with_its_problems_and_nothing_is_stored() {
    let p = Pair::start().await;
    assert_eq!(
        p.put_config("iv", paused(), None).await.status(),
        StatusCode::OK
    );
    let before = p.audit_all("iv").await.len();
    let soon = p.redis_in(60).await;
    let cases = [
        (
            json!({"at": soon, "set": {"admit_per_minute": 0}}),
            "set.admit_per_minute",
        ),
        (
            json!({"at": soon, "set": {"mode": "safety_net"}}),
            "set.safety_net",
        ),
        (json!({"at": soon, "set": {"bogus": 1}}), "set"),
        (json!({"at": soon, "set": {}}), "set"),
        (
            json!({"at": "2021-01-01T00:00:00Z", "set": {"mode": "queue"}}),
            "at",
        ),
    ];
    for (body, field) in cases {
        let (s, v) = p
            .schedule(
                reqwest::Method::POST,
                "/admin/events/iv/schedule",
                Some(body.clone()),
                Some("ops"),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert_eq!(v["code"], "VALIDATION_FAILED");
        assert!(
            v["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["field"] == field),
            "{body}: {v}"
        );
    }
    // No operator named: refused before anything else.
    let (s, v) = p
        .schedule(
            reqwest::Method::POST,
            "/admin/events/iv/schedule",
            Some(json!({"at": soon, "set": {"mode": "queue"}})),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["code"], "ACTOR_REQUIRED");
    // A config PUT whose schedule has a bad change stores neither.
    let mut cfg = paused();
    cfg["admit_per_minute"] = json!(777);
    cfg["schedule"] = json!([{"at": soon, "set": {"max_active": -1}}]);
    let r = p.put_config("iv", cfg, Some("ops")).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let c = p.config(&p.a, "iv").await;
    assert_eq!(c["config"]["admit_per_minute"], 600);
    assert_eq!(c["schedule"], json!([]));
    let (s, v) = p
        .schedule(
            reqwest::Method::GET,
            "/admin/events/iv/schedule",
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["pending"], json!([]));
    assert_eq!(
        p.audit_all("iv").await.len(),
        before,
        "a refusal was recorded"
    );
    let mut conn = redis_conn().await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(format!("{}fg:{{iv}}:sched", p.prefix))
        .arg(format!("{}fg:{{iv}}:schedq", p.prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 0);
    // A good PUT with a schedule stores both, and a second PUT naming none keeps it.
    let mut cfg = paused();
    cfg["schedule"] = json!([{"at": soon, "set": {"mode": "queue"}}]);
    assert_eq!(
        p.put_config("iv", cfg, Some("ops")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        p.put_config("iv", paused(), None).await.status(),
        StatusCode::OK
    );
    let c = p.config(&p.a, "iv").await;
    assert_eq!(c["schedule"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c["schedule"][0]["set"]["mode"], "queue");
    p.stop().await;
}

#[tokio::test]
async fn every_config_change_is_in_the_audit_log_newest_first_and_paged() {
    let p = Pair::start().await;
    let url = |path: &str| p.admin(&p.a, path);
    assert_eq!(
        p.put_config("au", paused(), None).await.status(),
        StatusCode::OK
    );
    let mut open = paused();
    open["mode"] = json!("queue");
    assert_eq!(
        p.put_config("au", open, Some("ops-erin")).await.status(),
        StatusCode::OK
    );
    let r = p
        .http
        .put(url("/admin/events/au/sold_out"))
        .bearer_auth(ADMIN)
        .header("x-floodgate-actor", "ops-frank")
        .json(&json!({"sold_out": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = p
        .http
        .post(url("/admin/events/au/revoke"))
        .bearer_auth(ADMIN)
        .header("x-floodgate-actor", "ops-gina")
        .json(&json!({"account": "mallory"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // An operator name that is no name is refused, and changes nothing.
    let r = p
        .http
        .put(url("/admin/events/au/sold_out"))
        .bearer_auth(ADMIN)
        .header("x-floodgate-actor", "   ")
        .json(&json!({"sold_out": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let all = p.audit_all("au").await;
    let got: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
                e["note"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    // The bootstrap secret is always the actor; the name it sent, if any, the note.
    assert_eq!(
        got,
        [
            ("revoke", "bootstrap", "ops-gina"),
            ("sold_out", "bootstrap", "ops-frank"),
            ("config.put", "bootstrap", "ops-erin"),
            ("config.put", "bootstrap", "-"),
        ]
    );
    assert!(
        all.iter()
            .all(|e| e["role"] == "admin" && e.get("operator_id").is_none())
    );
    assert_eq!(all[1]["before"], false);
    assert_eq!(all[1]["after"], true);
    assert_eq!(all[2]["before"]["mode"], "paused");
    assert_eq!(all[2]["after"]["mode"], "queue");
    assert_eq!(all[3]["before"], Value::Null);
    assert!(all[0]["at"].as_str().unwrap().ends_with('Z'));
    // Pages of two: the cursor walks the same entries.
    let (s, page1) = p.audit("au", "?limit=2").await;
    assert_eq!(s, StatusCode::OK);
    let cursor = page1["next_before"].as_str().unwrap().to_owned();
    let (_, page2) = p.audit("au", &format!("?limit=2&before={cursor}")).await;
    let ids = |v: &Value| -> Vec<Value> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].clone())
            .collect()
    };
    let mut paged = ids(&page1);
    paged.extend(ids(&page2));
    let every: Vec<Value> = all.iter().map(|e| e["id"].clone()).collect();
    assert_eq!(paged, every);
    let (_, page3) = p
        .audit(
            "au",
            &format!("?limit=2&before={}", page2["next_before"].as_str().unwrap()),
        )
        .await;
    assert_eq!(page3["entries"], json!([]));
    assert_eq!(page3["next_before"], Value::Null);
    // Nothing is older than the stream's first id (Redis refuses `(0-0`: this was a 503).
    let (s, origin) = p.audit("au", "?before=0-0").await;
    assert_eq!(s, StatusCode::OK, "{origin}");
    assert_eq!(origin["entries"], json!([]));
    for bad in [
        "?limit=0",
        "?limit=9999",
        "?before=x",
        "?what=1",
        "?before=18446744073709551616-0",
    ] {
        let (s, v) = p.audit("au", bad).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(v["code"], "VALIDATION_FAILED");
    }
    let (s, v) = p.audit("nobody", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "UNKNOWN_EVENT");
    p.stop().await;
}

#[tokio::test]
async fn a_change_that_no_longer_validates_when_due_fails_and_changes_nothing() {
    let p = Pair::start().await;
    let mut cfg = paused();
    cfg["safety_net"] = json!({"arrivals_per_minute": 100});
    assert_eq!(
        p.put_config("fl", cfg, Some("ops")).await.status(),
        StatusCode::OK
    );
    let (s, change) = p
        .schedule(
            reqwest::Method::POST,
            "/admin/events/fl/schedule",
            Some(json!({"at": p.redis_in(2).await, "set": {"mode": "safety_net"}})),
            Some("ops-hana"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{change}");
    let id = change["id"].as_str().unwrap().to_owned();
    // Ops drop the thresholds the change relies on (the schedule is kept).
    assert_eq!(
        p.put_config("fl", paused(), Some("ops")).await.status(),
        StatusCode::OK
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let failed = loop {
        let (_, v) = p
            .schedule(
                reqwest::Method::GET,
                &format!("/admin/events/fl/schedule/{id}"),
                None,
                None,
            )
            .await;
        if v["status"] != "pending" {
            break v;
        }
        assert!(Instant::now() < deadline, "never came due: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["problems"][0]["field"], "set.safety_net");
    let c = p.config(&p.a, "fl").await;
    assert_eq!(c["config"]["mode"], "paused");
    assert_eq!(c["schedule"], json!([]));
    let entries = p.audit_all("fl").await;
    assert_eq!(applies(&entries, &id), 0);
    let fail: Vec<&Value> = entries
        .iter()
        .filter(|e| e["action"] == "schedule.fail")
        .collect();
    assert_eq!(fail.len(), 1, "{entries:?}");
    // Whoever scheduled it: the bootstrap secret (its note, "ops-hana", is on the add).
    assert_eq!(fail[0]["actor"], "bootstrap");
    p.stop().await;
}
