//! What a scanned text is, decided before the database: a code this deployment signed, for
//! this event, and on a rotating ticket with a TOTP of the current 15 s step or one either
//! side (computed from the event's door key, never trusted from the device). Pure, with unit
//! tests below; the database then decides what the ticket's state allows (`repo`).
//!
//! A code carries `rot: true` when it was issued for a rotating event; the claim is signed, so
//! a rotating ticket's bare static code (a screenshot of the page's QR without its moving part)
//! is refused, and so is a static code with a `~` part it never had.

use crate::tickets::code::{CodeError, TicketClaims, TicketKeys, split_rotating, ticket_secret};
use crate::tickets::totp;

/// Why a scanned text is refused before the database is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `400 INVALID_CODE`: not a code of this deployment, or its TOTP part is missing, extra
    /// or not 8 digits. The reason names which (never the text itself).
    Invalid(&'static str),
    /// `403 WRONG_EVENT`: a good code of another event.
    WrongEvent(Box<TicketClaims>),
    /// `409 CODE_EXPIRED`: a rotating code whose TOTP is not of the current step ±1.
    Expired(Box<TicketClaims>),
}

/// The claims of `text` when it may be decided for `event` at `unix_s` (server time).
pub fn read(
    keys: &TicketKeys,
    text: &str,
    event: &str,
    unix_s: u64,
) -> Result<TicketClaims, Refused> {
    let (code, moving) = split_rotating(text.trim());
    let claims = keys.verify(code).map_err(|e| {
        Refused::Invalid(match e {
            CodeError::Malformed => "malformed",
            CodeError::WrongAlgorithm | CodeError::WrongType => "not_a_ticket_code",
            CodeError::UnknownKey => "unknown_key",
            CodeError::BadSignature => "bad_signature",
        })
    })?;
    if claims.evt != event {
        return Err(Refused::WrongEvent(Box::new(claims)));
    }
    let rotating = claims.rot == Some(true);
    match (rotating, moving) {
        (false, None) => Ok(claims),
        (false, Some(_)) => Err(Refused::Invalid("unexpected_totp")),
        (true, None) => Err(Refused::Invalid("missing_totp")),
        (true, Some(digits)) => {
            if digits.len() != totp::DIGITS as usize || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(Refused::Invalid("malformed_totp"));
            }
            let secret = ticket_secret(&keys.door_key(&claims.evt), &claims.tid, claims.ver);
            if totp::accepts(&secret, digits, unix_s, totp::TICKET_STEP_S) {
                Ok(claims)
            } else {
                Err(Refused::Expired(Box::new(claims)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tickets::TicketSettings;
    use crate::tickets::code::rotating_text;

    fn keys() -> TicketKeys {
        TicketSettings::default().keys().expect("dev keys")
    }

    fn claims(event: &str, rot: bool) -> TicketClaims {
        TicketClaims {
            tid: "tkt_1".into(),
            evt: event.into(),
            seat: Some("S1-R1-1".into()),
            tier: None,
            hnd: "h".into(),
            ver: 3,
            iat: 1_800_000_000,
            rot: rot.then_some(true),
        }
    }

    #[test]
    fn a_static_code_of_this_event_is_read() {
        let k = keys();
        let code = k.sign(&claims("ev", false));
        assert_eq!(read(&k, &code, "ev", 0), Ok(claims("ev", false)));
        // Whitespace a scanner may add around what it read.
        assert_eq!(
            read(&k, &format!(" {code}\n"), "ev", 0),
            Ok(claims("ev", false))
        );
    }

    #[test]
    fn forged_truncated_and_foreign_texts_are_invalid() {
        let k = keys();
        let code = k.sign(&claims("ev", false));
        // Cut inside the signature: not base64url of 64 bytes any more.
        let truncated = &code[..code.len() - 5];
        assert_eq!(
            read(&k, truncated, "ev", 0),
            Err(Refused::Invalid("malformed"))
        );
        // Claims changed under the signature.
        let (head, rest) = code.split_once('.').expect("parts");
        let (_, sig) = rest.split_once('.').expect("parts");
        let other_claims = k.sign(&claims("ev", true));
        let payload = other_claims.split('.').nth(1).expect("payload");
        assert_eq!(
            read(&k, &format!("{head}.{payload}.{sig}"), "ev", 0),
            Err(Refused::Invalid("bad_signature"))
        );
        for junk in ["", "hello", "a.b.c", "https://example.com/"] {
            assert!(
                matches!(read(&k, junk, "ev", 0), Err(Refused::Invalid(_))),
                "{junk}"
            );
        }
        // Another deployment's key under our kid: a bad signature.
        let other = crate::tickets::TicketSettings {
            signing_keys: vec![crate::tickets::code::SigningKeySetting {
                kid: "dev-1".into(),
                secret: secrecy::SecretString::from("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
            }],
            ..TicketSettings::default()
        }
        .keys()
        .expect("other keys");
        assert_eq!(
            read(&k, &other.sign(&claims("ev", false)), "ev", 0),
            Err(Refused::Invalid("bad_signature"))
        );
        // A static code with a TOTP part it never had.
        assert_eq!(
            read(&k, &format!("{code}~12345678"), "ev", 0),
            Err(Refused::Invalid("unexpected_totp"))
        );
    }

    #[test]
    fn a_good_code_of_another_event_is_the_wrong_event() {
        let k = keys();
        let code = k.sign(&claims("other", false));
        assert_eq!(
            read(&k, &code, "ev", 0),
            Err(Refused::WrongEvent(Box::new(claims("other", false))))
        );
    }

    #[test]
    fn a_rotating_code_needs_a_current_totp() {
        let k = keys();
        let c = claims("ev", true);
        let code = k.sign(&c);
        let secret = k.ticket_secret("ev", &c.tid, c.ver);
        let now = 1_800_000_000; // the start of a 15 s step
        let step = totp::TICKET_STEP_S;
        for at in [now - step, now, now + step] {
            assert_eq!(
                read(&k, &rotating_text(&code, &secret, at), "ev", now),
                Ok(c.clone()),
                "{at}"
            );
        }
        for at in [now - 2 * step, now + 2 * step, now - 3600] {
            assert_eq!(
                read(&k, &rotating_text(&code, &secret, at), "ev", now),
                Err(Refused::Expired(Box::new(c.clone()))),
                "{at}"
            );
        }
        // The bare static code of a rotating ticket, and broken TOTP parts.
        assert_eq!(
            read(&k, &code, "ev", now),
            Err(Refused::Invalid("missing_totp"))
        );
        for bad in ["", "1234567", "123456789", "abcdefgh"] {
            assert_eq!(
                read(&k, &format!("{code}~{bad}"), "ev", now),
                Err(Refused::Invalid("malformed_totp")),
                "{bad}"
            );
        }
        // A TOTP under another ticket version's secret (an old page after a transfer).
        let stale = k.ticket_secret("ev", &c.tid, c.ver - 1);
        assert_eq!(
            read(&k, &rotating_text(&code, &stale, now), "ev", now),
            Err(Refused::Expired(Box::new(c)))
        );
    }
}
