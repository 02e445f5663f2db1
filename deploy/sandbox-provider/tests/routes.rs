//! The calls Stripe's libraries make beyond create/confirm/refund, on the wire: PaymentIntents
//! update (metadata merged, money fixed once taken) and list, Refunds retrieve and list (Stripe's
//! list object, newest first, `limit` / `starting_after` / `ending_before` / `created`), and
//! Stripe's JSON error — exact shape and status — for an unknown id, an unknown route and a
//! wrong method, where axum alone would answer a bare 404 or 405.

#[allow(dead_code, reason = "each test crate uses part of the shared helpers")]
mod common;
use serde_json::{Value, json};

const KEY: &str = "sk_test_routes_suite";

/// Any method, an optional form; (status, JSON body). Every answer must be JSON.
async fn call(
    url: &str,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    form: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .bearer_auth(KEY);
    if !form.is_empty() {
        req = req.form(form);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status} {path}: not JSON ({e}): {text:?}"));
    (status, body)
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    call(url, reqwest::Method::GET, path, None, &[]).await
}

async fn post(url: &str, path: &str, form: &[(&str, &str)]) -> (u16, Value) {
    call(url, reqwest::Method::POST, path, None, form).await
}

/// A charged intent; its id.
async fn paid(url: &str, order: &str) -> String {
    let (s, pi) = post(
        url,
        "/v1/payment_intents",
        &[
            ("amount", "1000"),
            ("currency", "jpy"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("metadata[order_id]", order),
        ],
    )
    .await;
    assert_eq!((s, pi["status"].as_str()), (200, Some("succeeded")), "{pi}");
    pi["id"].as_str().expect("id").to_owned()
}

fn ids(list: &Value) -> Vec<&str> {
    list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|o| o["id"].as_str().expect("id"))
        .collect()
}

#[tokio::test]
async fn payment_intents_list_newest_first_in_stripes_pages() {
    let (url, _sb) = common::start(KEY).await;
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(paid(&url, &format!("l{i}")).await);
    }
    let newest_first: Vec<&str> = made.iter().rev().map(String::as_str).collect();

    let (s, all) = get(&url, "/v1/payment_intents").await;
    assert_eq!(s, 200, "{all}");
    assert_eq!(
        (&all["object"], &all["url"], &all["has_more"]),
        (&json!("list"), &json!("/v1/payment_intents"), &json!(false))
    );
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all["data"][0]["object"], "payment_intent");

    // Forwards with starting_after, two at a time, until has_more is false.
    let (_, p1) = get(&url, "/v1/payment_intents?limit=2").await;
    assert_eq!(
        (ids(&p1), &p1["has_more"]),
        (newest_first[..2].to_vec(), &json!(true))
    );
    let (_, p2) = get(
        &url,
        &format!("/v1/payment_intents?limit=2&starting_after={}", made[3]),
    )
    .await;
    assert_eq!(
        (ids(&p2), &p2["has_more"]),
        (newest_first[2..4].to_vec(), &json!(true))
    );
    let (_, p3) = get(
        &url,
        &format!("/v1/payment_intents?limit=2&starting_after={}", made[1]),
    )
    .await;
    assert_eq!(
        (ids(&p3), &p3["has_more"]),
        (vec![made[0].as_str()], &json!(false))
    );
    // Backwards with ending_before: the two just newer than the oldest.
    let (_, back) = get(
        &url,
        &format!("/v1/payment_intents?limit=2&ending_before={}", made[0]),
    )
    .await;
    assert_eq!(
        (ids(&back), &back["has_more"]),
        (vec![made[2].as_str(), made[1].as_str()], &json!(true))
    );
    // created bounds: none created in the future, all since the first one's second.
    let created = all["data"][4]["created"].as_i64().expect("created");
    let (_, future) = get(
        &url,
        &format!("/v1/payment_intents?created[gt]={}", created + 3600),
    )
    .await;
    assert_eq!(
        (ids(&future).len(), &future["has_more"]),
        (0, &json!(false))
    );
    let (_, since) = get(
        &url,
        &format!("/v1/payment_intents?created%5Bgte%5D={created}"),
    )
    .await;
    assert_eq!(ids(&since), newest_first);

    // Refusals: Stripe's 400 naming the parameter.
    for (query, param, code) in [
        ("limit=0", "limit", "parameter_invalid_integer"),
        ("limit=101", "limit", "parameter_invalid_integer"),
        (
            "starting_after=pi_nope",
            "starting_after",
            "resource_missing",
        ),
        (
            "starting_after=a&ending_before=b",
            "ending_before",
            "parameters_exclusive",
        ),
        ("colour=red", "colour", "parameter_unknown"),
    ] {
        let (s, e) = get(&url, &format!("/v1/payment_intents?{query}")).await;
        assert_eq!(s, 400, "{query}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{query}");
        assert_eq!(
            (e["error"]["param"].as_str(), e["error"]["code"].as_str()),
            (Some(param), Some(code)),
            "{query}"
        );
    }
}

#[tokio::test]
async fn update_merges_metadata_and_never_changes_money_taken() {
    let (url, sb) = common::start(KEY).await;
    let (_, pi) = post(
        &url,
        "/v1/payment_intents",
        &[
            ("amount", "1000"),
            ("currency", "jpy"),
            ("payment_method", "pm_card_visa"),
            ("metadata[order_id]", "u1"),
            ("metadata[drop]", "x"),
        ],
    )
    .await;
    let id = pi["id"].as_str().expect("id");
    let path = format!("/v1/payment_intents/{id}");
    let form = [
        ("amount", "1200"),
        ("metadata[drop]", ""),
        ("metadata[seat]", "A-1"),
        ("receipt_email", "fan@example.test"),
    ];
    let (s, up) = call(&url, reqwest::Method::POST, &path, Some("u-1"), &form).await;
    assert_eq!(s, 200, "{up}");
    assert_eq!(up["amount"], 1200);
    assert_eq!(up["metadata"], json!({"order_id": "u1", "seat": "A-1"}));
    assert_eq!(up["receipt_email"], "fan@example.test");
    // The same key and parameters replay; the intent is as the first update left it.
    let (s, again) = call(&url, reqwest::Method::POST, &path, Some("u-1"), &form).await;
    assert_eq!((s, &again), (200, &up));

    let (s, confirmed) = post(&url, &format!("{path}/confirm"), &[]).await;
    assert_eq!(
        (s, confirmed["amount_received"].as_i64()),
        (200, Some(1200))
    );
    let (s, e) = post(&url, &path, &[("amount", "1")]).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "payment_intent_unexpected_state");
    assert_eq!(e["error"]["param"], "amount");
    assert_eq!(
        e["error"]["message"],
        "This PaymentIntent's amount could not be updated because it has a status of succeeded. \
         You may only update the amount of a PaymentIntent with one of the following statuses: \
         requires_payment_method, requires_confirmation, requires_action."
    );
    assert_eq!(e["error"]["payment_intent"]["id"], id);
    assert_eq!(
        sb.order_summary("u1").amount_charged,
        1200,
        "the charge kept its amount"
    );
    // Metadata can still change after the payment (as at Stripe).
    let (s, noted) = post(&url, &path, &[("metadata[note]", "gift")]).await;
    assert_eq!((s, noted["metadata"]["note"].as_str()), (200, Some("gift")));

    let (s, e) = post(&url, "/v1/payment_intents/pi_x", &[("metadata[a]", "b")]).await;
    assert_eq!(s, 404);
    assert_eq!(
        e,
        json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
                         "param": "id", "message": "No such payment_intent: 'pi_x'"}})
    );
}

#[tokio::test]
async fn refunds_are_retrieved_and_listed_per_intent() {
    let (url, _sb) = common::start(KEY).await;
    let a = paid(&url, "r1").await;
    let b = paid(&url, "r2").await;
    let mut refunds = Vec::new();
    for (pi, amount) in [(&a, "100"), (&b, "200"), (&a, "300")] {
        let (s, r) = post(
            &url,
            "/v1/refunds",
            &[("payment_intent", pi), ("amount", amount)],
        )
        .await;
        assert_eq!(s, 200, "{r}");
        refunds.push(r);
    }
    let id = |r: &Value| r["id"].as_str().expect("id").to_owned();

    let (s, got) = get(&url, &format!("/v1/refunds/{}", id(&refunds[1]))).await;
    assert_eq!((s, &got), (200, &refunds[1]));
    let (s, e) = get(&url, "/v1/refunds/re_x").await;
    assert_eq!(s, 404);
    assert_eq!(
        e,
        json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
                         "param": "id", "message": "No such refund: 're_x'"}})
    );

    let (s, of_a) = get(&url, &format!("/v1/refunds?payment_intent={a}")).await;
    assert_eq!(s, 200, "{of_a}");
    assert_eq!(
        (&of_a["object"], &of_a["url"]),
        (&json!("list"), &json!("/v1/refunds"))
    );
    assert_eq!(ids(&of_a), [id(&refunds[2]), id(&refunds[0])]);
    let (_, all) = get(&url, "/v1/refunds?limit=2").await;
    assert_eq!(
        (ids(&all), &all["has_more"]),
        (
            vec![id(&refunds[2]).as_str(), id(&refunds[1]).as_str()],
            &json!(true)
        )
    );
    let (_, rest) = get(
        &url,
        &format!("/v1/refunds?limit=2&starting_after={}", id(&refunds[1])),
    )
    .await;
    assert_eq!(
        (ids(&rest), &rest["has_more"]),
        (vec![id(&refunds[0]).as_str()], &json!(false))
    );
    // A cursor from another intent's refunds is not in this list.
    let (s, e) = get(
        &url,
        &format!(
            "/v1/refunds?payment_intent={a}&starting_after={}",
            id(&refunds[1])
        ),
    )
    .await;
    assert_eq!(
        (s, e["error"]["param"].as_str()),
        (400, Some("starting_after"))
    );
}

#[tokio::test]
async fn what_the_sandbox_does_not_serve_is_stripes_json_error() {
    let (url, _sb) = common::start(KEY).await;
    let unrecognized = |method: &str, path: &str| {
        json!({"error": {"type": "invalid_request_error", "message": format!(
            "Unrecognized request URL ({method}: {path}). Please see https://stripe.com/docs or \
             we can help at https://support.stripe.com/."
        )}})
    };
    use reqwest::Method;
    for (method, path) in [
        (Method::GET, "/v1/xyz"),
        (Method::GET, "/v1/customers/cus_x"),
        (Method::POST, "/v1/charges"),
        (Method::DELETE, "/v1/payment_intents/pi_x"),
        (Method::PUT, "/v1/refunds"),
        (Method::POST, "/v1/refunds/re_x"),
        (Method::GET, "/v1/payment_intents/pi_x/confirm"),
        (Method::GET, "/v2/core/events"),
    ] {
        let (s, e) = call(&url, method.clone(), path, None, &[]).await;
        assert_eq!(
            (s, e),
            (404, unrecognized(method.as_str(), path)),
            "{method} {path}"
        );
    }
    // The query string is not part of the URL Stripe names.
    let (s, e) = get(&url, "/v1/xyz?limit=3").await;
    assert_eq!((s, e), (404, unrecognized("GET", "/v1/xyz")));
    // The key is checked first, as for every Stripe call.
    let resp = reqwest::Client::new()
        .get(format!("{url}/v1/xyz"))
        .bearer_auth("sk_test_wrong")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 401);
    let v: Value = resp.json().await.expect("a JSON answer");
    assert_eq!(v["error"]["type"], "authentication_error");
}
