//! The waiting page in a real headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol against a running gateway: it must show the fan's position, then move
//! on to the event's shop page once admitted.

use crate::helpers::*;
use serde_json::json;
use std::time::Duration;
use testkit::browser::{Browser, chromium_or_skip};

#[tokio::test]
async fn waiting_page_shows_the_position_then_moves_on_to_the_shop() {
    let Some(bin) = chromium_or_skip("the browser test") else {
        return;
    };
    let app = TestApp::spawn().await;
    let paused = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
                        "mode": "paused"});
    assert!(app.put_config("br", paused).await.status().is_success());
    // Two fans already wait, so the browser's fan is third.
    for a in ["first-fan", "second-fan"] {
        let t = app.login(a).await;
        assert!(app.join("br", &t).await.status().is_success());
    }
    let chrome = Browser::launch(&bin).await;
    let page = chrome.open_page().await;
    page.call("Page.navigate", json!({"url": app.url("/e/br")}))
        .await;
    // The page logs in (dev mode), joins and shows the position and the paused state.
    page.wait_until(
        "document.getElementById('position') && document.getElementById('position').textContent",
        Duration::from_secs(15),
        |v| v == "3",
    )
    .await;
    let state = page.eval("document.body.getAttribute('data-state')").await;
    assert_eq!(state, "paused");
    let ahead = page
        .eval("document.getElementById('ahead').textContent")
        .await;
    assert_eq!(ahead, "2");
    // Japanese on request.
    page.eval("document.getElementById('lang').click()").await;
    let label = page
        .eval("document.querySelector('[data-i18n=\"label.position\"]').textContent")
        .await;
    assert_eq!(label, "あなたの順番");
    // Reloading keeps the place.
    page.call("Page.reload", json!({})).await;
    page.wait_until(
        "document.getElementById('position') && document.getElementById('position').textContent",
        Duration::from_secs(15),
        |v| v == "3",
    )
    .await;
    // Admission opens: the page moves on to the shop by itself, with the admission cookie.
    let open = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 6000});
    assert!(app.put_config("br", open).await.status().is_success());
    page.wait_until("location.pathname", Duration::from_secs(20), |v| {
        v == "/e/br/shop"
    })
    .await;
    let cookies = page
        .call("Network.getCookies", json!({"urls": [app.url("/")]}))
        .await;
    let names: Vec<&str> = cookies["cookies"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"fg_admission"),
        "admission cookie not stored: {cookies}"
    );
}
