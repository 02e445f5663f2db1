//! The fan-facing waiting room: join, status, draw commitment, receipts, dev login.
//!
//! Guarantees: one place per account per event (the join script's `HSETNX`-style check and
//! `ZADD NX` run atomically in Redis); a waiting fan's status poll that carries their place
//! receipt is answered from memory (`progress.rs`), any other is one Redis round trip; an admission is
//! claimed (and the token minted, with Redis time) only by the account it was given to;
//! with Redis down a fan gets `503 WAITING_ROOM_UNAVAILABLE` with `Retry-After`, never a hang.

use crate::draw::{ReceiptClaims, presale_score};
use crate::event_config::EventConfig;
use crate::limits::{Scope, retry_after_secs};
use crate::progress::Located;
use crate::respond::{Reply, is_json, parse_json, read_body};
use crate::state::Shared;
use crate::store::{EventSnapshot, JoinOutcome, Place, StatusOutcome, Store, StoreError, shard_of};
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::json;
use shared::error::{ErrorBody, codes};
use std::net::IpAddr;
use std::sync::Arc;

mod cadence;
mod notes;
mod side;
use cadence::Waiting;
pub use cadence::{MAX_POLL_MS, MIN_POLL_MS, expected_wait_ms, poll_after_ms, poll_cap_ms};
pub use side::{DevLoginBody, ReceiptBody, challenge, dev_login, draw, receipt};

/// Seconds a fan is told to wait before retrying while Redis is unavailable.
const REDIS_RETRY_AFTER_S: u64 = 5;

/// The fan's address for per-IP limits (see [`crate::clientip`]).
pub fn client_ip(shared: &Shared, session: &Session) -> Option<IpAddr> {
    let peer = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    let xff = session
        .req_header()
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.as_bytes());
    shared.trusted_proxies.client(peer, xff)
}

/// The fan's account from the identity (login) token in `Authorization: Bearer`.
fn account(shared: &Shared, session: &Session) -> Result<String, Reply> {
    let token = session
        .req_header()
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(shared::token::bearer)
        .ok_or_else(|| {
            Reply::error(
                401,
                codes::UNAUTHORIZED,
                "log in first (identity token required)",
            )
        })?;
    let now = chrono::Utc::now().timestamp();
    let verify = |t: &str| shared.identity.verify_until(t);
    shared.identities.account(token, now, verify).map_err(|_| {
        Reply::error(
            401,
            codes::UNAUTHORIZED,
            "identity token invalid or expired",
        )
    })
}

fn limited(shared: &Shared, scope: Scope, wait: std::time::Duration) -> Reply {
    shared
        .metrics
        .rate_limited
        .with_label_values(&[scope.label()])
        .inc();
    Reply::error(429, codes::RATE_LIMITED, "too many requests; slow down")
        .retry_after(retry_after_secs(wait))
}

/// Rate limits (IP first, before any token work) and identity.
pub(crate) async fn admit_caller(
    shared: &Shared,
    store: &Store,
    session: &Session,
    scope: Scope,
) -> Result<String, Reply> {
    let l = &shared.limits;
    let v = l.check_ip(scope, client_ip(shared, session));
    l.settle(store, v)
        .await
        .map_err(|w| limited(shared, scope, w))?;
    let account = account(shared, session)?;
    let v = l.check_account(scope, &account);
    l.settle(store, v)
        .await
        .map_err(|w| limited(shared, scope, w))?;
    Ok(account)
}

pub fn unavailable(shared: &Shared, e: &StoreError) -> Reply {
    shared.metrics.redis_errors.inc();
    tracing::debug!(error = %e, "waiting-room redis call failed");
    Reply::error(
        503,
        codes::WAITING_ROOM_UNAVAILABLE,
        "the waiting room is briefly unavailable; your place is kept, retry shortly",
    )
    .retry_after(REDIS_RETRY_AFTER_S)
}

fn unknown_event() -> Reply {
    Reply::error(404, codes::UNKNOWN_EVENT, "no waiting room for this event")
}

/// The event's live snapshot: from memory, else straight from Redis (a config made less
/// than one refresh ago).
pub async fn snapshot(
    shared: &Shared,
    store: &Store,
    event: &str,
) -> Result<Arc<EventSnapshot>, Reply> {
    if let Some(s) = shared.live.get(event) {
        return Ok(s);
    }
    match store.load_event(event).await {
        Ok(Some(s)) => {
            shared.live.upsert(event, s);
            shared.live.get(event).ok_or_else(unknown_event)
        }
        Ok(None) => Err(unknown_event()),
        Err(e) => Err(unavailable(shared, &e)),
    }
}

pub(crate) fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The join body: a proof-of-work solution when the event asks for one (else ignored).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinBody {
    pow: Option<crate::pow::Solution>,
}

/// `POST /queue/{event}/join`.
pub async fn join(shared: &Shared, store: &Store, session: &mut Session, event: &str) -> Reply {
    let account = match admit_caller(shared, store, session, Scope::Join).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let body = match read_body(session, shared.config.gateway.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.reply(),
    };
    let snap = match snapshot(shared, store, event).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Some(cfg) = &snap.config else {
        return unknown_event();
    };
    if cfg.pow_difficulty > 0 {
        let parsed: JoinBody = if body.is_empty() {
            JoinBody::default()
        } else if !is_json(session) {
            return Reply::error(415, codes::UNSUPPORTED_MEDIA_TYPE, "send application/json");
        } else {
            match parse_json(&body) {
                Ok(b) => b,
                Err(r) => return r,
            }
        };
        let Some(solution) = parsed.pow else {
            return Reply::from_error(
                403,
                ErrorBody::new(codes::POW_REQUIRED, "solve the challenge first")
                    .with("challenge_url", format!("/queue/{event}/challenge"))
                    .with("difficulty", cfg.pow_difficulty),
            );
        };
        let now = chrono::Utc::now().timestamp();
        if let Err(e) = shared
            .pow
            .verify(&solution, event, &account, cfg.pow_difficulty, now)
        {
            return Reply::error(403, codes::POW_INVALID, &e.to_string());
        }
    }
    let presale = presale_score(&snap.seed, &account);
    let session_id = shared::ids::new_id();
    // The fan's receipt (cookie or header), should this Redis have lost their place.
    let restore = place_of(shared, session, event, &account);
    let shards = snap.queue_shards();
    let outcome = store
        .join(
            event,
            shards,
            &account,
            presale,
            &session_id,
            cfg.token_ttl_s,
            restore.as_ref(),
        )
        .await;
    shared.metrics.joins.inc();
    match outcome {
        Err(e) => unavailable(shared, &e),
        Ok(JoinOutcome::UnknownEvent) => unknown_event(),
        Ok(JoinOutcome::Closed) => {
            Reply::error(409, codes::EVENT_CLOSED, "this waiting room is closed")
        }
        Ok(JoinOutcome::SoldOut) => Reply::error(409, codes::SOLD_OUT, "sold out"),
        Ok(JoinOutcome::NotRegistered { now_ms }) => {
            crate::registration::not_registered(event, cfg.registration_closes_ms(), now_ms)
        }
        Ok(JoinOutcome::Placed {
            place,
            new,
            admitted,
            ahead,
            before,
            restored,
        }) => {
            if restored {
                shared.metrics.places_restored.inc();
                tracing::info!(event, account, "place restored from the fan's receipt");
            }
            let receipt = shared.receipts.sign(&ReceiptClaims {
                evt: event.to_owned(),
                sub: account.clone(),
                sid: place.session.clone(),
                score: place.score.clone(),
                kind: place.kind.clone(),
                joined_ms: place.joined_ms,
                before: before.filter(|_| place.kind == "fifo"),
            });
            let cookie = place_cookie(event, &receipt);
            let mut body = json!({
                "event": event,
                "state": if admitted { "admitted" } else { "waiting" },
                "new": new,
                "restored": restored,
                "session": place.session,
                "kind": place.kind,
                "score": place.score,
                "joined_at": rfc3339_ms(place.joined_ms),
                "receipt": receipt,
                "status_url": format!("/queue/{event}/status"),
                "poll_after_ms": 0,
                "access": cfg.access.as_str(),
            });
            // The page reads the event's name here (every page load joins); status polls,
            // the hottest path, do not carry it.
            if let Some(name) = &cfg.name {
                body["name"] = json!(name);
            }
            // Tell a waiting fan where they stand now, and when to ask again: the first poll
            // of a fan far back comes late instead of one second after every join.
            if let (false, Some(ahead)) = (admitted, ahead) {
                let ahead = ahead + elsewhere(&snap, shards, &account, &place.score, &place.kind);
                let w = Waiting::of(&snap, cfg, ahead);
                body["state"] = json!(w.state);
                body["position"] = json!(ahead + 1);
                body["ahead"] = json!(ahead);
                body["eta_seconds"] = json!(w.eta_s);
                body["poll_after_ms"] = json!(w.poll_ms);
                body["admit_per_minute"] = json!(w.rate);
            } else if !admitted {
                body["poll_after_ms"] = json!(MIN_POLL_MS);
            }
            if !admitted {
                notes::add(&mut body, &snap, cfg);
            }
            Reply::json(if new { 201 } else { 200 }, &body).header("set-cookie", cookie)
        }
    }
}

/// Header and cookie carrying a fan's place receipt on status polls: with it the gateway
/// answers a waiting fan from memory (`progress.rs`); without it, from Redis.
pub const PLACE_HEADER: &str = "x-floodgate-place";
pub const PLACE_COOKIE: &str = "fg_place";

/// The place receipt as a cookie scoped to this event's queue paths, so a browser's status
/// polls carry it without any script.
fn place_cookie(event: &str, receipt: &str) -> String {
    format!(
        "{PLACE_COOKIE}={receipt}; Max-Age=172800; Path=/queue/{event}/; HttpOnly; Secure; SameSite=Lax"
    )
}

/// The caller's place receipt for `event`, when it is genuine and theirs.
fn place_of(
    shared: &Shared,
    session: &Session,
    event: &str,
    account: &str,
) -> Option<ReceiptClaims> {
    let h = &session.req_header().headers;
    let raw = h
        .get(PLACE_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            h.get_all(http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(|v| shared::token::cookie(v, PLACE_COOKIE))
        })?;
    shared
        .receipts
        .verify(raw)
        .filter(|c| c.evt == event && c.sub == account)
}

/// `GET /queue/{event}/status`.
pub async fn status(shared: &Shared, store: &Store, session: &Session, event: &str) -> Reply {
    let account = match admit_caller(shared, store, session, Scope::Status).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let snap = match snapshot(shared, store, event).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Some(cfg) = &snap.config else {
        return unknown_event();
    };
    shared.metrics.status_polls.inc();
    let shards = snap.queue_shards();
    if let Some(place) = place_of(shared, session, event, &account)
        && let Located::Waiting { rank, queue_len } = snap.progress.locate(
            &account,
            shard_of(&account, shards),
            &place.score,
            &place.kind,
            place.before,
        )
    {
        shared.metrics.status_from_memory.inc();
        return waiting(&snap, cfg, event, rank, queue_len);
    }
    match store.status(event, shards, &account, cfg.token_ttl_s).await {
        Err(e) => unavailable(shared, &e),
        Ok(StatusOutcome::NotJoined) => Reply::from_error(
            404,
            ErrorBody::new(codes::NOT_IN_QUEUE, "join the queue first")
                .with("join_url", format!("/queue/{event}/join")),
        ),
        Ok(StatusOutcome::Expired) => Reply::json(
            200,
            &json!({"event": event, "state": "expired", "poll_after_ms": 0,
                    "join_url": format!("/queue/{event}/join")}),
        ),
        Ok(StatusOutcome::Waiting {
            rank,
            queue_len,
            place,
        }) if shards > 1 => {
            // The rank and length are the fan's sub-queue's: add the others' from memory.
            let rank = rank + elsewhere(&snap, shards, &account, &place.score, &place.kind);
            let queue_len = snap.progress.queue_len().max(queue_len).max(rank + 1);
            waiting(&snap, cfg, event, rank, queue_len)
        }
        Ok(StatusOutcome::Waiting {
            rank, queue_len, ..
        }) => waiting(&snap, cfg, event, rank, queue_len),
        Ok(StatusOutcome::Admitted {
            place,
            now_ms,
            expires_ms,
        }) => admitted(shared, event, &account, &place, now_ms, expires_ms),
    }
}

/// A split queue: the fans ahead of this place in the other sub-queues (0 when not split or
/// when the view cannot say yet: the first second of a room).
fn elsewhere(snap: &EventSnapshot, shards: u32, account: &str, score: &str, kind: &str) -> u64 {
    if shards <= 1 {
        return 0;
    }
    score
        .parse::<f64>()
        .ok()
        .and_then(|s| {
            snap.progress
                .waiting_elsewhere(shard_of(account, shards), s, kind)
        })
        .unwrap_or(0)
}

/// A waiting fan's status answer.
fn waiting(
    snap: &EventSnapshot,
    cfg: &EventConfig,
    event: &str,
    rank: u64,
    queue_len: u64,
) -> Reply {
    let w = Waiting::of(snap, cfg, rank);
    let mut body = json!({
            "event": event,
            "state": w.state,
            "position": rank + 1,
            "ahead": rank,
            "queue_length": queue_len,
            "eta_seconds": w.eta_s,
            "poll_after_ms": w.poll_ms,
            "admit_per_minute": w.rate,
    });
    notes::add(&mut body, snap, cfg);
    Reply::json(200, &body)
}

fn admitted(
    shared: &Shared,
    event: &str,
    account: &str,
    place: &Place,
    now_ms: i64,
    expires_ms: i64,
) -> Reply {
    let now_s = now_ms / 1000;
    let ttl_s = u64::try_from((expires_ms - now_ms) / 1000)
        .unwrap_or(0)
        .max(1);
    // A repeat poll of a fan already admitted (and maybe refreshed through checkout) gets a
    // token of the same admission: it keeps the admission time.
    let admitted_s = place.admitted_ms.map_or(now_s, |ms| ms / 1000);
    let exp_s = now_s.saturating_add(i64::try_from(ttl_s).unwrap_or(i64::MAX));
    match shared
        .tokens
        .mint_session(account, &place.session, event, admitted_s, now_s, exp_s)
    {
        Ok((token, claims)) => {
            let cookie = admission_cookie(&token, ttl_s);
            Reply::json(
                200,
                &json!({
                    "event": event,
                    "state": "admitted",
                    "token": token,
                    "expires_at": rfc3339_ms(claims.exp * 1000),
                    "expires_in_s": ttl_s,
                    "next": format!("/e/{event}/shop"),
                    "poll_after_ms": 0,
                }),
            )
            .header("set-cookie", cookie)
        }
        Err(e) => {
            tracing::error!(error = %e, "minting an admission token failed");
            Reply::error(500, codes::INTERNAL, "could not issue the admission")
        }
    }
}

/// The `Set-Cookie` value carrying an admission token for browsers.
pub fn admission_cookie(token: &str, max_age_s: u64) -> String {
    format!(
        "{}={token}; Max-Age={max_age_s}; Path=/; HttpOnly; Secure; SameSite=Lax",
        shared::headers::ADMISSION_COOKIE
    )
}
