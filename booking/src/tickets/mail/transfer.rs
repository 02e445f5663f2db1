//! The transfer e-mails (`tickets::transfer`), keyed by the transfer id:
//!
//! - `transfer_offer` to the offer's address: which ticket, the accept link, the expiry. Not
//!   sent once the offer is no longer open (cancelled before the sender got to it).
//! - `transfer_ticket` to the address the receiver gave: the ticket with its current code
//!   (the ticket message of [`message::build`] with that one ticket), while they hold it.
//! - `transferred` to the sender's address: a notice that their code no longer gets in
//!   (the void notice with reason `transferred`).
//!
//! Addresses are read from `ticket_transfers` at send time; an erased one is not mailed.

use crate::platform::email::Email;
use crate::tickets::code::TicketClaims;
use crate::tickets::mail::message::{self, Content, Envelope, TicketLine, VoidNotice};
use crate::tickets::mail::sender::{Claimed, Mailer};
use crate::tickets::mail::{MailState, message_id};
use anyhow::Context;
use chrono::{DateTime, Utc};
use lettre::message::{Mailbox, MultiPart};

pub const KINDS: [&str; 3] = ["transfer_offer", "transfer_ticket", "transferred"];

#[derive(sqlx::FromRow)]
struct Row {
    status: String,
    from_email: Option<String>,
    to_email: Option<String>,
    receiver_email: Option<String>,
    receiver_account: Option<String>,
    expires_at: DateTime<Utc>,
    ticket_id: String,
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    version: i32,
    issued_at: DateTime<Utc>,
    holder_account: String,
    voided: bool,
    name: String,
    venue: String,
    venue_address: Option<String>,
    starts_at: Option<DateTime<Utc>>,
    doors_at: Option<DateTime<Utc>>,
    timezone: Option<String>,
    ticket_code: String,
}

/// The message of a claimed transfer row (`Err`: nothing to send, and why).
pub async fn compose(
    state: &MailState,
    mailer: &Mailer,
    c: &Claimed,
) -> anyhow::Result<Result<(Email, lettre::Message), &'static str>> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT x.status, x.from_email, x.to_email, x.receiver_email, x.receiver_account,
                x.expires_at, t.id AS ticket_id, t.event_id, t.seat_id, t.ga_tier, t.version,
                t.issued_at, t.holder_account, t.voided_at IS NOT NULL AS voided,
                e.name, e.venue, e.venue_address, e.starts_at, e.doors_at, e.timezone,
                e.ticket_code
           FROM ticket_transfers x JOIN tickets t ON t.id = x.ticket_id
           JOIN events e ON e.id = t.event_id
          WHERE x.id = $1",
    )
    .bind(&c.key)
    .fetch_optional(&state.pool)
    .await
    .context("failed to read the transfer")?;
    let Some(r) = row else {
        return Ok(Err("no such transfer"));
    };
    let to = match c.kind.as_str() {
        "transfer_offer" => r.to_email.as_deref(),
        "transfer_ticket" => r.receiver_email.as_deref(),
        _ => r.from_email.as_deref(),
    };
    let Some(to) = to.and_then(|a| Email::parse(a).ok()) else {
        return Ok(Err("no address (erased)"));
    };
    let envelope = Envelope {
        from: &mailer.from,
        to: &to,
        message_id: message_id(&c.kind, &c.key, &mailer.domain),
        domain: &mailer.domain,
    };
    let line = |code: Option<String>| TicketLine {
        id: r.ticket_id.clone(),
        seat: r.seat_id.clone(),
        tier: r.ga_tier.clone(),
        code,
    };
    let msg = match c.kind.as_str() {
        "transfer_offer" => {
            if r.status != "offered" {
                return Ok(Err("the offer is no longer open"));
            }
            build_offer(
                &r.name,
                &line(None),
                &state.settings.transfer_accept(&r.event_id, &c.key),
                r.expires_at,
                &envelope,
            )?
        }
        "transfer_ticket" => {
            if r.voided || r.receiver_account.as_deref() != Some(r.holder_account.as_str()) {
                return Ok(Err("the receiver no longer holds the ticket"));
            }
            let rotating = r.ticket_code == "rotating";
            // Signed over the version as it is now, like every ticket message.
            let code = (!rotating).then(|| {
                state.keys.sign(&TicketClaims {
                    tid: r.ticket_id.clone(),
                    evt: r.event_id.clone(),
                    seat: r.seat_id.clone(),
                    tier: r.ga_tier.clone(),
                    hnd: state.keys.handle(&r.holder_account),
                    ver: r.version,
                    iat: r.issued_at.timestamp(),
                    rot: None,
                })
            });
            let content = Content {
                order_id: c.order_id.clone(),
                event_name: r.name.clone(),
                venue: r.venue.clone(),
                venue_address: r.venue_address.clone(),
                starts_at: r.starts_at,
                doors_at: r.doors_at,
                timezone: r.timezone.clone(),
                rotating,
                tickets: vec![line(code)],
                ticket_page: state.settings.ticket_page(&r.event_id, &c.order_id),
                resend: false,
            };
            let (from, domain, message_id, to_owned) = (
                mailer.from.clone(),
                mailer.domain.clone(),
                envelope.message_id.clone(),
                to.clone(),
            );
            // The QR image is CPU work: off the runtime's threads, as for order messages.
            tokio::task::spawn_blocking(move || {
                message::build(
                    &content,
                    &Envelope {
                        from: &from,
                        to: &to_owned,
                        message_id,
                        domain: &domain,
                    },
                )
            })
            .await
            .context("the transfer e-mail builder stopped")??
        }
        _ => message::build_void(
            &VoidNotice {
                order_id: c.order_id.clone(),
                event_name: r.name.clone(),
                ticket: line(None),
                reason: "transferred".into(),
                ticket_page: state.settings.ticket_page(&r.event_id, &c.order_id),
            },
            &envelope,
        )?,
    };
    Ok(Ok((to, msg)))
}

/// The offer: which ticket, the link, until when. Everything from data is escaped.
fn build_offer(
    event_name: &str,
    ticket: &TicketLine,
    accept_url: &str,
    expires_at: DateTime<Utc>,
    env: &Envelope<'_>,
) -> anyhow::Result<lettre::Message> {
    let what = match (&ticket.seat, &ticket.tier) {
        (Some(seat), _) => format!("seat {seat}"),
        (None, Some(tier)) => format!("general admission ({tier})"),
        (None, None) => "a ticket".to_owned(),
    };
    let until = expires_at.format("%A %-d %B %Y, %H:%M UTC");
    let text = format!(
        "Someone is giving you a ticket for {event_name}: {what}.\n\n\
         To accept it, sign in and open:\n{accept_url}\n\n\
         The offer is open until {until}. No payment is asked: the ticket changes hands at \
         face value. If you did not expect this, ignore this message.\n"
    );
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>A ticket for you</title></head><body>\
         <h1>A ticket for {}</h1><p>{}</p><p><a href=\"{}\">Accept the ticket</a> (sign in first).</p>\
         <p>The offer is open until {}. No payment is asked. If you did not expect this, ignore this message.</p></body></html>",
        message::html_escape(event_name),
        message::html_escape(&what),
        message::html_escape(accept_url),
        until
    );
    let name: String = event_name
        .chars()
        .filter(|c| !c.is_control())
        .take(120)
        .collect();
    lettre::Message::builder()
        .from(env.from.clone())
        .to(Mailbox::new(None, env.to.address().clone()))
        .subject(format!("A ticket for you: {name}"))
        .message_id(Some(env.message_id.clone()))
        .date_now()
        .multipart(MultiPart::alternative_plain_html(text, html))
        .context("failed to build the transfer offer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offer_escapes_what_it_quotes_and_adds_no_header() {
        let from: Mailbox = "T <t@floodgate.test>".parse().expect("mailbox");
        let to = Email::parse("friend@example.com").expect("address");
        let env = Envelope {
            from: &from,
            to: &to,
            message_id: "<x.transfer_offer@floodgate.test>".into(),
            domain: "floodgate.test",
        };
        let line = TicketLine {
            id: "tkt".into(),
            seat: Some("A-1".into()),
            tier: None,
            code: None,
        };
        let msg = build_offer(
            "Live <b>\r\nBcc: x@evil.test",
            &line,
            "http://x/e/ev/transfers/t1?a=1&b=2",
            "2031-01-01T00:00:00Z".parse().expect("time"),
            &env,
        )
        .expect("message");
        let raw = String::from_utf8(msg.formatted()).expect("utf-8");
        // The name's CR/LF may reach the body (harmless there), never the header block.
        let headers = raw.split("\r\n\r\n").next().unwrap_or_default();
        assert!(!headers.lines().any(|l| l.starts_with("Bcc:")), "{headers}");
        assert!(raw.contains("Live &lt;b&gt;"), "{raw}");
    }
}
