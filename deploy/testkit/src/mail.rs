//! What the local SMTP server received (feature `mail`): `deploy/smtp/mailsink.py`, a real
//! SMTP server that `deploy/stack` starts (`deps`, `test`, `up`) and whose HTTP view the
//! tests read, so a test checks the message as it crossed the wire, not what the mailer
//! meant to send.
//!
//! - [`Mailbox::from_env`]: the view at `FLOODGATE_TEST_MAIL_VIEW_URL`; the SMTP server
//!   itself is at [`smtp_url`] (`FLOODGATE_TEST_SMTP_URL`).
//! - [`Mailbox::wait_for`]: the messages to one address, once at least `count` arrived.
//! - [`Message::parsed`]: subject, text and HTML bodies and every leaf part (inline images,
//!   `.ics` attachments), decoded by `mail-parser`.
//! - [`zbar_decode`]: the texts of the QR codes in an image, read by Debian's `zbarimg` —
//!   a decoder that shares nothing with the encoder under test.
//!
//! The server is shared by every test of a run: give each test its own random recipients
//! ([`unique_address`]) and ask only for those.
//!
//! Recipient policies of the server (by local part): `reject-…` is refused with `550` at
//! `RCPT TO`; `tempfail<N>-…` is refused with `451` for the first N attempts, then accepted.

use mail_parser::{MessageParser, MimeHeaders, PartType};
use serde::Deserialize;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The SMTP server's URL (`smtp://127.0.0.1:PORT`), from `FLOODGATE_TEST_SMTP_URL`, which
/// `deploy/stack test` sets. Panics, naming the command, when it is missing.
pub fn smtp_url() -> String {
    std::env::var("FLOODGATE_TEST_SMTP_URL").expect(
        "FLOODGATE_TEST_SMTP_URL is not set: run the tests with `deploy/stack test` \
         (or start the SMTP server with `deploy/stack deps` and export the variables \
         `deploy/stack test` sets)",
    )
}

/// A recipient no other test uses: `{prefix}{random}@example.test` (`prefix` may carry a
/// server policy, e.g. `reject-` or `tempfail2-`).
pub fn unique_address(prefix: &str) -> String {
    format!("{prefix}{}@example.test", shared::ids::new_id())
}

/// One message as the view lists it.
#[derive(Debug, Clone, Deserialize)]
struct Listed {
    id: String,
    from: String,
    to: Vec<String>,
    subject: String,
    message_id: String,
    received_at: String,
}

/// A received message: the envelope, the main headers and the bytes as received.
#[derive(Debug, Clone)]
pub struct Message {
    /// The server's id of the stored message.
    pub id: String,
    /// The envelope sender (`MAIL FROM`).
    pub from: String,
    /// The envelope recipients (`RCPT TO`) the server accepted.
    pub to: Vec<String>,
    pub subject: String,
    /// The `Message-ID` header, angle brackets included (empty when there was none).
    pub message_id: String,
    /// When the server accepted it (RFC 3339).
    pub received_at: String,
    /// The message as received, headers included (the server's two envelope trace headers,
    /// `X-Floodgate-Envelope-From`/`-To`, come first).
    pub raw: Vec<u8>,
}

/// One leaf part of a message (not a multipart container, not a body counted in `text` or
/// `html`), decoded from its transfer encoding.
#[derive(Debug, Clone)]
pub struct Part {
    /// `type/subtype`, lower case (`image/png`, `text/calendar`).
    pub content_type: String,
    /// `Content-ID` without angle brackets (what `cid:` URLs name).
    pub content_id: Option<String>,
    /// The attachment's file name, when it has one.
    pub filename: Option<String>,
    /// `inline` or `attachment`, when the part says.
    pub disposition: Option<String>,
    pub bytes: Vec<u8>,
}

/// A message taken apart.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub subject: Option<String>,
    pub message_id: Option<String>,
    /// The `From` header's address.
    pub from: Option<String>,
    /// The `To` header's addresses.
    pub to: Vec<String>,
    /// The first `text/plain` body.
    pub text: Option<String>,
    /// The first `text/html` body.
    pub html: Option<String>,
    /// Every other leaf part: inline images, attachments.
    pub parts: Vec<Part>,
    /// Every header as `(name, raw value)`, in order (to look for what must not be there).
    pub headers: Vec<(String, String)>,
}

impl Message {
    /// The message taken apart by `mail-parser`. Panics when it is not a message at all.
    pub fn parsed(&self) -> Parsed {
        let m = MessageParser::default()
            .parse(&self.raw[..])
            .unwrap_or_else(|| panic!("message {} is not RFC 5322", self.id));
        let text_ids: Vec<_> = m.text_body.clone();
        let html_ids: Vec<_> = m.html_body.clone();
        let mut text = None;
        let mut html = None;
        let mut parts = Vec::new();
        for (i, part) in m.parts.iter().enumerate() {
            let content_type = part
                .content_type()
                .map(|ct| {
                    format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or_default())
                        .to_ascii_lowercase()
                })
                .unwrap_or_else(|| "text/plain".into());
            match &part.body {
                PartType::Multipart(_) | PartType::Message(_) => continue,
                PartType::Text(t)
                    if content_type == "text/plain"
                        && text.is_none()
                        && text_ids.contains(&(i as u32)) =>
                {
                    text = Some(t.to_string());
                    continue;
                }
                PartType::Html(h) if html.is_none() && html_ids.contains(&(i as u32)) => {
                    html = Some(h.to_string());
                    continue;
                }
                _ => {}
            }
            parts.push(Part {
                content_type,
                content_id: part
                    .content_id()
                    .map(|c| c.trim_matches(|ch| ch == '<' || ch == '>').to_owned()),
                filename: part.attachment_name().map(str::to_owned),
                disposition: part
                    .content_disposition()
                    .map(|d| d.ctype().to_ascii_lowercase()),
                bytes: part.contents().to_vec(),
            });
        }
        let addresses = |a: Option<&mail_parser::Address<'_>>| -> Vec<String> {
            a.map(|a| {
                a.iter()
                    .filter_map(|x| x.address().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
        };
        Parsed {
            subject: m.subject().map(str::to_owned),
            message_id: m.message_id().map(str::to_owned),
            from: addresses(m.from()).into_iter().next(),
            to: addresses(m.to()),
            text,
            html,
            parts,
            headers: m
                .headers_raw()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }
}

/// Server-wide counters (`GET /api/stats`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct Stats {
    pub accepted: u64,
    pub rejected: u64,
    pub tempfailed: u64,
    pub connections: u64,
    /// Distinct `Message-ID`s among the accepted messages: fewer than `accepted` means a
    /// message was sent twice.
    pub distinct_message_ids: u64,
}

/// The local SMTP server's HTTP view.
#[derive(Clone)]
pub struct Mailbox {
    base: String,
    http: reqwest::Client,
}

impl Mailbox {
    /// The view at `FLOODGATE_TEST_MAIL_VIEW_URL` (set by `deploy/stack test`). Panics,
    /// naming the command, when it is missing.
    pub fn from_env() -> Mailbox {
        let base = std::env::var("FLOODGATE_TEST_MAIL_VIEW_URL").expect(
            "FLOODGATE_TEST_MAIL_VIEW_URL is not set: run the tests with `deploy/stack test`",
        );
        Mailbox::at(&base)
    }

    /// The view at `base` (`http://127.0.0.1:2580`).
    pub fn at(base: &str) -> Mailbox {
        Mailbox {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
        }
    }

    async fn listed(&self, to: &str) -> Vec<Listed> {
        let url = format!("{}/api/messages", self.base);
        let r = self
            .http
            .get(&url)
            .query(&[("to", to)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("the mail view at {url} did not answer: {e}"));
        assert!(r.status().is_success(), "{url}: {}", r.status());
        r.json()
            .await
            .unwrap_or_else(|e| panic!("{url} answered something else than a list: {e}"))
    }

    async fn fetch(&self, l: Listed) -> Message {
        let url = format!("{}/api/messages/{}/raw", self.base, l.id);
        let r = self
            .http
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(r.status().is_success(), "{url}: {}", r.status());
        let raw = r.bytes().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        Message {
            id: l.id,
            from: l.from,
            to: l.to,
            subject: l.subject,
            message_id: l.message_id,
            received_at: l.received_at,
            raw: raw.to_vec(),
        }
    }

    /// Every message received so far for `to` (an envelope recipient, case-insensitive),
    /// oldest first.
    pub async fn messages(&self, to: &str) -> Vec<Message> {
        let mut out = Vec::new();
        for l in self.listed(to).await {
            out.push(self.fetch(l).await);
        }
        out
    }

    /// How many messages were received for `to` so far.
    pub async fn count(&self, to: &str) -> usize {
        self.listed(to).await.len()
    }

    /// The messages for `to` once at least `count` have arrived (all of them: more than
    /// `count` when more came). Panics after `timeout`, naming the address and what arrived.
    pub async fn wait_for(&self, to: &str, count: usize, timeout: Duration) -> Vec<Message> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let listed = self.listed(to).await;
            if listed.len() >= count {
                let mut out = Vec::new();
                for l in listed {
                    out.push(self.fetch(l).await);
                }
                return out;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {count} message(s) to {to} ({} arrived within {timeout:?})",
                listed.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's counters.
    pub async fn stats(&self) -> Stats {
        let url = format!("{}/api/stats", self.base);
        let r = self
            .http
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("the mail view at {url} did not answer: {e}"));
        r.json().await.unwrap_or_else(|e| panic!("{url}: {e}"))
    }
}

/// The texts of the QR codes in an image (PNG, or anything `zbarimg` reads), by Debian's
/// `zbarimg` (package `zbar-tools`, installed by `deploy/stack test`). Empty when the image
/// holds none. Panics when `zbarimg` cannot be run.
pub fn zbar_decode(image: &[u8]) -> Vec<String> {
    let mut child = Command::new("zbarimg")
        // Raw text, one symbol per line; QR only; binary-safe (no charset guessing).
        .args([
            "--quiet",
            "--raw",
            "-Sdisable",
            "-Sqrcode.enable",
            "-Sbinary",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run zbarimg ({e}): install zbar-tools (deploy/stack test does)")
        });
    child
        .stdin
        .take()
        .expect("zbarimg's stdin")
        .write_all(image)
        .expect("the image written to zbarimg");
    let out = child.wait_with_output().expect("zbarimg's output");
    // Exit 4: no symbol found; anything else but 0 is an error (an unreadable image).
    match out.status.code() {
        Some(0) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(4) => Vec::new(),
        _ => panic!(
            "zbarimg failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multipart_message_comes_apart_into_bodies_and_parts() {
        let raw = b"X-Floodgate-Envelope-From: a@x.test\r\n\
From: Floodgate <tickets@x.test>\r\nTo: fan@example.test\r\nSubject: Your tickets\r\n\
Message-ID: <e1.tickets@x.test>\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n\
--b1\r\nContent-Type: multipart/related; boundary=\"b2\"\r\n\r\n\
--b2\r\nContent-Type: multipart/alternative; boundary=\"b3\"\r\n\r\n\
--b3\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nSeat A-1\r\n\
--b3\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>Seat A-1</p><img src=\"cid:qr1\">\r\n\
--b3--\r\n\
--b2\r\nContent-Type: image/png\r\nContent-ID: <qr1>\r\nContent-Disposition: inline\r\n\
Content-Transfer-Encoding: base64\r\n\r\niVBORw0K\r\n\
--b2--\r\n\
--b1\r\nContent-Type: text/calendar; method=PUBLISH; charset=utf-8\r\n\
Content-Disposition: attachment; filename=\"event.ics\"\r\n\r\nBEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n\
--b1--\r\n";
        let m = Message {
            id: "1".into(),
            from: "a@x.test".into(),
            to: vec!["fan@example.test".into()],
            subject: "Your tickets".into(),
            message_id: "<e1.tickets@x.test>".into(),
            received_at: String::new(),
            raw: raw.to_vec(),
        };
        let p = m.parsed();
        assert_eq!(p.subject.as_deref(), Some("Your tickets"));
        assert_eq!(p.message_id.as_deref(), Some("e1.tickets@x.test"));
        assert_eq!(p.from.as_deref(), Some("tickets@x.test"));
        assert_eq!(p.to, ["fan@example.test"]);
        assert_eq!(p.text.as_deref().map(str::trim), Some("Seat A-1"));
        assert!(p.html.as_deref().is_some_and(|h| h.contains("cid:qr1")));
        let png = p
            .parts
            .iter()
            .find(|x| x.content_type == "image/png")
            .expect("the inline image");
        assert_eq!(png.content_id.as_deref(), Some("qr1"));
        assert_eq!(png.bytes, b"\x89PNG\r\n");
        let ics = p
            .parts
            .iter()
            .find(|x| x.content_type == "text/calendar")
            .expect("the calendar entry");
        assert_eq!(ics.filename.as_deref(), Some("event.ics"));
        assert_eq!(ics.disposition.as_deref(), Some("attachment"));
    }
}
