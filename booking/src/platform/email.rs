//! A fan's e-mail address as booking accepts it: parsed through lettre's typed [`Address`]
//! (so it can only ever become a `To:` mailbox, never extra headers), normalised, and masked
//! for display.
//!
//! Guarantee: a value of [`Email`] has no control character, no whitespace, no CR/LF, no
//! display name or group syntax, is at most [`MAX_LEN`] bytes and parses as `local@domain`.
//! The address itself is never formatted by `Debug` (it must not reach the logs by accident).

use lettre::Address;
use std::str::FromStr;

/// Longest address accepted (RFC 5321's path limit less the angle brackets).
pub const MAX_LEN: usize = 254;

/// A validated, normalised address (domain lowercased; the local part kept as given, which
/// RFC 5321 lets a receiver treat as case-sensitive).
#[derive(Clone, PartialEq, Eq)]
pub struct Email(Address);

impl std::fmt::Debug for Email {
    // Never the address: a `?email` in a tracing field would otherwise log it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Email({})", mask(self.as_str()))
    }
}

/// Why an address was refused (no part of the address in the text: it goes to the client
/// and may be logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmailError {
    #[error("email is empty")]
    Empty,
    #[error("email is longer than {MAX_LEN} bytes")]
    TooLong,
    #[error("email contains a control, space or header character")]
    ForbiddenCharacter,
    #[error("email is not an address (local@domain)")]
    NotAnAddress,
}

impl Email {
    pub fn parse(raw: &str) -> Result<Self, EmailError> {
        let s = raw.trim_matches(' ');
        if s.is_empty() {
            return Err(EmailError::Empty);
        }
        if s.len() > MAX_LEN {
            return Err(EmailError::TooLong);
        }
        // CR/LF and any other control character would let a value end a header; `<>,;:"()[]\`
        // and spaces belong to display names, groups and quoted forms a fan never needs.
        if s.chars().any(|c| {
            c.is_control() || c.is_whitespace() || "<>,;:\"()[]\\".contains(c) || c == '\u{7f}'
        }) {
            return Err(EmailError::ForbiddenCharacter);
        }
        let (local, domain) = s.rsplit_once('@').ok_or(EmailError::NotAnAddress)?;
        // A domain without a dot (`user@localhost`) is not somewhere a ticket can be mailed.
        if local.is_empty()
            || local.starts_with('.')
            || local.ends_with('.')
            || local.contains("..")
            || !domain.contains('.')
            || domain.starts_with('.')
            || domain.ends_with('.')
        {
            return Err(EmailError::NotAnAddress);
        }
        let normalised = format!("{local}@{}", domain.to_ascii_lowercase());
        let address = Address::from_str(&normalised).map_err(|_| EmailError::NotAnAddress)?;
        Ok(Self(address))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_ref()
    }

    pub fn address(&self) -> &Address {
        &self.0
    }
}

/// The address as ops see it: the local part's first character, `***`, the domain
/// (`a***@example.com`). Anything that is not `local@domain` masks to `***`.
pub fn mask(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) if !local.is_empty() => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        _ => "***".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalised() {
        let e = Email::parse(" Fan.One+x@Example.COM ").expect("valid");
        assert_eq!(e.as_str(), "Fan.One+x@example.com");
        assert_eq!(Email::parse("a@b.io").expect("valid").as_str(), "a@b.io");
    }

    #[test]
    fn header_injection_and_non_addresses_are_refused() {
        for (raw, why) in [
            ("", EmailError::Empty),
            ("   ", EmailError::Empty),
            (
                "a@example.com\r\nBcc: x@evil.test",
                EmailError::ForbiddenCharacter,
            ),
            (
                "a@example.com\nBcc:x@evil.test",
                EmailError::ForbiddenCharacter,
            ),
            ("a@exa\rmple.com", EmailError::ForbiddenCharacter),
            ("Fan <a@example.com>", EmailError::ForbiddenCharacter),
            (
                "a@example.com, b@example.com",
                EmailError::ForbiddenCharacter,
            ),
            ("\"a b\"@example.com", EmailError::ForbiddenCharacter),
            ("a\u{0}@example.com", EmailError::ForbiddenCharacter),
            ("not-an-address", EmailError::NotAnAddress),
            ("@example.com", EmailError::NotAnAddress),
            ("a@localhost", EmailError::NotAnAddress),
            ("a@.example.com", EmailError::NotAnAddress),
            ("a@@example.com", EmailError::NotAnAddress),
            ("a..b@example.com", EmailError::NotAnAddress),
        ] {
            assert_eq!(Email::parse(raw), Err(why), "{raw:?}");
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert_eq!(Email::parse(&long), Err(EmailError::TooLong));
    }

    #[test]
    fn masks_keep_the_first_character_and_the_domain_only() {
        assert_eq!(mask("alice@example.com"), "a***@example.com");
        assert_eq!(mask("x@e.io"), "x***@e.io");
        assert_eq!(mask("nothing"), "***");
        let e = Email::parse("secret.person@example.com").expect("valid");
        assert!(!format!("{e:?}").contains("secret"), "{e:?}");
    }
}
