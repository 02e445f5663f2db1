//! The answers the handlers build with `json!` (the waiting room's hot paths and the small
//! admin answers), as types for the documents only: nothing serialises them. Each names the
//! handler whose `json!` it describes; schemathesis' response checks hold the two in step.

use crate::draw::ReceiptClaims;
use crate::event_config::{Access, EventConfig, EventName};
use crate::schedule::Change;
use crate::store::AuditEntry;
use chrono::{DateTime, Utc};
use utoipa::ToSchema;

/// `GET /healthz` (both listeners).
#[derive(ToSchema)]
pub struct Health {
    #[schema(value_type = String, pattern = "^ok$")]
    pub status: &'static str,
}

/// `GET /readyz` (`proxy/steps.rs`; the admin listener omits `upstream`).
#[derive(ToSchema)]
pub struct Ready {
    /// Redis answered a ping.
    pub redis: bool,
    /// An upstream booking instance is reachable (public listener).
    #[schema(required = false)]
    pub upstream: bool,
}

/// Where a fan stands (`queue.rs`: `join`, `status`, `waiting`, `admitted`). Which fields are
/// present depends on `state`.
#[derive(ToSchema)]
pub struct Waiting {
    pub event: String,
    pub state: WaitingState,
    /// Join: a new place (`201`), not the same place again (`200`).
    #[schema(required = false)]
    pub new: bool,
    /// Join: the place was restored from the fan's receipt after Redis lost it.
    #[schema(required = false)]
    pub restored: bool,
    /// Join: the place's session id.
    #[schema(required = false)]
    pub session: String,
    /// Join: `draw` (joined before the sale start) or `fifo`.
    #[schema(required = false)]
    pub kind: PlaceKind,
    /// Join: the queue score exactly as stored.
    #[schema(required = false)]
    pub score: String,
    /// Join: when the place was taken (Redis time).
    #[schema(required = false)]
    pub joined_at: DateTime<Utc>,
    /// Join: the signed place receipt (also set as the `fg_place` cookie).
    #[schema(required = false)]
    pub receipt: String,
    #[schema(required = false)]
    pub status_url: String,
    /// When to ask again (0: now, or no need).
    #[schema(minimum = 0)]
    pub poll_after_ms: u64,
    #[schema(required = false)]
    pub access: Access,
    /// Join: the event's name as the room config gives it (absent when unnamed).
    #[schema(required = false)]
    pub name: EventName,
    /// Waiting: 1 for the head of the queue.
    #[schema(required = false, minimum = 1)]
    pub position: u64,
    #[schema(required = false)]
    pub ahead: u64,
    /// Status: fans waiting in the event's queue.
    #[schema(required = false)]
    pub queue_length: u64,
    /// Waiting: the expected wait, or null when it cannot be estimated yet.
    #[schema(required = false)]
    pub eta_seconds: Option<u64>,
    /// Waiting: the admit rate in force.
    #[schema(required = false)]
    pub admit_per_minute: u64,
    /// A safety-net room is queueing a surge.
    #[schema(required = false, value_type = String, pattern = "^queueing$")]
    pub safety_net: &'static str,
    /// A scheduled change opens the sale then.
    #[schema(required = false)]
    pub opens_at: DateTime<Utc>,
    /// Admitted: the admission token (also set as the `fg_admission` cookie).
    #[schema(required = false)]
    pub token: String,
    #[schema(required = false)]
    pub expires_at: DateTime<Utc>,
    #[schema(required = false, minimum = 1)]
    pub expires_in_s: u64,
    /// Admitted: the shop page.
    #[schema(required = false)]
    pub next: String,
    /// Expired: join again here.
    #[schema(required = false)]
    pub join_url: String,
}

#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingState {
    Waiting,
    Admitted,
    Paused,
    Closed,
    SoldOut,
    Expired,
}

#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PlaceKind {
    Draw,
    Fifo,
}

/// `409` on a checkout write that takes a `max_active` slot (`proxy/gate.rs::room_full`):
/// `ROOM_FULL` when the gateway answers (the fan's slot was freed after checkout and every
/// slot is taken; nothing was forwarded), booking's own conflict codes otherwise.
#[derive(ToSchema)]
pub struct RoomFull {
    /// `ROOM_FULL` from the gateway; booking's conflict codes (booking's document) otherwise.
    #[schema(pattern = "^[A-Z][A-Z0-9_]*$", example = "ROOM_FULL")]
    pub code: String,
    pub message: String,
    /// With `ROOM_FULL`: the event's waiting room (`/e/{event}`), where the fan gets a slot
    /// again.
    #[schema(required = false, example = "/e/demo")]
    pub waiting_room_url: String,
}

/// `POST /queue/{event}/register` (`registration.rs`).
#[derive(ToSchema)]
pub struct Registered {
    pub event: String,
    #[schema(value_type = bool)]
    pub registered: bool,
    /// Fans may register until then (Redis time).
    #[schema(required = true)]
    pub registration_closes: Option<DateTime<Utc>>,
    pub join_url: String,
}

/// `GET /queue/{event}/draw` (`queue/side.rs`).
#[derive(ToSchema)]
pub struct Draw {
    pub event: String,
    pub sale_start: DateTime<Utc>,
    /// hex(SHA-256(seed)), published before the sale.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub seed_hash: String,
    pub revealed: bool,
    /// The seed (hex) once the sale has started, else null.
    #[schema(required = true)]
    pub seed: Option<String>,
    /// How `seed_hash` is computed.
    pub hash: String,
    /// How a draw score is computed.
    pub score: String,
    pub access: Access,
    /// Registered rooms: how a registered account's first join is scored; null otherwise.
    #[schema(required = true)]
    pub registered: Option<String>,
}

/// `POST /queue/{event}/receipt` (`queue/side.rs`).
#[derive(ToSchema)]
pub struct ReceiptCheck {
    pub valid: bool,
    /// The place the receipt proves (when valid).
    #[schema(required = false)]
    pub place: ReceiptClaims,
}

/// `GET /queue/{event}/challenge` (`queue/side.rs`).
#[derive(ToSchema)]
pub struct Challenge {
    pub challenge: String,
    /// Leading zero bits the solution's hash needs (0: none needed).
    #[schema(minimum = 0, maximum = 24)]
    pub difficulty: u32,
    pub algorithm: String,
}

/// `POST /dev/login` (`queue/side.rs`).
#[derive(ToSchema)]
pub struct DevLogin {
    pub account: String,
    pub token: String,
}

/// `GET`/`PUT /admin/events/{event}/config` (`admin.rs`).
#[derive(ToSchema)]
pub struct ShownConfig {
    pub event: String,
    /// The config in force; null for an event that has only a sold-out flag or revocations.
    #[schema(required = true)]
    pub config: Option<EventConfig>,
    /// Bumped by every config write.
    pub version: i64,
    /// hex(SHA-256(seed)) of the pre-sale draw.
    pub seed_hash: String,
    /// The admit rate in force (the measured one in auto mode).
    pub effective_admit_per_minute: u64,
    pub sold_out: bool,
    /// Pending scheduled changes, by time.
    pub schedule: Vec<Change>,
    /// Safety-net rooms: `pass` or `queueing`, as last decided; null otherwise.
    #[schema(required = true)]
    pub safety_net_state: Option<SafetyNetState>,
    /// When a pending change opens the sale, if one does.
    #[schema(required = true)]
    pub opens_at: Option<DateTime<Utc>>,
}

#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SafetyNetState {
    Pass,
    Queueing,
}

/// `GET /admin/events/{event}/schedule` (`admin/schedule.rs`).
#[derive(ToSchema)]
pub struct Pending {
    pub event: String,
    pub pending: Vec<Change>,
}

/// `GET /admin/events/{event}/audit` (`admin/audit.rs`).
#[derive(ToSchema)]
pub struct AuditPage {
    pub event: String,
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next page; null on the last one.
    #[schema(required = true)]
    pub next_before: Option<String>,
}

/// `POST /admin/events/{event}/revoke` (`admin.rs`).
#[derive(ToSchema)]
pub struct Revoked {
    pub event: String,
    /// `a:{account}` or `s:{session}`.
    pub revoked: String,
    /// Unix seconds: tokens issued at or before it are refused.
    pub revoked_at: i64,
}

/// `PUT /admin/events/{event}/sold_out` (`admin.rs`).
#[derive(ToSchema)]
pub struct SoldOut {
    pub event: String,
    pub sold_out: bool,
}

/// `PUT /admin/events/{event}/registrations` (`registration.rs`).
#[derive(ToSchema)]
pub struct Uploaded {
    pub event: String,
    pub mode: crate::openapi::admin::ListMode,
    /// Account ids in the upload.
    pub accounts: u64,
    /// Accounts added or removed (not with `replace`).
    #[schema(required = false)]
    pub changed: u64,
    /// Accounts on the list now.
    pub count: u64,
}

/// `GET /admin/events/{event}/registrations` (`registration.rs`).
#[derive(ToSchema)]
pub struct Count {
    pub event: String,
    pub count: u64,
    /// With `?account=`: the account asked about.
    #[schema(required = false)]
    pub account: String,
    #[schema(required = false)]
    pub registered: bool,
}
