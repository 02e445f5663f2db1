//! The waiting room's side endpoints: the draw commitment, receipt checks, proof-of-work
//! challenges and dev login.

use super::{admit_caller, rfc3339_ms, snapshot, unavailable, unknown_event};
use crate::limits::Scope;
use crate::respond::{Reply, read_json};
use crate::state::Shared;
use crate::store::Store;
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::json;
use shared::error::codes;

/// `GET /queue/{event}/draw`: the seed commitment, and the seed once the sale has started.
///
/// Unauthenticated, so it costs Redis at most one command per event per second per instance
/// (`answers.rs`), and none for an event this instance does not know (made-up names).
pub async fn draw(shared: &Shared, store: &Store, event: &str) -> Reply {
    let Some(snap) = shared.live.get(event) else {
        return unknown_event();
    };
    let access = snap.config.as_ref().map(|c| c.access).unwrap_or_default();
    shared
        .answers
        .get_or_fill(event, snap.version, || {
            draw_from_redis(shared, store, event, access)
        })
        .await
}

async fn draw_from_redis(
    shared: &Shared,
    store: &Store,
    event: &str,
    access: crate::event_config::Access,
) -> Reply {
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
                "access": access.as_str(),
                "registered": (access == crate::event_config::Access::Registered).then_some(
                    "registered room: every registered account's first join scores score(account), before or after the sale start; a later join (after an admission lapsed or a revocation) scores its arrival time"
                ),
            }),
        ),
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptBody {
    receipt: String,
}

/// `POST /queue/{event}/receipt {"receipt"}`: checks a place receipt (no Redis needed).
pub async fn receipt(shared: &Shared, session: &mut Session, event: &str) -> Reply {
    let b: ReceiptBody = match read_json(session, shared.config.gateway.max_body_bytes).await {
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
    let account = match admit_caller(shared, store, session, Scope::Status).await {
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DevLoginBody {
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._@-]+$")]
    account: String,
}

/// `POST /dev/login {"account"}` (dev mode only): a login token for local use.
pub async fn dev_login(shared: &Shared, session: &mut Session) -> Reply {
    if !shared.dev_login {
        return Reply::error(404, codes::NOT_FOUND, "not found");
    }
    let b: DevLoginBody = match read_json(session, shared.config.gateway.max_body_bytes).await {
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
