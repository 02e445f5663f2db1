//! The waiting page in headless Chromium explains the safety net queueing a surge and a
//! scheduled opening ("the sale opens at HH:MM", the fan's local time: UTC in the test
//! browser), in English and in Japanese.

use crate::helpers::*;
use serde_json::json;
use std::time::Duration;
use testkit::browser::{Browser, Page, chromium_or_skip};

const NOTE: &str = "(() => { const n = document.getElementById('note'); \
                    return n && !n.hidden ? n.textContent : ''; })()";

/// Shows `event`'s waiting page, waits for the note to contain `en`, switches to Japanese
/// and waits for it to contain `ja`.
async fn note_in_both_languages(page: &Page<'_>, app: &TestApp, event: &str, en: &str, ja: &str) {
    page.call(
        "Page.navigate",
        json!({"url": app.url(&format!("/e/{event}"))}),
    )
    .await;
    page.wait_until(NOTE, Duration::from_secs(20), |v| {
        v.as_str().is_some_and(|s| s.contains(en))
    })
    .await;
    page.eval("document.getElementById('lang').click()").await;
    page.wait_until(NOTE, Duration::from_secs(10), |v| {
        v.as_str().is_some_and(|s| s.contains(ja))
    })
    .await;
    // Back to English for the next page (the choice is remembered).
    page.eval("document.getElementById('lang').click()").await;
}

#[tokio::test]
async fn waiting_page_explains_the_safety_net_and_a_scheduled_opening() {
    let Some(bin) = chromium_or_skip("the browser test") else {
        return;
    };
    let app = TestApp::spawn().await;
    // A safety net that trips at the second arrival and admits one fan a minute.
    let sn = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1,
                    "mode": "safety_net", "safety_net": {"arrivals_per_minute": 1}});
    assert!(app.put_config("snb", sn).await.status().is_success());
    for (a, want) in [("calm-fan", "admitted"), ("surge-fan", "waiting")] {
        let t = app.login(a).await;
        let v = json(app.join("snb", &t).await).await;
        assert_eq!(v["state"], want, "{v}");
    }
    // A paused room with an opening scheduled an hour ahead (Redis time, whole minutes).
    let mut conn = redis_conn().await;
    let (now_s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let opens = chrono::DateTime::from_timestamp((now_s / 60 + 60) * 60, 0).unwrap();
    let paused = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
                        "mode": "paused",
                        "schedule": [{"at": opens.to_rfc3339(), "set": {"mode": "queue"}}]});
    assert!(app.put_config("opb", paused).await.status().is_success());
    let hhmm = opens.format("%H:%M").to_string();

    let chrome = Browser::launch(&bin).await;
    let page = chrome.open_page().await;
    note_in_both_languages(&page, &app, "snb", "High demand", "アクセスが集中").await;
    let state = page.eval("document.body.getAttribute('data-state')").await;
    assert_eq!(state, "waiting");
    note_in_both_languages(
        &page,
        &app,
        "opb",
        &format!("The sale opens at {hhmm}."),
        &format!("販売開始は {hhmm} です。"),
    )
    .await;
    let state = page.eval("document.body.getAttribute('data-state')").await;
    assert_eq!(state, "paused");
}
