//! The ops page in real headless Chromium against the whole stack (booking with its jobs,
//! the sandbox provider, the gateway), signed in with personal operator credentials (issue
//! 42). Automation issues the first credentials with the bootstrap secret (naming itself in
//! X-Floodgate-Actor): a support operator and an admin. The page is served by booking's own
//! listener and never by the gateway's public one. Garbage (the shared admin secret) is
//! refused by the page without a request, an unknown credential by booking; nothing is kept.
//! The support operator finds a fan's paid order, refunds one line (the order stays paid),
//! then the rest — with the first answer lost on the way back, so the retry must reuse the
//! same Idempotency-Key — and Postgres, the provider and the audit log show exactly those
//! two refunds, by that operator with the support role. Support is not offered the event
//! cancel, and booking refuses it (403 ROLE_FORBIDDEN, shown as such, nothing changed). The
//! support operator signs out; the admin signs in, issues a viewer from the Operators
//! section (shown once, wiped on leaving the section), revokes the support operator: booking
//! refuses that credential at once, and a second tab where support was about to cancel an
//! order is signed out saying why, with nothing changed; the new viewer signs in there and
//! finds the order actions disabled with the reason. The last admin cannot be revoked.
//! Then the admin cancels the event from the page (the confirmation needs the event id
//! typed) and the progress view reaches done; the page switches to Japanese, and a tab whose
//! browser language is Japanese starts in Japanese.

use crate::journey_api::{Fan, admitted_fan};
use crate::journey_browser::shot;
use crate::stack::{ADMIN, Stack, demo_event, json as read_json};
use serde_json::{Value, json};
use std::time::Duration;
use testkit::browser::{Browser, Page, chromium_or_skip};

const WAIT: Duration = Duration::from_secs(20);
const SUPPORT: &str = "Aiko Ops";
const ADMIN_OP: &str = "Ren Admin";
const VIEWER: &str = "Mika View";
/// What automation names itself with the bootstrap secret (kept as the audit entry's note).
const AUTOMATION: &str = "e2e automation";

/// An audit entry's actor, role, operator id and note.
type AuditWho = (String, Option<String>, Option<String>, Option<String>);

/// Issues an operator credential with the bootstrap secret, as automation would: (id,
/// credential).
async fn issue(stack: &Stack, name: &str, role: &str) -> (String, String) {
    let resp = stack
        .http
        .post(format!("{}/admin/operators", stack.booking_url))
        .bearer_auth(ADMIN)
        .header("X-Floodgate-Actor", AUTOMATION)
        .json(&json!({"name": name, "role": role}))
        .send()
        .await
        .expect("issue an operator");
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let (status, body) = read_json(resp).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["name"], name);
    assert_eq!(body["role"], role);
    let credential = body["credential"].as_str().expect("credential").to_owned();
    assert!(is_operator_credential(&credential), "{credential}");
    (body["id"].as_str().expect("id").to_owned(), credential)
}

/// `fgop_` and 43 base64url characters.
fn is_operator_credential(s: &str) -> bool {
    s.strip_prefix("fgop_").is_some_and(|body| {
        body.len() == 43
            && body
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    })
}

/// Signs the page in with `credential` and waits for the ops view naming `who`.
async fn sign_in(page: &Page<'_>, credential: &str, who: &str) {
    type_into(page, "#credential", credential).await;
    page.click("#login-form button[type=submit]").await;
    page.wait_for("!document.getElementById('ops-view').hidden", WAIT)
        .await;
    wait_text(page, "#who", who).await;
    assert_eq!(
        page.eval("sessionStorage.getItem('fg_ops_credential')")
            .await,
        credential
    );
    assert_eq!(page.eval("localStorage.length").await, 0);
    assert_eq!(page.eval("document.cookie").await, "");
    let href = page.eval("location.href").await;
    assert!(
        !href.as_str().unwrap_or_default().contains(credential),
        "{href}"
    );
}

/// Whether the element is hidden (itself or by an ancestor).
async fn hidden(page: &Page<'_>, selector: &str) -> bool {
    let sel = serde_json::to_string(selector).expect("selector json");
    page.eval(&format!(
        "(() => {{ const e = document.querySelector({sel}); return !e || e.offsetParent === null; }})()"
    ))
    .await
        == true
}

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
async fn the_ops_page_signs_in_with_operator_credentials_and_refunds_and_cancels_exactly_once() {
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
            !body.contains("FG_OPS_I18N") && !body.contains("operator credential"),
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

    // Automation issues the first credentials with the bootstrap secret; a change made with
    // it must name who asked (kept as a note).
    let r = stack
        .http
        .post(booking("/admin/operators"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": SUPPORT, "role": "support"}))
        .send()
        .await
        .expect("unnamed bootstrap call");
    let (status, body) = read_json(r).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("ACTOR_REQUIRED"))
    );
    let (support_id, support) = issue(&stack, SUPPORT, "support").await;
    let (admin_id, admin) = issue(&stack, ADMIN_OP, "admin").await;

    let Some(chromium) = chromium_or_skip("ops page") else {
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
    assert_eq!(page.eval("document.body.dataset.state").await, "login");

    // The shared admin secret: refused by the page itself, never sent, nothing kept.
    type_into(&page, "#credential", ADMIN).await;
    page.click("#login-form button[type=submit]").await;
    let said = wait_text(&page, "#login-message", "not an operator credential").await;
    assert!(
        said.contains("for automation") && said.contains("ask an admin"),
        "{said}"
    );
    let asked: Vec<_> = page
        .responses()
        .into_iter()
        .filter(|(url, _)| url.contains("/admin/"))
        .collect();
    assert!(
        asked.is_empty(),
        "the page sent a malformed credential: {asked:?}"
    );
    // A well-formed credential booking does not know: refused (401), nothing kept.
    let unknown = format!("fgop_{}", "A".repeat(43));
    type_into(&page, "#credential", &unknown).await;
    page.click("#login-form button[type=submit]").await;
    wait_text(&page, "#login-message", "not known to booking").await;
    assert_eq!(
        page.eval("sessionStorage.getItem('fg_ops_credential')")
            .await,
        Value::Null
    );
    assert_eq!(
        page.eval("document.getElementById('ops-view').hidden")
            .await,
        true
    );

    // The support operator: kept in this tab's sessionStorage only, never in the URL; the
    // page offers what support may do and no more.
    sign_in(&page, &support, "Signed in as Aiko Ops (Support)").await;
    assert_eq!(
        page.eval("sessionStorage.getItem('fg_ops_role')").await,
        "support"
    );
    assert!(
        hidden(&page, "#e-cancel").await,
        "event cancel offered to support"
    );
    assert!(hidden(&page, "#operators").await);
    assert!(hidden(&page, "#nav-operators").await);
    wait_text(&page, "#e-role-note", "needs the Admin role").await;

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
    assert!(hidden(&page, "#a-role-note").await);
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
    let headers = held[0]["request"]["headers"]
        .as_object()
        .expect("request headers");
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_str())
    };
    let first_key = header("Idempotency-Key")
        .expect("the refund carried an Idempotency-Key")
        .to_owned();
    // The credential says who: no name header.
    assert_eq!(
        header("Authorization"),
        Some(format!("Bearer {support}").as_str())
    );
    assert_eq!(header("X-Floodgate-Actor"), None, "{headers:?}");
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
    let actors: Vec<AuditWho> = sqlx::query_as(
        "SELECT actor, role, operator_id, note FROM ops_audit
          WHERE target = $1 AND action = 'order.refund' ORDER BY id",
    )
    .bind(format!("order:{order_a}"))
    .fetch_all(&stack.pool)
    .await
    .expect("audit");
    let by_support = (
        SUPPORT.to_owned(),
        Some("support".to_owned()),
        Some(support_id.clone()),
        None,
    );
    assert_eq!(actors, vec![by_support; 2], "the line and the rest");
    wait_text(&page, "#d-audit", "Aiko Ops (Support)").await;
    wait_text(&page, "#d-refunds", "succeeded").await;
    wait_text(
        &page,
        "#audit-body tr[data-action=\"order.refund\"]",
        "Aiko Ops (Support)",
    )
    .await;

    // Support may not cancel the event: booking refuses it and nothing changes.
    let r = stack
        .http
        .post(booking(&format!("/admin/events/{event}/cancel")))
        .bearer_auth(&support)
        .json(&json!({}))
        .send()
        .await
        .expect("support cancels the event");
    let (status, body) = read_json(r).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "ROLE_FORBIDDEN");
    assert_eq!(
        (body["role"].as_str(), body["required_role"].as_str()),
        (Some("support"), Some("admin"))
    );
    // The page shows booking's refusal as such when it believes (wrongly) it may.
    page.eval("sessionStorage.setItem('fg_ops_role', 'admin'); true")
        .await;
    page.click("#lang").await;
    page.click("#lang").await;
    type_into(&page, "#e-id", &event).await;
    page.click("#e-cancel").await;
    type_into(&page, "#e-typed", &event).await;
    page.click("#e-confirm-yes").await;
    let said = wait_text(&page, "#event-message", "Your role Support may not do this").await;
    assert!(
        said.contains("it needs Admin") && said.contains("Nothing was changed"),
        "{said}"
    );
    page.eval("sessionStorage.setItem('fg_ops_role', 'support'); true")
        .await;
    page.click("#lang").await;
    page.click("#lang").await;
    assert!(hidden(&page, "#e-cancel").await);
    let cancelled: Option<String> =
        sqlx::query_scalar("SELECT cancelled_at::text FROM events WHERE id = $1")
            .bind(&event)
            .fetch_one(&stack.pool)
            .await
            .expect("event");
    assert_eq!(cancelled, None, "support cancelled the event");
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM ops_audit WHERE action = 'event.cancel' AND event_id = $1",
            &event
        )
        .await,
        0
    );

    // A second tab, signed in as support too, about to cancel order B.
    let other = browser.new_page(412, 915).await;
    other.set_locale("en-GB").await;
    other.navigate(&booking("/ops/")).await;
    other
        .wait_for("document.body.dataset.ready === 'true'", WAIT)
        .await;
    sign_in(&other, &support, SUPPORT).await;
    type_into(&other, "#q-account", "fan-ops-b").await;
    other.click("#search").await;
    let open_b = format!("#results-body button[data-order=\"{order_b}\"]");
    let open_js = serde_json::to_string(&open_b).expect("selector json");
    other
        .wait_for(&format!("document.querySelector({open_js}) !== null"), WAIT)
        .await;
    other.click(&open_b).await;
    other.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_b}\"][data-status=\"PAID\"]') !== null"),
        WAIT,
    )
    .await;
    other.click("#a-cancel").await;
    wait_text(&other, "#confirm-text", "is refunded").await;

    // Support signs out of the first tab: it forgets the credential and what was shown.
    page.click("#logout").await;
    page.wait_for("document.body.dataset.state === 'login'", WAIT)
        .await;
    assert_eq!(
        page.eval("[sessionStorage.getItem('fg_ops_credential'), sessionStorage.getItem('fg_ops_name'), sessionStorage.getItem('fg_ops_role')]")
            .await,
        json!([null, null, null])
    );
    assert_eq!(
        page.eval("document.querySelectorAll('#results-body tr, #audit-body tr').length")
            .await,
        0
    );

    // The admin: everything is offered, the operators section too.
    sign_in(&page, &admin, "Signed in as Ren Admin (Admin)").await;
    assert!(!hidden(&page, "#e-cancel").await);
    assert!(hidden(&page, "#e-role-note").await);
    assert!(!hidden(&page, "#nav-operators").await);
    page.wait_for(
        &format!("document.querySelector('#op-body tr[data-operator=\"{support_id}\"][data-status=\"active\"]') !== null"),
        WAIT,
    )
    .await;
    // The bootstrap secret's entries name it, with what its caller called itself.
    let row = wait_text(
        &page,
        "#audit-body tr[data-action=\"operator.create\"]",
        "bootstrap (Admin)",
    )
    .await;
    assert!(row.contains(&format!("note: {AUTOMATION}")), "{row}");

    // Issue a viewer from the page: the credential is shown once, stored nowhere, and wiped
    // on leaving the section.
    page.click("#nav-operators").await;
    type_into(&page, "#op-name", VIEWER).await;
    page.eval("document.getElementById('op-role').value = 'viewer'; true")
        .await;
    type_into(&page, "#op-days", "30").await;
    // Enter in the form issues it (keyboard use).
    page.press("Enter").await;
    page.wait_for("document.getElementById('op-secret').value !== ''", WAIT)
        .await;
    wait_text(&page, "#op-new", "shown this once").await;
    wait_text(&page, "#op-new-for", "Mika View (Viewer)").await;
    let viewer = page
        .eval("document.getElementById('op-secret').value")
        .await
        .as_str()
        .expect("credential")
        .to_owned();
    assert!(is_operator_credential(&viewer), "{viewer}");
    assert_eq!(
        page.eval("document.getElementById('op-secret').readOnly")
            .await,
        true
    );
    let kept = page
        .eval("JSON.stringify(Object.assign({}, sessionStorage)) + JSON.stringify(Object.assign({}, localStorage)) + document.cookie")
        .await;
    assert!(
        !kept.as_str().unwrap_or_default().contains(&viewer),
        "{kept}"
    );
    let origin = stack.booking_url.clone();
    browser
        .call(
            None,
            "Browser.grantPermissions",
            json!({"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}),
        )
        .await;
    page.click("#op-copy").await;
    wait_text(&page, "#op-copy-message", "Copied").await;
    assert_eq!(page.eval("navigator.clipboard.readText()").await, viewer);
    page.screenshot(&shot("ops-operators"), false).await;
    let (name, role, created_by, days): (String, String, String, f64) = sqlx::query_as(
        "SELECT name, role, created_by,
                (EXTRACT(EPOCH FROM expires_at - created_at) / 86400)::float8
           FROM credentials WHERE kind = 'operator' AND name = $1",
    )
    .bind(VIEWER)
    .fetch_one(&stack.pool)
    .await
    .expect("the viewer");
    assert_eq!((name.as_str(), role.as_str()), (VIEWER, "viewer"));
    assert_eq!(created_by, ADMIN_OP);
    assert!((days - 30.0).abs() < 0.01, "{days}");
    let r = stack
        .http
        .get(booking("/admin/operators/me"))
        .bearer_auth(&viewer)
        .send()
        .await
        .expect("me");
    let (status, me) = read_json(r).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str()),
        (Some(VIEWER), Some("viewer"))
    );
    page.click("a[href=\"#orders\"]").await;
    page.wait_for(
        "document.getElementById('op-secret').value === '' && document.getElementById('op-new').hidden",
        WAIT,
    )
    .await;

    // Revoke the support operator from the page.
    page.click("#nav-operators").await;
    let revoke = format!("#op-body button[data-revoke=\"{support_id}\"]");
    page.click(&revoke).await;
    wait_text(
        &page,
        "#op-confirm-text",
        "Revoke the credential of Aiko Ops (Support)",
    )
    .await;
    page.click("#op-confirm-yes").await;
    wait_text(
        &page,
        "#op-revoke-message",
        "Aiko Ops's credential is revoked",
    )
    .await;
    page.wait_for(
        &format!("document.querySelector('#op-body tr[data-operator=\"{support_id}\"][data-status=\"revoked\"]') !== null"),
        WAIT,
    )
    .await;
    // Booking refuses it at once.
    let r = stack
        .http
        .get(booking("/admin/orders"))
        .bearer_auth(&support)
        .send()
        .await
        .expect("revoked support");
    let (status, body) = read_json(r).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["reason"], "revoked");
    // The second tab's cancel: refused, the tab signed out saying why, nothing changed.
    other.click("#confirm-yes").await;
    other
        .wait_for("document.body.dataset.state === 'login'", WAIT)
        .await;
    wait_text(&other, "#login-message", "your credential has been revoked").await;
    assert_eq!(
        other
            .eval("sessionStorage.getItem('fg_ops_credential')")
            .await,
        Value::Null
    );
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
    other.click("#lang").await;
    let said = other.text("#login-message").await;
    assert!(said.contains("取り消されました"), "{said}");
    // The viewer the admin issued signs in there (the tab now speaks Japanese): reads, and
    // the order actions are disabled with the reason.
    sign_in(&other, &viewer, "Mika View（閲覧者）としてサインイン中").await;
    type_into(&other, "#q-account", "fan-ops-b").await;
    other.click("#search").await;
    other
        .wait_for(&format!("document.querySelector({open_js}) !== null"), WAIT)
        .await;
    other.click(&open_b).await;
    other.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_b}\"][data-status=\"PAID\"]:not([hidden])') !== null"),
        WAIT,
    )
    .await;
    assert_eq!(
        other
            .eval("['a-refund', 'a-lines', 'a-cancel'].map(id => document.getElementById(id).disabled)")
            .await,
        json!([true, true, true])
    );
    wait_text(&other, "#a-role-note", "サポート権限が必要です").await;
    assert!(hidden(&other, "#e-cancel").await);
    assert!(hidden(&other, "#operators").await);

    // The last live admin cannot be revoked (here: by themselves).
    let revoke = format!("#op-body button[data-revoke=\"{admin_id}\"]");
    page.click(&revoke).await;
    wait_text(&page, "#op-confirm-text", "your own credential").await;
    page.click("#op-confirm-yes").await;
    wait_text(&page, "#op-revoke-message", "last active admin").await;
    assert!(hidden(&page, "#op-confirm").await);
    assert_eq!(
        count(
            &stack,
            "SELECT count(*) FROM credentials WHERE id = $1 AND revoked_at IS NULL",
            &admin_id
        )
        .await,
        1
    );

    // Open order B, then cancel the event: the confirmation needs the event id typed exactly.
    type_into(&page, "#q-account", "fan-ops-b").await;
    page.click("#search").await;
    page.wait_for(&format!("document.querySelector({open_js}) !== null"), WAIT)
        .await;
    page.click(&open_b).await;
    page.wait_for(
        &format!("document.querySelector('#detail[data-order=\"{order_b}\"][data-status=\"PAID\"]') !== null"),
        WAIT,
    )
    .await;
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
    assert_eq!(cancelled_by.as_deref(), Some(ADMIN_OP));

    // The audit log, filtered by the event, names the operator and their role.
    type_into(&page, "#au-event", &event).await;
    page.click("#audit-form button[type=submit]").await;
    let row = wait_text(
        &page,
        "#audit-body tr[data-action=\"event.cancel\"]",
        "Ren Admin (Admin)",
    )
    .await;
    assert!(row.contains(&event), "{row}");

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
    assert_eq!(
        page.text("#who").await,
        "Ren Admin（管理者）としてサインイン中"
    );
    // What is already on screen is re-worded too (the last results and errors).
    let said = page.text("#event-message").await;
    assert!(said.starts_with("公演を中止しました"), "{said}");
    let said = page.text("#op-revoke-message").await;
    assert!(said.contains("最後の有効な管理者"), "{said}");
    let row = page
        .text("#audit-body tr[data-action=\"event.cancel\"]")
        .await;
    assert!(row.contains("Ren Admin（管理者）"), "{row}");
    page.screenshot(&shot("ops-ja"), true).await;
    page.assert_no_js_errors();

    // A tab whose browser speaks Japanese starts in Japanese, signed out (its own session).
    let ja = browser.new_page(412, 915).await;
    ja.set_locale("ja-JP").await;
    ja.navigate(&booking("/ops/")).await;
    ja.wait_for("document.body.dataset.ready === 'true'", WAIT)
        .await;
    assert_eq!(ja.text("#login-view h1").await, "サインイン");
    assert_eq!(
        ja.text("label[for=credential]").await,
        "オペレーター認証情報"
    );
    assert_eq!(ja.eval("document.body.dataset.state").await, "login");
    ja.assert_no_js_errors();

    drop(browser);
    stack.stop().await;
}
