//! Config changes and their audit log: config writes (manual or scheduled), the pending
//! schedule, the sold-out flag, and reading the log back.
//!
//! Keys: `fg:{event}:cfglog` (stream, capped at [`AUDIT_MAX_LEN`]: every config change with
//! who/when/what, written by the same script as the change, so no change goes unrecorded),
//! `fg:{event}:sched` (hash: change id → record JSON, any status), `fg:{event}:schedq`
//! (sorted set: pending change ids by their time, ms). The config hash keeps the pending list
//! rendered as JSON (`pending`) so every instance reads it with the config on each refresh.

use super::scripts::Reply;
use super::{Store, StoreError};
use crate::event_config::EventConfig;
use crate::schedule::Change;
use redis::Value;
use serde::Serialize;
use shared::redis_conn::LuaScript as Script;
use std::sync::LazyLock;

/// Entries kept per event in the config audit log (approximately: `MAXLEN ~`).
pub const AUDIT_MAX_LEN: u64 = 10_000;

/// Lua helpers shared by the scripts that change the schedule: `now_ms()` from Redis `TIME`
/// and `render_pending()`, which rewrites the config hash's `pending` field from the pending
/// set (KEYS[1] config, KEYS[3] pending set, KEYS[4] records) and returns it.
macro_rules! pending_lua {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local function render_pending()
  local ids = redis.call('ZRANGE', KEYS[3], 0, -1)
  if #ids == 0 then
    redis.call('HDEL', KEYS[1], 'pending')
    return '[]'
  end
  local recs = redis.call('HMGET', KEYS[4], unpack(ids))
  local out = {}
  for _, r in ipairs(recs) do if r then out[#out + 1] = r end end
  local s = '[' .. table.concat(out, ',') .. ']'
  redis.call('HSET', KEYS[1], 'pending', s)
  return s
end
"#
    };
}
pub(super) use pending_lua;

/// Stores one change record if the stored one is still `ARGV[2]` (compare and set, so an
/// edit, a cancel and the scheduler never overwrite each other). ARGV: id, expected record
/// ('' = new), new record, its time ms ('' = no longer pending), actor, action, audit cap,
/// most pending, then the actor's role, operator id and note ([`Who`]).
const WRITE_CHANGE_LUA: &str = concat!(
    pending_lua!(),
    r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown'} end
local old = redis.call('HGET', KEYS[4], ARGV[1]) or ''
if old ~= ARGV[2] then return {'conflict', old} end
if old ~= '' and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return {'not_pending', old} end
local now = now_ms()
if ARGV[4] ~= '' then
  if tonumber(ARGV[4]) <= tonumber(now) then return {'past'} end
  if old == '' and redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[8]) then return {'full'} end
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
render_pending()
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'at', now, 'actor', ARGV[5],
  'role', ARGV[9], 'operator_id', ARGV[10], 'note', ARGV[11],
  'action', ARGV[6], 'before', old, 'after', ARGV[3], 'change', ARGV[1])
return {'ok'}
"#
);

/// The earliest change due by Redis time, with the config it would be merged onto.
const DUE_CHANGE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
if #due == 0 then return {'none'} end
local rec = redis.call('HGET', KEYS[3], due[1])
local c = redis.call('HMGET', KEYS[1], 'json', 'version')
return {'due', due[1], rec or '', c[1] or '', c[2] or '0', string.format('%d', now)}
"#;

/// Sets or clears the sold-out flag and records it. ARGV: '1'/'0', actor, audit cap, the
/// actor's role, operator id and note.
const SOLD_OUT_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local before = redis.call('EXISTS', KEYS[2])
if ARGV[1] == '1' then redis.call('SET', KEYS[2], '1') else redis.call('DEL', KEYS[2]) end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HINCRBY', KEYS[1], 'stamp', 1)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'at', now, 'actor', ARGV[2],
  'role', ARGV[4], 'operator_id', ARGV[5], 'note', ARGV[6], 'action', 'sold_out', 'before', before == 1 and 'true' or 'false',
  'after', ARGV[1] == '1' and 'true' or 'false')
return 1
"#;

static WRITE_CHANGE: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_CHANGE_LUA));
static DUE_CHANGE: LazyLock<Script> = LazyLock::new(|| Script::new(DUE_CHANGE_LUA));
static SOLD_OUT: LazyLock<Script> = LazyLock::new(|| Script::new(SOLD_OUT_LUA));

/// Who made a change, as its audit entry records it: the actor (an operator's name,
/// `bootstrap` for the bootstrap admin secret, or whoever scheduled a change the scheduler
/// applies), the role the call was made with, the operator's id, and the bootstrap secret's
/// `X-Floodgate-Actor` as a note. Empty parts are stored as `''` and read back as absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Who<'a> {
    pub actor: &'a str,
    pub role: Option<shared::credentials::Role>,
    pub operator_id: Option<&'a str>,
    pub note: Option<&'a str>,
}

impl<'a> From<&'a str> for Who<'a> {
    /// An actor with nothing else known (the scheduler applying a change; tests).
    fn from(actor: &'a str) -> Self {
        Who {
            actor,
            role: None,
            operator_id: None,
            note: None,
        }
    }
}

impl Who<'_> {
    /// The role, operator id and note as script arguments (`''` for absent), in that order.
    pub(super) fn extra(&self) -> [&str; 3] {
        [
            self.role.map_or("", |r| r.as_str()),
            self.operator_id.unwrap_or(""),
            self.note.unwrap_or(""),
        ]
    }
}

/// Who writes a config and why, plus what the write must find (for a scheduled change).
pub struct ConfigWrite<'a> {
    pub who: Who<'a>,
    /// `config.put` or `schedule.apply`.
    pub action: &'a str,
    /// Write only while the config is still at this version.
    pub expect_version: Option<i64>,
    /// The scheduled change being applied: id, the record it must still be, its new record.
    pub change: Option<(&'a str, &'a str, &'a str)>,
    /// The whole new pending list (a PUT that names `schedule`); `None` keeps the list.
    pub replace_schedule: Option<&'a [Change]>,
}

impl<'a> ConfigWrite<'a> {
    /// An operator's config PUT that leaves the schedule as it is.
    pub fn manual(who: impl Into<Who<'a>>) -> Self {
        ConfigWrite {
            who: who.into(),
            action: "config.put",
            expect_version: None,
            change: None,
            replace_schedule: None,
        }
    }
}

/// How a config write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// Stored; the new config version.
    Written(i64),
    /// The config changed since it was read.
    Stale,
    /// The scheduled change is no longer pending as read (cancelled, edited or applied).
    Gone,
    /// The write would change `queue_shards`, fixed at this count when the room was created.
    ShardsFixed(u32),
}

/// How a change-record write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeWrite {
    Done,
    UnknownEvent,
    /// Someone else changed the record first (the current record, '' for none).
    Conflict(String),
    /// The change is no longer pending (its record).
    NotPending(String),
    /// Its time has passed (Redis time).
    Past,
    /// Too many changes pending.
    Full,
}

impl ChangeWrite {
    pub fn is_ok(&self) -> bool {
        *self == ChangeWrite::Done
    }
}

/// A change due now, as the due script read it.
#[derive(Debug, Clone)]
pub struct DueChange {
    pub id: String,
    pub record: String,
    pub config: String,
    pub version: i64,
    pub now_ms: i64,
}

/// One audit-log entry.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Stream id: the cursor for the next page.
    pub id: String,
    #[schema(format = DateTime)]
    pub at: String,
    /// The operator's name, `bootstrap` (the bootstrap admin secret), or for
    /// `schedule.apply`/`schedule.fail` whoever scheduled the change.
    pub actor: String,
    /// The role the call was made with (`bootstrap` is `admin`); absent on the scheduler's
    /// own entries and on entries written before roles existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^(viewer|support|admin)$")]
    pub role: Option<String>,
    /// The operator credential's id, when an operator made the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator_id: Option<String>,
    /// The `X-Floodgate-Actor` the bootstrap secret sent, when it sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[schema(value_type = crate::openapi::AuditAction, inline)]
    pub action: String,
    /// The state before (a config, a change record, a registration count…), or null.
    pub before: serde_json::Value,
    pub after: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule_before: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule_after: Option<serde_json::Value>,
}

/// A stored value as JSON when it is JSON (configs, records), else as a string; '' is null.
fn as_json(raw: &str) -> serde_json::Value {
    if raw.is_empty() {
        return serde_json::Value::Null;
    }
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_owned()))
}

impl Store {
    /// Appends the audit and schedule parts of a config write to `inv` (after the config's
    /// own keys and arguments: KEYS[2..4], ARGV[12..]).
    pub(super) fn config_write_args(
        &self,
        inv: &mut shared::redis_conn::Invocation<'_>,
        event: &str,
        config: &EventConfig,
        w: &ConfigWrite<'_>,
    ) {
        inv.key(self.key(event, "cfglog"))
            .key(self.key(event, "schedq"))
            .key(self.key(event, "sched"));
        let (id, expect, record) = w.change.unwrap_or(("", "", ""));
        inv.arg(w.who.actor)
            .arg(w.action)
            .arg(w.expect_version.map(|v| v.to_string()).unwrap_or_default())
            .arg(id)
            .arg(expect)
            .arg(record)
            .arg(
                config
                    .safety_net_arrivals()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            )
            .arg(AUDIT_MAX_LEN)
            .arg(if w.replace_schedule.is_some() {
                "1"
            } else {
                ""
            })
            // ARGV[21], [22]: the room's access (registration.rs); [23] queue_shards; then the
            // schedule's triples.
            .arg(config.access.as_str())
            .arg(
                config
                    .registration_closes_ms()
                    .map(|ms| ms.to_string())
                    .unwrap_or_default(),
            )
            .arg(config.queue_shards);
        // ARGV[24..26]: the rest of who made the change.
        for part in w.who.extra() {
            inv.arg(part);
        }
        for c in w.replace_schedule.unwrap_or(&[]) {
            inv.arg(&c.id).arg(c.at_ms()).arg(c.to_json());
        }
    }

    /// Records a registration list upload (`registrations.add|remove|replace`, what it did as
    /// `after`) in the config audit log.
    pub async fn audit_registrations(
        &self,
        event: &str,
        who: Who<'_>,
        mode: &str,
        after: &str,
    ) -> Result<(), StoreError> {
        let key = self.key(event, "cfglog");
        let action = format!("registrations.{mode}");
        let [role, operator_id, note] = who.extra();
        self.with(|mut c| async move {
            let t: (i64, i64) = redis::cmd("TIME").query_async(&mut c).await?;
            let at = t.0 * 1000 + t.1 / 1000;
            redis::cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(AUDIT_MAX_LEN)
                .arg("*")
                .arg("at")
                .arg(at)
                .arg("actor")
                .arg(who.actor)
                .arg("role")
                .arg(role)
                .arg("operator_id")
                .arg(operator_id)
                .arg("note")
                .arg(note)
                .arg("action")
                .arg(&action)
                .arg("before")
                .arg("")
                .arg("after")
                .arg(after)
                .query_async::<String>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// Applies a due scheduled change: `config` is its merge onto `due.config`.
    pub async fn apply_change(
        &self,
        event: &str,
        config: &EventConfig,
        due: &DueChange,
        applied_record: &str,
        scheduled_by: &str,
    ) -> Result<WriteOutcome, StoreError> {
        let w = ConfigWrite {
            who: Who::from(scheduled_by),
            action: "schedule.apply",
            expect_version: Some(due.version),
            change: Some((&due.id, &due.record, applied_record)),
            replace_schedule: None,
        };
        // The seed was committed by the first config write; these are never used (HSETNX).
        self.put_config(event, config, "", "", &w).await
    }

    /// The earliest pending change of `event` due by Redis time.
    pub async fn due_change(&self, event: &str) -> Result<Option<DueChange>, StoreError> {
        let mut inv = DUE_CHANGE.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "schedq"))
            .key(self.key(event, "sched"));
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        if r.tag() != "due" {
            return Ok(None);
        }
        let s = |i| r.str(i).unwrap_or("").to_owned();
        Ok(Some(DueChange {
            id: s(1),
            record: s(2),
            config: s(3),
            version: r.int(4).unwrap_or(0),
            now_ms: r.int(5).unwrap_or(0),
        }))
    }

    /// Compare-and-set of one change record (see [`WRITE_CHANGE_LUA`]); `at_ms`: its time
    /// while it stays pending, `None` when this write ends it (cancel, apply failure).
    #[expect(clippy::too_many_arguments, reason = "one script's arguments, named")]
    pub async fn write_change(
        &self,
        event: &str,
        id: &str,
        expected: &str,
        record: &str,
        at_ms: Option<i64>,
        who: Who<'_>,
        action: &str,
    ) -> Result<ChangeWrite, StoreError> {
        let mut inv = WRITE_CHANGE.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "cfglog"))
            .key(self.key(event, "schedq"))
            .key(self.key(event, "sched"))
            .arg(id)
            .arg(expected)
            .arg(record)
            .arg(at_ms.map(|m| m.to_string()).unwrap_or_default())
            .arg(who.actor)
            .arg(action)
            .arg(AUDIT_MAX_LEN)
            .arg(crate::schedule::MAX_PENDING);
        for part in who.extra() {
            inv.arg(part);
        }
        let v: Value = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let r = Reply::from(v)?;
        let cur = || r.str(1).unwrap_or("").to_owned();
        Ok(match r.tag() {
            "ok" => ChangeWrite::Done,
            "unknown" => ChangeWrite::UnknownEvent,
            "conflict" => ChangeWrite::Conflict(cur()),
            "not_pending" => ChangeWrite::NotPending(cur()),
            "past" => ChangeWrite::Past,
            "full" => ChangeWrite::Full,
            _ => return Err(StoreError::Protocol("unknown change-write reply")),
        })
    }

    /// One change record, any status.
    pub async fn change(&self, event: &str, id: &str) -> Result<Option<String>, StoreError> {
        let key = self.key(event, "sched");
        let id = id.to_owned();
        self.with(|mut c| async move {
            redis::cmd("HGET")
                .arg(key)
                .arg(id)
                .query_async(&mut c)
                .await
        })
        .await
    }

    /// Redis time, ms (to check a change's time before storing it).
    pub async fn now_ms(&self) -> Result<i64, StoreError> {
        let (s, us): (i64, i64) = self
            .with(|mut c| async move { redis::cmd("TIME").query_async(&mut c).await })
            .await?;
        Ok(s * 1000 + us / 1000)
    }

    /// Sets or clears the sold-out flag, recorded in the audit log. `false`: unknown event.
    pub async fn set_sold_out(
        &self,
        event: &str,
        sold_out: bool,
        who: Who<'_>,
    ) -> Result<bool, StoreError> {
        let mut inv = SOLD_OUT.prepare_invoke();
        inv.key(self.key(event, "cfg"))
            .key(self.key(event, "sold_out"))
            .key(self.key(event, "cfglog"))
            .arg(if sold_out { "1" } else { "0" })
            .arg(who.actor)
            .arg(AUDIT_MAX_LEN);
        for part in who.extra() {
            inv.arg(part);
        }
        let n: i64 = self
            .with(|mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        if n > 0 {
            // A split queue's sub-queues refuse joins by their own copy of the flag.
            self.copy_config(event).await?;
        }
        Ok(n > 0)
    }

    /// Audit entries newest first: `limit` of them older than the entry `before` (a stream id
    /// from an earlier page), or the newest.
    pub async fn audit(
        &self,
        event: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        // Nothing is older than `0-0`, and Redis refuses the exclusive bound `(0-0`.
        if before.is_some_and(|b| b.bytes().all(|c| c == b'0' || c == b'-')) {
            return Ok(Vec::new());
        }
        let key = self.key(event, "cfglog");
        let start = before.map_or_else(|| "+".to_owned(), |b| format!("({b}"));
        let reply: redis::streams::StreamRangeReply = self
            .with(|mut c| async move {
                redis::cmd("XREVRANGE")
                    .arg(key)
                    .arg(start)
                    .arg("-")
                    .arg("COUNT")
                    .arg(limit)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(reply
            .ids
            .into_iter()
            .map(|e| {
                let f = |k: &str| e.get::<String>(k);
                let at_ms: i64 = f("at").and_then(|v| v.parse().ok()).unwrap_or(0);
                AuditEntry {
                    at: chrono::DateTime::from_timestamp_millis(at_ms)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                        .unwrap_or_default(),
                    actor: f("actor").unwrap_or_default(),
                    role: f("role").filter(|s| !s.is_empty()),
                    operator_id: f("operator_id").filter(|s| !s.is_empty()),
                    note: f("note").filter(|s| !s.is_empty()),
                    action: f("action").unwrap_or_default(),
                    before: as_json(&f("before").unwrap_or_default()),
                    after: as_json(&f("after").unwrap_or_default()),
                    change: f("change").filter(|c| !c.is_empty()),
                    version: f("version").and_then(|v| v.parse().ok()),
                    schedule_before: f("schedule_before").map(|s| as_json(&s)),
                    schedule_after: f("schedule_after").map(|s| as_json(&s)),
                    id: e.id,
                }
            })
            .collect())
    }
}
