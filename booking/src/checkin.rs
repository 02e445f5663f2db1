//! The door (issue 44, first part; DESIGN section 9, "Check-in"): scanners provisioned per
//! event and gate, and online scans decided by Postgres.
//!
//! Layout: [`scanners`] (`POST`/`GET`/`DELETE /admin/events/{event}/scanners`: a `fgsc_…`
//! credential per device, shown once, audited), [`code`] (what a scanned text is, decided
//! before the database: signature, event, TOTP), [`repo`] (the one conditional statement that
//! decides a scan and logs it), [`http`] (`POST /api/checkin/{event}/scans`, class `scanner`,
//! on booking's listener until the gateway's route table exists), [`gauges`] (the job that
//! reads the gate counts from Postgres into `/metrics`); offline (issue 44, "Offline"):
//! [`snapshot`] (`GET /api/checkin/{event}/snapshot`, what a scanner decides from alone, with an
//! incremental cursor that never misses a write), [`batch`] (`POST …/scans:batch`, the offline
//! decisions uploaded and re-decided in the server's order, conflicts recorded) and
//! [`conflicts`] (`GET /admin/events/{event}/checkin/conflicts`, for ops).
//!
//! Guarantees:
//! - **Each ticket enters once.** Whether a scan admits is decided by one statement that locks
//!   the ticket's row, updates its door state only when the code's ticket, event and version
//!   match, it is not void and not inside (or re-entry allows it), and logs the decision in
//!   `checkins` — never a read and a write in two statements. Concurrent scans of one ticket
//!   at any number of gates queue on that row: one `ENTRY`, the rest `ALREADY_INSIDE`.
//! - Every decision is logged, refusals included, with the server's time; a device's clock is
//!   information only.
//! - The same `scan_id` from the same scanner is one scan: a replay answers the first answer
//!   and changes nothing (its insert fails on a unique index and takes the statement with it).
//! - A scanner credential opens only its own event's scan route; a revocation is in force as
//!   soon as it commits (every scan reads the credential).

pub mod batch;
pub mod code;
pub mod conflicts;
pub mod gauges;
pub mod http;
pub mod repo;
pub mod scanners;
pub mod snapshot;

use crate::platform::auth::Auth;
use crate::platform::jobs::Job;
use crate::tickets::code::TicketKeys;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use sqlx::PgPool;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;

/// What the door's handlers use. Cheap to clone.
#[derive(Clone)]
pub struct CheckinState {
    pub pool: PgPool,
    pub auth: Auth,
    /// Verifies ticket codes and derives rotating tickets' secrets from the door key.
    pub keys: Arc<TicketKeys>,
    pub metrics: CheckinMetrics,
}

impl axum::extract::FromRef<CheckinState> for Auth {
    fn from_ref(state: &CheckinState) -> Self {
        state.auth.clone()
    }
}

/// The door's metrics. Scans, entries and exits are counted on each instance (sum them across
/// instances); the gauges of tickets inside and entered, per event and gate, are read from
/// Postgres by [`gauges::GateCounts`], the same on every instance (take the max).
#[derive(Clone)]
pub struct CheckinMetrics {
    /// Scan decisions by result (`ENTRY`, `ALREADY_INSIDE`, `VOIDED`, ...).
    pub scans: IntCounterVec,
    /// Admissions by event and gate.
    pub entries: IntCounterVec,
    /// Exits by event and gate.
    pub exits: IntCounterVec,
    /// Scans answered again from the log (the same `scan_id`).
    pub replays: IntCounter,
    /// Tickets inside now, by event and the gate they entered at.
    pub inside: IntGaugeVec,
    /// Tickets that entered at least once, by event and the gate of their latest entry.
    pub entered: IntGaugeVec,
    /// Uploaded offline decisions by the server's result.
    pub offline_scans: IntCounterVec,
    /// Offline admissions the server would not have made, by event and the server's result.
    pub offline_conflicts: IntCounterVec,
    /// Offline decisions uploaded by a scanner revoked since (an alert).
    pub offline_revoked: IntCounter,
}

impl CheckinMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let scans = IntCounterVec::new(
            Opts::new("checkin_scans_total", "Scan decisions by result"),
            &["result"],
        )?;
        let entries = IntCounterVec::new(
            Opts::new(
                "checkin_entries_total",
                "Tickets admitted at the door, by event and gate",
            ),
            &["event", "gate"],
        )?;
        let exits = IntCounterVec::new(
            Opts::new(
                "checkin_exits_total",
                "Tickets let out at the door, by event and gate",
            ),
            &["event", "gate"],
        )?;
        let replays = IntCounter::new(
            "checkin_scan_replays_total",
            "Scans answered again from the log (a scan_id seen before)",
        )?;
        registry.register(Box::new(scans.clone()))?;
        registry.register(Box::new(entries.clone()))?;
        registry.register(Box::new(exits.clone()))?;
        let inside = IntGaugeVec::new(
            Opts::new(
                "checkin_inside",
                "Tickets inside now, by event and the gate they entered at (from Postgres)",
            ),
            &["event", "gate"],
        )?;
        let entered = IntGaugeVec::new(
            Opts::new(
                "checkin_entered",
                "Tickets that entered at least once, by event and the gate of their latest \
                 entry (from Postgres)",
            ),
            &["event", "gate"],
        )?;
        registry.register(Box::new(replays.clone()))?;
        registry.register(Box::new(inside.clone()))?;
        registry.register(Box::new(entered.clone()))?;
        let offline_scans = IntCounterVec::new(
            Opts::new(
                "checkin_offline_scans_total",
                "Uploaded offline scan decisions, by the server's result",
            ),
            &["result"],
        )?;
        let offline_conflicts = IntCounterVec::new(
            Opts::new(
                "checkin_offline_conflicts_total",
                "Offline admissions the server would not have made (a double entry, a void \
                 ticket), by event and the server's result",
            ),
            &["event", "reason"],
        )?;
        let offline_revoked = IntCounter::new(
            "checkin_offline_revoked_scans_total",
            "Offline scan decisions uploaded by a scanner revoked since (kept, flagged)",
        )?;
        registry.register(Box::new(offline_scans.clone()))?;
        registry.register(Box::new(offline_conflicts.clone()))?;
        registry.register(Box::new(offline_revoked.clone()))?;
        Ok(Self {
            scans,
            entries,
            exits,
            replays,
            inside,
            entered,
            offline_scans,
            offline_conflicts,
            offline_revoked,
        })
    }
}

/// The door's background jobs: the gate-count gauges.
pub fn jobs(state: &CheckinState) -> Vec<Arc<dyn Job>> {
    vec![Arc::new(gauges::GateCounts::new(
        state.pool.clone(),
        state.metrics.clone(),
    ))]
}

/// Scanner provisioning (admin API) and the scan route (class `scanner`).
pub fn router() -> OpenApiRouter<CheckinState> {
    OpenApiRouter::new()
        .merge(scanners::router())
        .merge(http::router())
        .merge(snapshot::router())
        .merge(batch::router())
        .merge(conflicts::router())
}
