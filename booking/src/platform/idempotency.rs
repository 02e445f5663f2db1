//! Idempotency keys for write endpoints (IETF `Idempotency-Key` draft), reusable by any
//! handler: orders, bids, payments.
//!
//! # Guarantees
//! - Keys are scoped per account (two fans may pick the same string) and kept at least
//!   `[idempotency] retention_h` hours (default 24), then purged by [`purge_expired`].
//! - The first completed result is stored (status + exact body bytes) **in the same
//!   transaction as the business change** ([`Claim::complete_tx`]), so "the order exists" and
//!   "its response is stored" commit or vanish together. A repeat gets those bytes back
//!   byte-for-byte: a stored `2xx` replays as `200`, anything else with its own status, with
//!   the header `Idempotent-Replayed: true`.
//! - Same key, different request (method + path + canonical body) → `422
//!   IDEMPOTENCY_KEY_REUSED`; a repeat while the first attempt is still running → `409
//!   IDEMPOTENCY_IN_FLIGHT` (with `Retry-After`); no key or an empty one → `400
//!   IDEMPOTENCY_KEY_MISSING`; a key longer than 255 characters or with non-printable characters
//!   → `422 VALIDATION_FAILED`.
//! - The claim is one statement **before** any business work, so a retry of a request that
//!   succeeded is replayed and never re-evaluated ("sold out" for an order you already have
//!   cannot happen). Two ways to claim:
//!   - [`claim_tx`], when the answer is known inside one business transaction (orders): the
//!     claim is the transaction's first statement, so it commits with the business change and
//!     its completion, or vanishes with them on a rollback or a crash (no release, no stale
//!     claim, no transaction of its own). A concurrent duplicate waits on the key's unique
//!     index until the first transaction ends and then replays its answer, instead of getting
//!     `409 IDEMPOTENCY_IN_FLIGHT`.
//!   - [`begin`], when work outside Postgres lies between claim and answer (a provider call):
//!     the claim commits on its own with `synchronous_commit = off` (the business
//!     transaction's durable commit flushes it anyway; a claim lost in a crash only lets a
//!     retry start afresh), and a duplicate meanwhile is `409`. Work done **outside** Postgres
//!     that must never repeat needs its own durable record before the call, as payments keep.
//! - An attempt that fails after [`begin`] calls [`Claim::release`], deleting its claim so a
//!   retry with the same key proceeds. If the process dies in between, the claim goes stale
//!   and a retry older than `[idempotency] stale_after_s` (default 60) takes it over; the old
//!   attempt, should it wake up, can no longer complete (its `claim_id` no longer matches), so
//!   its transaction rolls back.
//!
//! # What is stored
//! Only results that changed something are stored: success, plus any outcome a caller
//! explicitly completes. Business refusals that changed nothing (`409 SOLD_OUT`,
//! `INSUFFICIENT_STOCK`, `HOLD_EXPIRED`, validation errors, `5xx`) **release** the key instead:
//! re-running such a request is harmless, and storing "sold out" for 24 h would keep refusing
//! a fan after stock came back (cancelled orders return units). This deviates from a literal
//! reading of the draft ("replay the first result") on purpose; see docs/decisions.md.
//! A caller whose refusal *did* change state (e.g. a declined payment attempt that was
//! recorded) completes the claim with that refusal instead, and it is replayed like a success.
//!
//! # Usage
//! ```ignore
//! let fp = Fingerprint::of_json(&method, uri.path(), &body);
//! let claim = match idempotency::begin(&state.idempotency, account, &key, &fp).await? {
//!     Begin::Replay(stored) => return Ok(stored.into_response()),
//!     Begin::Started(claim) => claim,
//! };
//! let result = db::retry(3, || async {
//!     let mut tx = state.pool.begin().await?;
//!     let view = do_the_work(&mut tx).await?;          // conditional UPDATEs etc.
//!     let body = serde_json::to_vec(&view).map_err(ApiError::unexpected)?;
//!     claim.complete_tx(&mut tx, StatusCode::CREATED, &body).await?;
//!     tx.commit().await?;
//!     Ok::<_, TxError>(body)
//! }).await;
//! match result {
//!     Ok(body) => Ok(idempotency::respond(StatusCode::CREATED, body)),
//!     Err(e) => { claim.release(&state.pool).await; Err(e.into()) }
//! }
//! ```

use crate::platform::db::TxError;
use crate::platform::error::{ApiError, ApiResult};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use shared::error::codes;
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;

mod purge;
mod request;
pub use purge::{PURGE_BATCH, PurgeKeys, purge_expired};
pub use request::{Fingerprint, IdempotencyKey};

/// Request header carrying the key.
pub const HEADER: &str = "idempotency-key";
/// Response header set on replays.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The pseudo-account ops calls' keys are scoped to (operators share them).
pub const OPS_ACCOUNT: &str = "ops:admin";
/// Longest accepted key.
pub const MAX_KEY_LEN: usize = 255;

/// `[idempotency]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdempotencySettings {
    /// Hours a key (and its stored response) is kept; at least 24 per the contract.
    pub retention_h: u32,
    /// A claim still `in_flight` after this many seconds is presumed dead (crashed process)
    /// and may be taken over by a retry.
    pub stale_after_s: u32,
    /// How often the purge job runs.
    pub purge_interval_ms: u64,
    /// Rows deleted per purge statement.
    pub purge_batch: i64,
}

impl Default for IdempotencySettings {
    fn default() -> Self {
        Self {
            retention_h: 24,
            stale_after_s: 60,
            purge_interval_ms: 60_000,
            purge_batch: 1000,
        }
    }
}

/// What [`begin`] decided.
#[derive(Debug)]
pub enum Begin {
    /// This request owns the key: do the work, then [`Claim::complete_tx`] or
    /// [`Claim::release`].
    Started(Claim),
    /// The key already has a stored result: answer with it.
    Replay(Replay),
}

/// Ownership of an in-flight key by one attempt.
#[derive(Debug, Clone)]
pub struct Claim {
    account_id: String,
    key: String,
    claim_id: String,
}

/// A stored response.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The status the first attempt answered with.
    pub status: StatusCode,
    pub body: Bytes,
}

impl IntoResponse for Replay {
    fn into_response(self) -> Response {
        let status = if self.status.is_success() {
            StatusCode::OK
        } else {
            self.status
        };
        let mut resp = respond(status, self.body);
        resp.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        resp
    }
}

/// A JSON response from already-serialised bytes (the exact bytes that were stored).
pub fn respond(status: StatusCode, body: impl Into<Bytes>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.into(),
    )
        .into_response()
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    fingerprint: Vec<u8>,
    state: String,
    response_status: Option<i16>,
    response_body: Option<Vec<u8>>,
}

/// The idempotency-key store: the pool and its settings. Cheap to clone.
#[derive(Clone)]
pub struct Idempotency {
    pub pool: PgPool,
    pub settings: Arc<IdempotencySettings>,
}

impl Idempotency {
    pub fn new(pool: PgPool, settings: IdempotencySettings) -> Self {
        Self {
            pool,
            settings: Arc::new(settings),
        }
    }
}

/// Claims `key` for `account` (one statement in its own, asynchronously committed
/// transaction), or tells why not. For work whose answer is only known after something
/// outside Postgres (a provider call); when the answer is known inside one transaction, use
/// [`claim_tx`].
///
/// Errors: `422 IDEMPOTENCY_KEY_REUSED` (different request), `409 IDEMPOTENCY_IN_FLIGHT`
/// (another attempt is running), `503` when Postgres is unavailable.
#[tracing::instrument(skip_all, fields(idempotency.outcome))]
pub async fn begin(
    keys: &Idempotency,
    account: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> ApiResult<Begin> {
    // The row can vanish between the two statements below (the running attempt released
    // it); then the INSERT simply runs again. Bounded: a key cannot flip forever.
    for _ in 0..3 {
        // The claim commits asynchronously: losing it in a crash is harmless (the attempt that
        // owned it fails to complete and its client retries), and the business transaction's
        // durable commit flushes the WAL up to and including this claim anyway. So a request
        // waits for one disk flush, not two.
        let mut tx = keys
            .pool
            .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
            .await?;
        let claimed = insert_claim(&mut tx, &keys.settings, account, key, fingerprint).await?;
        tx.commit().await?;
        if let Some(claim) = claimed {
            return Ok(Begin::Started(claim));
        }
        let mut conn = keys.pool.acquire().await?;
        if let Some(decided) = existing(&mut conn, account, key, fingerprint).await? {
            return decided;
        }
    }
    Err(in_flight())
}

/// Claims `key` for `account` **inside the caller's business transaction** (one statement;
/// nothing of its own to commit). The claim commits or vanishes with the business change, so
/// an attempt that fails, or dies, needs no [`Claim::release`]: its rollback is the release.
/// Complete it with [`Claim::complete_tx`] before the commit.
///
/// A concurrent duplicate (same account and key) does not get `409 IDEMPOTENCY_IN_FLIGHT`: its
/// claim waits on the key's unique index until this transaction ends, then replays the stored
/// answer (this one committed) or runs itself (this one rolled back). A committed claim still
/// in flight (a pay request waiting for its provider) is `409` as with [`begin`].
///
/// `Ok(Begin::Replay)` and errors leave the caller's transaction with nothing of ours in it;
/// the caller rolls it back and answers. Errors: `422 IDEMPOTENCY_KEY_REUSED`, `409
/// IDEMPOTENCY_IN_FLIGHT` ([`TxError::Api`]), or the database error ([`TxError::Db`]).
#[tracing::instrument(skip_all, fields(idempotency.outcome))]
pub async fn claim_tx(
    conn: &mut PgConnection,
    settings: &IdempotencySettings,
    account: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Begin, TxError> {
    for _ in 0..3 {
        if let Some(claim) = insert_claim(conn, settings, account, key, fingerprint).await? {
            return Ok(Begin::Started(claim));
        }
        // READ COMMITTED: this statement sees what the blocking transaction committed.
        if let Some(decided) = existing(conn, account, key, fingerprint).await? {
            return decided.map_err(TxError::Api);
        }
    }
    Err(TxError::Api(in_flight()))
}

/// Inserts a fresh claim, or takes over a stale one of the *same* request. A live claim or a
/// finished key is left alone (`None`).
async fn insert_claim(
    conn: &mut PgConnection,
    settings: &IdempotencySettings,
    account: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> sqlx::Result<Option<Claim>> {
    let claim_id = shared::ids::new_id();
    let claimed: Option<String> =
        sqlx::query_scalar(crate::claim_key_sql!("$1", "$2", "$3", "$4", "$5"))
            .bind(account)
            .bind(key.as_str())
            .bind(fingerprint.as_bytes())
            .bind(&claim_id)
            .bind(f64::from(settings.stale_after_s))
            .fetch_optional(conn)
            .await?;
    if claimed.is_none() {
        return Ok(None);
    }
    tracing::Span::current().record("idempotency.outcome", "started");
    Ok(Some(Claim {
        account_id: account.to_owned(),
        key: key.as_str().to_owned(),
        claim_id,
    }))
}

/// The claim statement (account, key, fingerprint, claim id, `stale_after_s` as SQL
/// parameters): a fresh `in_flight` row, or the takeover of a stale claim of the *same*
/// request; no row when the key is live or finished ([`existing`] says which). A statement
/// that claims and works at once (the pay request's start) embeds it as a CTE.
#[macro_export]
macro_rules! claim_key_sql {
    ($account:literal, $key:literal, $fp:literal, $claim:literal, $stale_s:literal) => {
        concat!(
            "INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id)
         VALUES (",
            $account,
            ", ",
            $key,
            ", ",
            $fp,
            ", 'in_flight', ",
            $claim,
            ")
         ON CONFLICT (account_id, key) DO UPDATE
            SET claim_id = EXCLUDED.claim_id, locked_at = clock_timestamp()
          WHERE idempotency_keys.state = 'in_flight'
            AND idempotency_keys.fingerprint = EXCLUDED.fingerprint
            AND idempotency_keys.locked_at
                < clock_timestamp() - make_interval(secs => ",
            $stale_s,
            ")
         RETURNING claim_id"
        )
    };
}

/// What an existing key means for this request: its stored answer, `422` for another
/// request, `409` while it is in flight. `None` when the key vanished meanwhile (claim again).
pub async fn existing(
    conn: &mut PgConnection,
    account: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> sqlx::Result<Option<ApiResult<Begin>>> {
    let row: Option<KeyRow> = sqlx::query_as(
        "SELECT fingerprint, state, response_status, response_body
           FROM idempotency_keys WHERE account_id = $1 AND key = $2",
    )
    .bind(account)
    .bind(key.as_str())
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    if row.fingerprint != fingerprint.as_bytes() {
        tracing::Span::current().record("idempotency.outcome", "reused");
        return Ok(Some(Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this Idempotency-Key was already used for a different request",
        ))));
    }
    if row.state == "done"
        && let (Some(status), Some(body)) = (row.response_status, row.response_body)
    {
        tracing::Span::current().record("idempotency.outcome", "replay");
        let status = u16::try_from(status)
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::OK);
        return Ok(Some(Ok(Begin::Replay(Replay {
            status,
            body: Bytes::from(body),
        }))));
    }
    tracing::Span::current().record("idempotency.outcome", "in_flight");
    Ok(Some(Err(in_flight())))
}

fn in_flight() -> ApiError {
    ApiError::conflict(
        codes::IDEMPOTENCY_IN_FLIGHT,
        "a request with this Idempotency-Key is still being processed; retry shortly",
    )
    .retry_after(1)
}

impl Claim {
    /// The claim `claim_id` that a statement of the caller's took with [`claim_key_sql!`]
    /// (it returned that id).
    pub fn claimed(account: &str, key: &IdempotencyKey, claim_id: String) -> Self {
        Self {
            account_id: account.to_owned(),
            key: key.as_str().to_owned(),
            claim_id,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// This attempt's claim id: a caller that stores the response in its own statement (the
    /// order insert) matches the row as [`Claim::complete_tx`] does, `claim_id` and
    /// `state = 'in_flight'`, and answers [`Claim::lost`] when it matched none.
    pub fn claim_id(&self) -> &str {
        &self.claim_id
    }

    /// The answer when this attempt lost its claim to a takeover (see [`Claim::complete_tx`]).
    pub fn lost() -> ApiError {
        in_flight()
    }

    pub fn account(&self) -> &str {
        &self.account_id
    }

    /// Stores the response inside the caller's business transaction. Fails (so the caller's
    /// transaction must roll back) with `409 IDEMPOTENCY_IN_FLIGHT` if this attempt lost its
    /// claim to a takeover after being presumed dead.
    pub async fn complete_tx(
        &self,
        conn: &mut PgConnection,
        status: StatusCode,
        body: &[u8],
    ) -> Result<(), TxError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys
                SET state = 'done', response_status = $4, response_body = $5,
                    completed_at = clock_timestamp()
              WHERE account_id = $1 AND key = $2 AND claim_id = $3 AND state = 'in_flight'",
        )
        .bind(&self.account_id)
        .bind(&self.key)
        .bind(&self.claim_id)
        .bind(i16::try_from(status.as_u16()).unwrap_or(500))
        .bind(body)
        .execute(conn)
        .await?
        .rows_affected();
        if done == 1 {
            Ok(())
        } else {
            Err(TxError::Api(in_flight()))
        }
    }

    /// Stores the response on its own (for results that are not part of a transaction).
    pub async fn complete(&self, pool: &PgPool, status: StatusCode, body: &[u8]) -> ApiResult<()> {
        let mut conn = pool.acquire().await?;
        self.complete_tx(&mut conn, status, body)
            .await
            .map_err(ApiError::from)
    }

    /// Gives the key back after a failed attempt so a retry can run. Best effort: if this
    /// fails, the claim goes stale and is taken over after `stale_after_s`.
    pub async fn release(&self, pool: &PgPool) {
        let res = sqlx::query(
            "DELETE FROM idempotency_keys
              WHERE account_id = $1 AND key = $2 AND claim_id = $3 AND state = 'in_flight'",
        )
        .bind(&self.account_id)
        .bind(&self.key)
        .bind(&self.claim_id)
        .execute(pool)
        .await;
        if let Err(e) = res {
            tracing::warn!(error = ?e, "failed to release idempotency claim; it will go stale");
        }
    }
}
