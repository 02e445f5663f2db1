//! Auctions (DESIGN.md section 5): creation, reads, bids, closing and live prices.
//!
//! What this module guarantees:
//! - **One decision per bid, made by the data store.** A cold auction's bid is decided by one
//!   conditional `UPDATE` (status, `end_time > clock_timestamp()`, minimum next amount,
//!   anti-sniping) that also writes the bid row in the same statement ([`bids`]); a hot
//!   auction's bid is decided by one Redis Lua script that also appends the bid to the
//!   auction's stream ([`hot`]). Rust never reads a price and then writes one.
//! - **The minimum next bid** is `start_price` while nobody leads, and
//!   `current_price + min_increment` afterwards. Amounts are integers in `1..=MAX_MONEY`, so
//!   no sum overflows in Postgres and every value is exact inside Lua (doubles are exact
//!   below 2^53).
//! - **Anti-sniping**: an accepted bid placed less than [`SNIPING_WINDOW_S`] before the end
//!   moves the end to `now + SNIPING_WINDOW_S`, at most `max_extensions` times.
//! - **Closing** happens once ([`closer`]) with an `auction.closed` outbox row in the same
//!   statement; no bid is accepted after the end, whether or not the closer has run yet.
//! - **One admission, one event**: an auction belongs to an event (`event`, required on
//!   creation, which needs a token of that event). Reading it, bidding on it and its live
//!   WebSocket need an admission token of its event (`403 WRONG_EVENT`, nothing changed);
//!   an auction created before events were required opens for no token.
//! - **Idempotent bids**: a bid's request id is the bidder-scoped `Idempotency-Key`; the first
//!   accepted result is replayed (`200`, same body) and the key cannot be reused for another
//!   amount (`422`).

//!
//! Layout: [`model`] (statuses, the auction row, the bidding rules as pure functions),
//! [`error`] (the domain's error enum), [`repo`] (SQL on the `auctions` table), [`bids`] (the
//! bid decision, cold path SQL), [`hot`] (the Redis path and its stream consumer), [`closer`],
//! [`live`] (live prices and their WebSocket), [`runtime`] (per-process rate limiter and
//! caches), [`http`] (handlers: the only place an [`AuctionError`] becomes an `ApiError`),
//! [`jobs`].

pub mod bids;
pub mod closer;
pub mod error;
pub mod handles;
pub mod hot;
pub mod http;
pub mod jobs;
pub mod live;
pub mod model;
pub mod repo;
pub mod runtime;

pub use error::AuctionError;
pub use http::router;
pub use jobs::jobs;
pub use model::{
    AUCTION_COLUMNS, AuctionRow, AuctionStatus, MAX_EXTENSIONS_LIMIT, MAX_MONEY, Meta,
    SNIPING_WINDOW_S, min_next_bid, rfc3339,
};
pub use runtime::AuctionRuntime;

use crate::platform::auth::Auth;
use crate::platform::idempotency::Idempotency;
use crate::platform::redis::Redis;
use anyhow::Context;
use error::StatementContext as _;
use prometheus::{IntCounterVec, Opts, Registry};
use serde::Deserialize;
use shared::config::{RedisSettings, TokenSettings};
use sqlx::PgPool;
use std::sync::Arc;

/// `[auctions]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuctionSettings {
    /// Per-bidder rate limit (sustained bids per second) and burst.
    pub bids_per_second: u32,
    pub bid_burst: u32,
    /// `max_extensions` when the seller does not say.
    pub default_max_extensions: i32,
    /// Longest time from creation to `end_time`.
    pub max_duration_days: i64,
    /// Closer: how often it runs and how many auctions one batch closes.
    pub closer_interval_ms: u64,
    pub closer_batch: i64,
    /// Hot-bid consumer: poll interval when idle, entries per batch, and how long a stream
    /// entry may stay unacknowledged by a (presumably dead) consumer before another takes it.
    pub consumer_interval_ms: u64,
    pub consumer_batch: usize,
    pub consumer_claim_idle_ms: u64,
    /// This process's consumer name in the stream consumer group; empty picks a unique one.
    pub consumer_name: String,
    /// Live prices: at most one update per this many milliseconds per auction per node.
    pub live_coalesce_ms: u64,
    /// Messages a WebSocket client may fall behind before it is dropped.
    pub live_client_buffer: usize,
    /// A WebSocket send that takes longer than this drops the client.
    pub live_send_timeout_ms: u64,
    /// How long the Redis state of a closed hot auction (and its replay records) is kept.
    pub hot_retention_s: u64,
    /// Key of the fans' pseudonymous handles ([`handles`]). Empty: derived from the current
    /// admission-token key (then a token-key rotation changes the handles of open auctions).
    pub handle_secret: secrecy::SecretString,
    /// Hot bids pass the script what Postgres has recorded (the floor a Redis rollback must
    /// not undercut); this process's copy of it is re-read after this many milliseconds.
    pub recorded_refresh_ms: u64,
}

impl Default for AuctionSettings {
    fn default() -> Self {
        Self {
            bids_per_second: 5,
            bid_burst: 5,
            default_max_extensions: 30,
            max_duration_days: 90,
            closer_interval_ms: 1000,
            closer_batch: 500,
            consumer_interval_ms: 50,
            consumer_batch: 500,
            consumer_claim_idle_ms: 30_000,
            consumer_name: String::new(),
            live_coalesce_ms: 150,
            live_client_buffer: 32,
            live_send_timeout_ms: 2000,
            hot_retention_s: 7 * 24 * 3600,
            handle_secret: secrecy::SecretString::from(""),
            recorded_refresh_ms: 1000,
        }
    }
}

/// The auctions domain's metrics.
#[derive(Clone)]
pub struct AuctionMetrics {
    /// `bids_total{path}`: accepted bids, by path (`cold`/`hot`).
    pub bids: IntCounterVec,
    /// `refusals_total{code}`: the process-wide counter of client-facing refusals, which the
    /// app registers once and every domain that refuses requests shares.
    pub refusals: IntCounterVec,
}

impl AuctionMetrics {
    /// Registers `bids_total`; `refusals` is the shared, already registered counter.
    pub fn register(
        registry: &Registry,
        refusals: IntCounterVec,
    ) -> Result<Self, prometheus::Error> {
        let bids = IntCounterVec::new(Opts::new("bids_total", "Accepted bids"), &["path"])?;
        registry.register(Box::new(bids.clone()))?;
        Ok(Self { bids, refusals })
    }
}

/// What the app layer hands the auctions domain: platform clients and the metrics.
pub struct Clients {
    pub pool: PgPool,
    pub redis: Redis,
    pub auth: Auth,
    pub idempotency: Idempotency,
    pub metrics: AuctionMetrics,
}

/// Everything the auctions domain's handlers and jobs use; the app layer builds it and
/// handlers take it with `State<AuctionsState>` (axum `FromRef`). Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct AuctionsState(Arc<Inner>);

pub struct Inner {
    pub pool: PgPool,
    pub redis: Redis,
    pub auth: Auth,
    /// Idempotency keys of auction creation (bids use the bids table itself).
    pub idempotency: Idempotency,
    pub settings: AuctionSettings,
    pub metrics: AuctionMetrics,
    /// What fans see of other fans' accounts.
    pub handles: handles::Handles,
    /// This node's live-price fan-out.
    pub live: Arc<live::LiveHub>,
    /// This process's name in the hot-bid stream's consumer group.
    pub consumer_name: String,
    /// The bid rate limiter and the caches of immutable facts and price floors.
    runtime: AuctionRuntime,
}

impl std::ops::Deref for AuctionsState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AuctionsState {
    pub fn new(
        clients: Clients,
        settings: AuctionSettings,
        redis: &RedisSettings,
        tokens: &TokenSettings,
    ) -> anyhow::Result<Self> {
        let handles = handles::Handles::from_settings(&settings, tokens)?;
        let consumer_name = if settings.consumer_name.is_empty() {
            format!("booking-{}-{}", std::process::id(), shared::ids::new_id())
        } else {
            settings.consumer_name.clone()
        };
        let live = live::LiveHub::new(&settings, redis, handles.clone())
            .context("failed to set up live prices")?;
        Ok(Self(Arc::new(Inner {
            pool: clients.pool,
            redis: clients.redis,
            auth: clients.auth,
            idempotency: clients.idempotency,
            metrics: clients.metrics,
            handles,
            live: Arc::new(live),
            consumer_name,
            runtime: AuctionRuntime::new(settings.bids_per_second, settings.bid_burst),
            settings,
        })))
    }
}

impl axum::extract::FromRef<AuctionsState> for Auth {
    fn from_ref(state: &AuctionsState) -> Self {
        state.auth.clone()
    }
}

/// Loads an auction row from Postgres.
pub async fn load(state: &AuctionsState, id: &str) -> Result<Option<AuctionRow>, AuctionError> {
    repo::load(&state.pool, id).await
}

/// The freshest view of an auction: Postgres, overlaid with the Redis state while a hot
/// auction is open (Postgres trails the hot path by the consumer's lag).
pub async fn current(state: &AuctionsState, id: &str) -> Result<Option<AuctionRow>, AuctionError> {
    let Some(mut row) = repo::load(&state.pool, id).await? else {
        return Ok(None);
    };
    if row.hot && row.status == AuctionStatus::Open {
        hot::overlay(state, &mut row).await?;
    }
    state.runtime.raise_floor(id, row.min_next_bid());
    Ok(Some(row))
}

/// Immutable facts about an auction (hot flag, seller, event), cached per process. An auction
/// without an event is not cached: ops may still assign it one.
pub async fn meta(state: &AuctionsState, id: &str) -> Result<Option<Meta>, AuctionError> {
    if let Some(m) = state.runtime.cached_meta(id) {
        return Ok(Some(m));
    }
    let meta = repo::load_meta(&state.pool, id).await?;
    if let Some(m) = &meta
        && m.event.is_some()
    {
        state.runtime.remember_meta(id, m.clone());
    }
    Ok(meta)
}

/// Inserts a validated auction for `seller` and completes the creation's idempotency claim
/// with `view` of the new row, in one transaction (retried from the top on a deadlock). The
/// end-time checks use the database clock, in the insert statement itself.
pub async fn create(
    state: &AuctionsState,
    seller: &str,
    new: &model::NewAuction,
    claim: &crate::platform::idempotency::Claim,
) -> Result<(AuctionRow, Vec<u8>), AuctionError> {
    let max_days = i32::try_from(state.settings.max_duration_days).unwrap_or(i32::MAX);
    let created = crate::platform::db::retry(2, || async {
        let mut tx = state.pool.begin().await.stmt("begin the auction insert")?;
        let Some(row) = repo::insert(&mut tx, seller, new, max_days).await? else {
            return Err(AuctionError::Invalid {
                field: "end_time",
                message: format!("end_time must be in the future and at most {max_days} days away"),
            });
        };
        let body = serde_json::to_vec(&row.view_for(&state.handles, seller))
            .context("failed to serialise the new auction")?;
        claim
            .complete_tx(&mut tx, axum::http::StatusCode::CREATED, &body)
            .await
            .map_err(|e| AuctionError::from_tx(e, "complete the creation's Idempotency-Key"))?;
        tx.commit().await.stmt("commit the auction insert")?;
        Ok((row, body))
    })
    .await?;
    after_create(state, &created.0).await;
    Ok(created)
}

/// After the commit: cache the immutable facts and set up a hot auction's Redis state.
async fn after_create(state: &AuctionsState, row: &AuctionRow) {
    state.runtime.remember_meta(
        &row.id,
        Meta {
            hot: row.hot,
            seller: row.seller_id.clone(),
            event: row.event_id.clone(),
        },
    );
    if row.hot {
        // Best effort: if Redis is unreachable now, the first bid initialises it from the row
        // (the init script is create-if-absent, so it can never reset a live auction).
        if let Err(e) = hot::init_from_row(state, row).await {
            tracing::warn!(auction = %row.id, error = ?e, "hot auction not yet initialised in Redis");
        }
    }
}
