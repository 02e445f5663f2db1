//! Tickets by e-mail (issue 43): each paid order that has an address gets one message with
//! its tickets, exactly once per `order.paid` event, plus the resends fans and ops ask for.
//!
//! Guarantees:
//! - One `mail_deliveries` row per (kind, key): `tickets` rows are inserted by the
//!   ticket-delivery consumer in its delivery row's transaction, keyed by the outbox event id
//!   (`outbox::delivery::MAIL_ROW`), so a redelivered event never queues a second message.
//! - Senders ([`sender`]) claim due rows in one statement (`FOR UPDATE SKIP LOCKED`, state
//!   `sending` with a lease) and commit `sent` only for the claim they hold (the attempt
//!   number fences a sender whose lease ran out). Any number of senders may run.
//! - The Message-ID is derived from the row's (key, kind), never random: if SMTP accepted a
//!   message and the sender died before `sent` committed, the lease expires and the same
//!   message goes again with the same Message-ID, which a receiver can recognise
//!   (docs/operations.md, "The crash window").
//! - SMTP 4xx, timeouts and connection errors retry with exponential backoff; a permanent
//!   5xx refusal, or `max_attempts` tries, makes the row `dead` (ops see and resend it).
//! - The address is read from `order_contacts` at send time and is never written to a log,
//!   the audit log, `last_error` or a metric. Erased addresses are not mailed.
//! - Without `[mail] smtp_url`, nothing is sent: rows stay `pending`, visible to ops.

pub mod compose;
pub mod http;
pub mod ics;
pub mod message;
pub mod qr;
pub mod retention;
pub mod sender;
pub mod settings;
pub mod transfer;

use crate::platform::auth::Auth;
use crate::platform::jobs::Job;
use crate::tickets::code::TicketKeys;
use sqlx::PgPool;
use std::sync::Arc;

pub use settings::{MailSettings, StartTls};

/// What the mail jobs and endpoints use. Cheap to clone.
#[derive(Clone)]
pub struct MailState {
    pub pool: PgPool,
    pub keys: Arc<TicketKeys>,
    pub settings: Arc<MailSettings>,
    /// `None`: no `[mail] smtp_url`, mailing is off (rows stay `pending`).
    pub mailer: Option<Arc<sender::Mailer>>,
    /// `[tickets] email_retention_days`.
    pub retention_days: u32,
    pub metrics: MailMetrics,
    pub auth: Auth,
}

impl axum::extract::FromRef<MailState> for Auth {
    fn from_ref(state: &MailState) -> Self {
        state.auth.clone()
    }
}

/// The mail jobs: the sender (only with a mailer) and the address retention.
pub fn jobs(state: &MailState) -> Vec<Arc<dyn Job>> {
    let mut jobs: Vec<Arc<dyn Job>> = vec![Arc::new(retention::Retention(state.clone()))];
    if state.mailer.is_some() {
        jobs.push(Arc::new(sender::Sender(state.clone())));
    }
    jobs
}

/// The RFC 5322 Message-ID of a delivery: `<{key}.{kind}@{domain}>`, a function of the row
/// alone so that a message sent again after a crash carries the same id.
pub fn message_id(kind: &str, key: &str, domain: &str) -> String {
    format!("<{key}.{kind}@{domain}>")
}

/// Ticket e-mail metrics.
#[derive(Clone)]
pub struct MailMetrics {
    /// Send results: `sent`, `retry` (4xx, timeout, connection), `dead` (5xx or attempts
    /// exhausted), `skipped` (nothing to send: address erased, no valid ticket).
    pub results: prometheus::IntCounterVec,
    /// Addresses erased (`retention`, `forget`).
    pub erased: prometheus::IntCounterVec,
}

impl MailMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        use prometheus::{IntCounterVec, Opts};
        let m = Self {
            results: IntCounterVec::new(
                Opts::new("ticket_mail_total", "Ticket e-mail send results"),
                &["result"],
            )?,
            erased: IntCounterVec::new(
                Opts::new(
                    "ticket_mail_addresses_erased_total",
                    "E-mail addresses erased",
                ),
                &["why"],
            )?,
        };
        registry.register(Box::new(m.results.clone()))?;
        registry.register(Box::new(m.erased.clone()))?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_id_is_a_function_of_the_row() {
        assert_eq!(
            message_id("tickets", "evt_1", "example.com"),
            "<evt_1.tickets@example.com>"
        );
        assert_ne!(
            message_id("tickets", "k", "d.io"),
            message_id("resend", "k", "d.io")
        );
    }
}
