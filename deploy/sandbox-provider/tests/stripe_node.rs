//! Stripe's official Node library (npm `stripe` 23.2.0) against a running sandbox, the twin of
//! `stripe_python.rs`: create and confirm, confirm later, retrieve, refund once, partial refunds
//! up to the charge, decline (`StripeCardError` with its decline code), 3-D Secure and
//! processing, idempotent replay and its refusal, update (metadata merged, the amount fixed
//! once paid), cancel, list and search with the library's auto-pagination, refund retrieve and
//! list, Stripe's JSON error for what the sandbox does not serve, bad input, a bad key
//! (`deploy/stripe-compat/stripe_client_check.mjs`).
//!
//! The library comes from the one Node toolchain of the tests (`deploy/node/`), which
//! `deploy/stack test` installs and exports as `FLOODGATE_TEST_NODE_MODULES`. Without it the
//! test fails when `CI` is set and otherwise skips loudly.

mod common;

use std::path::PathBuf;
use std::process::Command;

const KEY: &str = "sk_test_node_suite";

/// The installed node_modules folder, or `None` (after failing under CI) when it is not set.
fn node_modules() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FLOODGATE_TEST_NODE_MODULES") {
        // Set but wrong is a broken setup, not a reason to skip: the script says what is missing.
        return Some(PathBuf::from(dir));
    }
    common::unavailable(
        "FLOODGATE_TEST_NODE_MODULES is not set, so Stripe's Node library is not available: run \
         the tests with `deploy/stack test` (or set it to the output of `deploy/node/install.sh`)",
    );
    None
}

#[tokio::test]
async fn stripes_official_node_library_works_against_the_sandbox() {
    let Some(modules) = node_modules() else {
        return;
    };
    let (url, sandbox) = common::start(KEY).await;
    let mut node = Command::new("node");
    node.arg(common::root().join("deploy/stripe-compat/stripe_client_check.mjs"))
        .env("FLOODGATE_TEST_NODE_MODULES", modules);
    common::run_checks("Node (Node.js >= 20 on the PATH)", node, &url, KEY).await;
    // What the library did is what the sandbox recorded: 5 charges (create+confirm, the
    // partially refunded one, the later confirm, the idempotent pair once, the updated one), one
    // decline, one full refund and three partial ones (the replays and the refusals refunded
    // nothing).
    let stats = sandbox.0.store.stats();
    assert_eq!(stats["charges"], 5, "{stats}");
    assert_eq!(stats["refunds"], 4, "{stats}");
    assert_eq!(stats["declines"], 1, "{stats}");
}
