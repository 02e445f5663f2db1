//! Every refused transfer answers a clear 4xx and changes nothing (the database is compared
//! before and after): someone else's ticket, bad addresses, to oneself, an open offer, a
//! voided or checked-in ticket, transfers off, an accept by the sender, an expired offer, a
//! ticket that changed after the offer, and the receiver's per-account limit.

use super::{accept, cancel, offer, ticket_ids, transfer_state, usage};
use crate::checkin::{order_codes, provision, scan};
use crate::helpers::json;
use crate::mail::{address, paid_order};
use crate::payments::PayEnv;
use serde_json::{Value, json};

fn refused(what: &str, got: (u16, Value), status: u16, code: &str) {
    assert_eq!(
        (got.0, got.1["code"].as_str()),
        (status, Some(code)),
        "{what}: {}",
        got.1
    );
}

#[tokio::test]
async fn bad_offers_and_accepts_are_refused_and_change_nothing() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    crate::events::create_event(app, &crate::events::small_event("ev", 2, 5, 10, 1)).await;
    let mut off = crate::events::small_event("off", 2, 5, 10, 1);
    off["transfers"] = json!(false);
    crate::events::create_event(app, &off).await;
    let alice_addr = address("alice");
    let order = paid_order(&env, "ev", "alice", &["S1-R1-1", "S1-R1-2"], &alice_addr).await;
    let ids = ticket_ids(app, &order).await;
    let off_order = paid_order(&env, "off", "alice", &["S1-R1-1"], &alice_addr).await;
    let off_ticket = ticket_ids(app, &off_order).await.remove(0);
    let t = &ids[0];

    let before = transfer_state(app).await;
    let bob = json!(address("bob"));
    refused(
        "someone else's",
        offer(app, "bob", t, &bob).await,
        404,
        "NOT_FOUND",
    );
    refused(
        "unknown",
        offer(app, "alice", "tkt_none", &bob).await,
        404,
        "NOT_FOUND",
    );
    let long = "x".repeat(65);
    refused(
        "long id",
        offer(app, "alice", &long, &bob).await,
        404,
        "NOT_FOUND",
    );
    for bad in [
        json!("not-an-address"),
        json!("a@b.test\r\nBcc: x@evil.test"),
        json!(""),
        json!("x@localhost"),
        json!(format!("{}@example.test", "a".repeat(260))),
    ] {
        let got = offer(app, "alice", t, &bad).await;
        refused(&format!("address {bad}"), got, 422, "VALIDATION_FAILED");
    }
    let (s, _) = offer(app, "alice", t, &json!(42)).await;
    assert!(s == 422 || s == 400, "a number is not an address: {s}");
    // The address the ticket was mailed to (domain case does not matter).
    let own = alice_addr.replace("example.test", "EXAMPLE.test");
    refused(
        "to oneself",
        offer(app, "alice", t, &json!(own)).await,
        422,
        "TRANSFER_TO_SELF",
    );
    let got = offer(app, "alice", &off_ticket, &bob).await;
    refused("transfers off", got, 403, "TRANSFERS_DISABLED");
    // Not a login token: none, or an admission token.
    let resp = app
        .client
        .post(app.url(&format!("/api/tickets/{t}/transfers")))
        .json(&json!({"to_email": bob}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let admission = app.admission("alice", "ev");
    let got = json(
        app.post(
            &format!("/api/tickets/{t}/transfers"),
            &admission,
            &json!({"to_email": bob}),
        )
        .await,
    )
    .await;
    assert_eq!(got.0, 401, "{}", got.1);
    assert_eq!(
        transfer_state(app).await,
        before,
        "refused offers changed nothing"
    );

    // An open offer: a second one is refused, the sender cannot accept, bad accepts fail.
    let (s, made) = offer(app, "alice", t, &bob).await;
    assert_eq!(s, 201, "{made}");
    let transfer = made["id"].as_str().expect("id").to_owned();
    let before = transfer_state(app).await;
    let got = offer(app, "alice", t, &json!(address("carol"))).await;
    assert_eq!(got.1["transfer_id"], json!(transfer), "{}", got.1);
    refused("second offer", got, 409, "TRANSFER_PENDING");
    let got = accept(app, "alice", &transfer, &address("alice2")).await;
    refused("accept by the sender", got, 403, "TRANSFER_TO_SELF");
    let got = accept(app, "bob", &transfer, "bob at example").await;
    refused("accept, bad address", got, 422, "VALIDATION_FAILED");
    let got = accept(app, "bob", "tr_none", &address("bob")).await;
    refused("accept, unknown", got, 404, "NOT_FOUND");
    assert_eq!(cancel(app, "bob", &transfer).await, 404);
    assert_eq!(
        transfer_state(app).await,
        before,
        "refused accepts changed nothing"
    );

    // Checked in after the offer: the accept finds the ticket changed.
    let (_, scanner) = provision(app, "ev", "North").await;
    let codes = order_codes(app, "alice", &order).await;
    let code = &codes.iter().find(|c| &c.0 == t).expect("code").1;
    let (s, v) = scan(app, &scanner, "ev", code, "in", None).await;
    assert_eq!(s, 200, "{v}");
    let before = transfer_state(app).await;
    let got = accept(app, "bob", &transfer, &address("bob")).await;
    refused("accept after check-in", got, 409, "TRANSFER_STALE");
    assert_eq!(transfer_state(app).await, before);
    // And a checked-in ticket cannot be offered (once the stale offer is cancelled).
    assert_eq!(cancel(app, "alice", &transfer).await, 204);
    let before = transfer_state(app).await;
    let got = offer(app, "alice", t, &json!(address("carol"))).await;
    refused("checked in", got, 409, "TICKET_CHECKED_IN");
    assert_eq!(transfer_state(app).await, before);

    // An expired offer: not accepted, not cancelled; a new offer replaces it.
    let t2 = &ids[1];
    let (s, made) = offer(app, "alice", t2, &bob).await;
    assert_eq!(s, 201, "{made}");
    let expired = made["id"].as_str().expect("id").to_owned();
    sqlx::query(
        "UPDATE ticket_transfers SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(&expired)
    .execute(&app.pool)
    .await
    .expect("expire");
    let before = transfer_state(app).await;
    let got = accept(app, "bob", &expired, &address("bob")).await;
    refused("expired", got, 409, "TRANSFER_EXPIRED");
    assert_eq!(cancel(app, "alice", &expired).await, 409);
    assert_eq!(transfer_state(app).await, before);
    let (s, v) = offer(app, "alice", t2, &json!(address("carol"))).await;
    assert_eq!(s, 201, "{v}");
    let status: String = sqlx::query_scalar("SELECT status FROM ticket_transfers WHERE id = $1")
        .bind(&expired)
        .fetch_one(&app.pool)
        .await
        .expect("status");
    assert_eq!(status, "expired");

    // A voided ticket cannot be offered.
    let refunded = paid_order(&env, "ev", "alice", &["S2-R1-1"], &alice_addr).await;
    let (s, v, _) = crate::ops_refunds::ops_post(
        app,
        &format!("/admin/orders/{refunded}/refund"),
        Some("lead"),
        Some("refund-voided"),
        &json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let voided = ticket_ids(app, &refunded).await.remove(0);
    let before = transfer_state(app).await;
    let got = offer(app, "alice", &voided, &bob).await;
    refused("voided", got, 409, "TICKET_VOIDED");
    assert_eq!(transfer_state(app).await, before);
}

#[tokio::test]
async fn the_receivers_per_event_limit_applies_and_a_refused_accept_changes_nothing() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    crate::events::create_event(app, &crate::events::small_event("lim", 2, 5, 10, 1)).await;
    // Bob holds the event's limit (4) already.
    let seats = ["S2-R1-1", "S2-R1-2", "S2-R1-3", "S2-R1-4"];
    paid_order(&env, "lim", "bob", &seats, &address("bob")).await;
    let order = paid_order(&env, "lim", "alice", &["S1-R1-1"], &address("alice")).await;
    let tid = ticket_ids(app, &order).await.remove(0);
    let (s, made) = offer(app, "alice", &tid, &json!(address("bob"))).await;
    assert_eq!(s, 201, "{made}");
    let transfer = made["id"].as_str().expect("id").to_owned();

    let before = transfer_state(app).await;
    let (s, v) = accept(app, "bob", &transfer, &address("bob")).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("LIMIT_EXCEEDED")),
        "{v}"
    );
    assert_eq!((&v["limit"], &v["held"]), (&json!(4), &json!(4)), "{v}");
    assert_eq!(transfer_state(app).await, before, "nothing changed");

    // The offer is still open: someone under the limit takes it, and the counts move.
    let (s, v) = accept(app, "carol", &transfer, &address("carol")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            usage(app, "lim", "alice").await,
            usage(app, "lim", "bob").await,
            usage(app, "lim", "carol").await
        ),
        (0, 4, 1)
    );
}
