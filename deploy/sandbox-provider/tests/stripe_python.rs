//! Stripe's official Python library (`stripe==16.1.0`) against a running sandbox: create and
//! confirm, confirm later, retrieve, refund once, partial refunds up to the charge, decline
//! (`CardError` with its decline code), 3-D Secure and processing, idempotent replay and its
//! refusal, bad input, a bad key (`deploy/stripe-compat/stripe_client_check.py`).
//!
//! The library lives in a venv that `deploy/stack test` sets up (`.stack/py`, exported as
//! `FLOODGATE_TEST_PYTHON`). Without it the test fails when `CI` is set and otherwise skips
//! loudly.

mod common;

use std::path::PathBuf;
use std::process::Command;

const KEY: &str = "sk_test_python_suite";

/// The venv's python, or `None` (after failing under CI) when it is missing.
fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("FLOODGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::root().join(".stack/py/bin/python"));
    let has_stripe = Command::new(&candidate)
        .args([
            "-c",
            "import stripe, sys; sys.exit(stripe.VERSION != '16.1.0')",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if has_stripe {
        return Some(candidate);
    }
    common::unavailable(&format!(
        "Stripe's Python library (stripe==16.1.0) not found at {}: run `deploy/stack deps \
         python` (or set FLOODGATE_TEST_PYTHON)",
        candidate.display()
    ));
    None
}

#[tokio::test]
async fn stripes_official_python_library_works_against_the_sandbox() {
    let Some(python) = python() else { return };
    let (url, sandbox) = common::start(KEY).await;
    let mut check = Command::new(python);
    check.arg(common::root().join("deploy/stripe-compat/stripe_client_check.py"));
    common::run_checks("Python", check, &url, KEY).await;
    // What the library did is what the sandbox recorded: 4 charges (create+confirm, the
    // partially refunded one, the later confirm, the idempotent pair once), one decline, one
    // full refund and three partial ones (the replay and the refusals refunded nothing).
    let stats = sandbox.0.store.stats();
    assert_eq!(stats["charges"], 4, "{stats}");
    assert_eq!(stats["refunds"], 4, "{stats}");
    assert_eq!(stats["declines"], 1, "{stats}");
}
