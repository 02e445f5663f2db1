//! What a waiting fan is told beyond their place: that the safety net is queueing ("high
//! demand, a short queue") and when a scheduled change opens the sale. From the instance's
//! snapshot (refreshed every `refresh_ms`), so status polls answered from memory carry them.

use crate::event_config::{EventConfig, Mode};
use crate::store::EventSnapshot;
use serde_json::{Value, json};

/// Adds `safety_net` and `opens_at` (RFC 3339) to a waiting answer. A fan waiting in a
/// safety-net room after the sale start is in its backlog, so the net is queueing by
/// definition (the snapshot's state may be one refresh old).
pub(super) fn add(body: &mut Value, snap: &EventSnapshot, cfg: &EventConfig) {
    if cfg.mode == Mode::SafetyNet && cfg.sale_start <= chrono::Utc::now() {
        body["safety_net"] = json!("queueing");
    }
    if let Some(at) = crate::schedule::opening(cfg, &snap.pending, chrono::Utc::now()) {
        body["opens_at"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
}
