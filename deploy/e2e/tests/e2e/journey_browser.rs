//! The fan journey in real headless Chromium on a phone-sized viewport, through the gateway:
//! the waiting page shows the fan's place, admission sends the fan to the shop (the
//! admission travels only in the HttpOnly cookie), the fan picks
//! seats (one of them is taken by someone else at the last moment), holds, checks out, is
//! declined once, pays with the good test card and sees the tickets. Then the database and
//! the provider are checked.
//!
//! Skipped (with a printed reason) only when Chromium is absent and `CI` is unset.

use crate::journey_api::admitted_fan;
use crate::stack::{Stack, demo_event, json};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;
use testkit::browser::{Browser, Page, chromium_or_skip};

const WAIT: Duration = Duration::from_secs(20);

/// Where screenshots go (never committed): `$FLOODGATE_E2E_SCREENSHOTS` or /tmp.
pub fn shot(name: &str) -> PathBuf {
    let dir = std::env::var_os("FLOODGATE_E2E_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("floodgate-e2e-{name}.png"))
}

fn visible(id: &str) -> String {
    format!(
        "(() => {{ const e = document.getElementById('{id}'); return !!e && !e.hidden && e.offsetParent !== null; }})()"
    )
}

async fn seat_class(page: &Page<'_>, seat: &str) -> String {
    page.eval(&format!(
        "(() => {{ const b = document.querySelector('button.seat[data-seat=\"{seat}\"]'); return b ? b.className : ''; }})()"
    ))
    .await
    .as_str()
    .unwrap_or_default()
    .to_owned()
}

#[tokio::test]
async fn fan_journey_in_a_real_browser() {
    let Some(chromium) = chromium_or_skip("browser journey") else {
        return;
    };
    let stack = Stack::start().await;
    // Paused at first, so the fan sees a place in the queue before being let in.
    let paused = json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                        "mode": "paused"});
    let event = stack.create_event(&demo_event("e2e-web"), &paused).await;
    let browser = Browser::launch(&chromium).await;
    let page = browser.new_page(390, 844).await;
    page.set_locale("en-US").await;

    // The event site hands the fan's login over to the waiting page (#identity=...).
    let (status, login) = json(
        stack
            .http
            .post(stack.gw("/dev/login"))
            .json(&json!({"account": "fan-web-1"}))
            .send()
            .await
            .expect("dev login"),
    )
    .await;
    assert_eq!(status, 200, "{login}");
    let identity = login["token"].as_str().expect("identity token");
    page.navigate(&stack.gw(&format!("/e/{event}#identity={identity}")))
        .await;
    page.wait_for(
        &format!(
            "{} && document.getElementById('position').innerText.trim() === '1'",
            visible("queue")
        ),
        WAIT,
    )
    .await;
    page.screenshot(&shot("waiting"), false).await;

    // Ops open the gate: the page is admitted and moves on to the shop by itself, carrying
    // the admission in the HttpOnly cookie the status answer set.
    let mut open = paused.clone();
    open["mode"] = json!("queue");
    stack.configure_waiting_room(&event, &open).await;
    page.wait_for(
        &format!("location.pathname === '/e/{event}/shop'"),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        page.eval("document.cookie.includes('fg_admission')").await,
        json!(false),
        "the admission cookie must be HttpOnly"
    );

    // The shop: sections overview, open S1, pick two seats.
    page.wait_for(
        "document.querySelectorAll('#sections .section-card').length === 2",
        WAIT,
    )
    .await;
    assert_eq!(page.text("#event-name").await, "Floodgate E2E Tour — Tokyo");
    assert!(
        page.text("#limit-note").await.contains("Up to 4 tickets"),
        "{}",
        page.text("#limit-note").await
    );
    page.click(".section-card[data-section='S1']").await;
    page.wait_for(
        "document.querySelectorAll('#grid button.seat.s-available').length === 96",
        WAIT,
    )
    .await;
    page.screenshot(&shot("shop-map"), false).await;
    page.click("button.seat[data-seat='S1-R3-5']").await;
    page.click("button.seat[data-seat='S1-R3-6']").await;
    let tray = page.text("#tray-text").await;
    assert!(
        tray.contains("2 selected") && tray.contains("24,000"),
        "{tray}"
    );
    page.screenshot(&shot("shop-picked"), false).await;

    // Someone else takes S1-R3-6 just before the fan holds: the page must say so, mark the
    // seat, drop it from the pick, and create no hold. The page's map refreshes are held back
    // meanwhile, so a refresh cannot tell the page first (that path has its own message).
    page.hold_requests("*/seats*").await;
    let rival = admitted_fan(&stack, &event, "fan-web-rival").await;
    let (status, body) = rival
        .post(
            &stack,
            &format!("/api/events/{event}/holds"),
            None,
            &json!({"seats": ["S1-R3-6"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    page.click("#hold").await;
    page.wait_for(
        "(() => { const b = document.querySelector(\"button.seat[data-seat='S1-R3-6']\"); \
          return b && b.classList.contains('s-taken') && !b.classList.contains('s-selected'); })()",
        WAIT,
    )
    .await;
    let alert = page.text("#alert").await;
    assert!(
        alert.contains("someone else just took Section S1, row 3, seat 6"),
        "{alert}"
    );
    // At least the refresh the 409 triggered was held back: the page updated without it.
    assert!(page.release_requests().await >= 1);
    assert!(seat_class(&page, "S1-R3-5").await.contains("s-selected"));
    let holds: i64 =
        sqlx::query_scalar("SELECT count(*) FROM holds WHERE account_id = 'fan-web-1'")
            .fetch_one(&stack.pool)
            .await
            .expect("holds");
    assert_eq!(holds, 0, "a refused hold must leave nothing behind");
    page.screenshot(&shot("shop-seat-taken"), false).await;

    // Pick a replacement and hold: the countdown runs from the server's held_until.
    page.click("button.seat[data-seat='S1-R3-7']").await;
    page.click("#hold").await;
    page.wait_for(&visible("step-hold"), WAIT).await;
    let countdown = page.text("#hold-countdown").await;
    let minutes: u32 = countdown
        .strip_prefix("Held for ")
        .and_then(|r| r.split(':').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("countdown text: {countdown}"));
    assert!((8..=10).contains(&minutes), "{countdown}");
    let items = page.text("#hold-items").await;
    assert!(items.contains("Section S1, row 3, seat 5"), "{items}");
    assert!(items.contains("Section S1, row 3, seat 7"), "{items}");
    page.screenshot(&shot("shop-held"), false).await;

    // The tickets by e-mail too: an address for this test alone, typed on the hold step.
    let email = testkit::mail::unique_address("fan-web-");
    page.eval(&format!(
        "document.getElementById('email').value = {}",
        serde_json::to_string(&email).expect("json")
    ))
    .await;

    // Checkout, then a declined card, then the good card.
    page.click("#checkout").await;
    page.wait_for(&visible("step-pay"), WAIT).await;
    assert!(page.text("#pay-form").await.contains("SANDBOX"));
    // A reload resumes the same checkout (same order), it does not start another one.
    let order_line = page.text("#pay-order").await;
    page.navigate(&stack.gw(&format!("/e/{event}/shop"))).await;
    page.wait_for(&visible("step-pay"), WAIT).await;
    assert_eq!(page.text("#pay-order").await, order_line);
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = 'fan-web-1'")
            .fetch_one(&stack.pool)
            .await
            .expect("orders");
    assert_eq!(orders, 1);
    page.screenshot(&shot("shop-pay"), true).await;
    page.click("input[name='card'][value='pm_card_chargeDeclined']")
        .await;
    page.click("#pay").await;
    page.wait_for(
        "document.getElementById('alert').innerText.includes('declined')",
        WAIT,
    )
    .await;
    page.screenshot(&shot("shop-declined"), false).await;
    page.click("input[name='card'][value='pm_card_visa']").await;
    page.click("#pay").await;
    page.wait_for(&visible("step-ticket"), WAIT).await;
    let tickets = page.text("#tickets").await;
    assert!(tickets.contains("Section S1, row 3, seat 5"), "{tickets}");
    assert!(tickets.contains("Section S1, row 3, seat 7"), "{tickets}");
    assert_eq!(
        page.eval("document.querySelectorAll('#tickets .ticket').length")
            .await,
        json!(2)
    );
    // The same scannable codes as the ticket page (tickets-render.js), and a link to it.
    page.wait_for(
        "document.querySelectorAll('#ticket-codes canvas.tk-qr').length === 2",
        WAIT,
    )
    .await;
    assert_eq!(
        page.eval("[...document.querySelectorAll('#ticket-codes canvas.tk-qr')].every(c => c.getBoundingClientRect().width >= 240)")
            .await,
        json!(true)
    );
    let link = page
        .eval("document.getElementById('ticket-page-link').getAttribute('href')")
        .await;
    assert!(
        link.as_str()
            .is_some_and(|l| l.starts_with(&format!("/e/{event}/tickets?order="))),
        "{link}"
    );
    assert!(
        page.text("#ticket-page-line").await.contains("ticket page"),
        "{}",
        page.text("#ticket-page-line").await
    );
    page.screenshot(&shot("shop-ticket"), false).await;

    // Japanese, from the toggle.
    page.click("#lang").await;
    page.wait_for("document.documentElement.lang === 'ja'", WAIT)
        .await;
    let ja = page.text("#step-ticket").await;
    assert!(
        ja.contains("チケット") && ja.contains("S1 ブロック 3列 5番"),
        "{ja}"
    );
    page.screenshot(&shot("shop-ticket-ja"), false).await;
    page.assert_no_js_errors();

    // The database and the provider agree with the page.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT t.seat_id, o.status, o.id FROM tickets t JOIN orders o ON o.id = t.order_id
         WHERE t.account_id = 'fan-web-1' ORDER BY t.seat_id",
    )
    .fetch_all(&stack.pool)
    .await
    .expect("tickets");
    let seats: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(seats, ["S1-R3-5", "S1-R3-7"]);
    assert!(rows.iter().all(|r| r.1 == "PAID"));
    let order_id = rows[0].2.clone();
    let summary = stack.sandbox.order_summary(&order_id);
    assert_eq!(summary.charges, 1, "{summary:?}");
    assert_eq!(summary.declines, 1, "{summary:?}");
    assert_eq!(summary.amount_charged, 24000);
    let rival_seat: (String, Option<String>) = sqlx::query_as(
        "SELECT status, hold_id FROM seats WHERE event_id = $1 AND seat_id = 'S1-R3-6'",
    )
    .bind(&event)
    .fetch_one(&stack.pool)
    .await
    .expect("rival seat");
    assert_eq!(rival_seat.0, "held", "the rival keeps the seat they took");

    // The mail, as the local SMTP server received it: one message, whose QR images decode
    // (zbarimg, an independent decoder) to exactly the codes the fan's ticket API gives, and
    // those verify with the published JWKS (npm jose). The address is nowhere but Postgres.
    let mail = testkit::mail::Mailbox::from_env()
        .wait_for(&email, 1, Duration::from_secs(60))
        .await;
    assert_eq!(mail.len(), 1, "exactly one message to {email}");
    let parsed = mail[0].parsed();
    let text = parsed.text.as_deref().unwrap_or_default();
    for seat in ["Seat S1-R3-5", "Seat S1-R3-7"] {
        assert!(
            text.contains(seat),
            "{seat:?} missing from the mail: {text}"
        );
    }
    let mut mailed: Vec<String> = parsed
        .parts
        .iter()
        .filter(|p| p.content_type == "image/png")
        .flat_map(|p| testkit::mail::zbar_decode(&p.bytes))
        .collect();
    mailed.sort();
    let (status, listed) = json(
        stack
            .http
            .get(format!(
                "{}/api/orders/{order_id}/tickets",
                stack.booking_url
            ))
            .bearer_auth(identity)
            .send()
            .await
            .expect("the fan's tickets"),
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let mut codes: Vec<String> = listed["tickets"]
        .as_array()
        .expect("tickets")
        .iter()
        .map(|t| t["code"].as_str().expect("a code").to_owned())
        .collect();
    codes.sort();
    assert_eq!(mailed, codes, "the mailed QR codes are the fan's codes");
    if let Some(modules) = crate::tickets_page::node_modules() {
        let checked = crate::tickets_page::node(
            &crate::tickets_page::jose_script(),
            &modules,
            &json!({"jwks_url": format!("{}/api/events/{event}/ticket-keys", stack.booking_url),
                    "valid": mailed, "invalid": []}),
        )
        .await;
        for r in checked["valid"].as_array().expect("valid") {
            assert_eq!(r["ok"], true, "{r}");
        }
    }
    let outbox: Vec<(String,)> = sqlx::query_as("SELECT payload::text FROM outbox")
        .fetch_all(&stack.pool)
        .await
        .expect("outbox");
    assert!(
        outbox.iter().all(|(p,)| !p.contains(&email)),
        "the address left Postgres' contact table"
    );

    drop(page);
    drop(browser);
    stack.stop().await;
}

/// Opens the shop for a fan admitted over HTTP (the cookie is put into the browser as the
/// status answer would have set it), with the sections overview loaded.
async fn open_shop<'b>(
    stack: &Stack,
    browser: &'b Browser,
    event: &str,
    account: &str,
) -> Page<'b> {
    let page = browser.new_page(390, 844).await;
    page.set_locale("en-US").await;
    let fan = admitted_fan(stack, event, account).await;
    let (name, value) = fan.cookie.split_once('=').expect("cookie pair");
    page.call(
        "Network.setCookie",
        json!({"name": name, "value": value, "url": stack.gateway_url, "httpOnly": true,
               "sameSite": "Lax"}),
    )
    .await;
    page.navigate(&stack.gw(&format!("/e/{event}/shop"))).await;
    page.wait_for(
        "document.querySelectorAll('#sections .section-card').length === 2",
        WAIT,
    )
    .await;
    page
}

#[tokio::test]
async fn shop_keyboard_limit_expiry_ga_outage_and_lost_admission() {
    let Some(chromium) = chromium_or_skip("browser journey") else {
        return;
    };
    let mut stack = Stack::start().await;
    let event = stack
        .create_event(
            &demo_event("e2e-edge"),
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue"}),
        )
        .await;
    let browser = Browser::launch(&chromium).await;
    let page = open_shop(&stack, &browser, &event, "fan-edge-1").await;
    page.click(".section-card[data-section='S2']").await;
    page.wait_for(
        "document.querySelector(\"button.seat[data-seat='S2-R1-1']\")",
        WAIT,
    )
    .await;

    // Keyboard: one tab stop in the grid, arrow keys move, Enter picks and unpicks.
    page.eval("document.querySelector('#grid button.seat[tabindex=\"0\"]').focus()")
        .await;
    assert_eq!(
        page.eval("document.activeElement.dataset.seat").await,
        json!("S2-R1-1")
    );
    page.press("ArrowRight").await;
    page.press("ArrowDown").await;
    assert_eq!(
        page.eval("document.activeElement.dataset.seat").await,
        json!("S2-R2-2")
    );
    page.press("Enter").await;
    assert!(seat_class(&page, "S2-R2-2").await.contains("s-selected"));
    assert_eq!(
        page.eval("document.activeElement.getAttribute('aria-pressed')")
            .await,
        json!("true")
    );
    page.press("Enter").await;
    assert!(!seat_class(&page, "S2-R2-2").await.contains("s-selected"));

    // The per-account limit (4) is enforced while picking.
    for n in 1..=5 {
        page.click(&format!("button.seat[data-seat='S2-R1-{n}']"))
            .await;
    }
    assert!(
        page.text("#notice").await.contains("at most 4"),
        "{}",
        page.text("#notice").await
    );
    assert!(!seat_class(&page, "S2-R1-5").await.contains("s-selected"));
    let tray = page.text("#tray-text").await;
    assert!(
        tray.contains("4 selected") && tray.contains("32,000"),
        "{tray}"
    );
    page.click("#hold").await;
    page.wait_for(&visible("step-hold"), WAIT).await;

    // The hold runs out (by the database clock) before checkout: the server refuses the
    // order, the page says so and goes back to the map.
    let expired = sqlx::query(
        "WITH h AS (UPDATE holds SET expires_at = clock_timestamp() - interval '1 second'
                    WHERE account_id = 'fan-edge-1' AND status = 'active' RETURNING id)
         UPDATE seats SET held_until = clock_timestamp() - interval '1 second'
         WHERE hold_id IN (SELECT id FROM h)",
    )
    .execute(&stack.pool)
    .await
    .expect("expire the hold")
    .rows_affected();
    assert_eq!(expired, 4);
    page.click("#checkout").await;
    page.wait_for(&visible("step-choose"), WAIT).await;
    let alert = page.text("#alert").await;
    assert!(alert.contains("hold expired"), "{alert}");
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = 'fan-edge-1'")
            .fetch_one(&stack.pool)
            .await
            .expect("orders");
    assert_eq!(orders, 0);
    // The expired seats are offered again (the hold statement reclaims them).
    page.wait_for(
        "(() => { const b = document.querySelector(\"button.seat[data-seat='S2-R1-1']\"); \
          return b && b.classList.contains('s-available'); })()",
        WAIT,
    )
    .await;
    page.screenshot(&shot("shop-expired"), false).await;

    // The sweeper tidies the expired hold (every 2 s) and gives its 4 tickets back. Waiting
    // for it keeps the GA step below independent of booking's heal-versus-sweeper timing.
    testkit::wait::eventually(
        Duration::from_secs(15),
        "sweeper expires the hold",
        || async {
            let active: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM holds WHERE account_id = 'fan-edge-1' AND status = 'active'",
            )
            .fetch_one(&stack.pool)
            .await
            .expect("holds");
            (active == 0).then_some(())
        },
    )
    .await;

    // General admission: two FLOOR tickets held, then released again.
    page.click("#tab-ga").await;
    page.wait_for(&visible("panel-ga"), WAIT).await;
    let tiers = page.text("#ga-tiers").await;
    assert!(
        tiers.contains("FLOOR") && tiers.contains("100 left"),
        "{tiers}"
    );
    page.click("#ga-more").await;
    assert_eq!(page.text("#ga-hold").await, "Hold 2 × FLOOR");
    page.click("#ga-hold").await;
    page.wait_for(&visible("step-hold"), WAIT).await;
    let items = page.text("#hold-items").await;
    assert!(
        items.contains("FLOOR (general admission)") && items.contains("× 2"),
        "{items}"
    );
    assert!(page.text("#hold-total").await.contains("18,000"));
    page.click("#release").await;
    page.wait_for(&visible("step-choose"), WAIT).await;
    assert!(page.text("#notice").await.contains("released"));
    let ga: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM holds WHERE account_id = 'fan-edge-1' AND kind = 'ga'",
    )
    .fetch_all(&stack.pool)
    .await
    .expect("ga holds");
    assert_eq!(ga, ["released"]);
    page.wait_for(
        "document.getElementById('ga-tiers').innerText.includes('100 left')",
        WAIT,
    )
    .await;
    page.click("#tab-seats").await;
    page.wait_for(&visible("panel-seats"), WAIT).await;

    // Booking goes away: the gateway answers 503 with Retry-After and the page says to retry
    // shortly instead of spinning; the fan's pick stays.
    stack.stop_booking().await;
    page.click("button.seat[data-seat='S2-R3-1']").await;
    page.click("#hold").await;
    page.wait_for(
        "document.getElementById('alert').innerText.includes('very busy')",
        WAIT,
    )
    .await;
    assert!(seat_class(&page, "S2-R3-1").await.contains("s-selected"));
    page.screenshot(&shot("shop-busy"), false).await;

    // The admission is gone (expired cookie): the next API answer is 401 and the page takes
    // the fan back to the waiting room of this event.
    page.call(
        "Network.deleteCookies",
        json!({"name": "fg_admission", "url": stack.gateway_url}),
    )
    .await;
    page.wait_for("!document.getElementById('hold').disabled", WAIT)
        .await;
    page.click("#hold").await;
    page.wait_for(
        "document.getElementById('alert').innerText.includes('waiting room')",
        WAIT,
    )
    .await;
    let link = page
        .eval("document.querySelector('#alert a') && document.querySelector('#alert a').getAttribute('href')")
        .await;
    assert_eq!(link, json!(format!("/e/{event}")));
    page.wait_for(
        &format!("location.pathname === '/e/{event}'"),
        Duration::from_secs(15),
    )
    .await;
    page.assert_no_js_errors();

    drop(page);
    drop(browser);
    stack.stop().await;
}

#[tokio::test]
async fn a_60000_seat_map_stays_light_on_a_phone() {
    let Some(chromium) = chromium_or_skip("browser journey") else {
        return;
    };
    let stack = Stack::start().await;
    let sections: Vec<_> = (1..=30)
        .map(|i| {
            json!({"name": format!("B{i}"), "rows": 40, "seats_per_row": 50,
                         "price_tier": if i <= 10 { "A" } else { "B" }})
        })
        .collect();
    let mut event = demo_event("e2e-big");
    event["seat_map"] = json!({"sections": sections});
    let event = stack
        .create_event(
            &event,
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue"}),
        )
        .await;
    let browser = Browser::launch(&chromium).await;
    let started = std::time::Instant::now();
    let page = browser.new_page(390, 844).await;
    page.set_locale("en-US").await;
    let fan = admitted_fan(&stack, &event, "fan-big-1").await;
    let (name, value) = fan.cookie.split_once('=').expect("cookie pair");
    page.call(
        "Network.setCookie",
        json!({"name": name, "value": value, "url": stack.gateway_url, "httpOnly": true}),
    )
    .await;
    let t0 = std::time::Instant::now();
    page.navigate(&stack.gw(&format!("/e/{event}/shop"))).await;
    page.wait_for(
        "document.querySelectorAll('#sections .section-card').length === 30",
        Duration::from_secs(60),
    )
    .await;
    let overview = t0.elapsed();
    // The overview is canvases only: no seat exists in the DOM until a section is opened.
    assert_eq!(
        page.eval("document.querySelectorAll('button.seat').length")
            .await,
        json!(0)
    );
    let t1 = std::time::Instant::now();
    page.click(".section-card[data-section='B12']").await;
    page.wait_for("document.querySelectorAll('button.seat').length > 0", WAIT)
        .await;
    let open = t1.elapsed();
    // One page of rows of one section: 24 rows × 50 seats.
    assert_eq!(
        page.eval("document.querySelectorAll('button.seat').length")
            .await,
        json!(1200)
    );
    page.screenshot(&shot("shop-60k"), false).await;
    page.click("#rows-next").await;
    page.wait_for(
        "document.getElementById('rows-label').innerText.includes('25')",
        WAIT,
    )
    .await;
    page.click("button.seat[data-seat='B12-R30-25']").await;
    page.click("#hold").await;
    page.wait_for(&visible("step-hold"), WAIT).await;
    page.assert_no_js_errors();
    eprintln!(
        "60,000-seat map: overview rendered {overview:?} after navigation, section opened in \
         {open:?}, whole test {:?}",
        started.elapsed()
    );
    drop(page);
    drop(browser);
    stack.stop().await;
}

#[tokio::test]
async fn the_hold_countdown_runs_out_visibly() {
    let Some(chromium) = chromium_or_skip("browser journey") else {
        return;
    };
    let stack = Stack::start().await;
    let mut event = demo_event("e2e-ttl");
    event["hold_ttl_s"] = json!(10);
    let event = stack
        .create_event(
            &event,
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue"}),
        )
        .await;
    let browser = Browser::launch(&chromium).await;
    let page = open_shop(&stack, &browser, &event, "fan-ttl-1").await;
    page.click(".section-card[data-section='S1']").await;
    page.click("button.seat[data-seat='S1-R1-1']").await;
    page.click("#hold").await;
    page.wait_for(&visible("step-hold"), WAIT).await;
    // Counts down from the server's held_until (10 s TTL), turning urgent under a minute.
    let first = page.text("#hold-countdown").await;
    assert!(first.starts_with("Held for 0:"), "{first}");
    assert_eq!(
        page.eval(
            "document.getElementById('hold-countdown').parentNode.classList.contains('urgent')"
        )
        .await,
        json!(true)
    );
    page.wait_for(&visible("step-choose"), Duration::from_secs(30))
        .await;
    let alert = page.text("#alert").await;
    assert!(alert.contains("hold expired"), "{alert}");
    // The seat is offered again once the database clock has passed held_until.
    page.wait_for(
        "(() => { const b = document.querySelector(\"button.seat[data-seat='S1-R1-1']\"); \
          return b && b.classList.contains('s-available'); })()",
        WAIT,
    )
    .await;
    page.assert_no_js_errors();
    drop(page);
    drop(browser);
    stack.stop().await;
}
