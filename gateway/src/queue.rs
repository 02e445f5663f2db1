//! The fan-facing waiting room: join, status, draw commitment, receipts, dev login.
//!
//! Guarantees: one place per account per event (the join script's `HSETNX`-style check and
//! `ZADD NX` run atomically in Redis); a status poll is one Redis round trip; an admission is
//! claimed (and the token minted, with Redis time) only by the account it was given to;
//! with Redis down a fan gets `503 WAITING_ROOM_UNAVAILABLE` with `Retry-After`, never a hang.

use crate::draw::{ReceiptClaims, presale_score};
use crate::event_config::Mode;
use crate::limits::{Scope, retry_after_secs};
use crate::respond::{Reply, is_json, parse_json, read_body};
use crate::state::Shared;
use crate::store::{EventSnapshot, JoinOutcome, Place, StatusOutcome, Store, StoreError};
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::json;
use shared::error::{ErrorBody, codes};
use std::net::IpAddr;
use std::sync::Arc;

/// Seconds a fan is told to wait before retrying while Redis is unavailable.
const REDIS_RETRY_AFTER_S: u64 = 5;

pub fn client_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
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
    shared.identity.verify(token).map_err(|_| {
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
fn admit_caller(shared: &Shared, session: &Session, scope: Scope) -> Result<String, Reply> {
    shared
        .limits
        .check_ip(scope, client_ip(session))
        .map_err(|w| limited(shared, scope, w))?;
    let account = account(shared, session)?;
    shared
        .limits
        .check_account(scope, &account)
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

fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    pow: Option<crate::pow::Solution>,
}

/// `POST /queue/{event}/join`.
pub async fn join(shared: &Shared, store: &Store, session: &mut Session, event: &str) -> Reply {
    let account = match admit_caller(shared, session, Scope::Join) {
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
    let outcome = store
        .join(event, &account, presale, &session_id, cfg.token_ttl_s)
        .await;
    shared.metrics.joins.inc();
    match outcome {
        Err(e) => unavailable(shared, &e),
        Ok(JoinOutcome::UnknownEvent) => unknown_event(),
        Ok(JoinOutcome::Closed) => {
            Reply::error(409, codes::EVENT_CLOSED, "this waiting room is closed")
        }
        Ok(JoinOutcome::SoldOut) => Reply::error(409, codes::SOLD_OUT, "sold out"),
        Ok(JoinOutcome::Placed {
            place,
            new,
            admitted,
        }) => {
            let receipt = shared.receipts.sign(&ReceiptClaims {
                evt: event.to_owned(),
                sub: account.clone(),
                sid: place.session.clone(),
                score: place.score.clone(),
                kind: place.kind.clone(),
                joined_ms: place.joined_ms,
            });
            Reply::json(
                if new { 201 } else { 200 },
                &json!({
                    "event": event,
                    "state": if admitted { "admitted" } else { "waiting" },
                    "new": new,
                    "session": place.session,
                    "kind": place.kind,
                    "score": place.score,
                    "joined_at": rfc3339_ms(place.joined_ms),
                    "receipt": receipt,
                    "status_url": format!("/queue/{event}/status"),
                    "poll_after_ms": 1000,
                }),
            )
        }
    }
}

/// How long a fan should wait before the next poll: grows with the distance to the front
/// (and with the expected wait), capped at 30 s, with ±20 % jitter so that fans who joined
/// together do not poll together. `jitter` is uniform in `[-1, 1]`.
pub fn poll_after_ms(ahead: u64, rate_per_min: u64, jitter: f64) -> u64 {
    let by_position = 1000.0 + (ahead as f64).sqrt() * 100.0;
    let by_eta = match rate_per_min {
        0 => 0.0,
        r => (ahead as f64 * 60_000.0 / r as f64) / 10.0,
    };
    let base = by_position.max(by_eta).clamp(1000.0, 30_000.0);
    (base * (1.0 + 0.2 * jitter.clamp(-1.0, 1.0))) as u64
}

/// Seconds until `ahead` fans have been admitted at `rate_per_min` (`None` when paused).
pub fn eta_seconds(ahead: u64, rate_per_min: u64) -> Option<u64> {
    (rate_per_min > 0).then(|| (ahead * 60).div_ceil(rate_per_min))
}

fn jitter() -> f64 {
    rand::random::<f64>() * 2.0 - 1.0
}

/// `GET /queue/{event}/status`.
pub async fn status(shared: &Shared, store: &Store, session: &Session, event: &str) -> Reply {
    let account = match admit_caller(shared, session, Scope::Status) {
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
    match store.status(event, &account, cfg.token_ttl_s).await {
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
            rank, queue_len, ..
        }) => {
            let rate = snap.effective_rate();
            let state = if snap.sold_out {
                "sold_out"
            } else {
                match cfg.mode {
                    Mode::Paused => "paused",
                    Mode::Closed => "closed",
                    Mode::Queue | Mode::Passthrough => "waiting",
                }
            };
            let moving = state == "waiting";
            let eta = if moving {
                eta_seconds(rank, rate)
            } else {
                None
            };
            let poll = poll_after_ms(rank, if moving { rate } else { 0 }, jitter());
            Reply::json(
                200,
                &json!({
                    "event": event,
                    "state": state,
                    "position": rank + 1,
                    "ahead": rank,
                    "queue_length": queue_len,
                    "eta_seconds": eta,
                    "poll_after_ms": poll,
                    "admit_per_minute": rate,
                }),
            )
        }
        Ok(StatusOutcome::Admitted {
            place,
            now_ms,
            expires_ms,
        }) => admitted(shared, event, &account, &place, now_ms, expires_ms),
    }
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
    match shared
        .tokens
        .mint(account, &place.session, event, now_s, ttl_s)
    {
        Ok((token, claims)) => {
            let cookie = format!(
                "{}={token}; Max-Age={ttl_s}; Path=/; HttpOnly; Secure; SameSite=Lax",
                shared::headers::ADMISSION_COOKIE
            );
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

/// `GET /queue/{event}/draw`: the seed commitment, and the seed once the sale has started.
pub async fn draw(shared: &Shared, store: &Store, event: &str) -> Reply {
    match store.draw(event).await {
        Err(e) => unavailable(shared, &e),
        Ok(None) => unknown_event(),
        Ok(Some(d)) => Reply::json(
            200,
            &json!({
                "event": event,
                "sale_start": rfc3339_ms(d.sale_start_ms),
                "seed_hash": d.seed_hash,
                "revealed": d.seed.is_some(),
                "seed": d.seed,
                "hash": "seed_hash = hex(SHA-256(hex_decode(seed)))",
                "score": "score(account) = (u64_be(HMAC-SHA256(key = hex_decode(seed), msg = account)[0..8]) >> 12) - 2^52; lower scores are admitted first; arrivals after the sale start score their arrival time in ms",
            }),
        ),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiptBody {
    receipt: String,
}

/// `POST /queue/{event}/receipt {"receipt"}`: checks a place receipt (no Redis needed).
pub async fn receipt(shared: &Shared, session: &mut Session, event: &str) -> Reply {
    let body = match read_body(session, shared.config.gateway.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.reply(),
    };
    let b: ReceiptBody = match parse_json(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    match shared.receipts.verify(&b.receipt) {
        Some(c) if c.evt == event => Reply::json(200, &json!({"valid": true, "place": c})),
        _ => Reply::json(200, &json!({"valid": false})),
    }
}

/// `GET /queue/{event}/challenge`: a proof-of-work challenge for this fan.
pub async fn challenge(shared: &Shared, store: &Store, session: &Session, event: &str) -> Reply {
    let account = match admit_caller(shared, session, Scope::Status) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let snap = match snapshot(shared, store, event).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let difficulty = snap.config.as_ref().map_or(0, |c| c.pow_difficulty);
    let now = chrono::Utc::now().timestamp();
    Reply::json(
        200,
        &json!({
            "challenge": shared.pow.challenge(event, &account, now),
            "difficulty": difficulty,
            "algorithm": "find solution such that SHA-256(challenge + \":\" + solution) starts with `difficulty` zero bits",
        }),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DevLoginBody {
    account: String,
}

/// `POST /dev/login {"account"}` (dev mode only): a login token for local use.
pub async fn dev_login(shared: &Shared, session: &mut Session) -> Reply {
    if !shared.dev_login {
        return Reply::error(404, codes::NOT_FOUND, "not found");
    }
    let body = match read_body(session, shared.config.gateway.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.reply(),
    };
    let b: DevLoginBody = match parse_json(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !shared::identity::is_valid_account(&b.account) {
        return Reply::error(
            422,
            codes::VALIDATION_FAILED,
            "account: 1-128 characters of letters, digits, - _ . @",
        );
    }
    match shared
        .identity
        .dev_mint(&b.account, chrono::Utc::now().timestamp())
    {
        Some(token) => Reply::json(200, &json!({"account": b.account, "token": token})),
        None => Reply::error(
            404,
            codes::NOT_FOUND,
            "dev login needs an HS256 identity key",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_interval_grows_with_position_and_is_capped() {
        let mut last = 0;
        for ahead in [0, 10, 100, 1_000, 10_000, 100_000, 2_000_000] {
            let p = poll_after_ms(ahead, 600, 0.0);
            assert!(p >= last, "{ahead}: {p} < {last}");
            assert!((1000..=30_000).contains(&p));
            last = p;
        }
        assert_eq!(poll_after_ms(0, 600, 0.0), 1000);
        assert_eq!(poll_after_ms(10_000_000, 600, 0.0), 30_000);
        // Jitter spreads polls by ±20 %.
        assert_eq!(poll_after_ms(10_000_000, 600, 1.0), 36_000);
        assert_eq!(poll_after_ms(10_000_000, 600, -1.0), 24_000);
        // Paused (rate 0) still grows with position.
        assert!(poll_after_ms(10_000, 0, 0.0) > poll_after_ms(10, 0, 0.0));
    }

    #[test]
    fn eta() {
        assert_eq!(eta_seconds(0, 600), Some(0));
        assert_eq!(eta_seconds(600, 600), Some(60));
        assert_eq!(eta_seconds(1, 600), Some(1));
        assert_eq!(eta_seconds(5, 0), None);
    }
}
