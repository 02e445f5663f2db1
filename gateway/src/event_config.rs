//! The per-event waiting-room configuration ops set with `PUT /admin/events/{event}/config`.
//!
//! Guarantee: a config that reaches Redis has passed [`EventConfigInput::validate`]; a bad
//! value is a `422` listing every problem and nothing is applied. Validation is a plain
//! function so it is unit-tested without a socket.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod name;
pub use name::{EventName, MAX_NAME_CHARS, MAX_NAME_LANGUAGES};

/// Admission mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Normal: admit from the queue at the configured (or measured) rate.
    Queue,
    /// Stop admitting; fans keep their places.
    Paused,
    /// Every join is admitted at once (tokens are still minted and required).
    Passthrough,
    /// Refuse new joins; stop admitting.
    Closed,
    /// Admit straight through while arrivals and active fans stay under the safety net's
    /// thresholds; queue new arrivals once either is passed, until the backlog drains.
    #[serde(rename = "safety_net")]
    SafetyNet,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Queue => "queue",
            Mode::Paused => "paused",
            Mode::Passthrough => "passthrough",
            Mode::Closed => "closed",
            Mode::SafetyNet => "safety_net",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "queue" => Some(Mode::Queue),
            "paused" => Some(Mode::Paused),
            "passthrough" => Some(Mode::Passthrough),
            "closed" => Some(Mode::Closed),
            "safety_net" => Some(Mode::SafetyNet),
            _ => None,
        }
    }
}

/// Who may join: anyone, or only accounts on the event's registration list
/// (`registration.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    #[default]
    Open,
    Registered,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Open => "open",
            Access::Registered => "registered",
        }
    }
}

/// Auto mode: the admit rate follows the measured upstream health between these bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AutoBounds {
    /// The lowest admit rate (per minute).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub floor: i64,
    /// The highest admit rate (per minute); at least `floor`.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub ceiling: i64,
    /// Upstream p99 latency above this lowers the rate.
    #[serde(default = "default_target_p99_ms")]
    #[schema(minimum = 1, maximum = 60_000, default = 800)]
    pub target_p99_ms: i64,
    /// Share of 5xx/429 responses above this lowers the rate.
    #[serde(default = "default_max_error_ratio")]
    #[schema(minimum = 0.0, maximum = 1.0, default = 0.02)]
    pub max_error_ratio: f64,
}

/// Safety-net thresholds (`mode: "safety_net"`); `max_active` is the room's own cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SafetyNet {
    /// New arrivals in the last minute (counted in 10-second buckets) above this queue.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub arrivals_per_minute: i64,
}

fn default_target_p99_ms() -> i64 {
    800
}

fn default_max_error_ratio() -> f64 {
    0.02
}

/// The request body of a config PUT. Numbers are signed so a negative value is reported as
/// a validation problem (`422`) with the field name rather than a parse error.
///
/// The schema carries the per-field ranges of [`EventConfigInput::validate`]; the rules that
/// tie fields together (`max_session_s` at least `token_ttl_s`, `auto.ceiling` at least
/// `auto.floor`, `registration_closes` not after `sale_start`) and the schedule's rules are
/// `422 VALIDATION_FAILED` with the field named.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventConfigInput {
    /// When the sale starts (a date in 2000..=2099).
    pub sale_start: DateTime<Utc>,
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub admit_per_minute: i64,
    #[serde(default = "default_mode")]
    #[schema(default = "queue")]
    pub mode: Mode,
    /// Cap on concurrently admitted fans (unclaimed + active); 0 = no cap.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 10_000_000, default = 0)]
    pub max_active: i64,
    /// An admission token's lifetime (the gateway's default when absent).
    #[schema(minimum = 30, maximum = 86_400)]
    pub token_ttl_s: Option<i64>,
    /// Longest an admission can be kept alive by checkout refreshes, counted from the
    /// admission (default 1800, at least `token_ttl_s`).
    #[schema(minimum = 30, maximum = 86_400)]
    pub max_session_s: Option<i64>,
    #[serde(default)]
    pub auto: Option<AutoBounds>,
    /// How long an admitted fan has to claim the admission (the gateway's default when
    /// absent).
    #[schema(minimum = 10, maximum = 3600)]
    pub claim_deadline_s: Option<i64>,
    /// Leading zero bits a join's proof of work needs (0: none).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 24, default = 0)]
    pub pow_difficulty: i64,
    #[serde(default)]
    pub access: Access,
    /// Registered rooms: fans may register until then (required with `registered`, refused
    /// with `open`; not after `sale_start`).
    #[serde(default)]
    pub registration_closes: Option<DateTime<Utc>>,
    /// Required with `mode: "safety_net"` (and allowed, unused, otherwise).
    #[serde(default)]
    pub safety_net: Option<SafetyNet>,
    /// Scheduled changes: when present the pending list becomes exactly these (see
    /// `schedule.rs`); when absent the pending list is kept.
    #[serde(default)]
    #[schema(max_items = 100)]
    pub schedule: Option<Vec<crate::schedule::ChangeInput>>,
    /// Sub-queues the event's queue is split over (each its own hash tag, so one event's
    /// joins spread over several Redis Cluster masters). Fixed when the room is created
    /// (`409 QUEUE_SHARDS_FIXED` for another count); every mode and access works split.
    #[serde(default = "default_queue_shards_input")]
    #[schema(minimum = 1, maximum = 16, default = 1)]
    pub queue_shards: i64,
    /// The event's name on the waiting page, once or per language (the page falls back to
    /// English, then to the event's id). Absent: the event's id.
    #[serde(default)]
    pub name: Option<EventName>,
}

fn default_queue_shards_input() -> i64 {
    1
}

fn default_queue_shards() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Default `max_session_s`: half an hour from admission.
pub const DEFAULT_MAX_SESSION_S: u64 = 1800;

fn default_max_session_s() -> u64 {
    DEFAULT_MAX_SESSION_S
}

fn default_mode() -> Mode {
    Mode::Queue
}

/// A validated config, as stored in Redis and served by `GET`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventConfig {
    pub sale_start: DateTime<Utc>,
    pub admit_per_minute: u64,
    pub mode: Mode,
    pub max_active: u64,
    pub token_ttl_s: u64,
    /// Stored configs written before this field existed read as the default.
    #[serde(default = "default_max_session_s")]
    pub max_session_s: u64,
    pub auto: Option<AutoBounds>,
    pub claim_deadline_s: u64,
    pub pow_difficulty: u32,
    /// Stored configs written before registered rooms existed read as open.
    #[serde(default)]
    pub access: Access,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration_closes: Option<DateTime<Utc>>,
    #[serde(default)]
    pub safety_net: Option<SafetyNet>,
    /// Omitted when 1 (one queue, today's layout), so configs stored before it read as 1.
    #[serde(default = "default_queue_shards", skip_serializing_if = "is_one")]
    pub queue_shards: u32,
    /// Omitted when unset (configs stored before it read as unnamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EventName>,
}

/// Upper bounds that catch typos (an extra zero or two) without limiting real launches.
pub const MAX_ADMIT_PER_MINUTE: i64 = 1_000_000;
pub const MAX_ACTIVE: i64 = 10_000_000;
pub const MAX_POW_DIFFICULTY: i64 = 24;
/// A split queue's tick reads every sub-queue's head: a handful is what a launch needs (the
/// simulator's "sub-queues needed"), more only adds round trips.
pub const MAX_QUEUE_SHARDS: i64 = 16;

/// One validation problem: which field and why.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FieldError {
    pub field: &'static str,
    pub problem: String,
}

impl EventConfigInput {
    /// Checks every field and fills defaults. Returns all problems at once.
    pub fn validate(
        self,
        default_ttl_s: u64,
        default_claim_deadline_s: u64,
    ) -> Result<EventConfig, Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut bad = |field: &'static str, problem: String| {
            errs.push(FieldError { field, problem });
        };
        if !(1..=MAX_ADMIT_PER_MINUTE).contains(&self.admit_per_minute) {
            bad(
                "admit_per_minute",
                format!("must be between 1 and {MAX_ADMIT_PER_MINUTE}"),
            );
        }
        if !(0..=MAX_ACTIVE).contains(&self.max_active) {
            bad(
                "max_active",
                format!("must be between 0 (no cap) and {MAX_ACTIVE}"),
            );
        }
        let ttl = self
            .token_ttl_s
            .unwrap_or_else(|| i64::try_from(default_ttl_s).unwrap_or(600));
        if !(30..=86_400).contains(&ttl) {
            bad("token_ttl_s", "must be between 30 and 86400".into());
        }
        // The default never undercuts a long token lifetime (a session is at least one token).
        let max_session = self.max_session_s.unwrap_or_else(|| {
            i64::try_from(DEFAULT_MAX_SESSION_S)
                .unwrap_or(1800)
                .max(ttl)
        });
        if !(ttl..=86_400).contains(&max_session) {
            bad(
                "max_session_s",
                "must be between token_ttl_s and 86400".into(),
            );
        }
        let claim = self
            .claim_deadline_s
            .unwrap_or_else(|| i64::try_from(default_claim_deadline_s).unwrap_or(120));
        if !(10..=3600).contains(&claim) {
            bad("claim_deadline_s", "must be between 10 and 3600".into());
        }
        if !(0..=MAX_POW_DIFFICULTY).contains(&self.pow_difficulty) {
            bad(
                "pow_difficulty",
                format!("must be between 0 (off) and {MAX_POW_DIFFICULTY}"),
            );
        }
        if let Some(a) = &self.auto {
            if !(1..=MAX_ADMIT_PER_MINUTE).contains(&a.floor) {
                bad(
                    "auto.floor",
                    format!("must be between 1 and {MAX_ADMIT_PER_MINUTE}"),
                );
            }
            if !(1..=MAX_ADMIT_PER_MINUTE).contains(&a.ceiling) || a.ceiling < a.floor {
                bad(
                    "auto.ceiling",
                    format!("must be between auto.floor and {MAX_ADMIT_PER_MINUTE}"),
                );
            }
            if !(1..=60_000).contains(&a.target_p99_ms) {
                bad("auto.target_p99_ms", "must be between 1 and 60000".into());
            }
            if !(a.max_error_ratio.is_finite() && (0.0..=1.0).contains(&a.max_error_ratio)) {
                bad("auto.max_error_ratio", "must be between 0 and 1".into());
            }
        }
        match (&self.safety_net, self.mode) {
            (Some(sn), _) if !(1..=MAX_ADMIT_PER_MINUTE).contains(&sn.arrivals_per_minute) => {
                bad(
                    "safety_net.arrivals_per_minute",
                    format!("must be between 1 and {MAX_ADMIT_PER_MINUTE}"),
                );
            }
            (None, Mode::SafetyNet) => bad(
                "safety_net",
                "required with mode safety_net (arrivals_per_minute)".into(),
            ),
            _ => {}
        }
        let year = self.sale_start.format("%Y").to_string();
        if !("2000".."2100").contains(&year.as_str()) {
            bad("sale_start", "must be a date between 2000 and 2099".into());
        }
        match (self.access, self.registration_closes) {
            (Access::Registered, None) => bad(
                "registration_closes",
                "required when access is registered".into(),
            ),
            // The seed is revealed at the sale start and a registered fan's first join is
            // drawn whenever it happens: registering after the reveal would let anyone pick
            // accounts with known good scores.
            (Access::Registered, Some(t)) if t > self.sale_start => bad(
                "registration_closes",
                "must not be after sale_start (the draw seed is revealed then)".into(),
            ),
            (Access::Open, Some(_)) => bad(
                "registration_closes",
                "only applies when access is registered".into(),
            ),
            _ => {}
        }
        if !(1..=MAX_QUEUE_SHARDS).contains(&self.queue_shards) {
            bad(
                "queue_shards",
                format!("must be between 1 and {MAX_QUEUE_SHARDS}"),
            );
        }
        if let Some(name) = &self.name {
            for problem in name.problems() {
                bad("name", problem);
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        // Every value was range-checked above, so these conversions cannot fail.
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(EventConfig {
            sale_start: self.sale_start,
            admit_per_minute: u(self.admit_per_minute),
            mode: self.mode,
            max_active: u(self.max_active),
            token_ttl_s: u(ttl),
            max_session_s: u(max_session),
            auto: self.auto,
            claim_deadline_s: u(claim),
            pow_difficulty: u32::try_from(self.pow_difficulty).unwrap_or(0),
            access: self.access,
            registration_closes: self.registration_closes,
            safety_net: self.safety_net,
            queue_shards: u32::try_from(self.queue_shards).unwrap_or(1),
            name: self.name,
        })
    }
}

impl EventConfig {
    pub fn sale_start_ms(&self) -> i64 {
        self.sale_start.timestamp_millis()
    }

    /// When registration closes (unix ms); `None` for open rooms.
    pub fn registration_closes_ms(&self) -> Option<i64> {
        self.registration_closes.map(|t| t.timestamp_millis())
    }

    /// The safety net's arrivals threshold when the room is in safety-net mode.
    pub fn safety_net_arrivals(&self) -> Option<u64> {
        match (&self.safety_net, self.mode) {
            (Some(sn), Mode::SafetyNet) => u64::try_from(sn.arrivals_per_minute).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
