//! The fans' pages (issue 41, item 4): nothing a page loads is answered `404` (browsers ask
//! for `/favicon.ico` unless a page names its icon), and the waiting page shows the event's
//! name from the room config, in the fan's language, as text.

use crate::helpers::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;
use testkit::browser::{Browser, chromium_or_skip};

const PAGES: [&str; 4] = ["/", "/e/pg", "/e/pg/shop", "/e/pg/tickets"];

/// The same-origin paths a page names in `src` and `href` attributes.
fn referenced(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in [" src=\"", " href=\""] {
        for part in html.split(attr).skip(1) {
            if let Some(v) = part.split('"').next()
                && v.starts_with('/')
                && !v.starts_with("//")
            {
                out.push(v.to_owned());
            }
        }
    }
    out
}

/// Every page of the public listener names an icon, every file it names is served, and
/// `/favicon.ico` (which browsers ask for regardless) is a real icon.
#[tokio::test]
async fn every_page_and_every_file_it_names_is_served_never_404() {
    let app = TestApp::spawn().await;
    for page in PAGES {
        let r = app.http.get(app.url(page)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{page}");
        let html = r.text().await.unwrap();
        assert!(
            html.contains("<link rel=\"icon\" href=\"/favicon.svg\""),
            "{page} names no icon, so browsers ask for /favicon.ico"
        );
        let files = referenced(&html);
        assert!(files.len() >= 2, "{page}: {files:?}");
        for file in files {
            let r = app.http.get(app.url(&file)).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{page} names {file}");
        }
    }
    let r = app.http.get(app.url("/favicon.svg")).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "image/svg+xml");
    assert!(r.text().await.unwrap().starts_with("<svg"));
    let r = app.http.get(app.url("/favicon.ico")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "image/x-icon");
    let icon = r.bytes().await.unwrap();
    assert_eq!(icon[..4], [0, 0, 1, 0], "an ICO file");
}

/// The ticket page: served for any event slug with its strict CSP, which allows calls to the
/// configured tickets origin and nothing else; the URL is in the page's meta tag (and the
/// shop's), and the service worker's script is served from the root, whose scope covers
/// `/e/{event}/tickets`.
#[tokio::test]
async fn the_ticket_page_carries_its_csp_and_the_configured_tickets_origin() {
    let app = TestApp::spawn_with(|c| {
        c.gateway.tickets_api_url = "https://booking.example:8443/".into();
    })
    .await;
    let r = app
        .http
        .get(app.url("/e/pg/tickets?order=o1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self' https://booking.example:8443;",
        "worker-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'none'",
    ] {
        assert!(csp.contains(part), "{part} not in {csp}");
    }
    let html = r.text().await.unwrap();
    assert!(
        html.contains(
            r#"<meta name="floodgate-tickets-api" content="https://booking.example:8443">"#
        ),
        "{html}"
    );
    let shop = app.http.get(app.url("/e/pg/shop")).send().await.unwrap();
    assert!(shop.headers().get("content-security-policy").is_none());
    assert!(
        shop.text()
            .await
            .unwrap()
            .contains(r#"content="https://booking.example:8443""#)
    );
    let sw = app
        .http
        .get(app.url("/tickets-sw.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(sw.status(), StatusCode::OK);
    assert_eq!(
        sw.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let r = app
        .http
        .post(app.url("/e/pg/tickets"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
}

async fn config_of(app: &TestApp, event: &str) -> Value {
    let r = app
        .http
        .get(app.admin_url(&format!("/admin/events/{event}/config")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    json(r).await
}

/// The room config's optional `name`: one string or one per language, validated (`422`,
/// nothing applied), returned by the config GET and carried by every join answer.
#[tokio::test]
async fn the_room_config_takes_a_name_per_language_and_joins_carry_it() {
    let app = TestApp::spawn().await;
    let room = |name: Value| {
        let mut c = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
                           "mode": "paused"});
        if !name.is_null() {
            c["name"] = name;
        }
        c
    };
    for bad in [
        json!(""),
        json!("   "),
        json!("a".repeat(101)),
        json!("bell\u{7}"),
        json!({}),
        json!({"english": "Stadium Tour"}),
        json!({"en": ""}),
        json!({"en": "ok", "JA": "ok"}),
    ] {
        let r = app.put_config("nm", room(bad.clone())).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        let v = json(r).await;
        assert_eq!(v["code"], "VALIDATION_FAILED", "{v}");
        assert_eq!(v["errors"][0]["field"], "name", "{v}");
    }
    let r = app.put_config("nm", room(json!(42))).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = app
        .http
        .get(app.admin_url("/admin/events/nm/config"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "nothing was applied");

    let both = json!({"en": "Stadium Tour", "ja": "スタジアムツアー", "pt-BR": "Turnê"});
    let r = app.put_config("nm", room(both.clone())).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    assert_eq!(config_of(&app, "nm").await["config"]["name"], both);
    let fan = app.login("fan-named").await;
    let v = json(app.join("nm", &fan).await).await;
    assert_eq!(v["name"], both, "{v}");

    let r = app.put_config("nm", room(json!("Stadium Tour"))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        config_of(&app, "nm").await["config"]["name"],
        "Stadium Tour"
    );
    // The join answers from the instance's snapshot, refreshed every `refresh_ms`.
    testkit::wait::eventually(
        Duration::from_secs(5),
        "the join to carry the new name",
        || {
            let (app, fan) = (&app, &fan);
            async move {
                let v = json(app.join("nm", fan).await).await;
                (v["name"] == "Stadium Tour").then_some(())
            }
        },
    )
    .await;

    // Unnamed again: the name is gone from both.
    let r = app.put_config("nm", room(Value::Null)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(config_of(&app, "nm").await["config"].get("name").is_none());
    testkit::wait::eventually(Duration::from_secs(5), "the join to drop the name", || {
        let (app, fan) = (&app, &fan);
        async move {
            let v = json(app.join("nm", fan).await).await;
            v.get("name").is_none().then_some(())
        }
    })
    .await;
}

/// In a real browser: the index, waiting, shop and ticket pages load without a single `404`, their
/// icon is served, and the waiting page shows the event's name in the fan's language, as
/// text (markup in a name is shown, never parsed).
#[tokio::test]
async fn pages_load_in_a_browser_without_a_404_and_the_waiting_page_shows_the_name() {
    let Some(bin) = chromium_or_skip("the pages browser test") else {
        return;
    };
    let app = TestApp::spawn().await;
    let cfg = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 60,
                     "mode": "paused",
                     "name": {"en": "Stadium Tour", "ja": "スタジアムツアー <b>東京</b>"}});
    assert_eq!(app.put_config("pg", cfg).await.status(), StatusCode::OK);
    let chrome = Browser::launch(&bin).await;
    let page = chrome.open_page().await;
    page.record_responses().await;

    page.navigate(&app.url("/")).await;
    page.navigate(&app.url("/e/pg")).await;
    let name = "document.getElementById('event-name').textContent";
    page.wait_until(name, Duration::from_secs(15), |v| v == "Stadium Tour")
        .await;
    page.eval("document.getElementById('lang').click()").await;
    assert_eq!(page.eval(name).await, "スタジアムツアー <b>東京</b>");
    assert_eq!(
        page.eval("document.getElementById('event-name').children.length")
            .await,
        0,
        "the name is text, never markup"
    );
    // Back to English for the next pages (the choice is remembered).
    page.eval("document.getElementById('lang').click()").await;
    page.wait_for(
        "document.body.getAttribute('data-state') === 'paused'",
        Duration::from_secs(15),
    )
    .await;

    // The shop without an admission: it asks booking through the gateway (401) and sends
    // the fan back to the waiting room; what matters here is what it loads.
    page.navigate(&app.url("/e/pg/shop")).await;
    page.wait_for(
        "performance.getEntriesByType('resource').some(e => e.name.includes('/api/'))",
        Duration::from_secs(15),
    )
    .await;
    // The ticket page, with the login token the waiting page kept: with no `tickets_api_url`
    // it asks its own origin, where the gateway wants an admission (401 ADMISSION_REQUIRED);
    // the page says it could not load the tickets (not "sign in again"). Its CSP let every
    // file it names load: a refused script would leave "Loading…" on screen.
    page.navigate(&app.url("/e/pg/tickets")).await;
    let note = page
        .wait_for(
            "document.getElementById('loading').hidden && document.getElementById('note').innerText",
            Duration::from_secs(15),
        )
        .await;
    assert_eq!(
        note,
        "Your tickets could not be loaded (401). Try again in a moment.",
    );
    assert_eq!(
        page.eval("getComputedStyle(document.querySelector('.tp-bar')).backgroundColor")
            .await,
        "rgb(0, 0, 0)",
        "the stylesheet applied under the CSP"
    );
    for icon in [
        "document.querySelector('link[rel=icon]').href",
        "location.origin + '/favicon.ico'",
    ] {
        let status = page
            .eval(&format!("fetch({icon}).then(r => r.status)"))
            .await;
        assert_eq!(status, 200, "{icon}");
    }

    let answers = page.responses();
    assert!(answers.len() >= 8, "{answers:#?}");
    let missing: Vec<_> = answers.iter().filter(|(_, s)| *s == 404).collect();
    assert!(
        missing.is_empty(),
        "answered 404 while loading: {missing:#?}"
    );
    page.assert_no_js_errors();
}
