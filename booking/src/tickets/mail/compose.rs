//! Building a claimed row's message from the database as it is now: the order's current
//! valid tickets (codes signed over their current versions) or one ticket's void notice.
//! Nothing here is sent or recorded ([`super::sender`] does both).

use crate::platform::email::Email;
use crate::tickets::code::TicketClaims;
use crate::tickets::mail::message::{self, Content, Envelope, TicketLine};
use crate::tickets::mail::sender::{Claimed, Mailer};
use crate::tickets::mail::{MailState, message_id};
use anyhow::Context;
use chrono::{DateTime, Utc};

/// The message of one claimed row, from the database as it is now (`None`: nothing to send,
/// with the reason).
pub async fn compose(
    state: &MailState,
    mailer: &Mailer,
    c: &Claimed,
) -> anyhow::Result<Result<(Email, lettre::Message), &'static str>> {
    if super::transfer::KINDS.contains(&c.kind.as_str()) {
        return super::transfer::compose(state, mailer, c).await;
    }
    let address: Option<String> = if c.kind == "void" {
        void_address(state, c).await?
    } else {
        sqlx::query_scalar(
            "SELECT email FROM order_contacts WHERE order_id = $1 AND email IS NOT NULL",
        )
        .bind(&c.order_id)
        .fetch_optional(&state.pool)
        .await
        .context("failed to read the order's address")?
    };
    let Some(to) = address.and_then(|a| Email::parse(&a).ok()) else {
        return Ok(Err("no address (erased)"));
    };
    let envelope = Envelope {
        from: &mailer.from,
        to: &to,
        message_id: message_id(&c.kind, &c.key, &mailer.domain),
        domain: &mailer.domain,
    };
    if c.kind == "void" {
        return compose_void(state, c, &envelope)
            .await
            .map(|r| r.map(|m| (to.clone(), m)));
    }
    let rows: Vec<TicketRow> = sqlx::query_as(
        "SELECT t.id, t.event_id, t.seat_id, t.ga_tier, t.version, t.issued_at,
                t.holder_account, e.name, e.venue, e.venue_address, e.starts_at, e.doors_at,
                e.timezone, e.ticket_code
           FROM tickets t JOIN events e ON e.id = t.event_id
           JOIN orders o ON o.id = t.order_id
          WHERE t.order_id = $1 AND t.voided_at IS NULL AND t.holder_account = o.account_id
          ORDER BY t.seat_id, t.ga_tier, t.id",
    )
    .bind(&c.order_id)
    .fetch_all(&state.pool)
    .await
    .context("failed to read the order's tickets")?;
    let Some(first) = rows.first() else {
        return Ok(Err("no valid ticket to send"));
    };
    let rotating = first.ticket_code == "rotating";
    let content = Content {
        order_id: c.order_id.clone(),
        event_name: first.name.clone(),
        venue: first.venue.clone(),
        venue_address: first.venue_address.clone(),
        starts_at: first.starts_at,
        doors_at: first.doors_at,
        timezone: first.timezone.clone(),
        rotating,
        ticket_page: state.settings.ticket_page(&first.event_id, &c.order_id),
        resend: c.kind == "resend",
        tickets: rows
            .iter()
            .map(|r| TicketLine {
                id: r.id.clone(),
                seat: r.seat_id.clone(),
                tier: r.ga_tier.clone(),
                // Rotating events: the static part alone does not get in, so no QR of it.
                code: (!rotating).then(|| {
                    state.keys.sign(&TicketClaims {
                        tid: r.id.clone(),
                        evt: r.event_id.clone(),
                        seat: r.seat_id.clone(),
                        tier: r.ga_tier.clone(),
                        hnd: state.keys.handle(&r.holder_account),
                        ver: r.version,
                        iat: r.issued_at.timestamp(),
                        rot: None,
                    })
                }),
            })
            .collect(),
    };
    // Drawing and deflating the QR images is most of a message's CPU: off the runtime's
    // threads, so several messages build at once on several cores and nothing else waits.
    let (from, domain, message_id, to_owned) = (
        mailer.from.clone(),
        mailer.domain.clone(),
        envelope.message_id,
        to.clone(),
    );
    let msg = tokio::task::spawn_blocking(move || {
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
    .context("the ticket e-mail builder stopped")??;
    Ok(Ok((to, msg)))
}

/// Where a void notice goes: the ticket's holder. The order's address when the buyer holds
/// it; after a transfer, the address the receiver gave when accepting (never the buyer's:
/// the buyer no longer has the ticket).
async fn void_address(state: &MailState, c: &Claimed) -> anyhow::Result<Option<String>> {
    let Some((tid, _)) = c.key.rsplit_once(".v") else {
        return Ok(None);
    };
    let address: Option<Option<String>> = sqlx::query_scalar(
        "SELECT CASE WHEN t.holder_account = o.account_id
                     THEN (SELECT k.email FROM order_contacts k WHERE k.order_id = t.order_id)
                     ELSE (SELECT x.receiver_email FROM ticket_transfers x
                            WHERE x.ticket_id = t.id AND x.status = 'accepted'
                              AND x.receiver_account = t.holder_account
                            ORDER BY x.accepted_at DESC LIMIT 1)
                END
           FROM tickets t JOIN orders o ON o.id = t.order_id
          WHERE t.id = $1 AND t.order_id = $2",
    )
    .bind(tid)
    .bind(&c.order_id)
    .fetch_optional(&state.pool)
    .await
    .context("failed to read the ticket holder's address")?;
    Ok(address.flatten())
}

#[derive(sqlx::FromRow)]
struct VoidedRow {
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    void_reason: Option<String>,
    name: String,
}

/// The void notice of a `void` row (key `<ticket id>.v<version>`).
async fn compose_void(
    state: &MailState,
    c: &Claimed,
    envelope: &Envelope<'_>,
) -> anyhow::Result<Result<lettre::Message, &'static str>> {
    let Some((tid, _)) = c.key.rsplit_once(".v") else {
        return Ok(Err("malformed void key"));
    };
    let row: Option<VoidedRow> = sqlx::query_as(
        "SELECT t.event_id, t.seat_id, t.ga_tier, t.void_reason, e.name
           FROM tickets t JOIN events e ON e.id = t.event_id
          WHERE t.id = $1 AND t.order_id = $2",
    )
    .bind(tid)
    .bind(&c.order_id)
    .fetch_optional(&state.pool)
    .await
    .context("failed to read the voided ticket")?;
    let Some(VoidedRow {
        event_id,
        seat_id: seat,
        ga_tier: tier,
        void_reason: reason,
        name: event_name,
    }) = row
    else {
        return Ok(Err("no such ticket"));
    };
    let notice = message::VoidNotice {
        order_id: c.order_id.clone(),
        event_name,
        ticket: TicketLine {
            id: tid.to_owned(),
            seat,
            tier,
            code: None,
        },
        reason: reason.unwrap_or_default(),
        ticket_page: state.settings.ticket_page(&event_id, &c.order_id),
    };
    Ok(Ok(message::build_void(&notice, envelope)?))
}

#[derive(sqlx::FromRow)]
struct TicketRow {
    id: String,
    event_id: String,
    seat_id: Option<String>,
    ga_tier: Option<String>,
    version: i32,
    issued_at: DateTime<Utc>,
    holder_account: String,
    name: String,
    venue: String,
    venue_address: Option<String>,
    starts_at: Option<DateTime<Utc>>,
    doors_at: Option<DateTime<Utc>>,
    timezone: Option<String>,
    ticket_code: String,
}
