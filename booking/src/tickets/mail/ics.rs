//! The calendar entry attached to a ticket e-mail when the event has a start (RFC 5545):
//! one `VEVENT`, `UID` from the order (stable across resends, so a calendar updates the
//! entry rather than adding another), `DTSTART` in UTC, text escaped and lines folded at 75
//! octets, CRLF line ends.

use chrono::{DateTime, Utc};

pub struct CalendarEvent<'a> {
    pub uid: &'a str,
    pub summary: &'a str,
    pub location: Option<&'a str>,
    pub starts_at: DateTime<Utc>,
    pub stamp: DateTime<Utc>,
}

fn utc(t: DateTime<Utc>) -> String {
    t.format("%Y%m%dT%H%M%SZ").to_string()
}

/// TEXT value escaping (RFC 5545 3.3.11).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            ';' => out.push_str("\\;"),
            ',' => out.push_str("\\,"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Folds a content line at 75 octets, never inside a UTF-8 character (RFC 5545 3.1).
fn fold(line: &str, out: &mut String) {
    let mut width = 0;
    for c in line.chars() {
        if width + c.len_utf8() > 75 {
            out.push_str("\r\n ");
            width = 1;
        }
        out.push(c);
        width += c.len_utf8();
    }
    out.push_str("\r\n");
}

pub fn render(e: &CalendarEvent<'_>) -> String {
    let mut lines = vec![
        "BEGIN:VCALENDAR".to_owned(),
        "VERSION:2.0".into(),
        "PRODID:-//Floodgate//Tickets//EN".into(),
        "METHOD:PUBLISH".into(),
        "BEGIN:VEVENT".into(),
        format!("UID:{}", escape(e.uid)),
        format!("DTSTAMP:{}", utc(e.stamp)),
        format!("DTSTART:{}", utc(e.starts_at)),
        format!("SUMMARY:{}", escape(e.summary)),
    ];
    if let Some(loc) = e.location.filter(|l| !l.trim().is_empty()) {
        lines.push(format!("LOCATION:{}", escape(loc)));
    }
    lines.push("END:VEVENT".into());
    lines.push("END:VCALENDAR".into());
    let mut out = String::new();
    for l in &lines {
        fold(l, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn an_event_renders_in_utc_escaped_and_folded() {
        let start = Utc
            .with_ymd_and_hms(2027, 3, 1, 18, 30, 0)
            .single()
            .expect("time");
        let text = render(&CalendarEvent {
            uid: "ord_1@example.com",
            summary: "Night, with; \\ backslash\nand newline",
            location: Some(&"Hall ".repeat(30)),
            starts_at: start,
            stamp: start,
        });
        assert!(text.contains("DTSTART:20270301T183000Z\r\n"), "{text}");
        assert!(text.contains("SUMMARY:Night\\, with\\; \\\\ backslash\\nand newline\r\n"));
        assert!(text.starts_with("BEGIN:VCALENDAR\r\n") && text.ends_with("END:VCALENDAR\r\n"));
        assert!(text.split("\r\n").all(|l| l.len() <= 75), "{text}");
        assert!(text.contains("\r\n "), "folded: {text}");
    }
}
