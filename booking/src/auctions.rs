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

pub mod bids;
pub mod closer;
pub mod handles;
pub mod hot;
pub mod live;

/// Everything the auctions domain's handlers and jobs use; the app layer builds it and handlers take
/// it with `State<AuctionsState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct AuctionsState {
    pub pool: sqlx::PgPool,
    pub redis: crate::platform::redis::Redis,
    pub auth: crate::platform::auth::Auth,
}

impl axum::extract::FromRef<AuctionsState> for crate::platform::auth::Auth {
    fn from_ref(state: &AuctionsState) -> Self {
        state.auth.clone()
    }
}

use crate::app::state::AppState;
use crate::platform::auth::Admitted;
use crate::platform::db::TxError;
use crate::platform::error::{ApiError, ApiResult};
use crate::platform::idempotency::{self, Begin, Fingerprint, IdempotencyKey};
use crate::platform::json::ApiJson;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, SecondsFormat, Utc};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use shared::error::codes;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;

/// Largest amount (minor units) a price, increment or bid may have: 10^15.
pub const MAX_MONEY: i64 = 1_000_000_000_000_000;
/// A bid accepted this close to the end pushes the end to this far from now.
pub const SNIPING_WINDOW_S: i64 = 120;
/// Upper bound for an auction's `max_extensions` (also a CHECK in the schema).
pub const MAX_EXTENSIONS_LIMIT: i32 = 1000;

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

/// Per-process auction state: the bid rate limiter, caches of immutable auction facts and of
/// price floors (for early rejection only), and the live-price hub.
pub struct AuctionRuntime {
    limiter: DefaultKeyedRateLimiter<String>,
    /// Auction id -> (hot, seller, event). None of them changes after creation.
    meta: Mutex<HashMap<String, Meta>>,
    /// Auction id -> a known lower bound of the minimum next bid. Prices only rise, so any
    /// value once observed stays a lower bound forever: a bid below it is certainly too low.
    /// Used to skip the contended row lock, never to accept.
    floors: Mutex<HashMap<String, i64>>,
    /// Hot auction id -> what Postgres had recorded when this process last looked, and when.
    /// Passed to the bid script as a floor, so a Redis that lost writes (rollback, failover)
    /// cannot accept a bid below a recorded one ([`hot::Recorded`]).
    recorded: Mutex<HashMap<String, (std::time::Instant, hot::Recorded)>>,
    pub live: std::sync::Arc<live::LiveHub>,
    pub consumer_name: String,
    /// What fans see of other fans' accounts.
    pub handles: handles::Handles,
}

#[derive(Debug, Clone)]
pub struct Meta {
    pub hot: bool,
    pub seller: String,
    /// `None` only for an auction created before events were required.
    pub event: Option<String>,
}

/// Caches are bounded: past this many entries they are simply cleared (they only save work).
const CACHE_LIMIT: usize = 100_000;

impl AuctionRuntime {
    pub fn new(config: &crate::app::config::BookingConfig) -> anyhow::Result<Self> {
        let settings = &config.auctions;
        let rate = NonZeroU32::new(settings.bids_per_second.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.bid_burst.max(1)).unwrap_or(NonZeroU32::MIN);
        let consumer_name = if settings.consumer_name.is_empty() {
            format!("booking-{}-{}", std::process::id(), shared::ids::new_id())
        } else {
            settings.consumer_name.clone()
        };
        let handles = handles::Handles::from_config(config)?;
        Ok(Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            meta: Mutex::new(HashMap::new()),
            floors: Mutex::new(HashMap::new()),
            recorded: Mutex::new(HashMap::new()),
            live: std::sync::Arc::new(live::LiveHub::new(config, handles.clone())?),
            consumer_name,
            handles,
        })
    }

    /// `Err(seconds)` when `bidder` is over the per-bidder bid rate.
    fn check_rate(&self, bidder: &str) -> Result<(), u64> {
        match self.limiter.check_key(&bidder.to_owned()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
            }
        }
    }

    /// Forgets idle rate-limit keys (called by the closer tick) so memory stays bounded.
    pub fn tidy(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    fn cached_meta(&self, id: &str) -> Option<Meta> {
        self.meta.lock().ok()?.get(id).cloned()
    }

    fn remember_meta(&self, id: &str, meta: Meta) {
        if let Ok(mut m) = self.meta.lock() {
            if m.len() >= CACHE_LIMIT {
                m.clear();
            }
            m.insert(id.to_owned(), meta);
        }
    }

    /// The known lower bound of the next acceptable bid, if any.
    fn floor(&self, id: &str) -> Option<i64> {
        self.floors.lock().ok()?.get(id).copied()
    }

    /// This process's copy of what Postgres recorded for a hot auction, if younger than
    /// `max_age`.
    fn recorded(&self, id: &str, max_age: std::time::Duration) -> Option<hot::Recorded> {
        let m = self.recorded.lock().ok()?;
        let (at, rec) = m.get(id)?;
        (at.elapsed() <= max_age).then(|| rec.clone())
    }

    /// Remembers what Postgres recorded (merged monotonically: a stale read can never lower
    /// a newer one) and restarts its age.
    fn remember_recorded(&self, id: &str, rec: hot::Recorded) {
        if let Ok(mut m) = self.recorded.lock() {
            if m.len() >= CACHE_LIMIT {
                m.clear();
            }
            let now = std::time::Instant::now();
            match m.get_mut(id) {
                Some((at, cur)) => {
                    cur.merge(rec);
                    *at = now;
                }
                None => {
                    m.insert(id.to_owned(), (now, rec));
                }
            }
        }
    }

    /// Records an observed minimum next bid (keeps the highest seen).
    fn raise_floor(&self, id: &str, min_next: i64) {
        if let Ok(mut f) = self.floors.lock() {
            if f.len() >= CACHE_LIMIT {
                f.clear();
            }
            let e = f.entry(id.to_owned()).or_insert(min_next);
            *e = (*e).max(min_next);
        }
    }
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/auctions", post(create))
        .route("/api/auctions/{id}", get(show))
        .route("/api/auctions/{id}/bids", post(bids::place))
        .route("/ws/auctions/{id}", get(live::upgrade))
}

/// RFC 3339 with the precision the value has (µs from Postgres, ms from Redis), UTC.
pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// An auction as clients see it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct AuctionRow {
    pub id: String,
    pub event_id: Option<String>,
    pub seller_id: String,
    pub title: String,
    pub start_price: i64,
    pub min_increment: i64,
    pub current_price: i64,
    pub leader_id: Option<String>,
    pub bid_count: i64,
    pub hot: bool,
    pub status: String,
    pub end_time: DateTime<Utc>,
    pub extensions: i32,
    pub max_extensions: i32,
    pub created_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

pub const AUCTION_COLUMNS: &str = "id, event_id, seller_id, title, start_price, min_increment, \
    current_price, leader_id, bid_count, hot, status, end_time, extensions, max_extensions, \
    created_at, closed_at";

impl AuctionRow {
    /// The smallest amount the next bid must have.
    pub fn min_next_bid(&self) -> i64 {
        min_next_bid(
            self.current_price,
            self.min_increment,
            self.leader_id.is_some(),
        )
    }

    /// The auction as `viewer` (an account) sees it: other fans appear only as handles, and
    /// `you_lead` / `you_sell` say whether the viewer is the leader / the seller.
    pub fn view_for(&self, handles: &handles::Handles, viewer: &str) -> serde_json::Value {
        let (leader, you_lead) = handles.leader(&self.id, self.leader_id.as_deref(), viewer);
        serde_json::json!({
            "id": self.id,
            "event": self.event_id,
            "seller": handles.seller(&self.id, &self.seller_id),
            "you_sell": self.seller_id == viewer,
            "title": self.title,
            "start_price": self.start_price,
            "min_increment": self.min_increment,
            "current_price": self.current_price,
            "min_next_bid": self.min_next_bid(),
            "leader": leader,
            "you_lead": you_lead,
            "bid_count": self.bid_count,
            "hot": self.hot,
            "status": self.status,
            "end_time": rfc3339(&self.end_time),
            "extensions": self.extensions,
            "max_extensions": self.max_extensions,
            "created_at": rfc3339(&self.created_at),
            "closed_at": self.closed_at.as_ref().map(rfc3339),
        })
    }
}

/// Both inputs are at most [`MAX_MONEY`], so the sum cannot overflow; saturate anyway.
pub fn min_next_bid(current_price: i64, min_increment: i64, has_leader: bool) -> i64 {
    if has_leader {
        current_price.saturating_add(min_increment)
    } else {
        current_price
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAuction {
    /// The event this auction belongs to; the seller's token must be for it.
    pub event: String,
    pub title: String,
    pub start_price: i64,
    pub min_increment: i64,
    /// RFC 3339; must be in the future (by the database clock).
    pub end_time: String,
    #[serde(default)]
    pub hot: bool,
    pub max_extensions: Option<i32>,
}

/// Validated creation input.
struct NewAuction {
    event: String,
    title: String,
    start_price: i64,
    min_increment: i64,
    end_time: DateTime<Utc>,
    hot: bool,
    max_extensions: i32,
}

fn validate(req: CreateAuction, settings: &AuctionSettings) -> ApiResult<NewAuction> {
    let title = req.title.trim().to_owned();
    if title.is_empty() || title.chars().count() > 200 {
        return Err(
            ApiError::validation("title must be 1 to 200 characters").with("field", "title")
        );
    }
    for (field, v) in [
        ("start_price", req.start_price),
        ("min_increment", req.min_increment),
    ] {
        if !(1..=MAX_MONEY).contains(&v) {
            return Err(ApiError::validation(format!(
                "{field} must be a positive integer amount in minor units, at most {MAX_MONEY}"
            ))
            .with("field", field));
        }
    }
    let end_time = DateTime::parse_from_rfc3339(&req.end_time)
        .map_err(|_| {
            ApiError::validation("end_time must be an RFC 3339 timestamp").with("field", "end_time")
        })?
        .with_timezone(&Utc);
    let max_extensions = req
        .max_extensions
        .unwrap_or(settings.default_max_extensions);
    if !(0..=MAX_EXTENSIONS_LIMIT).contains(&max_extensions) {
        return Err(ApiError::validation(format!(
            "max_extensions must be between 0 and {MAX_EXTENSIONS_LIMIT}"
        ))
        .with("field", "max_extensions"));
    }
    Ok(NewAuction {
        event: req.event,
        title,
        start_price: req.start_price,
        min_increment: req.min_increment,
        end_time,
        hot: req.hot,
        max_extensions,
    })
}

/// `POST /api/auctions` (Idempotency-Key): the seller is the token's account. The key is
/// handled by the shared layer ([`crate::platform::idempotency`]): the stored `201` body commits in the
/// same transaction as the auction row, so a retry replays exactly it.
async fn create(
    State(state): State<AppState>,
    who: Admitted,
    key: IdempotencyKey,
    ApiJson(req): ApiJson<CreateAuction>,
) -> ApiResult<Response> {
    let fingerprint = Fingerprint::of_json(
        &Method::POST,
        "/api/auctions",
        &serde_json::to_value(&req).map_err(ApiError::unexpected)?,
    );
    // Bad input is refused before a key is claimed: it changes nothing, not even the key.
    let new = validate(req, &state.config.auctions)?;
    who.for_event(&new.event)?;
    // Events are never deleted while an auction refers to them (foreign key).
    if !crate::orders::products::event_exists(&state.pool, &new.event).await? {
        return Err(crate::orders::products::unknown_event_field(&new.event));
    }
    let claim =
        match idempotency::begin(&state.idempotency, who.account(), &key, &fingerprint).await? {
            Begin::Replay(stored) => return Ok(stored.into_response()),
            Begin::Started(claim) => claim,
        };
    match create_auction(&state, who.account(), new, &claim).await {
        Ok((row, body)) => {
            after_create(&state, &row).await;
            Ok(idempotency::respond(StatusCode::CREATED, body))
        }
        Err(e) => {
            claim.release(&state.pool).await;
            Err(e)
        }
    }
}

/// Inserts the auction and completes the key, in one transaction. The end-time checks use
/// the database clock, in the insert statement itself.
async fn create_auction(
    state: &AppState,
    seller: &str,
    new: NewAuction,
    claim: &idempotency::Claim,
) -> ApiResult<(AuctionRow, Vec<u8>)> {
    let sql = format!(
        "INSERT INTO auctions (id, seller_id, title, start_price, min_increment, current_price, \
                               hot, end_time, max_extensions, event_id)
         SELECT $1, $2, $3, $4, $5, $4, $6, $7, $8, $10
          WHERE $7 > clock_timestamp() AND $7 <= clock_timestamp() + make_interval(days => $9)
         RETURNING {AUCTION_COLUMNS}"
    );
    let max_days = i32::try_from(state.config.auctions.max_duration_days).unwrap_or(i32::MAX);
    let result = crate::platform::db::retry(2, || async {
        let mut tx = state.pool.begin().await?;
        let row: Option<AuctionRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
            .bind(shared::ids::new_id())
            .bind(seller)
            .bind(&new.title)
            .bind(new.start_price)
            .bind(new.min_increment)
            .bind(new.hot)
            .bind(new.end_time)
            .bind(new.max_extensions)
            .bind(max_days)
            .bind(&new.event)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Err(TxError::Api(
                ApiError::validation(format!(
                    "end_time must be in the future and at most {max_days} days away"
                ))
                .with("field", "end_time"),
            ));
        };
        let body = serde_json::to_vec(&row.view_for(&state.auctions.handles, seller))
            .map_err(ApiError::unexpected)?;
        claim
            .complete_tx(&mut tx, StatusCode::CREATED, &body)
            .await?;
        tx.commit().await?;
        Ok::<_, TxError>((row, body))
    })
    .await;
    result.map_err(ApiError::from)
}

/// After the commit: cache the immutable facts and set up a hot auction's Redis state.
async fn after_create(state: &AppState, row: &AuctionRow) {
    state.auctions.remember_meta(
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

/// Loads an auction row from Postgres.
pub async fn load(state: &AppState, id: &str) -> ApiResult<Option<AuctionRow>> {
    let sql = format!("SELECT {AUCTION_COLUMNS} FROM auctions WHERE id = $1");
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(&state.pool)
        .await?)
}

pub fn unknown_auction() -> ApiError {
    ApiError::not_found(codes::NOT_FOUND, "no such auction")
}

/// The freshest view of an auction: Postgres, overlaid with the Redis state while a hot
/// auction is open (Postgres trails the hot path by the consumer's lag).
pub async fn current(state: &AppState, id: &str) -> ApiResult<Option<AuctionRow>> {
    let Some(mut row) = load(state, id).await? else {
        return Ok(None);
    };
    if row.hot && row.status == "OPEN" {
        hot::overlay(state, &mut row).await?;
    }
    state.auctions.raise_floor(id, row.min_next_bid());
    Ok(Some(row))
}

/// `GET /api/auctions/{id}` (an admission of the auction's event).
async fn show(
    State(state): State<AppState>,
    who: Admitted,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let meta = meta(&state, &id).await?.ok_or_else(unknown_auction)?;
    who.opens(meta.event.as_deref())?;
    let row = current(&state, &id).await?.ok_or_else(unknown_auction)?;
    Ok(axum::Json(row.view_for(&state.auctions.handles, who.account())).into_response())
}

/// Immutable facts about an auction (hot flag, seller, event), cached per process. An auction
/// without an event is not cached: ops may still assign it one.
pub async fn meta(state: &AppState, id: &str) -> ApiResult<Option<Meta>> {
    if let Some(m) = state.auctions.cached_meta(id) {
        return Ok(Some(m));
    }
    let row: Option<(bool, String, Option<String>)> =
        sqlx::query_as("SELECT hot, seller_id, event_id FROM auctions WHERE id = $1")
            .bind(id)
            .fetch_optional(&state.pool)
            .await?;
    Ok(row.map(|(hot, seller, event)| {
        let m = Meta { hot, seller, event };
        if m.event.is_some() {
            state.auctions.remember_meta(id, m.clone());
        }
        m
    }))
}

/// The auction jobs: the closer, and the hot-bid consumer (stream -> Postgres).
pub fn spawn_jobs(
    state: &AppState,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let s = &state.config.auctions;
    let closer_every = std::time::Duration::from_millis(s.closer_interval_ms.max(50));
    let consumer_every = std::time::Duration::from_millis(s.consumer_interval_ms.max(5));
    vec![
        crate::platform::jobs::spawn_periodic("auction-closer", closer_every, stop.clone(), {
            let state = state.clone();
            move || {
                let state = state.clone();
                async move {
                    closer::close_due(&state).await?;
                    state.auctions.tidy();
                    Ok(())
                }
            }
        }),
        crate::platform::jobs::spawn_periodic("hot-bid-consumer", consumer_every, stop.clone(), {
            let state = state.clone();
            move || {
                let state = state.clone();
                async move {
                    hot::consume_all(&state).await?;
                    Ok(())
                }
            }
        }),
    ]
}
