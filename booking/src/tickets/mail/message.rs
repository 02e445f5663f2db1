//! The ticket e-mail itself: `multipart/mixed` of [`multipart/related` of
//! (`multipart/alternative`: plain text, HTML) and one inline QR PNG per ticket (`cid:`)],
//! plus an `.ics` when the event has a start. Rotating events get no QR (a screenshot of it
//! would not get in) but a link to the ticket page, where the device shows the rotating code.
//!
//! Every piece of data is escaped for where it goes (HTML text, the subject); the addresses
//! are lettre's typed mailboxes, so no value can add a header.

use crate::platform::email::Email;
use crate::tickets::mail::{ics, qr};
use anyhow::Context;
use chrono::{DateTime, Utc};
use lettre::Message;
use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};

/// One valid ticket of the message.
pub struct TicketLine {
    pub id: String,
    pub seat: Option<String>,
    pub tier: Option<String>,
    /// The signed static code (static events); `None` on rotating events.
    pub code: Option<String>,
}

/// Everything the message says.
pub struct Content {
    pub order_id: String,
    pub event_name: String,
    pub venue: String,
    pub venue_address: Option<String>,
    pub starts_at: Option<DateTime<Utc>>,
    pub doors_at: Option<DateTime<Utc>>,
    /// IANA name; UTC when unset or unknown.
    pub timezone: Option<String>,
    pub rotating: bool,
    pub tickets: Vec<TicketLine>,
    pub ticket_page: String,
    /// A resend (the subject says so).
    pub resend: bool,
}

/// How the message is addressed.
pub struct Envelope<'a> {
    pub from: &'a Mailbox,
    pub to: &'a Email,
    pub message_id: String,
    /// The `from` domain (the `.ics` UID's right-hand side).
    pub domain: &'a str,
}

/// A time in the event's zone: `Saturday 6 March 2027, 19:30 JST`.
fn local_time(t: DateTime<Utc>, timezone: Option<&str>) -> String {
    match timezone.and_then(|tz| tz.parse::<chrono_tz::Tz>().ok()) {
        Some(tz) => t
            .with_timezone(&tz)
            .format("%A %-d %B %Y, %H:%M %Z")
            .to_string(),
        None => t.format("%A %-d %B %Y, %H:%M UTC").to_string(),
    }
}

pub(crate) fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The subject: fixed text and the event name with control characters removed and bounded.
pub fn subject(content: &Content) -> String {
    let name: String = content
        .event_name
        .chars()
        .filter(|c| !c.is_control())
        .take(120)
        .collect();
    if content.resend {
        format!("Your tickets (sent again): {name}")
    } else {
        format!("Your tickets: {name}")
    }
}

fn place(t: &TicketLine) -> String {
    match (&t.seat, &t.tier) {
        (Some(seat), _) => format!("Seat {seat}"),
        (None, Some(tier)) => format!("General admission, {tier}"),
        (None, None) => "Ticket".into(),
    }
}

/// The `cid:` of a ticket's QR image.
fn cid(t: &TicketLine) -> String {
    format!("qr-{}", t.id)
}

fn when_lines(c: &Content) -> Vec<String> {
    let tz = c.timezone.as_deref();
    let mut out = Vec::new();
    if let Some(s) = c.starts_at {
        out.push(format!("Starts: {}", local_time(s, tz)));
    }
    if let Some(d) = c.doors_at {
        out.push(format!("Doors: {}", local_time(d, tz)));
    }
    if !c.venue.trim().is_empty() {
        out.push(format!("Venue: {}", c.venue));
    }
    if let Some(a) = c.venue_address.as_deref().filter(|a| !a.trim().is_empty()) {
        out.push(format!("Address: {a}"));
    }
    out
}

pub fn plain_text(c: &Content) -> String {
    let mut s = format!("Your tickets for {}\n\n", c.event_name);
    for l in when_lines(c) {
        s.push_str(&l);
        s.push('\n');
    }
    s.push_str(&format!("Order: {}\n\n", c.order_id));
    for t in &c.tickets {
        s.push_str(&format!("- {} (ticket {})\n", place(t), t.id));
    }
    if c.rotating {
        s.push_str(
            "\nThis event uses rotating codes: open your tickets on your phone at the door:\n",
        );
    } else {
        s.push_str("\nShow the QR code of each ticket at the door (HTML part), or open:\n");
    }
    s.push_str(&c.ticket_page);
    s.push('\n');
    s
}

pub fn html(c: &Content) -> String {
    let mut s = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Your tickets</title></head><body>\
         <h1>Your tickets for {}</h1><p>",
        html_escape(&c.event_name)
    );
    for l in when_lines(c) {
        s.push_str(&html_escape(&l));
        s.push_str("<br>");
    }
    s.push_str(&format!("Order: {}</p>", html_escape(&c.order_id)));
    for t in &c.tickets {
        s.push_str(&format!(
            "<h2>{}</h2><p>Ticket {}</p>",
            html_escape(&place(t)),
            html_escape(&t.id)
        ));
        if t.code.is_some() {
            s.push_str(&format!(
                "<p><img src=\"cid:{}\" width=\"280\" height=\"280\" alt=\"QR code of ticket {}\"></p>",
                html_escape(&cid(t)),
                html_escape(&t.id)
            ));
        }
    }
    let page = html_escape(&c.ticket_page);
    if c.rotating {
        s.push_str(&format!(
            "<p>This event uses rotating codes: <a href=\"{page}\">open your tickets</a> on your phone at the door.</p>"
        ));
    } else {
        s.push_str(&format!(
            "<p>Your tickets are also on <a href=\"{page}\">the ticket page</a>.</p>"
        ));
    }
    s.push_str("</body></html>");
    s
}

/// The whole message.
pub fn build(c: &Content, env: &Envelope<'_>) -> anyhow::Result<Message> {
    let mut related =
        MultiPart::related().multipart(MultiPart::alternative_plain_html(plain_text(c), html(c)));
    let png = ContentType::parse("image/png").context("image/png content type")?;
    for t in &c.tickets {
        if let Some(code) = &t.code {
            let image = qr::png(code)?;
            related = related.singlepart(Attachment::new_inline(cid(t)).body(image, png.clone()));
        }
    }
    let mut mixed = MultiPart::mixed().multipart(related);
    if let Some(starts_at) = c.starts_at {
        let calendar = ics::render(&ics::CalendarEvent {
            uid: &format!("{}@{}", c.order_id, env.domain),
            summary: &c.event_name,
            location: Some(c.venue_address.as_deref().unwrap_or(&c.venue)),
            starts_at,
            stamp: Utc::now(),
        });
        let kind = ContentType::parse("text/calendar; charset=utf-8; method=PUBLISH")
            .context("text/calendar content type")?;
        let part: SinglePart = Attachment::new("event.ics".into()).body(calendar, kind);
        mixed = mixed.singlepart(part);
    }
    Message::builder()
        .from(env.from.clone())
        .to(Mailbox::new(None, env.to.address().clone()))
        .subject(subject(c))
        .message_id(Some(env.message_id.clone()))
        .date_now()
        .multipart(mixed)
        .context("failed to build the ticket e-mail")
}

/// A void notice: which ticket, of which event, and why its code no longer gets in.
pub struct VoidNotice {
    pub order_id: String,
    pub event_name: String,
    pub ticket: TicketLine,
    /// `refunded`, `disputed`.
    pub reason: String,
    pub ticket_page: String,
}

fn void_reason_text(reason: &str) -> &'static str {
    match reason {
        "refunded" => "the order was refunded",
        "disputed" => "the payment was disputed",
        "transferred" => "you transferred it; the receiver has a new code",
        _ => "it was cancelled",
    }
}

pub fn build_void(v: &VoidNotice, env: &Envelope<'_>) -> anyhow::Result<Message> {
    let what = format!("{} (ticket {})", place(&v.ticket), v.ticket.id);
    let why = void_reason_text(&v.reason);
    let text = format!(
        "Your ticket for {} is no longer valid: {what}.\nWhy: {why}.\nOrder: {}\n\n\
         Its code will not get in at the door. Your remaining tickets, if any: {}\n",
        v.event_name, v.order_id, v.ticket_page
    );
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Ticket voided</title></head><body>\
         <h1>Your ticket for {} is no longer valid</h1><p>{}<br>Why: {}.<br>Order: {}</p>\
         <p>Its code will not get in at the door. <a href=\"{}\">Your remaining tickets</a>.</p></body></html>",
        html_escape(&v.event_name),
        html_escape(&what),
        html_escape(why),
        html_escape(&v.order_id),
        html_escape(&v.ticket_page)
    );
    let name: String = v
        .event_name
        .chars()
        .filter(|c| !c.is_control())
        .take(120)
        .collect();
    Message::builder()
        .from(env.from.clone())
        .to(Mailbox::new(None, env.to.address().clone()))
        .subject(format!("Ticket voided: {name}"))
        .message_id(Some(env.message_id.clone()))
        .date_now()
        .multipart(MultiPart::alternative_plain_html(text, html))
        .context("failed to build the void notice")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(rotating: bool) -> Content {
        Content {
            order_id: "ord_1".into(),
            event_name: "Live <b>& \"Loud\"\r\nBcc: x@evil.test".into(),
            venue: "Hall".into(),
            venue_address: Some("1 Road".into()),
            starts_at: "2027-03-06T10:30:00Z".parse().ok(),
            doors_at: None,
            timezone: Some("Asia/Tokyo".into()),
            rotating,
            tickets: vec![TicketLine {
                id: "tkt_1".into(),
                seat: Some("A-1".into()),
                tier: None,
                code: (!rotating).then(|| "eyJ.code.sig".into()),
            }],
            ticket_page: "http://x/e/ev/tickets?order=ord_1&a=b".into(),
            resend: false,
        }
    }

    #[test]
    fn text_and_html_carry_the_event_in_its_timezone_escaped() {
        let c = content(false);
        assert!(plain_text(&c).contains("Saturday 6 March 2027, 19:30 JST"));
        let h = html(&c);
        assert!(h.contains("Live &lt;b&gt;&amp; &quot;Loud&quot;"), "{h}");
        assert!(h.contains("cid:qr-tkt_1"));
        assert!(h.contains("order=ord_1&amp;a=b"));
        let r = html(&content(true));
        assert!(!r.contains("cid:") && r.contains("rotating codes"));
    }

    #[test]
    fn the_subject_cannot_carry_a_header() {
        let s = subject(&content(false));
        assert!(!s.contains('\r') && !s.contains('\n'), "{s}");
    }

    #[test]
    fn the_message_has_its_parts_and_no_injected_header() {
        let from: Mailbox = "Tickets <t@example.com>".parse().expect("from");
        let to = Email::parse("fan@example.test").expect("to");
        let m = build(
            &content(false),
            &Envelope {
                from: &from,
                to: &to,
                message_id: "<evt_1.tickets@example.com>".into(),
                domain: "example.com",
            },
        )
        .expect("message");
        let raw = String::from_utf8(m.formatted()).expect("utf-8");
        assert!(
            raw.contains("Message-ID: <evt_1.tickets@example.com>"),
            "{raw}"
        );
        for part in [
            "multipart/mixed",
            "multipart/related",
            "multipart/alternative",
            "text/plain",
            "text/html",
            "image/png",
            "Content-ID: <qr-tkt_1>",
            "text/calendar",
        ] {
            assert!(raw.contains(part), "{part} in {raw}");
        }
        // The event name's CR/LF stays out of the headers (it may show in a body line).
        let headers = raw.split("\r\n\r\n").next().unwrap_or_default();
        assert!(headers.contains("Subject: Your tickets: Live"), "{headers}");
        assert!(!headers.lines().any(|l| l.starts_with("Bcc:")), "{headers}");
        let rotating = build(
            &Content {
                starts_at: None,
                ..content(true)
            },
            &Envelope {
                from: &from,
                to: &to,
                message_id: "<k.tickets@example.com>".into(),
                domain: "example.com",
            },
        )
        .expect("message");
        let raw = String::from_utf8(rotating.formatted()).expect("utf-8");
        assert!(!raw.contains("image/png") && !raw.contains("text/calendar"));
    }
}
