//! Booking's Stripe adapter (`HttpProvider`) against a third-party Stripe fake: `localstripe`
//! (PyPI, pinned in `deploy/stripe-compat/requirements.txt`), spawned on a free port, for
//! every call it supports — create + confirm, retrieve (and an unknown id), refund. It has no
//! idempotent replay, no search and none of our fault knobs (see docs/decisions.md), so those
//! stay with the sandbox's tests.
//!
//! localstripe lives in the venv that `deploy/stack test` sets up (`.stack/py`, exported as
//! `FLOODGATE_TEST_PYTHON`). Without it the test fails when `CI` is set and otherwise skips
//! loudly.

use booking::payments::PaymentSettings;
use booking::payments::provider::{CreatePayment, PaymentProvider, PaymentStatus, ProviderError};
use booking::payments::stripe::HttpProvider;
use secrecy::SecretString;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv's `localstripe`, or `None` (after failing under CI) when it is missing.
fn localstripe_bin() -> Option<PathBuf> {
    let python = std::env::var_os("FLOODGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".stack/py/bin/python"));
    let bin = python.with_file_name("localstripe");
    if bin.exists() {
        return Some(bin);
    }
    let msg = format!(
        "localstripe not found at {}: run `deploy/stack deps python` (or set \
         FLOODGATE_TEST_PYTHON)",
        bin.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPED: {msg}\n");
    None
}

/// A running localstripe, stopped (by its own pid) when dropped. It saves its state to a
/// fixed `/tmp/localstripe.pickle`; `--from-scratch` keeps a run from loading another's.
struct Fake {
    child: Child,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(bin: PathBuf) -> (Fake, String) {
    let port = crate::helpers::free_port();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--from-scratch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn localstripe");
    let fake = Fake { child };
    // Ready when it answers; bounded (~30 s) so a broken install fails instead of hanging.
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return (fake, url);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("localstripe did not start on port {port}");
}

#[tokio::test]
async fn booking_adapter_passes_against_localstripe() {
    let Some(bin) = localstripe_bin() else { return };
    let (_fake, url) = start(bin).await;
    let provider = HttpProvider::new(&PaymentSettings {
        provider_url: url,
        api_key: SecretString::from("sk_test_localstripe"),
        ..PaymentSettings::default()
    })
    .expect("build the adapter");
    let req = CreatePayment {
        idempotency_key: format!("fake-{}", std::process::id()),
        amount: 4200,
        currency: "JPY".into(),
        payment_method: "pm_card_visa".into(),
        metadata: BTreeMap::from([
            ("order_id".to_owned(), "ord_fake".to_owned()),
            ("payment_id".to_owned(), "pay_fake".to_owned()),
            ("attempt".to_owned(), "1".to_owned()),
        ]),
    };
    // Create + confirm: a form-encoded PaymentIntent, metadata round-tripped.
    let paid = provider.create_payment(&req).await.expect("create");
    assert_eq!(paid.status, PaymentStatus::Succeeded);
    assert!(paid.id.starts_with("pi_"), "{}", paid.id);
    assert_eq!(paid.amount, 4200);
    assert_eq!(paid.meta("order_id"), Some("ord_fake"));
    assert_eq!(paid.meta("payment_id"), Some("pay_fake"));
    // Retrieve, and an unknown id as Stripe's 404.
    let got = provider.retrieve(&paid.id).await.expect("retrieve");
    assert_eq!(
        (got.id.as_str(), &got.status),
        (paid.id.as_str(), &PaymentStatus::Succeeded)
    );
    assert_eq!(got.meta("attempt"), Some("1"));
    match provider.retrieve("pi_does_not_exist").await {
        Err(ProviderError::Rejected { status: 404, .. }) => {}
        other => panic!("an unknown intent must be a 404 refusal: {other:?}"),
    }
    // Refund the whole payment.
    let refund = provider
        .refund(&format!("refund-{}", paid.id), &paid.id, None)
        .await
        .expect("refund");
    assert!(refund.id.starts_with("re_"), "{}", refund.id);
    assert_eq!(
        (refund.payment_id.as_str(), refund.amount),
        (paid.id.as_str(), 4200)
    );
}

/// 3-D Secure (`requires_action`) and `processing` answers from the sandbox: the pay request
/// is answered as in progress, nothing is sold, and only the provider's later
/// `payment_intent.succeeded` (the customer authenticated) pays the order — once, however
/// often it arrives and however the client retries.
#[tokio::test]
async fn requires_action_and_processing_are_pending_until_the_provider_settles() {
    use crate::payments::{PayEnv, order_status, pay, payment_state, seat_order};
    let env = PayEnv::spawn().await;
    let o = seat_order(&env.app, "ev3ds", true, "alice", &["S1-R1-1"]).await;
    let (status, v) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_authenticationRequired",
    )
    .await;
    assert_ne!(status, 200, "requires_action is not paid: {v}");
    assert_eq!(order_status(&env.app, &o.order_id).await, "PENDING_PAYMENT");
    let before = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (before["tickets"].as_i64(), before["succeeded"].as_i64()),
        (Some(0), Some(0))
    );
    // The retry with the same key asks the provider again (same Idempotency-Key): no new charge.
    let (status, _) = pay(
        &env.app,
        &o.token,
        &o.order_id,
        "k1",
        "pm_card_authenticationRequired",
    )
    .await;
    assert_ne!(status, 200);
    assert_eq!(env.charges(&o.order_id), 0);
    let intents = env.intents(&o.order_id);
    assert_eq!(intents.len(), 1, "one intent for one attempt: {intents:?}");
    // The customer completes 3-D Secure at the provider; the success event pays the order.
    let done = env
        .app
        .client
        .post(format!(
            "{}/_sandbox/payment_intents/{}/complete",
            env.provider_url, intents[0]
        ))
        .bearer_auth(crate::payments::API_KEY)
        .send()
        .await
        .expect("complete");
    assert_eq!(done.status().as_u16(), 200);
    let flushed = env.sandbox.flush_webhooks(false, true).await;
    assert!(
        flushed.iter().all(|d| d["acknowledged"] == true),
        "{flushed:?}"
    );
    assert_eq!(order_status(&env.app, &o.order_id).await, "PAID");
    let after = payment_state(&env.app, &o.order_id).await;
    assert_eq!(
        (after["tickets"].as_i64(), after["succeeded"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(env.charges(&o.order_id), 1);

    // processing, then the bank declines: still unpaid; a good card then pays once.
    let p = seat_order(&env.app, "ev3ds", false, "bob", &["S1-R1-2"]).await;
    let (status, _) = pay(
        &env.app,
        &p.token,
        &p.order_id,
        "p1",
        "pm_card_sandbox_processing",
    )
    .await;
    assert_ne!(status, 200);
    let intent = env.intents(&p.order_id)[0].clone();
    let failed = env
        .app
        .client
        .post(format!(
            "{}/_sandbox/payment_intents/{intent}/complete",
            env.provider_url
        ))
        .bearer_auth(crate::payments::API_KEY)
        .json(&serde_json::json!({"outcome": "failed"}))
        .send()
        .await
        .expect("complete");
    assert_eq!(failed.status().as_u16(), 200);
    env.sandbox.flush_webhooks(false, false).await;
    assert_eq!(order_status(&env.app, &p.order_id).await, "PENDING_PAYMENT");
    let (status, v) = pay(&env.app, &p.token, &p.order_id, "p2", "pm_card_visa").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(order_status(&env.app, &p.order_id).await, "PAID");
    assert_eq!(env.charges(&p.order_id), 1);
}
