//! Transfer at face value (issue 44): real booking, the real payment sandbox, Postgres, the
//! SMTP sink and the door. Tickets are bought and paid through the API, offered and accepted
//! with fans' login tokens, their codes scanned by a scanner provisioned through the admin
//! API.
//!
//! Layout: `flow` (offer → mail → accept → new code enters, old one is VOIDED; cancel; a
//! refund after a transfer), `refusals` (every bad input changes nothing, the receiver's
//! limit), `race` (concurrent accepts: exactly one winner).

mod flow;
mod race;
mod refusals;

use crate::helpers::{TestApp, json};
use crate::tickets::login;
use serde_json::{Value, json};

/// `POST /api/tickets/{ticket}/transfers` as `account`.
pub(super) async fn offer(app: &TestApp, account: &str, ticket: &str, to: &Value) -> (u16, Value) {
    json(
        app.post(
            &format!("/api/tickets/{ticket}/transfers"),
            &login(account),
            &json!({ "to_email": to }),
        )
        .await,
    )
    .await
}

/// `POST /api/transfers/{id}/accept` as `account`, giving `email`.
pub(super) async fn accept(app: &TestApp, account: &str, id: &str, email: &str) -> (u16, Value) {
    json(
        app.post(
            &format!("/api/transfers/{id}/accept"),
            &login(account),
            &json!({ "email": email }),
        )
        .await,
    )
    .await
}

/// `DELETE /api/transfers/{id}` as `account`: the status.
pub(super) async fn cancel(app: &TestApp, account: &str, id: &str) -> u16 {
    app.client
        .delete(app.url(&format!("/api/transfers/{id}")))
        .bearer_auth(login(account))
        .send()
        .await
        .expect("cancel")
        .status()
        .as_u16()
}

/// `GET /api/tickets` as `account`.
pub(super) async fn tickets_of(app: &TestApp, account: &str) -> Vec<Value> {
    let (s, v) = json(app.get("/api/tickets", &login(account)).await).await;
    assert_eq!(s, 200, "{v}");
    v["tickets"].as_array().expect("tickets").clone()
}

/// The ids of `order`'s tickets, by seat.
pub(super) async fn ticket_ids(app: &TestApp, order: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM tickets WHERE order_id = $1 ORDER BY seat_id, id")
        .bind(order)
        .fetch_all(&app.pool)
        .await
        .expect("ticket ids")
}

/// `account`'s usage of `event` (0 when no row).
pub(super) async fn usage(app: &TestApp, event: &str, account: &str) -> i32 {
    sqlx::query_scalar::<_, i32>(
        "SELECT tickets FROM account_event_usage WHERE event_id = $1 AND account_id = $2",
    )
    .bind(event)
    .bind(account)
    .fetch_optional(&app.pool)
    .await
    .expect("usage")
    .unwrap_or(0)
}

/// Everything a transfer may write, as one comparable text: tickets (holder, version,
/// validity, door state), offers, usage, queued mail, the audit log.
pub(super) async fn transfer_state(app: &TestApp) -> String {
    sqlx::query_scalar(
        "SELECT json_build_object(
           'tickets', (SELECT json_agg(json_build_array(id, holder_account, version,
                                                        voided_at IS NULL, entries) ORDER BY id)
                         FROM tickets),
           'transfers', (SELECT json_agg(json_build_array(id, status, receiver_account,
                                                          receiver_email) ORDER BY id)
                           FROM ticket_transfers),
           'usage', (SELECT json_agg(json_build_array(event_id, account_id, tickets)
                                     ORDER BY event_id, account_id) FROM account_event_usage),
           'mail', (SELECT count(*) FROM mail_deliveries),
           'audit', (SELECT count(*) FROM ops_audit))::text",
    )
    .fetch_one(&app.pool)
    .await
    .expect("state")
}
