//! Inventory: events and their seat maps, seat holds, general-admission counters, the hold
//! sweeper and the storefront's event view.
//!
//! Layers: [`model`] (hold statuses and kinds, the pure request checks), [`error`]
//! ([`InventoryError`]), the SQL of each area (`holds/{repo,take}.rs`, `ga/repo.rs`,
//! `events/repo.rs`, and the read functions of `seats.rs`, `storefront.rs`, `sweeper.rs`), and
//! the handlers, which alone turn an `InventoryError` into an `ApiError` (`http.rs`).
//!
//! Other domains use only the hold helpers [`holds::pin_hold_tx`], [`holds::release_hold_tx`]
//! and [`holds::sell_hold_tx`] (orders pin and release holds, payments sell them).

pub mod error;
pub mod events;
pub mod ga;
pub mod holdbacks;
pub mod holds;
mod http;
pub mod kills;
pub mod model;
pub mod seats;
pub mod storefront;
pub mod sweeper;

pub use error::InventoryError;

use crate::platform::auth::Auth;
use crate::platform::idempotency::Idempotency;
use crate::platform::jobs::Job;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};
use sqlx::PgPool;
use std::sync::Arc;

/// Everything the inventory's handlers and jobs use; the app layer builds it and handlers take
/// it with `State<InventoryState>` (axum `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct InventoryState {
    pub pool: PgPool,
    /// The hold statements' own connections ([`holds::take::hold_pool`]): their settings are
    /// the connection's, so a hold or a release is one statement with no transaction around it.
    pub hold_pool: crate::platform::kept::KeptPool,
    pub auth: Auth,
    /// `Idempotency-Key`s of the ops seat kills and GA hold-backs.
    pub idempotency: Idempotency,
    pub settings: Arc<InventorySettings>,
    pub metrics: InventoryMetrics,
    /// Rendered seat maps, per event (see [`seats`]).
    pub seat_maps: Arc<seats::SeatMapCache>,
    /// Per-process event facts of the hold paths (`no_orphans`, best-available queues).
    pub events: Arc<holds::pick::EventLocal>,
    /// Explicit seat holds of one event that arrive together go in one statement
    /// ([`holds::grouped`]).
    pub(crate) hold_batcher: Arc<holds::grouped::HoldBatcher>,
}

impl InventoryState {
    pub fn new(
        pool: PgPool,
        auth: Auth,
        idempotency: Idempotency,
        settings: InventorySettings,
        metrics: InventoryMetrics,
    ) -> Self {
        let hold_pool = holds::take::hold_pool(&pool, settings.async_commit_holds);
        let hold_batcher = Arc::new(holds::grouped::HoldBatcher::new(
            hold_pool.clone(),
            settings.hold_batch_max,
            settings.hold_batch_concurrency,
            metrics.seat_hold_batch.clone(),
            metrics.seat_holds_queued.clone(),
        ));
        Self {
            hold_pool,
            hold_batcher,
            pool,
            auth,
            idempotency,
            settings: Arc::new(settings),
            metrics,
            seat_maps: Default::default(),
            events: Default::default(),
        }
    }
}

impl axum::extract::FromRef<InventoryState> for Auth {
    fn from_ref(state: &InventoryState) -> Self {
        state.auth.clone()
    }
}

/// The inventory's settings. They are `[booking]` keys in the configuration file (the app
/// copies them here), plus the store currency from `[orders]`, shown by the storefront.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    /// How often the hold sweeper runs.
    pub sweeper_interval_ms: u64,
    /// Rows per sweeper batch.
    pub sweeper_batch: i64,
    /// Largest number of seats one hold request may name.
    pub max_seats_per_hold: usize,
    /// Use `synchronous_commit = off` for hold transactions (holds move no money; a crash can
    /// lose the last few milliseconds of holds, never a sale). See docs/decisions.md.
    pub async_commit_holds: bool,
    /// Most explicit seat holds of one event per statement (`holds/grouped.rs`); below 2,
    /// every hold runs on its own.
    pub hold_batch_max: u32,
    /// Statements of batched seat holds one event may have running at once.
    pub hold_batch_concurrency: u32,
    /// Longest a cached seat map is served without re-reading (seconds; also the JSON map's
    /// `Cache-Control: max-age`): the bound on how late changes made by other processes or
    /// by the order and payment flows show. 0 reads on every request.
    pub seat_map_cache_s: u64,
    /// The store currency; prices are in its minor units.
    pub currency: String,
}

/// The inventory's metrics (names and labels are read by dashboards and tests).
#[derive(Clone)]
pub struct InventoryMetrics {
    /// Holds placed, by kind (`seats`/`ga`): `holds_total`.
    pub holds: IntCounterVec,
    /// Holds released on expiry (sweeper and reclaims), by kind: `holds_expired_total`.
    pub holds_expired: IntCounterVec,
    /// Client-facing refusals by code (`refusals_total`). One counter for the whole process,
    /// shared with the other domains' refusals, so the app registers it and hands it in.
    pub refusals: IntCounterVec,
    /// Seat-map renderings by part (`layout`/`availability`/`json`):
    /// `seat_map_builds_total`. Once per change per process, not per request.
    pub seat_map_builds: IntCounterVec,
    /// Best-available requests per batch (one candidate read per section and tiers, see
    /// `holds/batch.rs`): `best_available_batch_size`.
    pub best_available_batch: Histogram,
    /// Explicit seat holds per statement of their batcher (`holds/grouped.rs`; 1: a hold on
    /// its own): `seat_hold_batch_size`.
    pub seat_hold_batch: Histogram,
    /// Explicit seat holds waiting for a batch: `seat_holds_queued`.
    pub seat_holds_queued: IntGauge,
}

impl InventoryMetrics {
    /// Registers the inventory's own metrics; `refusals` is the process-wide refusal counter.
    pub fn register(
        registry: &Registry,
        refusals: IntCounterVec,
    ) -> Result<Self, prometheus::Error> {
        let holds = IntCounterVec::new(Opts::new("holds_total", "Holds placed"), &["kind"])?;
        let holds_expired = IntCounterVec::new(
            Opts::new("holds_expired_total", "Holds released on expiry"),
            &["kind"],
        )?;
        let seat_map_builds = IntCounterVec::new(
            Opts::new("seat_map_builds_total", "Seat-map renderings by part"),
            &["part"],
        )?;
        registry.register(Box::new(holds.clone()))?;
        registry.register(Box::new(holds_expired.clone()))?;
        let best_available_batch = Histogram::with_opts(
            HistogramOpts::new(
                "best_available_batch_size",
                "Best-available requests served per batch",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )?;
        let seat_hold_batch = Histogram::with_opts(
            HistogramOpts::new(
                "seat_hold_batch_size",
                "Explicit seat holds per statement of the hold batcher",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )?;
        let seat_holds_queued = IntGauge::new(
            "seat_holds_queued",
            "Explicit seat holds waiting for a batch",
        )?;
        registry.register(Box::new(seat_map_builds.clone()))?;
        registry.register(Box::new(best_available_batch.clone()))?;
        registry.register(Box::new(seat_hold_batch.clone()))?;
        registry.register(Box::new(seat_holds_queued.clone()))?;
        Ok(Self {
            holds,
            holds_expired,
            refusals,
            seat_map_builds,
            best_available_batch,
            seat_hold_batch,
            seat_holds_queued,
        })
    }
}

/// The inventory's background jobs: the hold sweeper.
pub fn jobs(state: &InventoryState) -> Vec<Arc<dyn Job>> {
    vec![Arc::new(sweeper::HoldSweeper::new(state))]
}
