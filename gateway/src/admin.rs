//! The admin listener (separate port, never the public one): live event config, early
//! revocation, the sold-out flag, registration lists (`registration.rs`), health and metrics.
//!
//! Guarantees: every admin call needs an operator credential whose role covers the route, or
//! the bootstrap admin secret (`auth.rs`; missing or wrong → `401`, a role too low → `403
//! ROLE_FORBIDDEN`, both before the body is read, so a refused call changes nothing and
//! writes no audit entry); every change that is made writes exactly one entry in the config
//! audit log naming who made it ([`Who`]); a config PUT is validated as a whole and nothing
//! is stored unless every field is valid (`422` lists the problems); once stored, every
//! instance applies it within one refresh (`refresh_ms`, 250 ms by default).

use crate::event_config::EventConfigInput;
use crate::queue::unavailable;
use crate::respond::{Reply, is_json, parse_json, read_body, send};
use crate::routes::{self, AdminRoute};
use crate::state::Shared;
use crate::store::{Store, Who};
use async_trait::async_trait;
use auth::{Caller, Refusal};
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, ErrorType, Result};
use pingora_proxy::{ProxyHttp, Session};
use serde::Deserialize;
use serde_json::json;
use shared::credentials::AuthFailures;
use shared::error::{ErrorBody, codes};
use std::sync::Arc;

mod audit;
pub mod auth;
pub mod operators;
mod schedule;

/// The header naming the person behind a call made with the bootstrap secret (booking's
/// convention); kept as the audit entry's `note`. Ignored for operator credentials, whose
/// name is the actor.
pub const ACTOR_HEADER: &str = "x-floodgate-actor";
const MAX_ACTOR: usize = 200;

/// The bootstrap secret's `X-Floodgate-Actor`: 1..=200 visible characters, trimmed. Missing:
/// `400 ACTOR_REQUIRED` when `required`, else `None`; present but unusable: `400`.
fn note(session: &Session, required: bool) -> std::result::Result<Option<String>, Reply> {
    let refuse = || {
        Reply::error(
            400,
            codes::ACTOR_REQUIRED,
            "name the operator in X-Floodgate-Actor (1 to 200 visible characters)",
        )
    };
    let Some(raw) = session.req_header().headers.get(ACTOR_HEADER) else {
        return if required { Err(refuse()) } else { Ok(None) };
    };
    let raw = raw.to_str().map_err(|_| refuse())?.trim();
    let ok =
        !raw.is_empty() && raw.chars().count() <= MAX_ACTOR && raw.chars().all(|c| !c.is_control());
    ok.then(|| Some(raw.to_owned())).ok_or_else(refuse)
}

/// The note an audit entry of `caller`'s call carries: the bootstrap secret's
/// `X-Floodgate-Actor` (required where `required`); never anything for an operator, whose
/// header is not trusted. A header that is present but unusable is refused (`400`) for every
/// caller, as the document says, so bad input never passes silently.
pub(crate) fn caller_note(
    session: &Session,
    caller: &Caller,
    required: bool,
) -> std::result::Result<Option<String>, Reply> {
    if caller.is_bootstrap() {
        note(session, required)
    } else {
        note(session, false).map(|_| None)
    }
}

/// The audit log's view of `caller` (and the bootstrap secret's note).
pub(crate) fn who<'a>(caller: &'a Caller, note: Option<&'a str>) -> Who<'a> {
    Who {
        actor: &caller.actor,
        role: Some(caller.role),
        operator_id: caller.operator_id.as_deref(),
        note,
    }
}

/// A `422` listing the problems of scheduled changes; nothing was stored.
fn schedule_refused(problems: &[crate::schedule::Problem]) -> Reply {
    Reply::from_error(
        422,
        ErrorBody::new(
            codes::VALIDATION_FAILED,
            "invalid scheduled change; nothing stored",
        )
        .with("errors", serde_json::to_value(problems).unwrap_or_default()),
    )
}

/// The body of `PUT /admin/events/{event}/sold_out`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SoldOutBody {
    sold_out: bool,
}

/// `405` with the `Allow` header RFC 9110 asks for.
fn method_not_allowed(path: &str) -> Reply {
    Reply::error(405, codes::METHOD_NOT_ALLOWED, "method not allowed")
        .header("allow", routes::admin_allow(path))
}

pub struct AdminApp {
    pub shared: Arc<Shared>,
    pub store: Store,
    /// Failed credential checks per peer address (`None`: the limit is off).
    pub failures: Option<AuthFailures>,
}

/// What an admitted admin call does (its route, owned, so the handler may borrow the
/// session mutably).
enum Action {
    GetConfig(String),
    PutConfig(String),
    Revoke(String),
    SoldOut(String),
    PutRegistrations(String),
    GetRegistrations(String),
    Audit(String),
    Schedule(String),
    AddChange(String),
    Change(String, String),
    EditChange(String, String),
    CancelChange(String, String),
}

impl AdminApp {
    /// Routes a request and checks its caller: the answer when it ends here (health, metrics,
    /// this document, a refusal: `Err`), else what to do and for whom (`None`: the readiness
    /// probe, which needs no credential).
    fn decide(&self, session: &Session) -> std::result::Result<Option<(Action, Caller)>, Reply> {
        let req = session.req_header();
        let route = routes::admin(&req.method, req.uri.path());
        match route {
            AdminRoute::Healthz => return Err(Reply::json(200, &json!({"status": "ok"}))),
            AdminRoute::Readyz => return Ok(None),
            AdminRoute::OpenApi => {
                return Err(crate::respond::openapi(crate::respond::OPENAPI_ADMIN));
            }
            AdminRoute::Metrics => {
                return Err(Reply::bytes(
                    200,
                    "text/plain; version=0.0.4",
                    Bytes::from(self.shared.metrics.render()),
                    "no-store",
                ));
            }
            AdminRoute::NotFound => {
                return Err(Reply::error(404, codes::NOT_FOUND, "not found"));
            }
            // The paths answered without credentials refuse other methods without them too.
            AdminRoute::MethodNotAllowed if !req.uri.path().starts_with("/admin/") => {
                return Err(method_not_allowed(req.uri.path()));
            }
            _ => {}
        }
        let caller = self.authenticate(session).map_err(|r| r.reply())?;
        if let Some(required) = auth::required_role(&route)
            && !caller.role.allows(required)
        {
            let refusal = Refusal::Role {
                role: caller.role,
                required,
            };
            self.shared.metrics.admin_auth_failed(refusal.reason());
            return Err(refusal.reply());
        }
        let action = match route {
            AdminRoute::UnknownEvent => {
                return Err(Reply::error(404, codes::UNKNOWN_EVENT, "invalid event id"));
            }
            AdminRoute::GetConfig(e) => Action::GetConfig(e.to_owned()),
            AdminRoute::PutConfig(e) => Action::PutConfig(e.to_owned()),
            AdminRoute::Revoke(e) => Action::Revoke(e.to_owned()),
            AdminRoute::SoldOut(e) => Action::SoldOut(e.to_owned()),
            AdminRoute::PutRegistrations(e) => Action::PutRegistrations(e.to_owned()),
            AdminRoute::GetRegistrations(e) => Action::GetRegistrations(e.to_owned()),
            AdminRoute::Audit(e) => Action::Audit(e.to_owned()),
            AdminRoute::Schedule(e) => Action::Schedule(e.to_owned()),
            AdminRoute::AddChange(e) => Action::AddChange(e.to_owned()),
            AdminRoute::Change(e, id) => Action::Change(e.to_owned(), id.to_owned()),
            AdminRoute::EditChange(e, id) => Action::EditChange(e.to_owned(), id.to_owned()),
            AdminRoute::CancelChange(e, id) => Action::CancelChange(e.to_owned(), id.to_owned()),
            AdminRoute::MethodNotAllowed
            | AdminRoute::Healthz
            | AdminRoute::Readyz
            | AdminRoute::OpenApi
            | AdminRoute::Metrics
            | AdminRoute::NotFound => return Err(method_not_allowed(req.uri.path())),
        };
        Ok(Some((action, caller)))
    }

    /// Checks the caller's credential: the peer address's failure budget first (a blocked
    /// address learns nothing, not even that a credential is valid), then the credential;
    /// a failed check counts against the address. Every refusal is counted by reason.
    fn authenticate(&self, session: &Session) -> std::result::Result<Caller, Refusal> {
        let authorization = session.req_header().headers.get("authorization");
        // The listener's own peer: admin clients connect directly, so no X-Forwarded-For.
        let ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let limiter = self.failures.as_ref().zip(ip);
        let result = match limiter.and_then(|(f, ip)| f.blocked(ip)) {
            Some(secs) if authorization.is_some() => Err(Refusal::RateLimited(secs)),
            _ => auth::check(
                authorization.map(|v| v.as_bytes()),
                self.shared.config.admin_token.as_ref(),
                &self.shared.live.operators,
                std::time::Instant::now(),
                chrono::Utc::now().timestamp_millis(),
            ),
        };
        if let Err(refusal) = &result {
            if refusal.is_failed_check()
                && let Some((f, ip)) = limiter
            {
                f.failed(ip);
            }
            self.shared.metrics.admin_auth_failed(refusal.reason());
            tracing::debug!(
                reason = refusal.reason(),
                peer = ?ip,
                "admin call refused before its handler"
            );
        }
        result
    }

    async fn get_config(&self, event: &str) -> Reply {
        match self.store.load_event(event).await {
            Err(e) => unavailable(&self.shared, &e),
            Ok(None) => Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event"),
            Ok(Some(s)) => Reply::json(
                200,
                &json!({
                    "event": event,
                    "config": s.config,
                    "version": s.version,
                    "seed_hash": s.seed_hash,
                    "effective_admit_per_minute": s.effective_rate(),
                    "sold_out": s.sold_out,
                    "schedule": s.pending,
                    "safety_net_state": s.safety_net_state,
                    "opens_at": s.config.as_ref().and_then(|c| {
                        crate::schedule::opening(c, &s.pending, chrono::Utc::now())
                    }),
                }),
            ),
        }
    }

    async fn body(&self, session: &mut Session) -> std::result::Result<Bytes, Reply> {
        if !is_json(session) {
            return Err(Reply::error(
                415,
                codes::UNSUPPORTED_MEDIA_TYPE,
                "send Content-Type: application/json",
            ));
        }
        read_body(session, self.shared.config.gateway.max_body_bytes)
            .await
            .map_err(|e| e.reply())
    }

    async fn put_config(&self, session: &mut Session, event: &str, caller: &Caller) -> Reply {
        let note = match caller_note(session, caller, false) {
            Ok(n) => n,
            Err(r) => return r,
        };
        let who = who(caller, note.as_deref());
        let body = match self.body(session).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let mut input: EventConfigInput = match parse_json(&body) {
            Ok(i) => i,
            Err(r) => return r,
        };
        let schedule = input.schedule.take();
        let cfg = match input.validate(
            self.shared.tokens.default_ttl_s(),
            self.shared.config.gateway.default_claim_deadline_s,
        ) {
            Ok(c) => c,
            Err(errors) => {
                return Reply::from_error(
                    422,
                    ErrorBody::new(
                        codes::VALIDATION_FAILED,
                        "invalid event config; nothing applied",
                    )
                    .with("errors", serde_json::to_value(errors).unwrap_or_default()),
                );
            }
        };
        // A fresh seed is offered every time; Redis keeps the first one (HSETNX), so the
        // published commitment never changes once made.
        let (seed, seed_hash) = match crate::draw::new_seed() {
            Ok(s) => s,
            Err(_) => return Reply::error(500, codes::INTERNAL, "no randomness available"),
        };
        let changes = match schedule {
            None => None,
            Some(list) => match self.new_schedule(&cfg, list, who.actor).await {
                Ok(c) => Some(c),
                Err(r) => return r,
            },
        };
        let write = crate::store::ConfigWrite {
            replace_schedule: changes.as_deref(),
            ..crate::store::ConfigWrite::manual(who)
        };
        match self
            .store
            .put_config(event, &cfg, &seed, &seed_hash, &write)
            .await
        {
            Err(e) => unavailable(&self.shared, &e),
            Ok(crate::store::WriteOutcome::ShardsFixed(n)) => Reply::from_error(
                409,
                ErrorBody::new(
                    codes::QUEUE_SHARDS_FIXED,
                    "queue_shards is fixed when the room is created; nothing applied",
                )
                .with("queue_shards", n),
            ),
            Ok(crate::store::WriteOutcome::Stale | crate::store::WriteOutcome::Gone) => {
                Reply::error(500, codes::INTERNAL, "config write refused unexpectedly")
            }
            Ok(crate::store::WriteOutcome::Written(version)) => {
                tracing::info!(
                    event,
                    version,
                    mode = cfg.mode.as_str(),
                    admit_per_minute = cfg.admit_per_minute,
                    "event config updated"
                );
                // Apply here at once; other instances pick it up on their next refresh.
                if let Ok(Some(s)) = self.store.load_event(event).await {
                    self.shared.live.upsert(event, s);
                }
                self.get_config(event).await
            }
        }
    }

    async fn revoke(&self, session: &mut Session, event: &str, caller: &Caller) -> Reply {
        let note = match caller_note(session, caller, false) {
            Ok(n) => n,
            Err(r) => return r,
        };
        let who = who(caller, note.as_deref());
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            account: Option<String>,
            session: Option<String>,
        }
        let body = match self.body(session).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let b: Body = match parse_json(&body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let (field, account, sid) = match (&b.account, &b.session) {
            (Some(a), None) if shared::identity::is_valid_account(a) => {
                (format!("a:{a}"), Some(a.as_str()), None)
            }
            (None, Some(s)) if shared::ids::is_valid_slug(s) => {
                (format!("s:{s}"), None, Some(s.as_str()))
            }
            _ => {
                return Reply::error(
                    422,
                    codes::VALIDATION_FAILED,
                    "give exactly one of a valid `account` or `session`",
                );
            }
        };
        // Keep the revocation as long as any token could still be valid.
        let keep_s = 86_400 + self.shared.config.tokens.leeway_s;
        match self
            .store
            .revoke(event, &field, account, sid, keep_s, who)
            .await
        {
            Err(e) => unavailable(&self.shared, &e),
            Ok(None) => Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event"),
            Ok(Some(at)) => {
                if let Ok(Some(s)) = self.store.load_event(event).await {
                    self.shared.live.upsert(event, s);
                }
                Reply::json(
                    200,
                    &json!({"event": event, "revoked": field, "revoked_at": at}),
                )
            }
        }
    }

    async fn sold_out(&self, session: &mut Session, event: &str, caller: &Caller) -> Reply {
        let note = match caller_note(session, caller, false) {
            Ok(n) => n,
            Err(r) => return r,
        };
        let who = who(caller, note.as_deref());
        let body = match self.body(session).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let b: SoldOutBody = match parse_json(&body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        match self.store.set_sold_out(event, b.sold_out, who).await {
            Err(e) => unavailable(&self.shared, &e),
            Ok(false) => Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event"),
            Ok(true) => Reply::json(200, &json!({"event": event, "sold_out": b.sold_out})),
        }
    }
}

#[async_trait]
impl ProxyHttp for AdminApp {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        let (action, caller) = match self.decide(session) {
            Ok(Some(a)) => a,
            Ok(None) => {
                let ok = self.store.ping().await.is_ok();
                let reply = Reply::json(if ok { 200 } else { 503 }, &json!({"redis": ok}));
                return send(session, reply).await;
            }
            Err(reply) => return send(session, reply).await,
        };
        let c = &caller;
        let reply = match action {
            Action::GetConfig(e) => self.get_config(&e).await,
            Action::PutConfig(e) => self.put_config(session, &e, c).await,
            Action::Revoke(e) => self.revoke(session, &e, c).await,
            Action::SoldOut(e) => self.sold_out(session, &e, c).await,
            Action::PutRegistrations(e) => {
                crate::registration::upload(&self.shared, &self.store, session, &e, c).await
            }
            Action::GetRegistrations(e) => {
                crate::registration::count(&self.shared, &self.store, session, &e).await
            }
            Action::Audit(e) => self.audit(session, &e).await,
            Action::Schedule(e) => self.schedule(&e).await,
            Action::AddChange(e) => self.add_change(session, &e, c).await.unwrap_or_else(|r| r),
            Action::Change(e, id) => self.change(&e, &id).await,
            Action::EditChange(e, id) => self
                .edit_change(session, &e, &id, c)
                .await
                .unwrap_or_else(|r| r),
            Action::CancelChange(e, id) => self
                .cancel_change(session, &e, &id, c)
                .await
                .unwrap_or_else(|r| r),
        };
        send(session, reply).await
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        // Every admin request is answered in `request_filter`.
        Err(Error::explain(
            ErrorType::InternalError,
            "admin listener has no upstream",
        ))
    }
}
