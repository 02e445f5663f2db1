//! The check-in statements. [`decide`] is the door: ONE statement that locks the ticket's row,
//! changes its door state only when the scan may, and logs the decision, so two gates scanning
//! one ticket at once queue on the row and the second sees the first's entry. [`record`] logs
//! a scan refused before the database was needed (a bad code, another event's code, an
//! expired TOTP). Both insert into `checkins`; a `scan_id` seen before from the same scanner
//! fails that insert on its unique index, which rolls the whole statement back (nothing
//! changed), and [`replay`] then reads the first answer. Offline decisions uploaded in a batch
//! go through the same two statements, which also log what the device decided and whether
//! that was a conflict (an admission the server would not have made).

use crate::platform::auth::ScannerCredential;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::ToSchema;

/// The unique index a replayed `scan_id` trips.
const SCAN_ID_INDEX: &str = "checkins_scan_id";

/// `in` (entering) or `out` (leaving).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    In,
    Out,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

/// One scan as the server received it.
#[derive(Debug, Clone, Copy)]
pub struct Scan<'a> {
    pub event: &'a str,
    pub scanner: &'a ScannerCredential,
    pub direction: Direction,
    pub scan_id: Option<&'a str>,
    /// The scanner's clock (information only).
    pub device_time: Option<DateTime<Utc>>,
    /// An uploaded offline decision: what the device decided (`ENTRY`, `EXIT` or its refusal
    /// code). `None` for an online scan.
    pub offline_decided: Option<&'a str>,
    /// The upload came from a scanner revoked since (kept as a fact, flagged).
    pub from_revoked: bool,
}

/// A logged decision, as answered (first time or replayed).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Decision {
    /// `ENTRY`, `EXIT`, or a refusal's code.
    pub result: String,
    pub reason: Option<String>,
    pub ticket_id: Option<String>,
    pub seat_id: Option<String>,
    pub ga_tier: Option<String>,
    /// The gate this scan was made at.
    pub gate: String,
    pub direction: String,
    /// Server time of the decision.
    pub received_at: DateTime<Utc>,
    /// The entry in force when the decision was made (the new one for `ENTRY`).
    pub entry_at: Option<DateTime<Utc>>,
    pub entry_gate: Option<String>,
    /// An offline admission the server would not have made (see `checkins.conflict`).
    pub conflict: bool,
}

/// What a write of a scan came to.
#[derive(Debug)]
pub enum Written {
    /// Decided now.
    New(Decision),
    /// The same `scan_id` was decided before: its first answer (nothing changed now).
    Replayed(Decision),
}

/// The decision of a scan whose code verified for this event: the ticket's row is locked
/// (`FOR UPDATE`: concurrent scans of it wait here and then read what the winner wrote), its
/// door state changes only when the code's version is the ticket's, the ticket is not void,
/// and it is not inside (on the way in; with `reentry` only once it went out) or is inside (on
/// the way out); the decision is inserted into `checkins` in the same statement, under the
/// code's ticket id (signed by us, so worth keeping even when no such ticket exists).
pub async fn decide(
    pool: &PgPool,
    scan: &Scan<'_>,
    ticket: &str,
    version: i32,
) -> Result<Written, sqlx::Error> {
    let run = sqlx::query_as::<_, Decision>(
        "WITH t AS MATERIALIZED (
             SELECT k.id, k.version, k.void_reason, k.inside, k.entered_at, k.entered_gate,
                    k.entries, k.seat_id, k.ga_tier, e.reentry
               FROM tickets k JOIN events e ON e.id = k.event_id
              WHERE k.id = $2::text AND k.event_id = $1::text
                FOR UPDATE OF k),
         moved AS (
             UPDATE tickets k
                SET inside = ($4::text = 'in'),
                    entered_at = CASE WHEN $4::text = 'in' THEN now() ELSE k.entered_at END,
                    entered_gate = CASE WHEN $4::text = 'in' THEN $6::text
                                        ELSE k.entered_gate END,
                    entries = k.entries + CASE WHEN $4::text = 'in' THEN 1 ELSE 0 END,
                    exited_at = CASE WHEN $4::text = 'out' THEN now() ELSE k.exited_at END
               FROM t
              WHERE k.id = t.id AND t.version = $3::int4 AND t.void_reason IS NULL
                AND CASE WHEN $4::text = 'in' THEN NOT t.inside AND (t.entries = 0 OR t.reentry)
                         ELSE t.inside END
             RETURNING k.id),
         decided AS (
             SELECT CASE
                      WHEN EXISTS (SELECT 1 FROM moved)
                        THEN CASE WHEN $4::text = 'in' THEN 'ENTRY' ELSE 'EXIT' END
                      WHEN t.id IS NULL THEN 'INVALID_CODE'
                      WHEN t.void_reason IS NOT NULL OR t.version <> $3::int4 THEN 'VOIDED'
                      WHEN $4::text = 'in' AND t.inside THEN 'ALREADY_INSIDE'
                      WHEN $4::text = 'in' THEN 'REENTRY_NOT_ALLOWED'
                      ELSE 'NOT_INSIDE'
                    END AS result,
                    CASE
                      WHEN EXISTS (SELECT 1 FROM moved) THEN NULL
                      WHEN t.id IS NULL THEN 'unknown_ticket'
                      WHEN t.void_reason IS NOT NULL THEN t.void_reason
                      WHEN t.version <> $3::int4 THEN 'reissued'
                    END AS reason,
                    t.id AS ticket_id, t.seat_id, t.ga_tier,
                    CASE WHEN EXISTS (SELECT 1 FROM moved) AND $4::text = 'in' THEN now()
                         WHEN t.inside THEN t.entered_at END AS entry_at,
                    CASE WHEN EXISTS (SELECT 1 FROM moved) AND $4::text = 'in' THEN $6::text
                         WHEN t.inside THEN t.entered_gate END AS entry_gate
               FROM (SELECT 1) AS one LEFT JOIN t ON true),
         logged AS (
             INSERT INTO checkins (event_id, scanner_id, gate, ticket_id, version_seen,
                                   direction, result, reason, scan_id, device_time,
                                   received_at, entry_at, entry_gate, offline_decided,
                                   conflict, from_revoked_scanner)
             SELECT $1::text, $5::text, $6::text, $2::text, $3::int4, $4::text, d.result,
                    d.reason, $7::text, $8::timestamptz, now(), d.entry_at, d.entry_gate,
                    $9::text,
                    coalesce($9::text IN ('ENTRY', 'EXIT') AND $9::text <> d.result, false),
                    $10::bool
               FROM decided d
             RETURNING result, reason, ticket_id, gate, direction, received_at, entry_at,
                       entry_gate, conflict)
         SELECT l.result, l.reason, l.ticket_id, d.seat_id, d.ga_tier, l.gate, l.direction,
                l.received_at, l.entry_at, l.entry_gate, l.conflict
           FROM logged l, decided d",
    )
    .bind(scan.event)
    .bind(ticket)
    .bind(version)
    .bind(scan.direction.as_str())
    .bind(&scan.scanner.id)
    .bind(&scan.scanner.gate)
    .bind(scan.scan_id)
    .bind(scan.device_time)
    .bind(scan.offline_decided)
    .bind(scan.from_revoked)
    .fetch_one(pool)
    .await;
    settle(pool, scan, run).await
}

/// Logs a scan refused before the database was asked (`INVALID_CODE`, `WRONG_EVENT`,
/// `CODE_EXPIRED`): `ticket` is the code's ticket and version when its signature was good.
pub async fn record(
    pool: &PgPool,
    scan: &Scan<'_>,
    ticket: Option<(&str, i32)>,
    result: &str,
    reason: Option<&str>,
) -> Result<Written, sqlx::Error> {
    let run = sqlx::query_as::<_, Decision>(
        "WITH logged AS (
             INSERT INTO checkins (event_id, scanner_id, gate, ticket_id, version_seen,
                                   direction, result, reason, scan_id, device_time,
                                   received_at, offline_decided, conflict,
                                   from_revoked_scanner)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), $11::text,
                     coalesce($11::text IN ('ENTRY', 'EXIT') AND $11::text <> $7::text, false),
                     $12)
             RETURNING result, reason, ticket_id, gate, direction, received_at, entry_at,
                       entry_gate, conflict)
         SELECT l.result, l.reason, l.ticket_id, k.seat_id, k.ga_tier, l.gate, l.direction,
                l.received_at, l.entry_at, l.entry_gate, l.conflict
           FROM logged l LEFT JOIN tickets k ON k.id = l.ticket_id",
    )
    .bind(scan.event)
    .bind(&scan.scanner.id)
    .bind(&scan.scanner.gate)
    .bind(ticket.map(|t| t.0))
    .bind(ticket.map(|t| t.1))
    .bind(scan.direction.as_str())
    .bind(result)
    .bind(reason)
    .bind(scan.scan_id)
    .bind(scan.device_time)
    .bind(scan.offline_decided)
    .bind(scan.from_revoked)
    .fetch_one(pool)
    .await;
    settle(pool, scan, run).await
}

/// A decision, or, when the insert met the scanner's `scan_id` already logged, the first one.
async fn settle(
    pool: &PgPool,
    scan: &Scan<'_>,
    run: Result<Decision, sqlx::Error>,
) -> Result<Written, sqlx::Error> {
    match run {
        Ok(d) => Ok(Written::New(d)),
        Err(sqlx::Error::Database(db)) if db.constraint() == Some(SCAN_ID_INDEX) => {
            let Some(scan_id) = scan.scan_id else {
                return Err(sqlx::Error::Database(db));
            };
            // The first insert committed before this one failed: it is there to read.
            replay(pool, &scan.scanner.id, scan_id)
                .await?
                .map(Written::Replayed)
                .ok_or(sqlx::Error::RowNotFound)
        }
        Err(e) => Err(e),
    }
}

/// The logged decision of `scan_id` from `scanner`.
pub async fn replay(
    pool: &PgPool,
    scanner: &str,
    scan_id: &str,
) -> Result<Option<Decision>, sqlx::Error> {
    sqlx::query_as(
        "SELECT c.result, c.reason, c.ticket_id, k.seat_id, k.ga_tier, c.gate, c.direction,
                c.received_at, c.entry_at, c.entry_gate, c.conflict
           FROM checkins c LEFT JOIN tickets k ON k.id = c.ticket_id
          WHERE c.scanner_id = $1 AND c.scan_id = $2",
    )
    .bind(scanner)
    .bind(scan_id)
    .fetch_optional(pool)
    .await
}
