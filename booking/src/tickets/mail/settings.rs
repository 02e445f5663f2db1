//! `[mail]`: where ticket e-mail goes and how hard it tries. No `smtp_url`: mailing is off.
//!
//! Fails closed outside dev mode ([`MailSettings::check`]): a missing `from`, credentials
//! over a connection that may stay plain text (`smtp://` with `starttls` other than
//! `required`), or a username without a password refuse to start.

use secrecy::SecretString;
use serde::Deserialize;

/// STARTTLS on an `smtp://` connection (`smtps://` is TLS from the first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StartTls {
    /// Plain text (a local relay or the test sink).
    Off,
    /// Upgrade when the server offers it, else plain text.
    #[default]
    Opportunistic,
    /// Upgrade or fail.
    Required,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MailSettings {
    /// `smtp://host:port` or `smtps://host:port`. Unset: no mail is sent.
    pub smtp_url: Option<String>,
    /// The sender mailbox (`Floodgate Tickets <tickets@example.com>`); its domain names the
    /// Message-IDs. Required outside dev mode.
    pub from: Option<String>,
    pub starttls: StartTls,
    /// SMTP AUTH (with `password`, from secrets).
    pub username: Option<String>,
    pub password: Option<SecretString>,
    /// Connect and command timeout.
    pub timeout_ms: u64,
    /// The ticket page a message links to; `{event}` and `{order}` are replaced.
    pub ticket_page_url: String,
    /// The page a transfer offer links to (the receiver signs in there and accepts);
    /// `{event}` and `{transfer}` are replaced.
    pub transfer_accept_url: String,
    /// Tries before a temporarily refused message is `dead`.
    pub max_attempts: i32,
    /// Backoff after a temporary failure: `backoff_base_s * 2^(attempt-1)`, at most
    /// `backoff_max_s`.
    pub backoff_base_s: u64,
    pub backoff_max_s: u64,
    /// How long a claimed row is invisible to other senders (longer than a send can take).
    pub lease_s: u64,
    /// Rows per claim, and how many of them are sent at once.
    pub batch: i64,
    pub concurrency: usize,
    /// How often the sender looks for due rows.
    pub poll_ms: u64,
}

impl Default for MailSettings {
    fn default() -> Self {
        Self {
            smtp_url: None,
            from: None,
            starttls: StartTls::default(),
            username: None,
            password: None,
            timeout_ms: 10_000,
            ticket_page_url: "http://127.0.0.1:8080/e/{event}/tickets?order={order}".into(),
            transfer_accept_url: "http://127.0.0.1:8080/e/{event}/transfers/{transfer}".into(),
            max_attempts: 8,
            backoff_base_s: 30,
            backoff_max_s: 3600,
            lease_s: 120,
            batch: 100,
            concurrency: 16,
            poll_ms: 1000,
        }
    }
}

/// The `from` used in dev mode when none is set.
pub const DEV_FROM: &str = "Floodgate Tickets <tickets@floodgate.localhost>";

impl MailSettings {
    /// Refuses settings that are unsafe outside dev mode (see the module docs) or unusable
    /// in any mode. Returns the `from` to use.
    pub fn check(&self, dev: bool) -> Result<String, String> {
        let Some(url) = self.smtp_url.as_deref() else {
            return Ok(self.from.clone().unwrap_or_else(|| DEV_FROM.into()));
        };
        let tls_from_start = url.starts_with("smtps://");
        if !tls_from_start && !url.starts_with("smtp://") {
            return Err("mail.smtp_url: must be smtp://host:port or smtps://host:port".into());
        }
        if self.username.is_some() != self.password.is_some() {
            return Err("mail.username and mail.password: set both or neither".into());
        }
        if self.max_attempts < 1 || self.batch < 1 || self.concurrency < 1 {
            return Err("mail.max_attempts, mail.batch, mail.concurrency: at least 1".into());
        }
        if dev {
            return Ok(self.from.clone().unwrap_or_else(|| DEV_FROM.into()));
        }
        let from = self
            .from
            .clone()
            .ok_or("mail.from: missing (set FLOODGATE_MAIL__FROM)")?;
        if self.username.is_some() && !tls_from_start && self.starttls != StartTls::Required {
            return Err(
                "mail: credentials over a connection that may stay plain text (use smtps:// or \
                 starttls = \"required\"; plain text only in dev mode)"
                    .into(),
            );
        }
        Ok(from)
    }

    /// The retry delay after `attempt` (1-based) failed temporarily.
    pub fn backoff_s(&self, attempt: i32) -> u64 {
        let exp = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
        self.backoff_base_s
            .saturating_mul(2u64.saturating_pow(exp))
            .min(self.backoff_max_s)
    }

    /// The ticket page of one order.
    pub fn ticket_page(&self, event: &str, order: &str) -> String {
        self.ticket_page_url
            .replace("{event}", &encode(event))
            .replace("{order}", &encode(order))
    }

    /// The accept link of a transfer offer.
    pub fn transfer_accept(&self, event: &str, transfer: &str) -> String {
        self.transfer_accept_url
            .replace("{event}", &encode(event))
            .replace("{transfer}", &encode(transfer))
    }
}

/// Percent-encodes everything but unreserved characters (ids are plain, but a URL built from
/// data is encoded anyway).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smtp(url: &str) -> MailSettings {
        MailSettings {
            smtp_url: Some(url.into()),
            from: Some("t@example.com".into()),
            ..Default::default()
        }
    }

    #[test]
    fn outside_dev_mode_unsafe_settings_refuse_to_start() {
        let no_from = MailSettings {
            from: None,
            ..smtp("smtp://127.0.0.1:2525")
        };
        assert!(no_from.check(false).is_err());
        assert_eq!(no_from.check(true).as_deref(), Ok(DEV_FROM));
        let creds = MailSettings {
            username: Some("u".into()),
            password: Some(SecretString::from("p")),
            ..smtp("smtp://mail.example.com:587")
        };
        assert!(creds.check(false).is_err(), "plain text with credentials");
        assert!(creds.check(true).is_ok());
        let required = MailSettings {
            starttls: StartTls::Required,
            ..creds.clone()
        };
        assert!(required.check(false).is_ok());
        let wrapped = MailSettings {
            smtp_url: Some("smtps://mail.example.com:465".into()),
            ..creds
        };
        assert!(wrapped.check(false).is_ok());
        let half = MailSettings {
            username: Some("u".into()),
            ..smtp("smtps://m.example.com")
        };
        assert!(half.check(true).is_err());
        assert!(smtp("http://x").check(true).is_err());
        // No SMTP: mailing is off, nothing to refuse.
        assert!(MailSettings::default().check(false).is_ok());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let s = MailSettings {
            backoff_base_s: 30,
            backoff_max_s: 3600,
            ..Default::default()
        };
        assert_eq!(
            [1, 2, 3, 8, 100].map(|a| s.backoff_s(a)),
            [30, 60, 120, 3600, 3600]
        );
    }

    #[test]
    fn the_ticket_page_is_filled_in_encoded() {
        let s = MailSettings::default();
        assert_eq!(
            s.ticket_page("ev 1", "ord_1"),
            "http://127.0.0.1:8080/e/ev%201/tickets?order=ord_1"
        );
    }
}
