//! What a waiting fan is told beyond their place: that the safety net is queueing ("high
//! demand, a short queue") and when a scheduled change opens the sale. From the instance's
//! snapshot (refreshed every `refresh_ms`), so status polls answered from memory carry them.

use crate::event_config::{EventConfig, Mode};
use crate::store::EventSnapshot;
use serde_json::{Value, json};

/// Adds `safety_net` (`pass`/`queueing`) and `opens_at` (RFC 3339) to a waiting answer.
pub(super) fn add(body: &mut Value, snap: &EventSnapshot, cfg: &EventConfig) {
    if cfg.mode == Mode::SafetyNet
        && let Some(state) = &snap.safety_net_state
    {
        body["safety_net"] = json!(state);
    }
    if let Some(at) = crate::schedule::opening(cfg, &snap.pending, chrono::Utc::now()) {
        body["opens_at"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
}
