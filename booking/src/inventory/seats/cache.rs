//! The per-process seat-map cache: per event, the layout (read once) and the current
//! availability snapshot, from which both the compact availability and the JSON map are
//! rendered (so the two always agree).
//!
//! A snapshot is served while it is fresh:
//! - no seat change made through this process since it was read (the hold and release
//!   handlers call [`SeatMapCache::changed`] after their commit, so a fan sees their own
//!   hold on the next fetch), and
//! - younger than `seat_map_cache_s` (the bound on how late other processes' changes, and
//!   sales, order expiries and cancellations made by the order and payment flows, show), and
//! - no displayed hold has run out since (the earliest `held_until` ahead, by the database
//!   clock, ends the snapshot's life: an expiry changes the map without any write).
//!
//! A request also accepts any snapshot whose read began after the request arrived, so with
//! `seat_map_cache_s = 0` every fetch reflects everything committed before it, and still
//! concurrent fetches share one read. Reads are single flight per event: one request reads,
//! the others wait for it and take its result.

use super::encode::{Encoded, Shown, content_tag, pack_statuses};
use super::layout::{self, Layout};
use crate::inventory::error::{During, InventoryError};
use prometheus::IntCounterVec;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// One availability snapshot and its renderings.
pub(crate) struct Snapshot {
    /// When its read began (before the generation was read).
    started: Instant,
    generation: u64,
    /// After this instant it is stale (the cache TTL or the next hold expiry, sooner first).
    fresh_until: Instant,
    pub layout: Arc<Layout>,
    pub statuses: Vec<Shown>,
    /// The compact availability body.
    pub availability: Encoded,
    /// The JSON map, rendered on the first request that wants it.
    json: tokio::sync::OnceCell<Arc<Encoded>>,
}

impl Snapshot {
    /// The JSON map of this snapshot (rendered once; its tag derives from the availability's).
    pub(crate) async fn json(
        &self,
        event: &str,
        builds: &IntCounterVec,
    ) -> Result<Arc<Encoded>, InventoryError> {
        self.json
            .get_or_try_init(|| async {
                builds.with_label_values(&["json"]).inc();
                let body = layout::json_map(event, &self.layout, &self.statuses)?;
                let tag = self
                    .availability
                    .etag
                    .to_str()
                    .unwrap_or("x")
                    .trim_matches('"');
                Ok::<_, InventoryError>(Arc::new(Encoded::new(body, &format!("j{tag}"))))
            })
            .await
            .cloned()
    }
}

#[derive(Default)]
struct EventMaps {
    /// Bumped by [`SeatMapCache::changed`].
    generation: AtomicU64,
    current: RwLock<Option<Arc<Snapshot>>>,
    /// Held by the one request (re)building this event's layout or snapshot.
    build: tokio::sync::Mutex<Option<Arc<Layout>>>,
}

impl EventMaps {
    fn fresh(&self, arrived: Instant) -> Option<Arc<Snapshot>> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        let snap = current.as_ref()?;
        let fresh = snap.generation == self.generation.load(Ordering::SeqCst)
            && (snap.started >= arrived || Instant::now() < snap.fresh_until);
        fresh.then(|| snap.clone())
    }
}

/// In-memory seat maps, one entry per event this process has served.
#[derive(Default)]
pub struct SeatMapCache {
    events: Mutex<HashMap<String, Arc<EventMaps>>>,
}

impl SeatMapCache {
    fn entry(&self, event: &str) -> Arc<EventMaps> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.entry(event.to_owned()).or_default().clone()
    }

    fn forget(&self, event: &str) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.remove(event);
    }

    /// Marks the event's cached availability stale: call AFTER committing a change of seat
    /// status (called before the commit, a concurrent read could cache the old state as new).
    pub fn changed(&self, event: &str) {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = events.get(event) {
            e.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The event's current snapshot for a request that `arrived` then (see the module docs).
    pub(crate) async fn snapshot(
        &self,
        pool: &PgPool,
        event: &str,
        ttl: Duration,
        arrived: Instant,
        builds: &IntCounterVec,
    ) -> Result<Arc<Snapshot>, InventoryError> {
        let entry = self.entry(event);
        if let Some(s) = entry.fresh(arrived) {
            return Ok(s);
        }
        let mut layout_slot = entry.build.lock().await;
        if let Some(s) = entry.fresh(arrived) {
            return Ok(s);
        }
        let r = build(&entry, &mut layout_slot, pool, event, ttl, builds).await;
        match r {
            Ok(snap) => {
                let mut current = entry.current.write().unwrap_or_else(|p| p.into_inner());
                *current = Some(snap.clone());
                Ok(snap)
            }
            Err(e) => {
                drop(layout_slot);
                if matches!(e, InventoryError::UnknownEvent) {
                    // Keep no entries for events that do not exist.
                    self.forget(event);
                }
                Err(e)
            }
        }
    }
}

async fn build(
    entry: &EventMaps,
    layout_slot: &mut Option<Arc<Layout>>,
    pool: &PgPool,
    event: &str,
    ttl: Duration,
    builds: &IntCounterVec,
) -> Result<Arc<Snapshot>, InventoryError> {
    let started = Instant::now();
    let generation = entry.generation.load(Ordering::SeqCst);
    let mut layout = match layout_slot.as_ref() {
        Some(l) => l.clone(),
        None => load_layout(layout_slot, pool, event, builds).await?,
    };
    let mut read = read_statuses(pool, event, &layout).await?;
    if read.unknown_seat {
        // A seat the cached layout does not know: the event was recreated. Read both again.
        layout = load_layout(layout_slot, pool, event, builds).await?;
        read = read_statuses(pool, event, &layout).await?;
    }
    builds.with_label_values(&["availability"]).inc();
    let mut fresh_until = started + ttl;
    if let Some(ms) = read.next_expiry_ms {
        // `held_until` is in the future by the database clock; add a millisecond so the
        // rebuild finds it expired.
        let left = Duration::from_millis(ms.max(0.0) as u64 + 1);
        fresh_until = fresh_until.min(started + left);
    }
    let packed = pack_statuses(&read.statuses);
    let body = serde_json::to_vec(&Availability {
        event,
        layout: &layout.id,
        seats: read.statuses.len(),
        encoding: "2bit-base64",
        data: &packed,
    })
    .map_err(InventoryError::Render)?;
    let tag = content_tag("a-", &body);
    Ok(Arc::new(Snapshot {
        started,
        generation,
        fresh_until,
        availability: Encoded::new(body, &tag),
        layout,
        statuses: read.statuses,
        json: Default::default(),
    }))
}

async fn load_layout(
    slot: &mut Option<Arc<Layout>>,
    pool: &PgPool,
    event: &str,
    builds: &IntCounterVec,
) -> Result<Arc<Layout>, InventoryError> {
    let layout = Arc::new(layout::load(pool, event).await?);
    builds.with_label_values(&["layout"]).inc();
    *slot = Some(layout.clone());
    Ok(layout)
}

/// The compact availability body (docs/api.md, "Compact seat map").
#[derive(Serialize)]
struct Availability<'a> {
    event: &'a str,
    /// The id of the layout whose seat order the bits follow.
    layout: &'a str,
    seats: usize,
    encoding: &'static str,
    data: &'a str,
}

struct Statuses {
    statuses: Vec<Shown>,
    /// Milliseconds until the earliest displayed hold runs out.
    next_expiry_ms: Option<f64>,
    unknown_seat: bool,
}

/// The status of every seat that is not plainly available, from one statement with one
/// `now` (the database clock): a hold past `held_until` shows as available (the next hold
/// takes it), a held-back seat as sold.
async fn read_statuses(
    pool: &PgPool,
    event: &str,
    layout: &Layout,
) -> Result<Statuses, InventoryError> {
    let rows: Vec<(String, i16, Option<f64>)> = sqlx::query_as(
        "WITH t AS (SELECT clock_timestamp() AS now)
         SELECT s.seat_id,
                CASE WHEN s.status = 'held' AND s.held_until > t.now THEN 1
                     WHEN s.status = 'held' THEN 0
                     ELSE 2 END::int2,
                CASE WHEN s.status = 'held' AND s.held_until > t.now
                     THEN (extract(epoch FROM s.held_until - t.now) * 1000)::float8 END
         FROM seats s, t
         WHERE s.event_id = $1 AND s.status <> 'available'",
    )
    .bind(event)
    .fetch_all(pool)
    .await
    .during("read the seat map's availability")?;
    let mut out = Statuses {
        statuses: vec![Shown::Available; layout.seats.len()],
        next_expiry_ms: None,
        unknown_seat: false,
    };
    for (seat_id, code, left_ms) in rows {
        let Some(&i) = layout.index.get(&seat_id) else {
            out.unknown_seat = true;
            continue;
        };
        out.statuses[i as usize] = match code {
            1 => Shown::Held,
            2 => Shown::Sold,
            _ => Shown::Available,
        };
        if let Some(ms) = left_ms {
            out.next_expiry_ms = Some(out.next_expiry_ms.map_or(ms, |m: f64| m.min(ms)));
        }
    }
    Ok(out)
}
