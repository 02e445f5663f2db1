//! `max_active` slots in a running gateway: a revocation or a paid order frees one at once,
//! and concurrent payments never push admissions over the cap.
//!
//! "B is not admitted" is shown over stepped ticks that certainly ran ([`Stepper`] holds the
//! event's lease, so the gateway's own ticker stays a follower), never within some sleep.

use crate::helpers::*;
use crate::stepper::{Stepper, pace};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;

/// One `max_active` slot: fan A is admitted and holds it, fan B waits behind the cap.
/// Admission is stepped by `stepper`.
struct OneSlot {
    a: String,
    a_session: String,
    a_admission: String,
    b: String,
    stepper: Stepper,
}

/// Paced ticks: nobody is admitted to `event`, though the bucket has tokens (the cap holds).
async fn ticks_admit_nobody(stepper: &mut Stepper, event: &str) {
    for _ in 0..5 {
        pace().await;
        let l = stepper.lead(event).await;
        assert_eq!((l.admitted, l.active, l.queue_len), (0, 1, 1));
    }
    assert!(stepper.bucket_tokens(event).await >= 1.0);
}

async fn one_slot_two_fans(app: &TestApp, event: &str) -> OneSlot {
    let cfg = |mode: &str| {
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
               "max_active": 1, "mode": mode})
    };
    let mut stepper = Stepper::take_lease(app, event).await;
    app.put_config(event, cfg("paused")).await;
    let a = app.login(&format!("fan-{event}-a")).await;
    let a_session = json(app.join(event, &a).await).await["session"]
        .as_str()
        .expect("join answers the session")
        .to_owned();
    let b = app.login(&format!("fan-{event}-b")).await;
    assert!(app.join(event, &b).await.status().is_success());
    app.put_config(event, cfg("queue")).await;
    stepper.watch(event).await;
    let first = stepper
        .lead_until_admitted(event, Duration::from_secs(5))
        .await;
    assert_eq!((first.admitted, first.queue_len), (1, 1));
    let a_admission = app.wait_admitted(event, &a, Duration::from_secs(5)).await["token"]
        .as_str()
        .expect("an admission token")
        .to_owned();
    // A holds the only slot (token lifetime: minutes); B waits behind the cap.
    ticks_admit_nobody(&mut stepper, event).await;
    assert_eq!(json(app.status(event, &b).await).await["state"], "waiting");
    OneSlot {
        a,
        a_session,
        a_admission,
        b,
        stepper,
    }
}

#[tokio::test]
async fn revoking_a_session_frees_its_slot_at_once() {
    let app = TestApp::spawn().await;
    let mut f = one_slot_two_fans(&app, "rvs").await;
    let r = app
        .http
        .post(app.admin_url("/admin/events/rvs/revoke"))
        .bearer_auth(ADMIN)
        .json(&json!({"session": f.a_session}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The slot returns to the budget now, not when A's token would have expired: the very
    // next tick admits B.
    assert_eq!(f.stepper.lead("rvs").await.admitted, 1);
    let v = app.wait_admitted("rvs", &f.b, Duration::from_secs(5)).await;
    assert_eq!(v["state"], "admitted");
    // A's place is gone: asking again says so (the waiting page then rejoins at the back).
    assert_eq!(
        app.status("rvs", &f.a).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_paid_order_returns_the_fans_slot_to_the_budget() {
    let app = TestApp::spawn().await;
    let mut f = one_slot_two_fans(&app, "paid").await;
    let post = |path: &str| {
        app.http
            .post(app.url(path))
            .bearer_auth(&f.a_admission)
            .send()
    };
    // Shopping (anything but a successful payment) keeps the slot.
    assert_eq!(post("/api/orders").await.unwrap().status(), StatusCode::OK);
    ticks_admit_nobody(&mut f.stepper, "paid").await;
    assert_eq!(
        json(app.status("paid", &f.b).await).await["state"],
        "waiting"
    );
    // Paid (the upstream answers 200): the slot is free for the next fan at once (the
    // release runs just after the answer, so tick until it has landed).
    assert_eq!(
        post("/api/orders/ord_1/pay").await.unwrap().status(),
        StatusCode::OK
    );
    let l = f
        .stepper
        .lead_until_admitted("paid", Duration::from_secs(5))
        .await;
    assert_eq!((l.admitted, l.queue_len), (1, 0));
    let v = app
        .wait_admitted("paid", &f.b, Duration::from_secs(5))
        .await;
    assert_eq!(v["state"], "admitted");
    // A keeps a working admission (order pages, receipts) until the token expires...
    let page = app
        .http
        .get(app.url("/api/orders/ord_1"))
        .bearer_auth(&f.a_admission)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    // ...but no new order without a slot, and B holds the only one (`slots_retake.rs`).
    let r = post("/api/orders").await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json(r).await["code"], "ROOM_FULL");
}

#[tokio::test]
async fn many_fans_paying_at_once_never_exceed_max_active_and_all_get_through() {
    let app = TestApp::spawn().await;
    app.put_config(
        "payrush",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000,
               "max_active": 5, "mode": "paused"}),
    )
    .await;
    let fans = join_many(&app, "payrush", 40, "pr").await;
    app.put_config(
        "payrush",
        json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60000, "max_active": 5}),
    )
    .await;
    // Every fan polls until admitted, then pays at once; all 40 run concurrently.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (mut c, adm, act, done) = (
            app.redis.clone(),
            app.key("payrush", "adm"),
            app.key("payrush", "active"),
            done.clone(),
        );
        tokio::spawn(async move {
            let mut worst = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (a, b): (u64, u64) = redis::pipe()
                    .cmd("ZCARD")
                    .arg(&adm)
                    .cmd("ZCARD")
                    .arg(&act)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                worst = worst.max(a + b);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            worst
        })
    };
    let rush = fans.iter().enumerate().map(|(i, t)| {
        let app = &app;
        async move {
            let v = app
                .wait_admitted("payrush", t, Duration::from_secs(30))
                .await;
            let adm = v["token"].as_str().expect("an admission token");
            let r = app
                .http
                .post(app.url(&format!("/api/orders/ord_{i}/pay")))
                .bearer_auth(adm)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
    });
    futures::future::join_all(rush).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = watcher.await.unwrap();
    assert!(
        worst <= 5,
        "{worst} fans held admissions at once (max_active 5)"
    );
    // Only freed slots let the next fans in: 40 admitted with a cap of 5, each exactly once.
    let adm = app.admissions("payrush").await;
    assert_eq!(adm.len(), 40);
    let mut names: Vec<_> = adm.into_iter().map(|(a, _, _)| a).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 40);
}
