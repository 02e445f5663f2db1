//! Concurrent accepts of one offer by twenty different receivers: exactly one wins, every
//! other is refused, and the database agrees (one holder, one version bump, one count moved,
//! one ticket e-mail). Checked every run, not by timing luck: the requests are all in flight
//! together and the invariant is read from Postgres afterwards.

use super::{accept, offer, ticket_ids, usage};
use crate::mail::{address, paid_order};
use crate::payments::PayEnv;
use serde_json::json;

const RECEIVERS: usize = 20;

#[tokio::test]
async fn twenty_concurrent_accepts_make_exactly_one_holder() {
    let env = PayEnv::spawn().await;
    let app = &env.app;
    crate::events::create_event(app, &crate::events::small_event("race", 2, 5, 10, 1)).await;
    let order = paid_order(&env, "race", "alice", &["S1-R1-1"], &address("alice")).await;
    let tid = ticket_ids(app, &order).await.remove(0);
    let (s, made) = offer(app, "alice", &tid, &json!(address("any"))).await;
    assert_eq!(s, 201, "{made}");
    let transfer = made["id"].as_str().expect("id").to_owned();

    let receivers: Vec<String> = (0..RECEIVERS).map(|i| format!("r{i}")).collect();
    let answers = futures::future::join_all(receivers.iter().map(|r| {
        let transfer = transfer.clone();
        async move { (r.clone(), accept(app, r, &transfer, &address(r)).await) }
    }))
    .await;
    let winners: Vec<&String> = answers
        .iter()
        .filter(|(_, (s, _))| *s == 200)
        .map(|(r, _)| r)
        .collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    let winner = winners[0];
    for (r, (s, v)) in &answers {
        if r != winner {
            assert_eq!(
                (*s, v["code"].as_str(), v["status"].as_str()),
                (409, Some("TRANSFER_NOT_OPEN"), Some("accepted")),
                "{r}: {v}"
            );
        }
    }

    let (holder, version): (String, i32) =
        sqlx::query_as("SELECT holder_account, version FROM tickets WHERE id = $1")
            .bind(&tid)
            .fetch_one(&app.pool)
            .await
            .expect("ticket");
    assert_eq!((&holder, version), (winner, 2));
    let (status, receiver): (String, Option<String>) =
        sqlx::query_as("SELECT status, receiver_account FROM ticket_transfers WHERE id = $1")
            .bind(&transfer)
            .fetch_one(&app.pool)
            .await
            .expect("transfer");
    assert_eq!(
        (status.as_str(), receiver.as_ref()),
        ("accepted", Some(winner))
    );
    assert_eq!(usage(app, "race", "alice").await, 0);
    for r in &receivers {
        let expected = i32::from(r == winner);
        assert_eq!(usage(app, "race", r).await, expected, "{r}");
    }
    let mails: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM mail_deliveries WHERE kind = 'transfer_ticket' AND key = $1",
    )
    .bind(&transfer)
    .fetch_one(&app.pool)
    .await
    .expect("mail rows");
    assert_eq!(mails, 1);
}
