//! Launch dry run (`floodgate-sim`): replays an arrival curve against a room config with the
//! gateway's own admission logic, in simulated time, and reports queue length, waits,
//! admitted/s, the sell-out, and from measured per-operation costs the Redis calls per shard
//! and gateway processes a launch needs (docs/operations.md, "Sizing a launch with the
//! simulator").
//!
//! What is the gateway's own: the room config and its validation ([`EventConfigInput`]), the
//! admission tick (a mirror of `TICK_LUA` in [`tick`], kept in step by hand), the poll
//! cadence (`queue::poll_after_ms`) and the checkout slot rules (`session::decide`). What is a
//! model: when fans arrive ([`arrivals`]), what admitted fans do ([`buyers`], after
//! `loadgen surge`), and what each request costs ([`costs`]). docs/decisions.md
//! ("simulator: model and limits") lists what the model leaves out.

pub mod arrivals;
pub mod buyers;
pub mod costs;
pub mod engine;
pub mod net;
pub mod polls;
pub mod report;
pub mod svg;
pub mod tick;
pub mod timeline;
pub mod waiting;

use crate::event_config::{EventConfig, EventConfigInput};
pub use engine::{SimInput, SimOutput, simulate};
pub use report::Summary;

/// Parses and validates a room config as `PUT /admin/events/{event}/config` does; every
/// problem is named (JSON position, or each field that fails validation).
pub fn parse_room(
    json: &str,
    default_ttl_s: u64,
    default_claim_s: u64,
) -> Result<EventConfig, String> {
    let input: EventConfigInput =
        serde_json::from_str(json).map_err(|e| format!("room config is not valid: {e}"))?;
    input
        .validate(default_ttl_s, default_claim_s)
        .map_err(|errs| {
            let list: Vec<String> = errs
                .iter()
                .map(|e| format!("{}: {}", e.field, e.problem))
                .collect();
            format!("room config refused: {}", list.join("; "))
        })
}

/// Runs the simulation and sizes the deployment: the summary, with the timeline (each
/// second's Redis calls and gateway load filled in).
pub fn run(input: &SimInput, c: &costs::Costs) -> (Summary, timeline::Timeline) {
    let mut out = simulate(input);
    let sizing = costs::size(&mut out.timeline, c);
    let summary = report::summarize(input, &mut out, sizing);
    (summary, out.timeline)
}

#[cfg(test)]
mod tests;
