//! Scheduled config changes: `{"at": RFC 3339, "set": {partial config}}`, applied at their
//! time on every instance.
//!
//! Guarantees: a change is stored only if the config it produces validates, merged in time
//! order onto the current config and the changes pending before it (`422` otherwise, nothing
//! stored); it applies at Redis time (`TIME`, never an instance's clock), exactly once however
//! many instances race for it (the write script takes it off the pending set in the same step
//! as it writes the config and the audit entry); a change cancelled or edited first never
//! applies in its old form (every write compares the stored record it read). A change whose
//! merge no longer validates when its time comes (ops changed the base since) is marked
//! `failed` with its problems, audited, and changes nothing.
//!
//! [`Scheduler`] is the pingora background service that looks for due changes every
//! `refresh_ms` on each instance; the instance that applies a change installs it at once and
//! the others read it on their next refresh, so every instance runs it within a second.

use crate::event_config::{EventConfig, EventConfigInput};
use crate::live::Live;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError, WriteOutcome};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;

/// Most changes pending at once per event.
pub const MAX_PENDING: usize = 100;
/// Furthest ahead a change may be scheduled.
pub const MAX_AHEAD_DAYS: i64 = 366;

/// A change as ops send it.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeInput {
    /// When it applies (Redis time): in the future, at most 366 days ahead.
    pub at: DateTime<Utc>,
    /// A partial room config laid over the config in force then (top-level fields replace;
    /// `null` clears an optional one); the merge must validate like a config PUT.
    #[schema(schema_with = crate::openapi::nonempty_object)]
    pub set: Map<String, Value>,
}

/// Where a change is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeStatus {
    Pending,
    Applied,
    Cancelled,
    /// Its time came but the merged config no longer validated.
    Failed,
}

/// A stored change (`fg:{event}:sched`, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Change {
    pub id: String,
    pub at: DateTime<Utc>,
    #[schema(value_type = Object)]
    pub set: Map<String, Value>,
    pub status: ChangeStatus,
    pub scheduled_by: String,
    pub scheduled_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<DateTime<Utc>>,
    /// Who cancelled it, or which instance applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<DateTime<Utc>>,
    /// Why it failed to apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

impl Change {
    pub fn at_ms(&self) -> i64 {
        self.at.timestamp_millis()
    }

    pub fn to_json(&self) -> String {
        // A struct of strings, maps and dates always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// True when this change opens the sale: it sets `sale_start` or a mode that admits.
    pub fn opens(&self) -> bool {
        self.set.contains_key("sale_start")
            || self
                .set
                .get("mode")
                .and_then(Value::as_str)
                .is_some_and(|m| matches!(m, "queue" | "passthrough" | "safety_net"))
    }
}

/// One reason a change cannot be stored or applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// The change's id (`new` for one not stored yet).
    pub change: String,
    pub field: String,
    pub problem: String,
}

/// `base` with `set` laid over it (top-level fields replace; `null` clears an optional one),
/// validated like a manual config PUT.
pub fn merge(
    base: &EventConfig,
    set: &Map<String, Value>,
    defaults: (u64, u64),
) -> Result<EventConfig, Vec<(String, String)>> {
    if set.is_empty() {
        return Err(vec![(
            "set".into(),
            "must change at least one field".into(),
        )]);
    }
    if set.contains_key("schedule") {
        return Err(vec![(
            "set.schedule".into(),
            "a scheduled change cannot schedule changes".into(),
        )]);
    }
    // Fans wait in the sub-queue their account hashes to under this count: a change would
    // strand them (the config write refuses it too, so it could never apply).
    if let Some(v) = set.get("queue_shards")
        && v.as_u64() != Some(u64::from(base.queue_shards))
    {
        return Err(vec![(
            "set.queue_shards".into(),
            format!("fixed at {} when the room was created", base.queue_shards),
        )]);
    }
    let mut merged = match serde_json::to_value(base) {
        Ok(Value::Object(m)) => m,
        _ => return Err(vec![("set".into(), "current config unreadable".into())]),
    };
    for (k, v) in set {
        merged.insert(k.clone(), v.clone());
    }
    let input: EventConfigInput = serde_json::from_value(Value::Object(merged))
        .map_err(|e| vec![("set".to_owned(), e.to_string())])?;
    input.validate(defaults.0, defaults.1).map_err(|errs| {
        errs.into_iter()
            .map(|e| (format!("set.{}", e.field), e.problem))
            .collect()
    })
}

/// Checks a whole pending list: each change merged in time order onto `base` and the ones
/// before it must validate. Returns every problem found (the first failing change stops its
/// successors from being checked against a config that could not exist).
pub fn check_chain(base: &EventConfig, changes: &[Change], defaults: (u64, u64)) -> Vec<Problem> {
    let mut sorted: Vec<&Change> = changes.iter().collect();
    sorted.sort_by_key(|c| (c.at_ms(), c.id.clone()));
    let mut cur = base.clone();
    for c in sorted {
        match merge(&cur, &c.set, defaults) {
            Ok(next) => cur = next,
            Err(errs) => {
                return errs
                    .into_iter()
                    .map(|(field, problem)| Problem {
                        change: c.id.clone(),
                        field,
                        problem,
                    })
                    .collect();
            }
        }
    }
    Vec::new()
}

/// Problems with a change's `at` against Redis time `now_ms`.
pub fn check_at(id: &str, at: DateTime<Utc>, now_ms: i64) -> Vec<Problem> {
    let ms = at.timestamp_millis();
    let mut out = Vec::new();
    let mut bad = |p: &str| {
        out.push(Problem {
            change: id.to_owned(),
            field: "at".into(),
            problem: p.into(),
        })
    };
    if ms <= now_ms {
        bad("must be in the future");
    } else if ms > now_ms + MAX_AHEAD_DAYS * 86_400_000 {
        bad("must be within a year");
    }
    out
}

/// The pending list as stored in the config hash (`pending`, a JSON array by time).
pub fn parse_pending(raw: Option<&String>) -> Vec<Change> {
    raw.and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default()
}

/// The earliest pending change that opens the sale, while the room is not admitting yet (what
/// the waiting page shows as "the sale opens at …").
pub fn opening(cfg: &EventConfig, pending: &[Change], now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    use crate::event_config::Mode;
    let waiting = matches!(cfg.mode, Mode::Paused | Mode::Closed) || cfg.sale_start > now;
    if !waiting {
        return None;
    }
    pending
        .iter()
        .filter(|c| c.status == ChangeStatus::Pending && c.opens())
        .map(|c| match c.set.get("sale_start").and_then(Value::as_str) {
            // A change of the sale start opens at the later of the two times.
            Some(s) => DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc).max(c.at))
                .unwrap_or(c.at),
            None => c.at.max(cfg.sale_start),
        })
        .min()
}

/// The answer body of one change.
pub fn view(c: &Change) -> Value {
    serde_json::to_value(c).unwrap_or_else(|_| json!({}))
}

/// Background service: applies due changes of every event that has any pending.
pub struct Scheduler {
    pub store: Store,
    pub live: Arc<Live>,
    pub metrics: Arc<Metrics>,
    pub instance: String,
    pub every: Duration,
    /// Default token lifetime and claim deadline (never used: the base is a full config).
    pub defaults: (u64, u64),
}

/// What one [`Scheduler::apply_due`] did for an event.
#[derive(Debug, PartialEq)]
pub enum Applied {
    Nothing,
    Applied {
        id: String,
        version: i64,
    },
    Failed {
        id: String,
    },
    /// Another instance (or an edit) got there first; look again next time.
    Lost,
}

impl Scheduler {
    /// Applies the earliest due change of `event`, if Redis time says one is due.
    pub async fn apply_due(&self, event: &str) -> Result<Applied, StoreError> {
        let Some(due) = self.store.due_change(event).await? else {
            return Ok(Applied::Nothing);
        };
        let Ok(mut change) = serde_json::from_str::<Change>(&due.record) else {
            return Err(StoreError::Protocol("unreadable scheduled change"));
        };
        let base: Option<EventConfig> = serde_json::from_str(&due.config).ok();
        let done_at = DateTime::from_timestamp_millis(due.now_ms);
        change.done_by = Some(format!("schedule@{}", self.instance));
        change.done_at = done_at;
        let merged = match &base {
            Some(b) => merge(b, &change.set, self.defaults),
            None => Err(vec![("config".into(), "no config to change".into())]),
        };
        match merged {
            Ok(cfg) => {
                change.status = ChangeStatus::Applied;
                let out = self
                    .store
                    .apply_change(event, &cfg, &due, &change.to_json(), &change.scheduled_by)
                    .await?;
                match out {
                    WriteOutcome::Written(version) => {
                        tracing::info!(event, change = %change.id, version,
                            scheduled_by = %change.scheduled_by, "scheduled config change applied");
                        if let Ok(Some(s)) = self.store.load_event(event).await {
                            self.live.upsert(event, s);
                        }
                        Ok(Applied::Applied {
                            id: change.id,
                            version,
                        })
                    }
                    _ => Ok(Applied::Lost),
                }
            }
            Err(errs) => {
                change.status = ChangeStatus::Failed;
                change.problems = errs
                    .into_iter()
                    .map(|(field, problem)| Problem {
                        change: change.id.clone(),
                        field,
                        problem,
                    })
                    .collect();
                let ok = self
                    .store
                    .write_change(
                        event,
                        &change.id,
                        &due.record,
                        &change.to_json(),
                        None,
                        change.scheduled_by.as_str().into(),
                        "schedule.fail",
                    )
                    .await?;
                if ok.is_ok() {
                    tracing::warn!(event, change = %change.id, problems = ?change.problems,
                        "scheduled config change no longer validates; not applied");
                    Ok(Applied::Failed { id: change.id })
                } else {
                    Ok(Applied::Lost)
                }
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Scheduler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            for event in self.live.event_ids() {
                let has_pending = self.live.get(&event).is_some_and(|s| !s.pending.is_empty());
                if !has_pending {
                    continue;
                }
                match self.apply_due(&event).await {
                    Ok(_) => failing = false,
                    Err(e) => {
                        self.metrics.redis_errors.inc();
                        if !failing {
                            tracing::warn!(error = %e, event, "applying scheduled changes failed; retrying");
                        }
                        failing = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> EventConfig {
        serde_json::from_str::<EventConfigInput>(
            r#"{"sale_start":"2027-01-10T10:00:00Z","admit_per_minute":600,"mode":"paused"}"#,
        )
        .unwrap()
        .validate(600, 120)
        .unwrap()
    }

    fn set(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    fn change(id: &str, at: &str, s: &str) -> Change {
        Change {
            id: id.into(),
            at: at.parse().unwrap(),
            set: set(s),
            status: ChangeStatus::Pending,
            scheduled_by: "ops".into(),
            scheduled_at: "2027-01-01T00:00:00Z".parse().unwrap(),
            edited_by: None,
            edited_at: None,
            done_by: None,
            done_at: None,
            problems: Vec::new(),
        }
    }

    #[test]
    fn merge_replaces_fields_and_validates_the_result() {
        let c = merge(
            &base(),
            &set(r#"{"mode":"queue","admit_per_minute":1200}"#),
            (600, 120),
        )
        .unwrap();
        assert_eq!(c.admit_per_minute, 1200);
        assert_eq!(c.mode, crate::event_config::Mode::Queue);
        assert_eq!(c.sale_start, base().sale_start);
        let errs = merge(&base(), &set(r#"{"admit_per_minute":0}"#), (600, 120)).unwrap_err();
        assert_eq!(errs[0].0, "set.admit_per_minute");
        let errs = merge(&base(), &set(r#"{"mode":"safety_net"}"#), (600, 120)).unwrap_err();
        assert_eq!(errs[0].0, "set.safety_net");
        assert!(merge(&base(), &set(r#"{"nope":1}"#), (600, 120)).is_err());
        assert!(merge(&base(), &set("{}"), (600, 120)).is_err());
        assert!(merge(&base(), &set(r#"{"schedule":[]}"#), (600, 120)).is_err());
        // queue_shards stays as the room was created: repeating it is fine, changing it not.
        let errs = merge(&base(), &set(r#"{"queue_shards":2}"#), (600, 120)).unwrap_err();
        assert_eq!(errs[0].0, "set.queue_shards");
        let c = merge(
            &base(),
            &set(r#"{"queue_shards":1,"admit_per_minute":1200}"#),
            (600, 120),
        )
        .unwrap();
        assert_eq!((c.queue_shards, c.admit_per_minute), (1, 1200));
    }

    #[test]
    fn chain_is_checked_in_time_order() {
        // Turning the safety net on needs its thresholds first: fine in this order only.
        let a = change(
            "a",
            "2027-01-10T09:00:00Z",
            r#"{"safety_net":{"arrivals_per_minute":100}}"#,
        );
        let b = change("b", "2027-01-10T10:00:00Z", r#"{"mode":"safety_net"}"#);
        assert!(check_chain(&base(), &[b.clone(), a.clone()], (600, 120)).is_empty());
        let early_b = change("b", "2027-01-10T08:00:00Z", r#"{"mode":"safety_net"}"#);
        let p = check_chain(&base(), &[a, early_b], (600, 120));
        assert_eq!(p[0].change, "b");
    }

    #[test]
    fn at_must_be_ahead_and_within_a_year() {
        let now: DateTime<Utc> = "2027-01-10T10:00:00Z".parse().unwrap();
        let ms = now.timestamp_millis();
        assert!(check_at("x", now + chrono::Duration::seconds(2), ms).is_empty());
        assert_eq!(check_at("x", now, ms)[0].field, "at");
        assert!(!check_at("x", now + chrono::Duration::days(400), ms).is_empty());
    }

    #[test]
    fn opening_is_the_first_pending_change_that_opens_the_sale() {
        let now: DateTime<Utc> = "2027-01-10T09:00:00Z".parse().unwrap();
        let p = vec![
            change("r", "2027-01-10T09:30:00Z", r#"{"admit_per_minute":60}"#),
            change("o", "2027-01-10T10:00:00Z", r#"{"mode":"queue"}"#),
        ];
        assert_eq!(
            opening(&base(), &p, now),
            Some("2027-01-10T10:00:00Z".parse().unwrap())
        );
        let mut open = base();
        open.mode = crate::event_config::Mode::Queue;
        open.sale_start = "2020-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(opening(&open, &p, now), None);
    }
}
