//! The JSON error shape every Floodgate endpoint answers with:
//! `{"code": "SEAT_TAKEN", "message": "...", ...details}`.
//!
//! `code` is stable and machine-readable; clients branch on it. `message` is for humans and
//! never contains internal error text.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Stable machine codes shared by gateway and booking.
pub mod codes {
    pub const ADMISSION_REQUIRED: &str = "ADMISSION_REQUIRED";
    pub const UNAUTHORIZED: &str = "UNAUTHORIZED";
    pub const UNKNOWN_EVENT: &str = "UNKNOWN_EVENT";
    pub const NOT_FOUND: &str = "NOT_FOUND";
    pub const SEAT_TAKEN: &str = "SEAT_TAKEN";
    pub const SOLD_OUT: &str = "SOLD_OUT";
    /// Best available found free seats, but no block of the quantity that strands no seat.
    pub const NO_SEATS_TOGETHER: &str = "NO_SEATS_TOGETHER";
    /// An explicit hold would strand a single free seat (events with `no_orphans`).
    pub const ORPHAN_SEAT: &str = "ORPHAN_SEAT";
    pub const LIMIT_EXCEEDED: &str = "LIMIT_EXCEEDED";
    pub const INSUFFICIENT_STOCK: &str = "INSUFFICIENT_STOCK";
    pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
    pub const MALFORMED_JSON: &str = "MALFORMED_JSON";
    pub const PAYLOAD_TOO_LARGE: &str = "PAYLOAD_TOO_LARGE";
    /// A proxied request body over booking's limit, refused by the gateway itself.
    pub const BODY_TOO_LARGE: &str = "BODY_TOO_LARGE";
    /// A request header block over the gateway's limit (`431`).
    pub const HEADERS_TOO_LARGE: &str = "HEADERS_TOO_LARGE";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "UNSUPPORTED_MEDIA_TYPE";
    pub const VALIDATION_FAILED: &str = "VALIDATION_FAILED";
    pub const IDEMPOTENCY_KEY_MISSING: &str = "IDEMPOTENCY_KEY_MISSING";
    pub const IDEMPOTENCY_KEY_REUSED: &str = "IDEMPOTENCY_KEY_REUSED";
    pub const IDEMPOTENCY_IN_FLIGHT: &str = "IDEMPOTENCY_IN_FLIGHT";
    pub const RATE_LIMITED: &str = "RATE_LIMITED";
    pub const UNAVAILABLE: &str = "UNAVAILABLE";
    pub const WAITING_ROOM_UNAVAILABLE: &str = "WAITING_ROOM_UNAVAILABLE";
    pub const UPSTREAM_UNAVAILABLE: &str = "UPSTREAM_UNAVAILABLE";
    pub const INTERNAL: &str = "INTERNAL";
    pub const CONFLICT: &str = "CONFLICT";
    pub const HOLD_EXPIRED: &str = "HOLD_EXPIRED";
    pub const CARD_DECLINED: &str = "CARD_DECLINED";
    pub const PAYMENT_PROVIDER_ERROR: &str = "PAYMENT_PROVIDER_ERROR";
    pub const PAYMENT_PROVIDER_TIMEOUT: &str = "PAYMENT_PROVIDER_TIMEOUT";
    pub const BID_TOO_LOW: &str = "BID_TOO_LOW";
    pub const AUCTION_CLOSED: &str = "AUCTION_CLOSED";
    pub const FORBIDDEN: &str = "FORBIDDEN";
    /// A valid admission token for another event than the resource's (`403`).
    pub const WRONG_EVENT: &str = "WRONG_EVENT";
    // Gateway (waiting room).
    pub const EVENT_CLOSED: &str = "EVENT_CLOSED";
    /// A config write that would change `queue_shards` after the room was created (`409`).
    pub const QUEUE_SHARDS_FIXED: &str = "QUEUE_SHARDS_FIXED";
    pub const NOT_IN_QUEUE: &str = "NOT_IN_QUEUE";
    /// A checkout write by a fan whose `max_active` slot was freed, with every slot taken
    /// (`409`, with `waiting_room_url`): nothing was held.
    pub const ROOM_FULL: &str = "ROOM_FULL";
    pub const POW_REQUIRED: &str = "POW_REQUIRED";
    pub const POW_INVALID: &str = "POW_INVALID";
    pub const METHOD_NOT_ALLOWED: &str = "METHOD_NOT_ALLOWED";
    /// A join to a registered-only room from an account not on its list (`403`).
    pub const NOT_REGISTERED: &str = "NOT_REGISTERED";
    /// Registering after the room's `registration_closes` (`409`).
    pub const REGISTRATION_CLOSED: &str = "REGISTRATION_CLOSED";
    /// Registering for a room open to everyone (`409`): there is nothing to register for.
    pub const REGISTRATION_NOT_REQUIRED: &str = "REGISTRATION_NOT_REQUIRED";
    /// An account list with malformed ids (`422`, the bad lines listed; nothing stored).
    pub const INVALID_ACCOUNTS: &str = "INVALID_ACCOUNTS";
    /// A mutating admin call that names no operator in `X-Floodgate-Actor`.
    pub const ACTOR_REQUIRED: &str = "ACTOR_REQUIRED";
    /// No scheduled change with this id.
    pub const CHANGE_NOT_FOUND: &str = "CHANGE_NOT_FOUND";
    /// The scheduled change already applied, failed or was cancelled.
    pub const CHANGE_NOT_PENDING: &str = "CHANGE_NOT_PENDING";
    // Seat booking.
    pub const EVENT_EXISTS: &str = "EVENT_EXISTS";
    pub const SALE_NOT_STARTED: &str = "SALE_NOT_STARTED";
    pub const EVENT_CANCELLED: &str = "EVENT_CANCELLED";
    pub const UNKNOWN_SEATS: &str = "UNKNOWN_SEATS";
    pub const UNKNOWN_TIER: &str = "UNKNOWN_TIER";
    pub const HOLD_ORDERED: &str = "HOLD_ORDERED";
    // Carts and orders.
    pub const UNKNOWN_SKU: &str = "UNKNOWN_SKU";
    pub const PRODUCT_EXISTS: &str = "PRODUCT_EXISTS";
    pub const CART_FULL: &str = "CART_FULL";
    pub const CART_EMPTY: &str = "CART_EMPTY";
    // Payments and webhooks.
    pub const ORDER_NOT_PAYABLE: &str = "ORDER_NOT_PAYABLE";
    pub const PAYMENT_IN_PROGRESS: &str = "PAYMENT_IN_PROGRESS";
    /// `[payments] max_attempts` attempts of this order were made: no more.
    pub const PAYMENT_ATTEMPTS_EXHAUSTED: &str = "PAYMENT_ATTEMPTS_EXHAUSTED";
    pub const PAYMENT_REFUNDED: &str = "PAYMENT_REFUNDED";
    pub const INVALID_SIGNATURE: &str = "INVALID_SIGNATURE";
    // Ops refunds.
    /// `422`: a per-line refund names lines the order does not have.
    pub const UNKNOWN_ORDER_LINES: &str = "UNKNOWN_ORDER_LINES";
    /// `409`: a per-line refund names lines a refund already took (done or under way).
    pub const LINES_ALREADY_REFUNDED: &str = "LINES_ALREADY_REFUNDED";

    // Operator and scanner credentials.
    /// `403`: the credential is valid but its role may not make this call (`role`,
    /// `required_role` in the body).
    pub const ROLE_FORBIDDEN: &str = "ROLE_FORBIDDEN";
    /// `403`: a scanner credential on an admin listener, or an operator credential on a
    /// scanner route.
    pub const WRONG_CREDENTIAL_TYPE: &str = "WRONG_CREDENTIAL_TYPE";
    /// `429`: this address failed too many credential checks; retry after `Retry-After`.
    pub const TOO_MANY_FAILED_LOGINS: &str = "TOO_MANY_FAILED_LOGINS";
    /// `409`: revoking this operator would leave no live admin.
    pub const LAST_ADMIN: &str = "LAST_ADMIN";
    /// `404`: no such operator.
    pub const UNKNOWN_OPERATOR: &str = "UNKNOWN_OPERATOR";
    /// `404`: no such scanner of this event.
    pub const UNKNOWN_SCANNER: &str = "UNKNOWN_SCANNER";

    // Check-in at the door (DESIGN section 9, "Check-in").
    /// `409`: the ticket is inside already (`at`, `gate` of the entry in force).
    pub const ALREADY_INSIDE: &str = "ALREADY_INSIDE";
    /// `410`: the code's ticket is void (`reason`: `refunded`, `disputed`, or `reissued` when
    /// the code names an older version of the ticket than the current one).
    pub const VOIDED: &str = "VOIDED";
    /// `400`: not a ticket code of this deployment (forged, truncated, unknown key, bad
    /// signature, or a rotating ticket's code without its TOTP).
    pub const INVALID_CODE: &str = "INVALID_CODE";
    /// `409`: a rotating code whose TOTP is outside the current 15 s step and one either side.
    pub const CODE_EXPIRED: &str = "CODE_EXPIRED";
    /// `409`: the ticket went out and its event does not allow re-entry (`reentry: false`);
    /// an addition to section 9 (docs/decisions.md).
    pub const REENTRY_NOT_ALLOWED: &str = "REENTRY_NOT_ALLOWED";
    /// `409`: an exit scan of a ticket that is not inside; an addition to section 9.
    pub const NOT_INSIDE: &str = "NOT_INSIDE";
}

/// The wire shape of an error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

impl ErrorBody {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds one detail field (`"seats": [...]`, `"current_price": 1200`, ...).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    pub fn to_json(&self) -> String {
        // Serialising a map of strings and JSON values cannot fail; fall back defensively.
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!(
                r#"{{"code":"{}","message":"error"}}"#,
                self.code.replace('"', "")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_flattened() {
        let body = ErrorBody::new(codes::SEAT_TAKEN, "taken").with("seats", vec!["A-1"]);
        let v: Value = serde_json::from_str(&body.to_json()).unwrap();
        assert_eq!(v["code"], "SEAT_TAKEN");
        assert_eq!(v["seats"][0], "A-1");
    }
}
