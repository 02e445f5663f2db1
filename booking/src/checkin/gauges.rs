//! The door's live counts as gauges: tickets inside and tickets that entered, per event and
//! gate (the gate of the entry in force), read from Postgres every few seconds by every
//! instance ([`GateCounts`]). Read from the database rather than kept in memory, so every
//! instance reports the same truth whatever it served and however often it restarted (the
//! dashboard takes `max` across instances). Two partial indexes keep the read to the tickets
//! at the door (`tickets_inside`, `tickets_entered`).

use crate::checkin::CheckinMetrics;
use crate::platform::jobs::Job;
use anyhow::Context;
use async_trait::async_trait;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

/// How often the gauges are refreshed.
const EVERY: Duration = Duration::from_secs(5);

/// Refreshes `checkin_inside` and `checkin_entered`.
pub struct GateCounts {
    pool: PgPool,
    metrics: CheckinMetrics,
    /// The (event, gate) pairs set last time: a pair that no longer has any ticket is removed.
    shown: Mutex<HashSet<(String, String)>>,
}

impl GateCounts {
    pub fn new(pool: PgPool, metrics: CheckinMetrics) -> Self {
        Self {
            pool,
            metrics,
            shown: Mutex::new(HashSet::new()),
        }
    }
}

#[async_trait]
impl Job for GateCounts {
    fn name(&self) -> &'static str {
        "checkin_gauges"
    }

    fn period(&self) -> Duration {
        EVERY
    }

    async fn run_once(&self) -> anyhow::Result<()> {
        // One statement, one snapshot: inside never exceeds entered in what is shown.
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT event_id, entered_gate, count(*) FILTER (WHERE inside), count(*)
               FROM tickets
              WHERE entries > 0 AND entered_gate IS NOT NULL
              GROUP BY event_id, entered_gate",
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to count the tickets at the door")?;
        let mut now = HashSet::with_capacity(rows.len());
        for (event, gate, inside, entered) in rows {
            let labels = [event.as_str(), gate.as_str()];
            self.metrics.inside.with_label_values(&labels).set(inside);
            self.metrics.entered.with_label_values(&labels).set(entered);
            now.insert((event, gate));
        }
        let mut shown = self
            .shown
            .lock()
            .map_err(|_| anyhow::anyhow!("the gauges' label set was poisoned"))?;
        for (event, gate) in shown.difference(&now) {
            let labels = [event.as_str(), gate.as_str()];
            // Absent is fine: nothing to remove.
            let _ = self.metrics.inside.remove_label_values(&labels);
            let _ = self.metrics.entered.remove_label_values(&labels);
        }
        *shown = now;
        Ok(())
    }
}
