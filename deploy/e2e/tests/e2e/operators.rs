//! Operators across both admin listeners (issue 42): an operator issued on booking works on
//! the gateway's admin listener with the same role once booking has published it; both audit
//! logs name them; a revocation on booking is refused at once by booking and within two
//! seconds by the gateway, with real booking, gateway and Redis.

use crate::stack::{ADMIN, Stack, demo_event, json};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// `POST /admin/operators` with the bootstrap secret: (id, credential).
async fn issue(stack: &Stack, name: &str, role: &str) -> (String, String) {
    let (s, v) = json(
        stack
            .http
            .post(format!("{}/admin/operators", stack.booking_url))
            .bearer_auth(ADMIN)
            .header("X-Floodgate-Actor", "launch lead")
            .json(&json!({"name": name, "role": role}))
            .send()
            .await
            .expect("issue operator"),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    (
        v["id"].as_str().expect("id").to_owned(),
        v["credential"].as_str().expect("credential").to_owned(),
    )
}

async fn gateway(
    stack: &Stack,
    method: reqwest::Method,
    path: &str,
    credential: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = stack
        .http
        .request(method, format!("{}{path}", stack.gateway_admin_url))
        .bearer_auth(credential)
        // Never the actor of an operator's change.
        .header("X-Floodgate-Actor", "impostor");
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("gateway admin call");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls the gateway until `credential` gets `want` on a read, or panics after `within`.
async fn until_gateway_answers(
    stack: &Stack,
    event: &str,
    credential: &str,
    want: u16,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let path = format!("/admin/events/{event}/config");
        let (s, v) = gateway(stack, reqwest::Method::GET, &path, credential, None).await;
        if s == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the gateway still answers {s} {v} after {within:?} (want {want})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn an_operator_acts_on_both_listeners_by_role_and_a_revocation_reaches_both() {
    let stack = Stack::start().await;
    let event = stack
        .create_event(
            &demo_event("ops-e2e"),
            &json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600}),
        )
        .await;
    let (support_id, support) = issue(&stack, "Aiko Support", "support").await;
    let (_, admin) = issue(&stack, "Ben Admin", "admin").await;

    // The gateway learns of them from booking's publication.
    until_gateway_answers(&stack, &event, &support, 200, Duration::from_secs(5)).await;
    until_gateway_answers(&stack, &event, &admin, 200, Duration::from_secs(5)).await;

    // Support may revoke a fan's admission, not reconfigure the room.
    let cfg_path = format!("/admin/events/{event}/config");
    let (s, cfg) = gateway(&stack, reqwest::Method::GET, &cfg_path, &support, None).await;
    assert_eq!(s, 200, "{cfg}");
    let new_cfg = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 1200});
    let (s, v) = gateway(
        &stack,
        reqwest::Method::PUT,
        &cfg_path,
        &support,
        Some(&new_cfg),
    )
    .await;
    assert_eq!(
        (s, v["code"].clone(), v["required_role"].clone()),
        (403, json!("ROLE_FORBIDDEN"), json!("admin")),
        "{v}"
    );
    let revoke_path = format!("/admin/events/{event}/revoke");
    let (s, v) = gateway(
        &stack,
        reqwest::Method::POST,
        &revoke_path,
        &support,
        Some(&json!({"account": "fan-to-stop"})),
    )
    .await;
    assert!((200..300).contains(&s), "{s} {v}");
    let (s, v) = gateway(
        &stack,
        reqwest::Method::PUT,
        &cfg_path,
        &admin,
        Some(&new_cfg),
    )
    .await;
    assert_eq!(s, 200, "{v}");

    // An unusable X-Floodgate-Actor is refused even from an operator, whose name it never is.
    let resp = stack
        .http
        .put(format!(
            "{}/admin/events/{event}/sold_out",
            stack.gateway_admin_url
        ))
        .bearer_auth(&admin)
        .header(
            "X-Floodgate-Actor",
            reqwest::header::HeaderValue::from_bytes(b"\xc3\x97\xc2\x9b").expect("obs-text"),
        )
        .json(&json!({"sold_out": true}))
        .send()
        .await
        .expect("bad header");
    assert_eq!(resp.status(), 400);
    // The gateway's config log names each operator with their role, never the header.
    let (s, log) = gateway(
        &stack,
        reqwest::Method::GET,
        &format!("/admin/events/{event}/audit"),
        &support,
        None,
    )
    .await;
    assert_eq!(s, 200, "{log}");
    let who: Vec<(Value, Value)> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["actor"].clone(), e["role"].clone()))
        .collect();
    assert!(
        who.contains(&(json!("Aiko Support"), json!("support"))),
        "{log}"
    );
    assert!(who.contains(&(json!("Ben Admin"), json!("admin"))), "{log}");
    assert!(!log.to_string().contains("impostor"), "{log}");

    // Revoked on booking: booking refuses at once, the gateway within two seconds.
    let resp = stack
        .http
        .delete(format!(
            "{}/admin/operators/{support_id}",
            stack.booking_url
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("revoke");
    assert_eq!(resp.status(), 204);
    let resp = stack
        .http
        .get(format!("{}/admin/operators/me", stack.booking_url))
        .bearer_auth(&support)
        .send()
        .await
        .expect("me");
    assert_eq!(resp.status(), 401);
    let took = until_gateway_answers(&stack, &event, &support, 401, Duration::from_secs(2)).await;
    eprintln!("revocation reached the gateway in {took:?}");
    // The admin still works on both.
    until_gateway_answers(&stack, &event, &admin, 200, Duration::from_secs(1)).await;
    // Booking's log has the revocation by the admin, under their name.
    let (actor, role): (String, String) = sqlx::query_as(
        "SELECT actor, role FROM ops_audit WHERE action = 'operator.revoke' AND target = $1",
    )
    .bind(format!("operator:{support_id}"))
    .fetch_one(&stack.pool)
    .await
    .expect("revoke entry");
    assert_eq!((actor.as_str(), role.as_str()), ("Ben Admin", "admin"));
    stack.stop().await;
}
