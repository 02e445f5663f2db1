//! `POST /v1/payment_intents/{id}/cancel` as Stripe answers it: an intent that has not taken
//! money becomes `canceled` (and can no longer be completed), anything else is `400
//! payment_intent_unexpected_state`, an unknown id `404 resource_missing`, and a repeat with
//! the same `Idempotency-Key` replays the first answer.

use sandbox_provider::Application;
use sandbox_provider::config::{SandboxSettings, WebhookMode};
use secrecy::SecretString;
use serde_json::Value;

const KEY: &str = "sk_test_sandbox_cancel";

async fn start() -> String {
    let s = SandboxSettings {
        listen: "127.0.0.1:0".into(),
        api_key: SecretString::from(KEY),
        webhook_mode: WebhookMode::Manual,
        ..SandboxSettings::default()
    };
    let app = Application::build(s).await.expect("build");
    let url = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    url
}

async fn post(url: &str, path: &str, key: Option<&str>, form: &[(&str, &str)]) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth(KEY)
        .form(form);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON answer"))
}

async fn intent(url: &str, pm: &str) -> Value {
    let (status, v) = post(
        url,
        "/v1/payment_intents",
        None,
        &[
            ("amount", "5000"),
            ("currency", "jpy"),
            ("payment_method", pm),
            ("confirm", "true"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn cancel_answers_as_stripe_does() {
    let url = start().await;
    // 3-D Secure left unauthenticated: cancelable.
    let pi = intent(&url, "pm_card_authenticationRequired").await;
    assert_eq!(pi["status"], "requires_action");
    assert!(pi["canceled_at"].is_null(), "{pi}");
    let id = pi["id"].as_str().expect("id");
    let path = format!("/v1/payment_intents/{id}/cancel");
    let reason = [("cancellation_reason", "abandoned")];
    let (status, v) = post(&url, &path, Some("c1"), &reason).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "canceled");
    assert_eq!(v["cancellation_reason"], "abandoned");
    assert!(v["canceled_at"].as_i64().is_some(), "{v}");
    // The same key replays the first answer, even though a second cancel would be refused.
    let (status, replay) = post(&url, &path, Some("c1"), &reason).await;
    assert_eq!((status, &replay), (200, &v));
    // Without a key: the intent is canceled already.
    let (status, e) = post(&url, &path, None, &[]).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "payment_intent_unexpected_state");
    assert_eq!(e["error"]["payment_intent"]["status"], "canceled");
    // A canceled intent cannot be completed (the customer authenticating too late).
    let (status, e) = post(
        &url,
        &format!("/_sandbox/payment_intents/{id}/complete"),
        None,
        &[],
    )
    .await;
    assert_eq!(status, 400, "{e}");

    // Money taken: not cancelable.
    let paid = intent(&url, "pm_card_visa").await;
    let paid_id = paid["id"].as_str().expect("id");
    let (status, e) = post(
        &url,
        &format!("/v1/payment_intents/{paid_id}/cancel"),
        None,
        &[],
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["code"], "payment_intent_unexpected_state");
    assert_eq!(e["error"]["payment_intent"]["status"], "succeeded");

    // An unknown reason and an unknown intent.
    let pending = intent(&url, "pm_card_sandbox_processing").await;
    let pending_id = pending["id"].as_str().expect("id");
    let (status, e) = post(
        &url,
        &format!("/v1/payment_intents/{pending_id}/cancel"),
        None,
        &[("cancellation_reason", "bored")],
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "cancellation_reason");
    let (status, e) = post(&url, "/v1/payment_intents/pi_nope/cancel", None, &[]).await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["code"], "resource_missing");
}
