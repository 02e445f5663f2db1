//! Tickets a fan can carry (issue 43): signed ticket codes, the keys behind them and the fan's
//! own ticket list, and tickets by e-mail ([`mail`]).
//!
//! Layout: [`code`] (the compact JWS, the JWKS, holder handles, the door key and per-ticket
//! secrets), [`totp`] (RFC 6238 for rotating codes), [`http`] (`GET
//! /api/events/{event}/ticket-keys`, class `public`; `GET /api/tickets` and `GET
//! /api/orders/{id}/tickets`, class `identity`).
//!
//! Guarantees: a code is only ever handed out for a valid ticket, to its holder (the identity
//! token's subject); a voided ticket shows as voided with its reason and no code; the code is
//! signed over the ticket's version, which every void bumps, so a code handed out before is
//! stale. Keys come from `[tickets]` secrets only (fail closed outside dev mode).

pub mod code;
pub mod cors;
pub mod http;
pub mod mail;
pub mod totp;
pub mod transfer;

use crate::tickets::code::{KeyError, SigningKeySetting, TicketKeys};
use secrecy::SecretString;
use serde::Deserialize;
use shared::identity::IdentityVerifier;
use sqlx::PgPool;
use std::sync::Arc;

/// `[tickets]`: the ticket-code keys. Every value here is a secret (the JWKS publishes only
/// the signing keys' public halves).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TicketSettings {
    /// Ed25519 signing keys, `[{kid, secret}]`, each secret base64url of a 32-byte seed. A
    /// retired key stays listed (verifying, published in the JWKS) until every event it
    /// signed for is over; a compromised one is removed at once (docs/operations.md).
    pub signing_keys: Vec<SigningKeySetting>,
    /// The kid new codes are signed with; must be among `signing_keys`.
    pub current_kid: String,
    /// HMAC-SHA256 key of the holder handle (`hnd`).
    pub handle_secret: SecretString,
    /// HMAC-SHA256 key each event's door key derives from: HMAC-SHA256(door_secret, event id).
    pub door_secret: SecretString,
    /// `Cache-Control: max-age` of the JWKS (seconds): how long a revoked key may still be
    /// trusted by a cache.
    pub jwks_max_age_s: u32,
    /// Days after the event (its `starts_at`, else the order's payment) an order's e-mail
    /// address is kept; then the retention job erases it (`mail::retention`).
    pub email_retention_days: u32,
    /// How long a transfer offer stays open (seconds).
    pub transfer_offer_ttl_s: u32,
}

impl Default for TicketSettings {
    fn default() -> Self {
        Self {
            signing_keys: vec![SigningKeySetting {
                kid: "dev-1".into(),
                secret: SecretString::from(shared::config::DEV_TICKET_SIGNING_SEED),
            }],
            current_kid: "dev-1".into(),
            handle_secret: SecretString::from(shared::config::DEV_TICKET_HANDLE_SECRET),
            door_secret: SecretString::from(shared::config::DEV_TICKET_DOOR_SECRET),
            jwks_max_age_s: 300,
            email_retention_days: 30,
            transfer_offer_ttl_s: 72 * 3600,
        }
    }
}

impl TicketSettings {
    pub fn keys(&self) -> Result<TicketKeys, KeyError> {
        TicketKeys::new(
            &self.signing_keys,
            &self.current_kid,
            &self.handle_secret,
            &self.door_secret,
        )
    }
}

/// What the ticket handlers use. Cheap to clone.
#[derive(Clone)]
pub struct TicketsState {
    pub pool: PgPool,
    pub keys: Arc<TicketKeys>,
    /// Verifies fans' login tokens (`[identity]`).
    pub identity: Arc<IdentityVerifier>,
    pub jwks_max_age_s: u32,
    pub transfer: TransferConfig,
}

/// What the transfer endpoints need from `[tickets]` and `[mail]`.
#[derive(Clone)]
pub struct TransferConfig {
    /// `[tickets] transfer_offer_ttl_s`.
    pub offer_ttl_s: u32,
    /// `[mail]`, for `transfer_accept_url`.
    pub mail: Arc<mail::MailSettings>,
}

impl TransferConfig {
    pub fn accept_url(&self, event: &str, transfer: &str) -> String {
        self.mail.transfer_accept(event, transfer)
    }
}

pub use http::router;
