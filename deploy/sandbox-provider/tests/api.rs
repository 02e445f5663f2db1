//! The sandbox's own contract over HTTP: authentication, idempotency (replay, mismatch,
//! concurrency), declines, search, refunds at most once, and signed webhook delivery with
//! retries.

use sandbox_provider::config::{SandboxSettings, WebhookMode};
use sandbox_provider::{Application, Sandbox};
use secrecy::SecretString;
use serde_json::{Value, json};

const KEY: &str = "sk_test_sandbox_suite";

async fn start(adjust: impl FnOnce(&mut SandboxSettings)) -> (String, Sandbox) {
    let mut s = SandboxSettings {
        listen: "127.0.0.1:0".into(),
        api_key: SecretString::from(KEY),
        webhook_mode: WebhookMode::Manual,
        ..SandboxSettings::default()
    };
    adjust(&mut s);
    let app = Application::build(s).await.expect("build");
    let url = format!("http://127.0.0.1:{}", app.port());
    let handle = app.sandbox();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    (url, handle)
}

/// Stripe's form encoding of a JSON object, one level of nesting (`metadata[k]=v`).
fn form(v: &Value) -> Vec<(String, String)> {
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = Vec::new();
    for (k, v) in v.as_object().expect("an object") {
        match v {
            Value::Object(m) => {
                out.extend(m.iter().map(|(mk, mv)| (format!("{k}[{mk}]"), scalar(mv))));
            }
            other => out.push((k.clone(), scalar(other))),
        }
    }
    out
}

async fn create(url: &str, key: Option<&str>, body: &Value) -> (u16, Value, bool) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/v1/payment_intents"))
        .bearer_auth(KEY)
        .form(&form(body));
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.expect("request");
    let replayed = resp.headers().contains_key("idempotent-replayed");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json"), replayed)
}

fn intent(order: &str, pm: &str) -> Value {
    json!({"amount": 1000, "currency": "jpy", "payment_method": pm, "confirm": true,
           "metadata": {"order_id": order, "attempt": "1"}})
}

#[tokio::test]
async fn idempotency_key_replays_and_refuses_other_parameters() {
    let (url, sb) = start(|_| {}).await;
    let (s1, v1, r1) = create(&url, Some("k1"), &intent("o1", "pm_card_visa")).await;
    assert_eq!((s1, r1), (200, false));
    assert_eq!(v1["status"], "succeeded");
    let (s2, v2, r2) = create(&url, Some("k1"), &intent("o1", "pm_card_visa")).await;
    assert_eq!((s2, r2), (200, true));
    assert_eq!(v1["id"], v2["id"]);
    let (s3, v3, _) = create(&url, Some("k1"), &intent("o1", "pm_card_mastercard")).await;
    assert_eq!(s3, 400);
    assert_eq!(v3["error"]["type"], "idempotency_error");
    assert_eq!(sb.order_summary("o1").charges, 1);
    // Concurrent requests with one key: one charge; the others replay or see 409.
    sb.update(|s| s.latency_ms = 100);
    let body = intent("o2", "pm_card_visa");
    let all = futures::future::join_all((0..20).map(|_| create(&url, Some("k2"), &body))).await;
    assert!(
        all.iter().all(|(s, _, _)| *s == 200 || *s == 409),
        "{all:?}"
    );
    assert_eq!(sb.order_summary("o2").charges, 1);
}

#[tokio::test]
async fn auth_declines_search_and_refunds() {
    let (url, sb) = start(|_| {}).await;
    let client = reqwest::Client::new();
    let unauth = client
        .post(format!("{url}/v1/payment_intents"))
        .bearer_auth("sk_wrong")
        .form(&form(&intent("o", "pm_card_visa")))
        .send()
        .await
        .unwrap();
    assert_eq!(unauth.status().as_u16(), 401);
    let (s, v, _) = create(&url, Some("d"), &intent("o", "pm_card_chargeDeclined")).await;
    assert_eq!(s, 402);
    assert_eq!(v["error"]["decline_code"], "generic_decline");
    assert_eq!(
        v["error"]["payment_intent"]["status"],
        "requires_payment_method"
    );
    let (_, ok, _) = create(&url, Some("c"), &intent("o", "pm_card_visa")).await;
    let found: Value = client
        .get(format!("{url}/v1/payment_intents/search"))
        .query(&[("query", "metadata['order_id']:'o'")])
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(found["data"].as_array().map(Vec::len), Some(2));
    let refund = |key: &'static str| {
        client
            .post(format!("{url}/v1/refunds"))
            .bearer_auth(KEY)
            .header("Idempotency-Key", key)
            .form(&[("payment_intent", ok["id"].as_str().unwrap_or_default())])
            .send()
    };
    let r1 = refund("r1").await.unwrap();
    assert_eq!(r1.status().as_u16(), 200);
    let r1b: Value = refund("r1").await.unwrap().json().await.unwrap();
    let r2 = refund("r2").await.unwrap();
    assert_eq!(
        r2.status().as_u16(),
        400,
        "a second refund under another key is refused"
    );
    let r2: Value = r2.json().await.unwrap();
    assert_eq!(r2["error"]["code"], "charge_already_refunded");
    let summary = sb.order_summary("o");
    assert_eq!(
        (summary.charges, summary.declines, summary.refunds),
        (1, 1, 1)
    );
    assert_eq!(r1b["object"], "refund");
}

#[tokio::test]
async fn webhooks_are_signed_and_retried_until_acknowledged() {
    use axum::routing::post;
    use std::sync::{Arc, Mutex};
    // A merchant that fails the first delivery and records the rest.
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let calls = Arc::new(Mutex::new(0u32));
    let app = {
        let seen = seen.clone();
        let calls = calls.clone();
        axum::Router::new().route(
            "/hook",
            post(move |headers: axum::http::HeaderMap, body: String| {
                let seen = seen.clone();
                let calls = calls.clone();
                async move {
                    let n = {
                        let mut c = calls.lock().unwrap();
                        *c += 1;
                        *c
                    };
                    if n == 1 {
                        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    let sig = headers
                        .get("stripe-signature")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push((sig, body));
                    axum::http::StatusCode::OK
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (url, sb) = start(|s| {
        s.webhook_mode = WebhookMode::Async;
        s.webhook_url = hook;
        s.webhook_secret = SecretString::from("whsec_suite");
        s.webhook_backoff_ms = 20;
    })
    .await;
    create(&url, Some("w"), &intent("ow", "pm_card_visa")).await;
    // Wait (bounded, 10 s) until the sandbox has recorded both attempts (it records an
    // attempt after the merchant's answer arrives, so wait on its log, not on the merchant).
    for _ in 0..1_000 {
        if sb.deliveries().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (sig, body) = seen
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("delivered after a retry");
    let ts: i64 = sig
        .split(',')
        .find_map(|p| p.strip_prefix("t="))
        .and_then(|t| t.parse().ok())
        .expect("t=");
    assert_eq!(
        sig,
        sandbox_provider::webhooks::signature_header("whsec_suite", ts, body.as_bytes())
    );
    let event: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(event["type"], "payment_intent.succeeded");
    let attempts: Vec<Option<u16>> = sb.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(attempts, [Some(500), Some(200)]);
}

async fn search(url: &str, order: &str) -> Vec<Value> {
    let v: Value = reqwest::Client::new()
        .get(format!("{url}/v1/payment_intents/search"))
        .bearer_auth(KEY)
        .query(&[("query", format!("metadata['order_id']:'{order}'"))])
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    v["data"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn search_lag_hides_young_intents_but_retrieve_and_replay_find_them() {
    let (url, sb) = start(|s| s.search_lag_s = 3_600).await;
    let (s, created, _) = create(&url, Some("lag-1"), &intent("lagging", "pm_card_visa")).await;
    assert_eq!(s, 200);
    // Charged, yet search does not return it (the index trails writes).
    assert_eq!(sb.order_summary("lagging").charges, 1);
    assert!(search(&url, "lagging").await.is_empty());
    // Asking about the attempt's own key (a replay) or the intent id finds it, no new charge.
    let (s, replayed, was_replay) =
        create(&url, Some("lag-1"), &intent("lagging", "pm_card_visa")).await;
    assert_eq!((s, was_replay), (200, true));
    assert_eq!(replayed["id"], created["id"]);
    let got: Value = reqwest::Client::new()
        .get(format!(
            "{url}/v1/payment_intents/{}",
            created["id"].as_str().expect("id")
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(got["status"], "succeeded");
    assert_eq!(sb.order_summary("lagging").charges, 1);
    // Without the lag the same search finds it.
    sb.update(|s| s.search_lag_s = 0);
    assert_eq!(search(&url, "lagging").await.len(), 1);
}

#[tokio::test]
async fn dashboard_refunds_and_disputes_send_stripe_shaped_webhooks() {
    let (url, sb) = start(|_| {}).await;
    let http = reqwest::Client::new();
    let (_, a, _) = create(&url, Some("d-1"), &intent("dash", "pm_card_visa")).await;
    let (_, b, _) = create(&url, Some("d-2"), &intent("dash2", "pm_card_visa")).await;
    let (_, declined, _) = create(
        &url,
        Some("d-3"),
        &intent("dash3", "pm_card_chargeDeclined"),
    )
    .await;
    let a_id = a["id"].as_str().expect("id");
    let b_id = b["id"].as_str().expect("id");
    let post = |path: String, body: Option<Value>| {
        let mut req = http.post(format!("{url}{path}")).bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.expect("json"))
        }
    };
    let (s, refund) = post(format!("/_sandbox/payment_intents/{a_id}/refund"), None).await;
    assert_eq!(s, 200, "{refund}");
    assert_eq!(refund["amount"], 1000);
    // Twice is refused: the money went back once.
    let (s, again) = post(format!("/_sandbox/payment_intents/{a_id}/refund"), None).await;
    assert_eq!(
        (s, again["error"]["code"].as_str()),
        (400, Some("charge_already_refunded"))
    );
    let (s, dispute) = post(
        format!("/_sandbox/payment_intents/{b_id}/dispute"),
        Some(json!({"reason": "product_not_received"})),
    )
    .await;
    assert_eq!(s, 200, "{dispute}");
    assert_eq!(dispute["object"], "dispute");
    assert_eq!(dispute["payment_intent"], b_id);
    assert_eq!(dispute["amount"], 1000);
    let (s, _) = post(format!("/_sandbox/payment_intents/{b_id}/dispute"), None).await;
    assert_eq!(s, 400);
    // Nothing to refund or dispute on a declined intent or an unknown one; bad input is a
    // clear error.
    let declined_id = declined["error"]["payment_intent"]["id"]
        .as_str()
        .expect("declined intent id");
    let (s, _) = post(
        format!("/_sandbox/payment_intents/{declined_id}/dispute"),
        None,
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = post("/_sandbox/payment_intents/pi_nope/refund".into(), None).await;
    assert_eq!(s, 404);
    let (s, _) = post(
        format!("/_sandbox/payment_intents/{b_id}/refund"),
        Some(json!({"amount": -5})),
    )
    .await;
    assert_eq!(s, 400);
    let summary = sb.order_summary("dash");
    assert_eq!((summary.refunds, summary.amount_refunded), (1, 1000));
    assert_eq!(sb.order_summary("dash2").disputes, 1);
    // The queued webhooks reach the merchant in order: charge.refunded (the charge, with the
    // payment's metadata), then charge.dispute.created (the dispute naming charge and intent).
    use axum::routing::post as route_post;
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let receiver = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/hook",
            route_post(move |body: String| {
                let seen = seen.clone();
                async move {
                    if let Ok(v) = serde_json::from_str::<Value>(&body) {
                        seen.lock().unwrap().push(v);
                    }
                    axum::http::StatusCode::OK
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });
    sb.update(|s| s.webhook_url = hook);
    let delivered = sb.flush_webhooks(false, false).await;
    assert!(
        delivered.iter().all(|d| d["acknowledged"] == true),
        "{delivered:?}"
    );
    let events = seen.lock().unwrap().clone();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "payment_intent.succeeded",
            "payment_intent.succeeded",
            "payment_intent.payment_failed",
            "charge.refunded",
            "charge.dispute.created"
        ]
    );
    let charge = &events[3]["data"]["object"];
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["payment_intent"], a_id);
    assert_eq!(charge["amount_refunded"], 1000);
    assert_eq!(charge["metadata"]["order_id"], "dash");
    let dispute = &events[4]["data"]["object"];
    assert_eq!(dispute["object"], "dispute");
    assert_eq!(dispute["payment_intent"], b_id);
    assert!(
        dispute["charge"]
            .as_str()
            .is_some_and(|c| c.starts_with("ch_"))
    );
}
