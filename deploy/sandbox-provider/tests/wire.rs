//! Stripe's wire as the sandbox takes it: form bodies only (JSON refused, unknown parameters
//! named), `Stripe-Version`, confirm later (once, under any concurrency), 3-D Secure and
//! processing outcomes and their settlement, refunds by charge, and events in Stripe's shape
//! (`request` naming the API request and its idempotency key, `charge.refunded` with its
//! refunds).

#[allow(dead_code, reason = "each test crate uses part of the shared helpers")]
mod common;
use sandbox_provider::Sandbox;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

const KEY: &str = "sk_test_wire_suite";

/// POSTs a form; (status, body, Request-Id).
async fn post(
    url: &str,
    path: &str,
    key: Option<&str>,
    form: &[(&str, &str)],
) -> (u16, Value, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth(KEY)
        .header("Stripe-Version", sandbox_provider::STRIPE_API_VERSION)
        .form(form);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let request = resp
        .headers()
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, resp.json().await.expect("json"), request)
}

const CARD: [(&str, &str); 3] = [
    ("amount", "700"),
    ("currency", "jpy"),
    ("payment_method_types[]", "card"),
];

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    CARD.iter().chain(extra).copied().collect()
}

#[tokio::test]
async fn json_bodies_unknown_parameters_and_bad_versions_are_refused_and_change_nothing() {
    let (url, sb) = common::start(KEY).await;
    let http = reqwest::Client::new();
    let json_body = http
        .post(format!("{url}/v1/payment_intents"))
        .bearer_auth(KEY)
        .json(
            &json!({"amount": 700, "currency": "jpy", "payment_method": "pm_card_visa",
                      "confirm": true}),
        )
        .send()
        .await
        .expect("request");
    assert_eq!(json_body.status().as_u16(), 400);
    let v: Value = json_body.json().await.expect("json");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (s, v, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &with(&[("colour", "red")]),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("parameter_unknown"))
    );
    assert_eq!(v["error"]["param"], "colour");
    let (s, v, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &[("amount", "-1"), ("currency", "jpy")],
    )
    .await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("amount")));
    let (s, v, _) = post(&url, "/v1/payment_intents", None, &[("currency", "jpy")]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("parameter_missing"))
    );
    let (s, v, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &with(&[("payment_method", "pm_card_visa"), ("confirm", "maybe")]),
    )
    .await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("confirm")));
    let bad_version = http
        .post(format!("{url}/v1/payment_intents"))
        .bearer_auth(KEY)
        .header("Stripe-Version", "yesterday")
        .form(&with(&[
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
        ]))
        .send()
        .await
        .expect("request");
    assert_eq!(bad_version.status().as_u16(), 400);
    assert_eq!(sb.0.store.stats()["intents"], 0, "nothing was created");
}

#[tokio::test]
async fn confirm_later_charges_once_under_concurrency() {
    let (url, sb) = common::start(KEY).await;
    let (s, pi, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &with(&[
            ("payment_method", "pm_card_visa"),
            ("metadata[order_id]", "w1"),
        ]),
    )
    .await;
    assert_eq!(
        (s, pi["status"].as_str()),
        (200, Some("requires_confirmation"))
    );
    let path = format!(
        "/v1/payment_intents/{}/confirm",
        pi["id"].as_str().expect("id")
    );
    // 50 confirms at once, each under its own key: one charges, the rest find it confirmed.
    let all = futures::future::join_all((0..50).map(|i| {
        let (url, path) = (url.clone(), path.clone());
        async move { post(&url, &path, Some(&format!("c{i}")), &[]).await }
    }))
    .await;
    let ok = all
        .iter()
        .filter(|(s, v, _)| *s == 200 && v["status"] == "succeeded")
        .count();
    let refused = all
        .iter()
        .filter(|(s, v, _)| *s == 400 && v["error"]["code"] == "payment_intent_unexpected_state")
        .count();
    assert_eq!((ok, refused), (1, 49), "{all:?}");
    assert_eq!(sb.order_summary("w1").charges, 1);
}

#[tokio::test]
async fn three_d_secure_and_processing_are_not_paid_until_they_settle() {
    let (url, sb) = common::start(KEY).await;
    let (s, action, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &with(&[
            ("payment_method", "pm_card_authenticationRequired"),
            ("confirm", "true"),
            ("metadata[order_id]", "a1"),
        ]),
    )
    .await;
    assert_eq!(
        (s, action["status"].as_str()),
        (200, Some("requires_action"))
    );
    assert_eq!(action["next_action"]["type"], "use_stripe_sdk");
    assert!(action["latest_charge"].is_null());
    let (s, processing, _) = post(
        &url,
        "/v1/payment_intents",
        None,
        &with(&[
            ("payment_method", "pm_card_sandbox_processing"),
            ("confirm", "true"),
            ("metadata[order_id]", "a2"),
        ]),
    )
    .await;
    assert_eq!(
        (s, processing["status"].as_str()),
        (200, Some("processing"))
    );
    assert_eq!(
        sb.order_summary("a1").charges + sb.order_summary("a2").charges,
        0
    );
    let http = reqwest::Client::new();
    let complete = |id: &str, body: Value| {
        http.post(format!("{url}/_sandbox/payment_intents/{id}/complete"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    let done = complete(
        action["id"].as_str().expect("id"),
        json!({"outcome": "succeeded"}),
    )
    .await
    .expect("request");
    assert_eq!(done.status().as_u16(), 200);
    let failed = complete(
        processing["id"].as_str().expect("id"),
        json!({"outcome": "failed"}),
    )
    .await
    .expect("request");
    assert_eq!(failed.status().as_u16(), 200);
    let again = complete(action["id"].as_str().expect("id"), json!({}))
        .await
        .expect("request");
    assert_eq!(
        again.status().as_u16(),
        400,
        "a succeeded intent has nothing to complete"
    );
    let bad = complete(
        action["id"].as_str().expect("id"),
        json!({"outcome": "maybe"}),
    )
    .await
    .expect("request");
    assert_eq!(bad.status().as_u16(), 400);
    assert_eq!(
        (
            sb.order_summary("a1").charges,
            sb.order_summary("a2").declines
        ),
        (1, 1)
    );
    let kinds: Vec<String> = events(&sb)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "payment_intent.requires_action",
            "payment_intent.processing",
            "payment_intent.succeeded",
            "payment_intent.payment_failed"
        ]
    );
}

/// Flushes the queued events to a local receiver and returns them.
async fn events(sb: &Sandbox) -> Vec<Value> {
    use axum::routing::post as route_post;
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let receiver = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/hook",
            route_post(move |body: String| {
                let seen = seen.clone();
                async move {
                    if let Ok(v) = serde_json::from_str::<Value>(&body) {
                        seen.lock().expect("lock").push(v);
                    }
                    axum::http::StatusCode::OK
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hook = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, receiver).await });
    sb.update(|s| s.webhook_url = hook);
    sb.flush_webhooks(false, false).await;
    seen.lock().expect("lock").clone()
}

#[tokio::test]
async fn events_have_stripes_shape_and_refunds_go_by_charge_once() {
    let (url, sb) = common::start(KEY).await;
    let (s, pi, request) = post(
        &url,
        "/v1/payment_intents",
        Some("ev-1"),
        &with(&[
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("metadata[order_id]", "e1"),
        ]),
    )
    .await;
    assert_eq!(s, 200);
    assert!(request.starts_with("req_"), "Request-Id: {request}");
    let charge = pi["latest_charge"].as_str().expect("charge id").to_owned();
    let (s, refund, refund_request) = post(
        &url,
        "/v1/refunds",
        Some("ev-r"),
        &[("charge", &charge), ("reason", "requested_by_customer")],
    )
    .await;
    assert_eq!(s, 200, "{refund}");
    assert_eq!(
        (refund["payment_intent"].as_str(), refund["charge"].as_str()),
        (pi["id"].as_str(), Some(charge.as_str()))
    );
    let (s, v, _) = post(
        &url,
        "/v1/refunds",
        Some("ev-r2"),
        &[("payment_intent", pi["id"].as_str().expect("id"))],
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("charge_already_refunded"))
    );
    let (s, v, _) = post(&url, "/v1/refunds", None, &[("charge", "ch_nope")]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("resource_missing"))
    );
    let (s, _, _) = post(
        &url,
        "/v1/refunds",
        None,
        &[
            ("payment_intent", pi["id"].as_str().expect("id")),
            ("reason", "bored"),
        ],
    )
    .await;
    assert_eq!(s, 400);
    let evs = events(&sb).await;
    assert_eq!(evs.len(), 2, "{evs:?}");
    let succeeded = &evs[0];
    assert_eq!(succeeded["object"], "event");
    assert_eq!(
        succeeded["api_version"],
        sandbox_provider::STRIPE_API_VERSION
    );
    assert_eq!(succeeded["livemode"], false);
    assert_eq!(succeeded["pending_webhooks"], 1);
    assert_eq!(
        succeeded["request"],
        json!({"id": request, "idempotency_key": "ev-1"})
    );
    assert_eq!(succeeded["data"]["object"]["object"], "payment_intent");
    assert_eq!(succeeded["data"]["object"]["metadata"]["order_id"], "e1");
    let refunded = &evs[1];
    assert_eq!(refunded["type"], "charge.refunded");
    assert_eq!(refunded["request"]["id"], refund_request);
    let ch = &refunded["data"]["object"];
    assert_eq!(
        (ch["object"].as_str(), ch["id"].as_str()),
        (Some("charge"), Some(charge.as_str()))
    );
    assert_eq!(
        (
            ch["amount"].as_i64(),
            ch["amount_refunded"].as_i64(),
            ch["refunded"].as_bool()
        ),
        (Some(700), Some(700), Some(true))
    );
    assert_eq!(ch["refunds"]["data"][0]["id"], refund["id"]);
}
