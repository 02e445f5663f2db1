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
//! - The claim is one committed statement **before** any business work, so a retry of a request
//!   that succeeded is replayed and never re-evaluated ("sold out" for an order you already
//!   have cannot happen). The claim commits with `synchronous_commit = off`: the business
//!   transaction's durable commit flushes it anyway, and a claim lost in a database crash only
//!   lets a retry start afresh. Work done **outside** Postgres that must never repeat (a
//!   payment provider call) needs its own durable record before the call, as payments keep.
//! - An attempt that fails calls [`Claim::release`], deleting its claim so a retry with the same
//!   key proceeds. If the process dies in between, the claim goes stale and a retry older than
//!   `[idempotency] stale_after_s` (default 60) takes it over; the old attempt, should it wake
//!   up, can no longer complete (its `claim_id` no longer matches), so its transaction rolls
//!   back.
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

mod request;
pub use request::{Fingerprint, IdempotencyKey};

/// Request header carrying the key.
pub const HEADER: &str = "idempotency-key";
/// Response header set on replays.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
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

/// The retention job: deletes keys older than `[idempotency] retention_h`.
pub struct PurgeKeys(pub Idempotency);

#[async_trait::async_trait]
impl crate::platform::jobs::Job for PurgeKeys {
    fn name(&self) -> &'static str {
        "idempotency-purge"
    }

    fn period(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0.settings.purge_interval_ms.max(1000))
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        purge_expired(&self.0.pool, &self.0.settings)
            .await
            .map(|_| ())
    }
}

/// Claims `key` for `account` (one statement in its own, asynchronously committed
/// transaction), or tells why not.
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
    let settings = &keys.settings;
    // The row can vanish between the two statements below (the running attempt released
    // it); then the INSERT simply runs again. Bounded: a key cannot flip forever.
    for _ in 0..3 {
        let claim_id = shared::ids::new_id();
        // The claim commits asynchronously: losing it in a crash is harmless (the attempt that
        // owned it fails to complete and its client retries), and the business transaction's
        // durable commit flushes the WAL up to and including this claim anyway. So a request
        // waits for one disk flush, not two.
        let mut tx = keys
            .pool
            .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
            .await?;
        // Insert a fresh claim, or take over a stale one of the *same* request. A live claim
        // or a finished key is left alone (no row returned).
        let claimed: Option<String> = sqlx::query_scalar(
            "INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id)
             VALUES ($1, $2, $3, 'in_flight', $4)
             ON CONFLICT (account_id, key) DO UPDATE
                SET claim_id = EXCLUDED.claim_id, locked_at = clock_timestamp()
              WHERE idempotency_keys.state = 'in_flight'
                AND idempotency_keys.fingerprint = EXCLUDED.fingerprint
                AND idempotency_keys.locked_at
                    < clock_timestamp() - make_interval(secs => $5)
             RETURNING claim_id",
        )
        .bind(account)
        .bind(key.as_str())
        .bind(fingerprint.as_bytes())
        .bind(&claim_id)
        .bind(f64::from(settings.stale_after_s))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        if claimed.is_some() {
            tracing::Span::current().record("idempotency.outcome", "started");
            return Ok(Begin::Started(Claim {
                account_id: account.to_owned(),
                key: key.as_str().to_owned(),
                claim_id,
            }));
        }
        let row: Option<KeyRow> = sqlx::query_as(
            "SELECT fingerprint, state, response_status, response_body
               FROM idempotency_keys WHERE account_id = $1 AND key = $2",
        )
        .bind(account)
        .bind(key.as_str())
        .fetch_optional(&keys.pool)
        .await?;
        let Some(row) = row else { continue };
        if row.fingerprint != fingerprint.as_bytes() {
            tracing::Span::current().record("idempotency.outcome", "reused");
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was already used for a different request",
            ));
        }
        if row.state == "done"
            && let (Some(status), Some(body)) = (row.response_status, row.response_body)
        {
            tracing::Span::current().record("idempotency.outcome", "replay");
            let status = u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::OK);
            return Ok(Begin::Replay(Replay {
                status,
                body: Bytes::from(body),
            }));
        }
        tracing::Span::current().record("idempotency.outcome", "in_flight");
        return Err(in_flight());
    }
    Err(in_flight())
}

fn in_flight() -> ApiError {
    ApiError::conflict(
        codes::IDEMPOTENCY_IN_FLIGHT,
        "a request with this Idempotency-Key is still being processed; retry shortly",
    )
    .retry_after(1)
}

impl Claim {
    pub fn key(&self) -> &str {
        &self.key
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

/// Deletes keys older than the retention, in `FOR UPDATE SKIP LOCKED` batches (safe on many
/// instances). Returns the number deleted.
pub async fn purge_expired(pool: &PgPool, settings: &IdempotencySettings) -> anyhow::Result<u64> {
    use anyhow::Context;
    let hours = i32::try_from(settings.retention_h.max(24)).unwrap_or(24);
    let batch = settings.purge_batch.max(1);
    let mut total = 0;
    loop {
        let n = sqlx::query(
            "DELETE FROM idempotency_keys WHERE (account_id, key) IN (
                 SELECT account_id, key FROM idempotency_keys
                  WHERE created_at < clock_timestamp() - make_interval(hours => $1)
                  LIMIT $2
                  FOR UPDATE SKIP LOCKED)",
        )
        .bind(hours)
        .bind(batch)
        .execute(pool)
        .await
        .context("failed to purge idempotency keys")?
        .rows_affected();
        total += n;
        if n < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(total);
        }
    }
}
