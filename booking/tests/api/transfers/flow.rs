//! The whole transfer: offer, the offer's mail with its link, accept, the receiver's new
//! code (verified, bumped `ver`, admitted at the door) and the sender's old one refused;
//! cancel; a refund after a transfer.

use super::{accept, cancel, offer, ticket_ids, tickets_of, usage};
use crate::checkin::{provision, scan};
use crate::helpers::json;
use crate::mail::{address, paid_order, parts, send_until_idle, spawn};
use crate::tickets::login;
use booking::tickets::TicketSettings;
use booking::tickets::mail::sender::Outcome;
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn code_of(list: &[serde_json::Value], ticket: &str) -> String {
    list.iter()
        .find(|t| t["id"] == ticket)
        .and_then(|t| t["code"].as_str())
        .expect("the ticket's code")
        .to_owned()
}

#[tokio::test]
async fn an_accepted_offer_moves_the_ticket_with_a_new_code_and_voids_the_old_one() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    crate::events::create_event(app, &crate::events::small_event("tr", 2, 5, 10, 1)).await;
    let alice_addr = address("alice");
    let order = paid_order(&env, "tr", "alice", &["S1-R1-1", "S1-R1-2"], &alice_addr).await;
    send_until_idle(app).await;
    let ids = ticket_ids(app, &order).await;
    let (tid, kept) = (&ids[0], &ids[1]);
    let old_code = code_of(&tickets_of(app, "alice").await, tid);
    assert_eq!(
        (
            usage(app, "tr", "alice").await,
            usage(app, "tr", "bob").await
        ),
        (2, 0)
    );

    // The offer, and its mail carrying the accept link.
    let offered_to = address("bob-offer");
    let (s, made) = offer(app, "alice", tid, &json!(offered_to)).await;
    assert_eq!(s, 201, "{made}");
    let transfer = made["id"].as_str().expect("id").to_owned();
    let accept_url = made["accept_url"].as_str().expect("accept_url").to_owned();
    assert_eq!(
        accept_url,
        format!("http://127.0.0.1:8080/e/tr/transfers/{transfer}")
    );
    assert!(made["expires_at"].as_str().is_some(), "{made}");
    assert_eq!(send_until_idle(app).await, vec![Outcome::Sent]);
    let got = mailbox.wait_for(&offered_to, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    let text = got[0].parsed().text.expect("text part");
    assert!(text.contains(&accept_url), "{text}");
    assert!(got[0].subject.contains("Test Event"), "{}", got[0].subject);
    // Until accepted, the ticket and its code stay the sender's.
    assert_eq!(code_of(&tickets_of(app, "alice").await, tid), old_code);

    // The receiver accepts, giving their own address.
    let bob_addr = address("bob");
    let (s, view) = accept(app, "bob", &transfer, &bob_addr).await;
    assert_eq!(s, 200, "{view}");
    assert_eq!(
        (&view["id"], &view["status"]),
        (&json!(tid), &json!("valid"))
    );
    let new_code = view["code"].as_str().expect("new code").to_owned();
    let keys = TicketSettings::default().keys().expect("keys");
    let claims = keys.verify(&new_code).expect("the new code verifies");
    assert_eq!((claims.tid.as_str(), claims.ver), (tid.as_str(), 2));
    assert_eq!(
        claims.hnd,
        keys.handle("bob"),
        "the holder handle is the receiver's"
    );
    assert_eq!(keys.verify(&old_code).expect("old signature").ver, 1);

    // The receiver's list has it (same code); the sender's and the sender's order no more.
    let bobs = tickets_of(app, "bob").await;
    assert_eq!(bobs.len(), 1);
    assert_eq!(code_of(&bobs, tid), new_code);
    let alices: Vec<_> = tickets_of(app, "alice").await;
    assert_eq!(alices.len(), 1);
    assert_eq!(alices[0]["id"], json!(kept));
    let (s, v) = json(
        app.get(&format!("/api/orders/{order}/tickets"), &login("alice"))
            .await,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["tickets"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        (
            usage(app, "tr", "alice").await,
            usage(app, "tr", "bob").await
        ),
        (1, 1)
    );

    // Both are mailed: the receiver the ticket (one QR), the sender a notice.
    assert_eq!(
        send_until_idle(app).await,
        vec![Outcome::Sent, Outcome::Sent]
    );
    let to_bob = mailbox.wait_for(&bob_addr, 1, WAIT).await;
    assert_eq!(to_bob.len(), 1);
    assert_eq!(
        to_bob[0].message_id,
        format!("<{transfer}.transfer_ticket@floodgate.test>")
    );
    assert_eq!(parts(&to_bob[0]).get("image/png").map(Vec::len), Some(1));
    let to_alice = mailbox.wait_for(&alice_addr, 2, WAIT).await;
    let notice = to_alice
        .iter()
        .find(|m| m.message_id == format!("<{transfer}.transferred@floodgate.test>"))
        .expect("the sender's notice");
    let text = notice.parsed().text.expect("text");
    assert!(text.contains("you transferred it"), "{text}");
    assert_eq!(
        mailbox.count(&offered_to).await,
        1,
        "the offer address got only the offer"
    );

    // The door: the old code is VOIDED (reissued), the new one enters.
    let (_, scanner) = provision(app, "tr", "North").await;
    let (s, v) = scan(app, &scanner, "tr", &old_code, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (410, Some("VOIDED"), Some("reissued")),
        "{v}"
    );
    let (s, v) = scan(app, &scanner, "tr", &new_code, "in", None).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("ENTRY")), "{v}");

    // Audited as the fans' own actions, without any address.
    let audit: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, detail::text FROM ops_audit
          WHERE action LIKE 'ticket.transfer%' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    let actions: Vec<_> = audit
        .iter()
        .map(|(a, b, _)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("fan:alice", "ticket.transfer_offer"),
            ("fan:bob", "ticket.transfer_accept")
        ]
    );
    assert!(audit.iter().all(|(_, _, d)| !d.contains('@')), "{audit:?}");
}

#[tokio::test]
async fn the_sender_cancels_an_open_offer_and_it_can_no_longer_be_accepted() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    crate::events::create_event(app, &crate::events::small_event("tc", 2, 5, 10, 1)).await;
    let order = paid_order(&env, "tc", "alice", &["S1-R1-1"], &address("alice")).await;
    send_until_idle(app).await;
    let tid = ticket_ids(app, &order).await.remove(0);
    let to = address("bob");
    let (s, made) = offer(app, "alice", &tid, &json!(to)).await;
    assert_eq!(s, 201, "{made}");
    let transfer = made["id"].as_str().expect("id").to_owned();

    assert_eq!(
        cancel(app, "bob", &transfer).await,
        404,
        "only the sender may cancel"
    );
    assert_eq!(cancel(app, "alice", &transfer).await, 204);
    assert_eq!(cancel(app, "alice", &transfer).await, 409);
    let (s, v) = accept(app, "bob", &transfer, &to).await;
    assert_eq!(
        (s, v["code"].as_str(), v["status"].as_str()),
        (409, Some("TRANSFER_NOT_OPEN"), Some("cancelled")),
        "{v}"
    );
    // Cancelled before the sender got to it: the offer is not mailed.
    assert_eq!(send_until_idle(app).await, vec![Outcome::Skipped]);
    assert_eq!(mailbox.count(&to).await, 0);
    // The ticket may be offered again.
    let (s, v) = offer(app, "alice", &tid, &json!(address("carol"))).await;
    assert_eq!(s, 201, "{v}");
    let version: i32 = sqlx::query_scalar("SELECT version FROM tickets WHERE id = $1")
        .bind(&tid)
        .fetch_one(&app.pool)
        .await
        .expect("version");
    assert_eq!(version, 1, "an offer alone changes no code");
}

#[tokio::test]
async fn a_refund_after_a_transfer_voids_the_receivers_ticket_and_releases_their_count() {
    let Some((env, mailbox)) = spawn(|_| {}).await else {
        return;
    };
    let app = &env.app;
    crate::helpers::create_refund_event(app, "tf", "release").await;
    let alice_addr = address("alice");
    let order = paid_order(&env, "tf", "alice", &["S1-R1-1", "S1-R1-2"], &alice_addr).await;
    let ids = ticket_ids(app, &order).await;
    let (s, made) = offer(app, "alice", &ids[0], &json!(address("bob-offer"))).await;
    assert_eq!(s, 201, "{made}");
    let bob_addr = address("bob");
    let transfer = made["id"].as_str().expect("id");
    let (s, view) = accept(app, "bob", transfer, &bob_addr).await;
    assert_eq!(s, 200, "{view}");
    let bob_code = view["code"].as_str().expect("code").to_owned();
    send_until_idle(app).await;
    assert_eq!(
        (
            usage(app, "tf", "alice").await,
            usage(app, "tf", "bob").await
        ),
        (1, 1)
    );

    // The buyer's order is refunded (the money goes back to the buyer: refunds go by order).
    let (s, v, _) = crate::ops_refunds::ops_post(
        app,
        &format!("/admin/orders/{order}/refund"),
        Some("lead"),
        Some("refund-tf"),
        &json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");

    let bobs = tickets_of(app, "bob").await;
    assert_eq!(
        bobs,
        vec![
            json!({"id": ids[0], "event": "tf", "seat": "S1-R1-1", "status": "voided",
                    "void_reason": "refunded"})
        ]
    );
    let (_, scanner) = provision(app, "tf", "North").await;
    let (s, v) = scan(app, &scanner, "tf", &bob_code, "in", None).await;
    assert_eq!(
        (s, v["code"].as_str(), v["reason"].as_str()),
        (410, Some("VOIDED"), Some("refunded")),
        "{v}"
    );
    // Both counts released: the receiver's one ticket, the buyer's other.
    assert_eq!(
        (
            usage(app, "tf", "alice").await,
            usage(app, "tf", "bob").await
        ),
        (0, 0)
    );

    // Each void notice goes to whoever held the ticket.
    send_until_idle(app).await;
    let refunded = |m: &testkit::mail::Message| {
        m.parsed()
            .text
            .is_some_and(|t| t.contains("the order was refunded"))
    };
    let to_bob = mailbox.wait_for(&bob_addr, 2, WAIT).await;
    let bob_voids: Vec<_> = to_bob.iter().filter(|m| refunded(m)).collect();
    assert_eq!(bob_voids.len(), 1);
    let text = bob_voids[0].parsed().text.unwrap_or_default();
    assert!(text.contains("S1-R1-1"), "{text}");
    let to_alice = mailbox.wait_for(&alice_addr, 3, WAIT).await;
    let alice_voids: Vec<_> = to_alice.iter().filter(|m| refunded(m)).collect();
    assert_eq!(
        alice_voids.len(),
        1,
        "the buyer hears of her own ticket only"
    );
    let text = alice_voids[0].parsed().text.unwrap_or_default();
    assert!(
        text.contains("S1-R1-2") && !text.contains("S1-R1-1"),
        "{text}"
    );
}
