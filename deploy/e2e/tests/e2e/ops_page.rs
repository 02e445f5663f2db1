//! The ops page in real headless Chromium against the whole stack (booking with its jobs,
//! the sandbox provider, the gateway): served by booking's own listener and never by the
//! gateway's public one; a wrong admin secret is refused and changes nothing; the operator
//! finds a fan's paid order by account, opens it, refunds one line (the order stays paid),
//! then refunds the rest — with the first answer lost on the way back, so the retry must
//! reuse the same Idempotency-Key — and then Postgres, the provider and the audit log must
//! show exactly those two refunds, by that operator. A mutation sent with a wrong secret
//! changes nothing. Then the event is cancelled from the page (the confirmation needs the
//! event id typed) and the progress view reaches done; the page switches to Japanese, and a
//! tab whose browser language is Japanese starts in Japanese.

use crate::journey_api::{Fan, admitted_fan};
use crate::journey_browser::shot;
use crate::stack::{ADMIN, Stack, demo_event};
use serde_json::{Value, json};
use std::time::Duration;
use testkit::browser::{Browser, Page, chromium_or_skip};

const WAIT: Duration = Duration::from_secs(20);
const OPERATOR: &str = "Aiko Ops";

/// A fan of `event` who bought two seats of row `row` and paid: (order id, total).
async fn paid_order(stack: &Stack, event: &str, account: &str, row: i64) -> (String, i64) {
    let fan: Fan = admitted_fan(stack, event, account).await;
    let (status, map) = fan.get(stack, &format!("/api/events/{event}/seats")).await;
    assert_eq!(status, 200, "{map}");
    let seats: Vec<Value> = map["seats"]
        .as_array()
        .expect("seats")
        .iter()
        .filter(|s| s["section"] == "S1" && s["row"] == row && s["status"] == "available")
        .take(2)
        .map(|s| s["seat_id"].clone())
        .collect();
    assert_eq!(seats.len(), 2, "{map}");
    let hold_path = format!("/api/events/{event}/holds");
    let (status, hold) = fan
        .post(stack, &hold_path, None, &json!({"seats": seats}))
        .await;
    assert_eq!(status, 201, "{hold}");
    let key = shared::ids::new_id();
    let (status, order) = fan
        .post(
            stack,
            "/api/orders",
            Some(&key),
            &json!({"hold_id": hold["hold_id"]}),
        )
        .await;
    assert_eq!(status, 201, "{order}");
    let id = order["id"].as_str().expect("order id").to_owned();
    let key = shared::ids::new_id();
    let body = json!({"payment_method": "pm_card_visa"});
    let (status, paid) = fan
        .post(stack, &format!("/api/orders/{id}/pay"), Some(&key), &body)
        .await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["status"], "PAID");
    (id, order["total"].as_i64().expect("total"))
}

/// Types `text` into the field like a person: focus, clear, then real text input.
async fn type_into(page: &Page<'_>, selector: &str, text: &str) {
    let sel = serde_json::to_string(selector).expect("selector json");
    let found = page
        .eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return false;
                       e.focus(); e.value = ''; e.dispatchEvent(new Event('input', {{bubbles: true}}));
                       return true; }})()"
        ))
        .await;
    assert_eq!(found, true, "no field {selector}");
    page.call("Input.insertText", json!({"text": text})).await;
}

/// Waits until the element's visible text contains `part`; returns the text.
async fn wait_text(page: &Page<'_>, selector: &str, part: &str) -> String {
    let sel = serde_json::to_string(selector).expect("selector json");
    let want = serde_json::to_string(part).expect("text json");
    page.wait_for(
        &format!(
            "(() => {{ const e = document.querySelector({sel});
                       return !!e && !e.hidden && e.innerText.includes({want}); }})()"
        ),
        WAIT,
    )
    .await;
    page.text(selector).await
}

async fn order_status(stack: &Stack, id: &str) -> String {
    sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(id)
        .fetch_one(&stack.pool)
        .await
        .expect("order status")
}

async fn count(stack: &Stack, sql: &str, arg: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(arg)
        .fetch_one(&stack.pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn the_ops_page_finds_refunds_and_cancels_exactly_once() {
    let stack = Stack::start().await;
    let event = stack
        .create_event(
            &demo_event("e2e-ops"),
            &json!({"sale_start": "2026-01-01T00:00:00Z", "admit_per_minute": 600,
                    "mode": "queue"}),
        )
        .await;
    let (order_a, total_a) = paid_order(&stack, &event, "fan-ops-a", 2).await;
    let (order_b, _) = paid_order(&stack, &event, "fan-ops-b", 4).await;

    // Booking serves the page with strict headers; the gateway's public port does not.
    let booking = |p: &str| format!("{}{p}", stack.booking_url);
    let resp = stack
        .http
        .get(booking("/ops/"))
        .send()
        .await
        .expect("ops page");
    assert_eq!(resp.status().as_u16(), 200);
    let h = resp.headers();
    let csp = h["content-security-policy"].to_str().expect("csp");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert!(csp.contains("form-action 'none'"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["cache-control"], "no-store");
    assert!(
        h["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/html")
    );
    let resp = stack.http.get(booking("/ops")).send().await.expect("ops");
    assert_eq!(resp.status().as_u16(), 308);
    assert_eq!(resp.headers()["location"], "/ops/");
    for path in [
        "/ops",
        "/ops/",
        "/ops/ops.js",
        "/ops/ops-i18n.js",
        "/ops/ops.css",
        "/ops/favicon.svg",
        "/ops/ops.html",
    ] {
        if path != "/ops" && path != "/ops/ops.html" {
            let r = stack.http.get(booking(path)).send().await.expect("booking");
            assert_eq!(r.status().as_u16(), 200, "booking {path}");
        }
        let r = stack
            .http
            .get(stack.gw(path))
            .send()
            .await
            .expect("gateway");
        assert_eq!(
            r.status().as_u16(),
            404,
            "the gateway must not serve {path}"
        );
        let body = r.text().await.expect("body");
        assert!(
            !body.contains("FG_OPS_I18N") && !body.contains("admin secret"),
            "{body}"
        );
    }
    // Nor does it forward the admin API the page calls.
    let r = stack
        .http
        .get(stack.gw("/admin/orders"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("gateway admin");
    assert_eq!(r.status().as_u16(), 404);

    let Some(chromium) = chromium_or_skip("browser journey") else {
        stack.stop().await;
        return;
    };
    let browser = Browser::launch(&chromium).await;
    let page = browser.new_page(412, 915).await;
    page.set_locale("en-GB").await;
    page.record_responses().await;
    page.navigate(&booking("/ops/")).await;
    page.wait_for("document.body.dataset.ready === 'true'", WAIT)
        .await;
    // Nothing the page loads is a 404 (its icon included: without one the browser asks for
    // /favicon.ico, which booking does not serve).
    assert_eq!(
        page.eval("fetch(document.querySelector('link[rel=icon]').href).then(r => r.status)")
            .await,
        200
    );
    let answers = page.responses();
    let missing: Vec<_> = answers.iter().filter(|(_, s)| *s == 404).collect();
    assert!(
        answers.len() >= 4 && missing.is_empty(),
        "answered 404 while loading: {missing:#?} (of {answers:#?})"
    );

    // A wrong secret: refused, nothing kept, still on the sign-in form.
    type_into(&page, "#secret", "not-the-admin-secret").await;
    type_into(&page, "#actor", OPERATOR).await;
    page.click("#login-form button[type=submit]").await;
    wait_text(&page, "#login-message", "The admin secret was not accepted").await;
    assert_eq!(
        page.eval("sessionStorage.getItem('fg_ops_secret')").await,
        Value::Null
    );
    assert_eq!(
        page.eval("document.getElementById('ops-view').hidden")
            .await,
        true
    );

    // The right one: kept in this tab's sessionStorage only, never in the URL.
    type_into(&page, "#secret", ADMIN).await;
    page.click("#login-form button[type=submit]").await;
    page.wait_for("!document.getElementById('ops-view').hidden", WAIT)
        .await;
    assert_eq!(
        page.eval("sessionStorage.getItem('fg_ops_secret')").await,
        ADMIN
    );
    assert_eq!(page.eval("localStorage.length").await, 0);
    assert_eq!(page.eval("document.cookie").await, "");
    let href = page.eval("location.href").await;
    assert!(!href.as_str().unwrap_or_default().contains(ADMIN), "{href}");
    wait_text(&page, "#who", OPERATOR).await;

    // The event's orders one per page: the next page brings the other one, then no more.
    type_into(&page, "#q-event", &event).await;
    type_into(&page, "#q-limit", "1").await;
    page.click("#search").await;
    page.wait_for("document.querySelectorAll('#results-body tr').length === 1 && !document.getElementById('next-page').hidden", WAIT)
        .await;
    page.click("#next-page").await;
    page.wait_for(
        "document.querySelectorAll('#results-body tr').length === 2",
        WAIT,
    )
    .await;
    let mut listed: Vec<String> = serde_json::from_value(
        page.eval("[...document.querySelectorAll('#results-body button[data-order]')].map(b => b.dataset.order)")
            .await,
    )
    .expect("order ids");
    listed.sort();
    let mut both = vec![order_a.clone(), order_b.clone()];
    both.sort();
    assert_eq!(listed, both);
    page.wait_for("document.getElementById('next-page').hidden", WAIT)
        .await;
    // A time range with nothing in it.
    page.eval("document.getElementById('q-from').value = '2099-01-01T00:00'; true")
        .await;
    page.click("#search").await;
    wait_text(&page, "#results-empty", "No orders match").await;
    page.eval("document.getElementById('q-from').value = ''; true")
        .await;
    type_into(&page, "#q-event", "").await;
    type_into(&page, "#q-limit", "20").await;

    // Search by account, open the order.
    type_into(&page, "#q-account", "fan-ops-a").await;
    page.click("#search").await;
    page.wait_for(
        "document.querySelectorAll('#results-body tr').length === 1",
        WAIT,
    )
    .await;
    let open = format!("#results-body button[data-order=\"{order_a}\"]");
    page.click(&open).await;
    page.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_a}\"][data-status=\"PAID\"]') !== null"),
        WAIT,
    )
    .await;
    assert_eq!(
        page.eval("document.querySelectorAll('#d-items tr').length")
            .await,
        2
    );
    assert_eq!(
        page.eval("document.querySelectorAll('#d-payments tr').length")
            .await,
        1
    );
    page.screenshot(&shot("ops-order"), true).await;

    // Per line: the first line goes back; the order stays paid until its last line goes.
    page.click("#d-items input.pick").await;
    page.click("#a-lines").await;
    page.wait_for("!document.getElementById('confirm').hidden", WAIT)
        .await;
    page.click("#confirm-yes").await;
    wait_text(&page, "#action-message", "Done. The order is now: Paid").await;
    assert_eq!(order_status(&stack, &order_a).await, "PAID");
    let line_amount: i64 = sqlx::query_scalar(
        "SELECT amount FROM order_refund_lines WHERE order_id = $1 AND line = 1",
    )
    .bind(&order_a)
    .fetch_one(&stack.pool)
    .await
    .expect("the first line was refunded");
    let summary = stack.sandbox.order_summary(&order_a);
    assert_eq!(
        (summary.refunds, summary.amount_refunded),
        (1, line_amount),
        "{summary:?}"
    );

    // The full refund (what is left); booking's first answer is lost on the way back (the
    // refund happened, the page saw a network error), so the operator retries: the same key,
    // no second refund.
    page.hold_responses("*/admin/orders/*/refund").await;
    page.click("#a-refund").await;
    let confirm = wait_text(&page, "#confirm-text", &order_a).await;
    assert!(confirm.contains("24,000"), "{confirm}");
    page.click("#confirm-yes").await;
    let deadline = std::time::Instant::now() + WAIT;
    while page.held() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the refund answer was never held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = page.fail_requests().await;
    assert_eq!(held.len(), 1, "{held:?}");
    let headers = &held[0]["request"]["headers"];
    let first_key = headers["Idempotency-Key"]
        .as_str()
        .or(headers["idempotency-key"].as_str())
        .expect("the refund carried an Idempotency-Key")
        .to_owned();
    assert_eq!(
        headers["X-Floodgate-Actor"]
            .as_str()
            .or(headers["x-floodgate-actor"].as_str()),
        Some(OPERATOR)
    );
    wait_text(&page, "#action-message", "No answer from booking").await;
    assert_eq!(
        order_status(&stack, &order_a).await,
        "REFUNDED",
        "the lost answer's refund ran"
    );
    wait_text(&page, "#confirm-yes", "Retry").await;
    page.click("#confirm-yes").await;
    wait_text(&page, "#action-message", "Done. The order is now: Refunded").await;
    page.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_a}\"][data-status=\"REFUNDED\"]') !== null"),
        WAIT,
    )
    .await;
    // Two ops keys: the line refund's and the full refund's first one (the retry reused it).
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM idempotency_keys WHERE account_id = 'ops:admin' ORDER BY created_at",
    )
    .fetch_all(&stack.pool)
    .await
    .expect("ops keys");
    assert_eq!(
        keys.len(),
        2,
        "{keys:?}: the retry must reuse the first key"
    );
    assert_eq!(keys[1], first_key, "the retry must reuse the first key");
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM order_refunds WHERE order_id = $1 AND status = 'succeeded'",
            &order_a
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM order_refunds WHERE order_id = $1",
            &order_a
        )
        .await,
        2
    );
    let summary = stack.sandbox.order_summary(&order_a);
    assert_eq!(
        (summary.refunds, summary.amount_refunded),
        (2, total_a),
        "{summary:?}"
    );
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM ops_audit WHERE target = $1 AND action = 'order.refund'",
    )
    .bind(format!("order:{order_a}"))
    .fetch_all(&stack.pool)
    .await
    .expect("audit");
    assert_eq!(
        actors,
        vec![OPERATOR.to_owned(); 2],
        "the line and the rest"
    );
    wait_text(&page, "#d-audit", OPERATOR).await;
    wait_text(&page, "#d-refunds", "succeeded").await;

    // A mutation with a secret that is no longer right: the error is shown, nothing changes.
    type_into(&page, "#q-account", "fan-ops-b").await;
    page.click("#search").await;
    let open = format!("#results-body button[data-order=\"{order_b}\"]");
    let open_js = serde_json::to_string(&open).expect("selector json");
    page.wait_for(&format!("document.querySelector({open_js}) !== null"), WAIT)
        .await;
    page.click(&open).await;
    page.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_b}\"][data-status=\"PAID\"]') !== null"),
        WAIT,
    )
    .await;
    page.eval("sessionStorage.setItem('fg_ops_secret', 'rotated-away'); true")
        .await;
    page.click("#a-cancel").await;
    wait_text(&page, "#confirm-text", "is refunded").await;
    page.click("#confirm-yes").await;
    wait_text(
        &page,
        "#action-message",
        "The admin secret was not accepted",
    )
    .await;
    assert_eq!(order_status(&stack, &order_b).await, "PAID");
    assert_eq!(stack.sandbox.order_summary(&order_b).refunds, 0);
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM ops_audit WHERE target = $1",
            &format!("order:{order_b}")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM order_refunds WHERE order_id = $1",
            &order_b
        )
        .await,
        0
    );
    page.eval(&format!(
        "sessionStorage.setItem('fg_ops_secret', '{ADMIN}'); true"
    ))
    .await;

    // Cancel the event: the confirmation needs the event id typed exactly.
    type_into(&page, "#e-id", &event).await;
    page.click("#e-cancel").await;
    page.wait_for("!document.getElementById('e-confirm').hidden", WAIT)
        .await;
    assert_eq!(
        page.eval("document.getElementById('e-confirm-yes').disabled")
            .await,
        true
    );
    type_into(&page, "#e-typed", "e2e-opz").await;
    assert_eq!(
        page.eval("document.getElementById('e-confirm-yes').disabled")
            .await,
        true
    );
    type_into(&page, "#e-typed", &event).await;
    assert_eq!(
        page.eval("document.getElementById('e-confirm-yes').disabled")
            .await,
        false
    );
    page.click("#e-confirm-yes").await;
    page.wait_for(
        "document.getElementById('e-view').dataset.done === 'true'",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(page.text("#e-failed").await, "0");
    assert_eq!(page.text("#e-paid").await, "0");
    assert_eq!(page.text("#e-pending").await, "0");
    assert_eq!(page.text("#e-state").await, "Done");
    assert_eq!(order_status(&stack, &order_b).await, "REFUNDED");
    assert_eq!(stack.sandbox.order_summary(&order_b).refunds, 1);
    // Order A was refunded before (a line, then the rest): nothing more.
    assert_eq!(
        stack.sandbox.order_summary(&order_a).refunds,
        2,
        "order A refunded again"
    );
    let cancelled_by: Option<String> =
        sqlx::query_scalar("SELECT cancelled_by FROM events WHERE id = $1")
            .bind(&event)
            .fetch_one(&stack.pool)
            .await
            .expect("event");
    assert_eq!(cancelled_by.as_deref(), Some(OPERATOR));

    // The audit log, filtered by the event, names the operator.
    type_into(&page, "#au-event", &event).await;
    page.click("#audit-form button[type=submit]").await;
    page.wait_for(
        "document.querySelector('#audit-body tr[data-action=\"event.cancel\"]') !== null",
        WAIT,
    )
    .await;
    let row = page
        .text("#audit-body tr[data-action=\"event.cancel\"]")
        .await;
    assert!(row.contains(OPERATOR), "{row}");

    // The open order (B) shows its refund once the cancellation is done.
    page.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_b}\"][data-status=\"REFUNDED\"]') !== null"),
        WAIT,
    )
    .await;

    // Japanese at the flick of the switch.
    page.click("#lang").await;
    assert_eq!(page.eval("document.documentElement.lang").await, "ja");
    assert_eq!(
        page.text("[data-i18n=\"orders.title\"]").await,
        "注文を探す"
    );
    assert_eq!(page.text("#e-state").await, "完了");
    assert_eq!(page.text("#d-status").await, "返金済み");
    // What is already on screen is re-worded too (the last results and errors).
    let said = page.text("#event-message").await;
    assert!(said.starts_with("公演を中止しました"), "{said}");
    let said = page.text("#action-message").await;
    assert!(
        said.contains("管理シークレットが正しくありません"),
        "{said}"
    );
    page.screenshot(&shot("ops-ja"), true).await;
    page.assert_no_js_errors();

    // A tab whose browser speaks Japanese starts in Japanese, signed out (its own session).
    let ja = browser.new_page(412, 915).await;
    ja.set_locale("ja-JP").await;
    ja.navigate(&booking("/ops/")).await;
    ja.wait_for("document.body.dataset.ready === 'true'", WAIT)
        .await;
    assert_eq!(ja.text("#login-view h1").await, "サインイン");
    assert_eq!(ja.text("label[for=secret]").await, "管理シークレット");
    assert_eq!(ja.eval("document.body.dataset.state").await, "login");
    ja.assert_no_js_errors();

    drop(browser);
    stack.stop().await;
}
