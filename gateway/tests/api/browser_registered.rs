//! The waiting page of a registered room in headless Chromium: a fan who is not on the list
//! is told so in English and Japanese, with the closing time in their locale, and can register
//! from the page while registration is open, after which they are queued.

use crate::helpers::*;
use crate::registered::rfc3339;
use serde_json::json;
use std::time::Duration;
use testkit::browser::{Browser, chromium_or_skip};

#[tokio::test]
async fn the_waiting_page_says_not_registered_in_english_and_japanese_then_registers() {
    let Some(bin) = chromium_or_skip("the browser test") else {
        return;
    };
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now();
    let closes = now + chrono::Duration::days(1);
    let cfg = json!({
        "sale_start": rfc3339(now + chrono::Duration::days(2)),
        "registration_closes": rfc3339(closes),
        "access": "registered",
        "admit_per_minute": 600,
        "mode": "paused",
    });
    assert!(app.put_config("brr", cfg).await.status().is_success());
    let year = closes.format("%Y").to_string();

    let chrome = Browser::launch(&bin).await;
    let page = chrome.open_page().await;
    page.call("Page.navigate", json!({"url": app.url("/e/brr")}))
        .await;
    page.wait_until(
        "document.body.getAttribute('data-state')",
        Duration::from_secs(15),
        |v| v == "not_registered",
    )
    .await;
    let headline = page
        .eval("document.getElementById('headline').textContent")
        .await;
    assert_eq!(headline, "This sale is for registered fans");
    let msg = page
        .eval("document.getElementById('message').textContent")
        .await;
    let msg = msg.as_str().unwrap_or_default().to_owned();
    assert!(
        msg.starts_with("You are not registered for this sale. Registration closes at "),
        "{msg}"
    );
    assert!(msg.contains(&year), "closing time not shown: {msg}");
    let button = page
        .eval("document.getElementById('action').hidden ? '' : document.getElementById('action').textContent")
        .await;
    assert_eq!(button, "Register");

    page.eval("document.getElementById('lang').click()").await;
    let headline = page
        .eval("document.getElementById('headline').textContent")
        .await;
    assert_eq!(headline, "この販売は事前登録された方限定です");
    let msg = page
        .eval("document.getElementById('message').textContent")
        .await;
    let msg = msg.as_str().unwrap_or_default().to_owned();
    assert!(
        msg.starts_with("このアカウントはこの販売に登録されていません。登録の締め切りは"),
        "{msg}"
    );
    assert!(msg.contains(&year), "closing time not shown: {msg}");
    let button = page
        .eval("document.getElementById('action').textContent")
        .await;
    assert_eq!(button, "登録する");

    // Registering from the page queues the fan (first in the room), with the room's note.
    page.eval("document.getElementById('action').click()").await;
    page.wait_until(
        "document.getElementById('position') && document.getElementById('position').textContent",
        Duration::from_secs(15),
        |v| v == "1",
    )
    .await;
    let note = page
        .eval("document.getElementById('room-note').hidden ? '' : document.getElementById('room-note').textContent")
        .await;
    assert_eq!(
        note,
        "この販売は事前登録された方限定です。あなたは登録済みです。"
    );
    let count = app
        .http
        .get(app.admin_url("/admin/events/brr/registrations"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(json(count).await["count"], 1);
}
