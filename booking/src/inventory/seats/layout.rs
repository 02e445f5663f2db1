//! The static half of a seat map: which seats exist, their section, row, number, tier and
//! price. Seats are written only when the event is created, so a process reads an event's
//! layout once and keeps it; the seat order here (section, row, number, seat id, as Postgres
//! sorts them) is the order of the JSON map and of the compact availability's bits.
//!
//! The compact layout groups seats by section and row, and a row into runs of consecutive
//! numbers of one tier whose ids follow the generated pattern `{section}-R{row}-{number}`;
//! see docs/api.md ("Compact seat map") for the format and a worked example.

use super::encode::{Encoded, Shown, content_tag};
use crate::inventory::error::{During, InventoryError};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;

/// One seat of the layout; `section` and `tier` index [`Layout::sections`] / [`Layout::tiers`].
pub(crate) struct Seat {
    pub seat_id: String,
    pub section: u32,
    pub row: i32,
    pub number: i32,
    pub tier: u32,
}

#[derive(Serialize)]
pub(crate) struct Tier {
    pub tier: String,
    /// Minor units; `None` for a seat tier without a price row (not created by the API).
    pub price: Option<i64>,
}

pub(crate) struct Layout {
    pub sections: Vec<String>,
    pub tiers: Vec<Tier>,
    pub seats: Vec<Seat>,
    /// Seat id → position in `seats` (and in the availability bits).
    pub index: HashMap<String, u32>,
    /// The compact layout body; its tag is the layout's id, named by every availability body.
    pub compact: Encoded,
    pub id: String,
}

type SeatRow = (String, String, i32, i32, String);

/// Reads the event's layout (`UnknownEvent` if there is no such event).
pub(crate) async fn load(pool: &PgPool, event: &str) -> Result<Layout, InventoryError> {
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .during("begin reading the seat layout")?;
    let tiers: Option<sqlx::types::Json<Vec<(String, i64)>>> = sqlx::query_scalar(
        "SELECT COALESCE((SELECT json_agg(json_build_array(tier, price) ORDER BY tier)
                          FROM price_tiers WHERE event_id = e.id), '[]'::json)
         FROM events e WHERE e.id = $1",
    )
    .bind(event)
    .fetch_optional(&mut *tx)
    .await
    .during("read the event's price tiers")?;
    let Some(sqlx::types::Json(tiers)) = tiers else {
        return Err(InventoryError::UnknownEvent);
    };
    let rows: Vec<SeatRow> = sqlx::query_as(
        "SELECT seat_id, section, row_no, number, tier FROM seats WHERE event_id = $1
         ORDER BY section, row_no, number, seat_id",
    )
    .bind(event)
    .fetch_all(&mut *tx)
    .await
    .during("read the seat layout")?;
    tx.commit().await.during("finish reading the seat layout")?;
    build(event, tiers, rows)
}

fn build(
    event: &str,
    tiers: Vec<(String, i64)>,
    rows: Vec<SeatRow>,
) -> Result<Layout, InventoryError> {
    let mut tier_ix: HashMap<String, u32> = HashMap::new();
    let mut tier_list: Vec<Tier> = Vec::new();
    for (tier, price) in tiers {
        tier_ix.insert(tier.clone(), tier_list.len() as u32);
        tier_list.push(Tier {
            tier,
            price: Some(price),
        });
    }
    let mut sections: Vec<String> = Vec::new();
    let mut seats = Vec::with_capacity(rows.len());
    let mut index = HashMap::with_capacity(rows.len());
    for (seat_id, section, row, number, tier) in rows {
        if sections.last() != Some(&section) {
            sections.push(section);
        }
        let tier = match tier_ix.get(&tier) {
            Some(i) => *i,
            None => {
                let i = tier_list.len() as u32;
                tier_ix.insert(tier.clone(), i);
                tier_list.push(Tier { tier, price: None });
                i
            }
        };
        index.insert(seat_id.clone(), seats.len() as u32);
        seats.push(Seat {
            seat_id,
            section: (sections.len() - 1) as u32,
            row,
            number,
            tier,
        });
    }
    let body = compact_body(event, &sections, &tier_list, &seats, None)?;
    let id = content_tag("l-", &body);
    let body = compact_body(event, &sections, &tier_list, &seats, Some(&id))?;
    Ok(Layout {
        compact: Encoded::new(body, &id),
        id,
        sections,
        tiers: tier_list,
        seats,
        index,
    })
}

#[derive(Serialize)]
struct CompactLayout<'a> {
    event: &'a str,
    /// The layout's id (also its `ETag`); `None` only while hashing the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    format: u32,
    seats: usize,
    tiers: &'a [Tier],
    sections: Vec<CompactSection<'a>>,
}

#[derive(Serialize)]
struct CompactSection<'a> {
    name: &'a str,
    rows: Vec<CompactRow>,
}

#[derive(Serialize)]
struct CompactRow {
    row: i32,
    /// `[first_number, count, tier_index]`, or with a fourth element, the seats' own ids
    /// when they do not follow `{section}-R{row}-{number}`.
    runs: Vec<Run>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Run {
    Generated(i32, u32, u32),
    Named(i32, u32, u32, Vec<String>),
}

fn generated_id(section: &str, row: i32, number: i32) -> String {
    format!("{section}-R{row}-{number}")
}

fn compact_body(
    event: &str,
    sections: &[String],
    tiers: &[Tier],
    seats: &[Seat],
    id: Option<&str>,
) -> Result<Vec<u8>, InventoryError> {
    let mut out: Vec<CompactSection> = sections
        .iter()
        .map(|name| CompactSection {
            name,
            rows: Vec::new(),
        })
        .collect();
    for seat in seats {
        let sec_name = &sections[seat.section as usize];
        let sec = &mut out[seat.section as usize];
        if sec.rows.last().map(|r| r.row) != Some(seat.row) {
            sec.rows.push(CompactRow {
                row: seat.row,
                runs: Vec::new(),
            });
        }
        let Some(row) = sec.rows.last_mut() else {
            continue;
        };
        let named = seat.seat_id != generated_id(sec_name, seat.row, seat.number);
        let extends = |first: i32, count: u32, tier: u32| {
            tier == seat.tier && i64::from(first) + i64::from(count) == i64::from(seat.number)
        };
        match row.runs.last_mut() {
            Some(Run::Generated(first, count, tier))
                if !named && extends(*first, *count, *tier) =>
            {
                *count += 1;
            }
            Some(Run::Named(first, count, tier, ids))
                if named && extends(*first, *count, *tier) =>
            {
                *count += 1;
                ids.push(seat.seat_id.clone());
            }
            _ if named => row.runs.push(Run::Named(
                seat.number,
                1,
                seat.tier,
                vec![seat.seat_id.clone()],
            )),
            _ => row.runs.push(Run::Generated(seat.number, 1, seat.tier)),
        }
    }
    serde_json::to_vec(&CompactLayout {
        event,
        id,
        format: 1,
        seats: seats.len(),
        tiers,
        sections: out,
    })
    .map_err(InventoryError::Render)
}

#[derive(Serialize)]
struct SeatView<'a> {
    seat_id: &'a str,
    section: &'a str,
    row: i32,
    number: i32,
    tier: &'a str,
    status: &'static str,
}

#[derive(Serialize)]
struct SeatMapView<'a> {
    event: &'a str,
    seats: Vec<SeatView<'a>>,
}

/// The JSON map (`GET /api/events/{event}/seats`), as it always was, from the layout and a
/// status per seat.
pub(crate) fn json_map(
    event: &str,
    layout: &Layout,
    statuses: &[Shown],
) -> Result<Vec<u8>, InventoryError> {
    let seats = layout
        .seats
        .iter()
        .zip(statuses)
        .map(|(s, status)| SeatView {
            seat_id: &s.seat_id,
            section: &layout.sections[s.section as usize],
            row: s.row,
            number: s.number,
            tier: &layout.tiers[s.tier as usize].tier,
            status: status.as_str(),
        })
        .collect();
    serde_json::to_vec(&SeatMapView { event, seats }).map_err(InventoryError::Render)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, sec: &str, r: i32, n: i32, tier: &str) -> SeatRow {
        (id.into(), sec.into(), r, n, tier.into())
    }

    #[test]
    fn rows_become_runs_of_generated_ids_and_named_seats_keep_theirs() {
        let layout = build(
            "ev",
            vec![("A".into(), 100), ("B".into(), 50)],
            vec![
                row("S1-R1-1", "S1", 1, 1, "A"),
                row("S1-R1-2", "S1", 1, 2, "A"),
                row("S1-R1-3", "S1", 1, 3, "B"),
                row("S1-R1-5", "S1", 1, 5, "B"),
                row("BOX-1", "S1", 2, 1, "A"),
                row("BOX-2", "S1", 2, 2, "A"),
                row("S2-R1-1", "S2", 1, 1, "C"),
            ],
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&layout.compact.body).unwrap();
        assert_eq!(v["id"], layout.id.as_str());
        assert_eq!(v["seats"], 7);
        assert_eq!(
            v["tiers"],
            serde_json::json!([
                {"tier": "A", "price": 100}, {"tier": "B", "price": 50},
                {"tier": "C", "price": null}
            ])
        );
        assert_eq!(
            v["sections"],
            serde_json::json!([
                {"name": "S1", "rows": [
                    {"row": 1, "runs": [[1, 2, 0], [3, 1, 1], [5, 1, 1]]},
                    {"row": 2, "runs": [[1, 2, 0, ["BOX-1", "BOX-2"]]]}
                ]},
                {"name": "S2", "rows": [{"row": 1, "runs": [[1, 1, 2]]}]}
            ])
        );
        assert_eq!(layout.index["BOX-2"], 5);
        let map: serde_json::Value =
            serde_json::from_slice(&json_map("ev", &layout, &[Shown::Sold; 7]).unwrap()).unwrap();
        assert_eq!(
            map["seats"][4],
            serde_json::json!({"seat_id": "BOX-1", "section": "S1", "row": 2, "number": 1,
                               "tier": "A", "status": "sold"})
        );
    }
}
