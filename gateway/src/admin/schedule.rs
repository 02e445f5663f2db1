//! The schedule endpoints: list, add, read, edit and cancel a pending config change
//! (`schedule.rs` holds the rules; every write is a compare-and-set in Redis).

use super::auth::Caller;
use super::{AdminApp, caller_note, schedule_refused, who};
use crate::event_config::EventConfig;
use crate::queue::unavailable;
use crate::respond::{Reply, parse_json};
use crate::schedule::{
    Change, ChangeInput, ChangeStatus, MAX_PENDING, check_at, check_chain, view,
};
use crate::store::{ChangeWrite, EventSnapshot};
use chrono::{DateTime, Utc};
use pingora_proxy::Session;
use serde_json::json;
use shared::error::{ErrorBody, codes};

fn not_found() -> Reply {
    Reply::error(
        404,
        codes::CHANGE_NOT_FOUND,
        "no scheduled change with this id",
    )
}

fn not_pending(record: &str) -> Reply {
    let status = serde_json::from_str::<Change>(record)
        .map(|c| c.status)
        .unwrap_or(ChangeStatus::Applied);
    Reply::from_error(
        409,
        ErrorBody::new(
            codes::CHANGE_NOT_PENDING,
            "this change is no longer pending; nothing changed",
        )
        .with("status", serde_json::to_value(status).unwrap_or_default()),
    )
}

fn conflict() -> Reply {
    Reply::error(
        409,
        codes::CONFLICT,
        "the change was edited meanwhile; read it again",
    )
}

impl AdminApp {
    fn defaults(&self) -> (u64, u64) {
        (
            self.shared.tokens.default_ttl_s(),
            self.shared.config.gateway.default_claim_deadline_s,
        )
    }

    /// The event's config and pending changes, straight from Redis.
    async fn current(&self, event: &str) -> Result<(EventConfig, EventSnapshot), Reply> {
        match self.store.load_event(event).await {
            Err(e) => Err(unavailable(&self.shared, &e)),
            Ok(Some(s)) => match s.config.clone() {
                Some(c) => Ok((c, s)),
                None => Err(Reply::error(
                    404,
                    codes::UNKNOWN_EVENT,
                    "no config for this event",
                )),
            },
            Ok(None) => Err(Reply::error(
                404,
                codes::UNKNOWN_EVENT,
                "no config for this event",
            )),
        }
    }

    async fn redis_now(&self) -> Result<(i64, DateTime<Utc>), Reply> {
        let ms = self
            .store
            .now_ms()
            .await
            .map_err(|e| unavailable(&self.shared, &e))?;
        Ok((ms, DateTime::from_timestamp_millis(ms).unwrap_or_default()))
    }

    /// The records of a config PUT's `schedule` (the whole new pending list), checked
    /// against the config being put.
    pub(super) async fn new_schedule(
        &self,
        cfg: &EventConfig,
        list: Vec<ChangeInput>,
        actor: &str,
    ) -> Result<Vec<Change>, Reply> {
        let (now_ms, now) = self.redis_now().await?;
        let changes: Vec<Change> = list
            .into_iter()
            .map(|c| new_change(c, actor, now))
            .collect();
        let mut problems: Vec<_> = changes
            .iter()
            .flat_map(|c| check_at(&c.id, c.at, now_ms))
            .collect();
        if changes.len() > MAX_PENDING {
            problems.push(too_many("schedule"));
        }
        problems.extend(check_chain(cfg, &changes, self.defaults()));
        if problems.is_empty() {
            Ok(changes)
        } else {
            Err(schedule_refused(&problems))
        }
    }

    pub(super) async fn schedule(&self, event: &str) -> Reply {
        match self.current(event).await {
            Err(r) => r,
            Ok((_, s)) => Reply::json(200, &json!({"event": event, "pending": s.pending})),
        }
    }

    async fn change_input(&self, session: &mut Session) -> Result<ChangeInput, Reply> {
        let body = self.body(session).await?;
        parse_json(&body)
    }

    pub(super) async fn add_change(
        &self,
        session: &mut Session,
        event: &str,
        caller: &Caller,
    ) -> Result<Reply, Reply> {
        let note = caller_note(session, caller, true)?;
        let who = who(caller, note.as_deref());
        let input = self.change_input(session).await?;
        let (cfg, snap) = self.current(event).await?;
        let (now_ms, now) = self.redis_now().await?;
        let change = new_change(input, who.actor, now);
        let mut all = snap.pending.clone();
        all.push(change.clone());
        let mut problems = check_at(&change.id, change.at, now_ms);
        problems.extend(check_chain(&cfg, &all, self.defaults()));
        if !problems.is_empty() {
            return Ok(schedule_refused(&problems));
        }
        let w = self
            .store
            .write_change(
                event,
                &change.id,
                "",
                &change.to_json(),
                Some(change.at_ms()),
                who,
                "schedule.add",
            )
            .await;
        Ok(self.after_write(event, w, &change, 201).await)
    }

    pub(super) async fn change(&self, event: &str, id: &str) -> Reply {
        match self.store.change(event, id).await {
            Err(e) => unavailable(&self.shared, &e),
            Ok(None) => not_found(),
            Ok(Some(raw)) => match serde_json::from_str::<Change>(&raw) {
                Ok(c) => Reply::json(200, &view(&c)),
                Err(_) => Reply::error(500, codes::INTERNAL, "stored change unreadable"),
            },
        }
    }

    /// The stored record of a pending change (raw, to compare and set) and the change.
    async fn pending_change(&self, event: &str, id: &str) -> Result<(String, Change), Reply> {
        let raw = match self.store.change(event, id).await {
            Err(e) => return Err(unavailable(&self.shared, &e)),
            Ok(None) => return Err(not_found()),
            Ok(Some(r)) => r,
        };
        let c: Change = serde_json::from_str(&raw)
            .map_err(|_| Reply::error(500, codes::INTERNAL, "stored change unreadable"))?;
        if c.status != ChangeStatus::Pending {
            return Err(not_pending(&raw));
        }
        Ok((raw, c))
    }

    pub(super) async fn edit_change(
        &self,
        session: &mut Session,
        event: &str,
        id: &str,
        caller: &Caller,
    ) -> Result<Reply, Reply> {
        let note = caller_note(session, caller, true)?;
        let who = who(caller, note.as_deref());
        let input = self.change_input(session).await?;
        let (raw, old) = self.pending_change(event, id).await?;
        let (cfg, snap) = self.current(event).await?;
        let (now_ms, now) = self.redis_now().await?;
        let mut change = old;
        change.at = input.at;
        change.set = input.set;
        change.edited_by = Some(who.actor.to_owned());
        change.edited_at = Some(now);
        let mut all: Vec<Change> = snap.pending.into_iter().filter(|c| c.id != id).collect();
        all.push(change.clone());
        let mut problems = check_at(id, change.at, now_ms);
        problems.extend(check_chain(&cfg, &all, self.defaults()));
        if !problems.is_empty() {
            return Ok(schedule_refused(&problems));
        }
        let w = self
            .store
            .write_change(
                event,
                id,
                &raw,
                &change.to_json(),
                Some(change.at_ms()),
                who,
                "schedule.edit",
            )
            .await;
        Ok(self.after_write(event, w, &change, 200).await)
    }

    pub(super) async fn cancel_change(
        &self,
        session: &Session,
        event: &str,
        id: &str,
        caller: &Caller,
    ) -> Result<Reply, Reply> {
        let note = caller_note(session, caller, true)?;
        let who = who(caller, note.as_deref());
        let (raw, mut change) = self.pending_change(event, id).await?;
        let (_, now) = self.redis_now().await?;
        change.status = ChangeStatus::Cancelled;
        change.done_by = Some(who.actor.to_owned());
        change.done_at = Some(now);
        let w = self
            .store
            .write_change(
                event,
                id,
                &raw,
                &change.to_json(),
                None,
                who,
                "schedule.cancel",
            )
            .await;
        Ok(self.after_write(event, w, &change, 200).await)
    }

    /// The answer to a change write; installs the new pending list on this instance at once.
    async fn after_write(
        &self,
        event: &str,
        w: Result<ChangeWrite, crate::store::StoreError>,
        change: &Change,
        status: u16,
    ) -> Reply {
        match w {
            Err(e) => unavailable(&self.shared, &e),
            Ok(ChangeWrite::Done) => {
                if let Ok(Some(s)) = self.store.load_event(event).await {
                    self.shared.live.upsert(event, s);
                }
                Reply::json(status, &view(change))
            }
            Ok(ChangeWrite::UnknownEvent) => {
                Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event")
            }
            Ok(ChangeWrite::NotPending(raw)) => not_pending(&raw),
            Ok(ChangeWrite::Conflict(_)) => conflict(),
            Ok(ChangeWrite::Past) => schedule_refused(&check_at(&change.id, change.at, i64::MAX)),
            Ok(ChangeWrite::Full) => schedule_refused(&[too_many(&change.id)]),
        }
    }
}

fn too_many(id: &str) -> crate::schedule::Problem {
    crate::schedule::Problem {
        change: id.to_owned(),
        field: "schedule".into(),
        problem: format!("at most {MAX_PENDING} changes may be pending"),
    }
}

fn new_change(input: ChangeInput, actor: &str, now: DateTime<Utc>) -> Change {
    Change {
        id: shared::ids::new_id(),
        at: input.at,
        set: input.set,
        status: ChangeStatus::Pending,
        scheduled_by: actor.to_owned(),
        scheduled_at: now,
        edited_by: None,
        edited_at: None,
        done_by: None,
        done_at: None,
        problems: Vec::new(),
    }
}
