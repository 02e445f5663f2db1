//! An event as the admin API creates it: the request, its defaults, and every check that
//! needs no database (a bad request is refused before anything is written). Pure, with unit
//! tests below.

use crate::inventory::model::{Invalid, is_valid_seat_id};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use utoipa::ToSchema;

/// Most seats one event may have.
pub const MAX_SEATS: u64 = 200_000;
/// Most rows, or seats per row, in one section.
const MAX_SECTION_DIM: i32 = 10_000;
/// Largest price (minor units) and GA capacity accepted.
const MAX_PRICE: i64 = 1_000_000_000_000;
const MAX_GA_CAPACITY: i32 = 10_000_000;
const MAX_GA_SHARDS: i32 = 64;
/// Largest per-seat rank a seat map may set (default ranks stay below 10,000 x 20,001).
pub const MAX_RANK: i32 = 1_000_000_000;
/// Most entries of `seat_map.ranks`.
const MAX_RANKS: usize = 200_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEvent {
    /// The event's id (a slug); generated when absent.
    #[schema(pattern = "^[a-z0-9_-]{1,64}$")]
    pub id: Option<String>,
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 200)]
    pub venue: String,
    pub sale_start: DateTime<Utc>,
    #[serde(default = "default_ttl")]
    #[schema(minimum = 10, maximum = 86400, default = 600)]
    pub hold_ttl_s: i32,
    #[serde(default = "default_limit")]
    #[schema(minimum = 1, maximum = 100, default = 4)]
    pub max_tickets_per_account: i32,
    #[serde(default)]
    #[schema(max_items = 50)]
    pub price_tiers: Vec<PriceTier>,
    #[serde(default)]
    pub seat_map: SeatMap,
    #[serde(default)]
    #[schema(max_items = 20)]
    pub ga_tiers: Vec<GaTierSpec>,
    /// What a refund or dispute of a paid order does with its seats/units.
    #[serde(default)]
    pub refund_stock: RefundStock,
    /// Refuse explicit holds that would strand a single free seat (`409 ORPHAN_SEAT`).
    #[serde(default)]
    pub no_orphans: bool,
    /// When the show starts (RFC 3339); tickets, e-mail and `.ics` use it when present.
    #[serde(default)]
    pub starts_at: Option<DateTime<Utc>>,
    /// When the doors open: not after `starts_at`.
    #[serde(default)]
    pub doors_at: Option<DateTime<Utc>>,
    /// The venue's IANA time zone (`Europe/London`), for showing the times.
    #[serde(default)]
    #[schema(max_length = 64, example = "Asia/Tokyo")]
    pub timezone: Option<String>,
    /// The venue's postal address, one text.
    #[serde(default)]
    #[schema(max_length = 500)]
    pub venue_address: Option<String>,
    /// How the event's ticket codes are shown (docs/api.md, "Ticket codes").
    #[serde(default)]
    pub ticket_code: TicketCode,
    /// Whether a ticket that went out at the door may come back in (default no).
    #[serde(default)]
    pub reentry: bool,
    /// Whether tickets may be transferred to another fan (default yes).
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub transfers: bool,
}

fn default_true() -> bool {
    true
}

/// `ticket_code`: one signed code per ticket version (`static`), or that code plus a TOTP the
/// fan's device computes every 15 s (`rotating`), which stops screenshots being passed on.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, sqlx::Type, ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum TicketCode {
    #[default]
    Static,
    Rotating,
}

/// Checks an event's date fields: doors not after the start, a real IANA zone name, an
/// address of at most 500 characters.
pub fn validate_date(
    starts_at: Option<DateTime<Utc>>,
    doors_at: Option<DateTime<Utc>>,
    timezone: Option<&str>,
    venue_address: Option<&str>,
) -> Result<(), Invalid> {
    if let (Some(start), Some(doors)) = (starts_at, doors_at)
        && doors > start
    {
        return Err(invalid("doors_at", "doors_at must not be after starts_at"));
    }
    if let Some(tz) = timezone
        && (tz.len() > 64 || tz.parse::<chrono_tz::Tz>().is_err())
    {
        return Err(invalid(
            "timezone",
            "timezone must be an IANA time zone name such as Europe/London",
        ));
    }
    if let Some(addr) = venue_address
        && addr.chars().count() > 500
    {
        return Err(invalid(
            "venue_address",
            "venue_address must be at most 500 characters",
        ));
    }
    Ok(())
}

/// `refund_stock`: units of an order refunded or disputed at the provider go back on sale
/// (`release`, the default) or are held back, neither sold nor on sale (`hold_back`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, sqlx::Type, ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum RefundStock {
    #[default]
    Release,
    HoldBack,
}

impl RefundStock {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundStock::Release => "release",
            RefundStock::HoldBack => "hold_back",
        }
    }
}

fn default_ttl() -> i32 {
    600
}
fn default_limit() -> i32 {
    4
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceTier {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,32}$")]
    pub tier: String,
    /// integer minor units
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    pub price: i64,
}

/// Sections (rows × seats per row, ids `"{section}-R{row}-{n}"`) and/or explicit seats; at
/// most 200,000 seats (the document bounds the sizes it lets a generator draw).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SeatMap {
    #[serde(default)]
    #[schema(max_items = 20)]
    pub sections: Vec<Section>,
    #[serde(default)]
    #[schema(max_items = 200)]
    pub seats: Vec<ExplicitSeat>,
    /// Per-seat rank for best available (lower is better), for any seat of the map; seats
    /// not named keep their own or the default (row ascending, then distance from centre).
    #[serde(default)]
    /// seat id → rank (lower is better)
    #[schema(value_type = BTreeMap<String, SeatRank>)]
    pub ranks: BTreeMap<String, i32>,
}

/// A seat's best-available rank (lower is better).
#[derive(ToSchema)]
#[schema(value_type = i32, minimum = 0, maximum = 1_000_000_000)]
#[expect(dead_code, reason = "a schema only: the rank's bounds in the document")]
pub struct SeatRank(i32);

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Section {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,32}$")]
    pub name: String,
    #[schema(minimum = 1, maximum = 100)]
    pub rows: i32,
    #[schema(minimum = 1, maximum = 100)]
    pub seats_per_row: i32,
    pub price_tier: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplicitSeat {
    #[schema(pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
    pub seat_id: String,
    #[schema(pattern = "^[A-Za-z0-9_-]{1,32}$")]
    pub section: String,
    #[schema(minimum = 1)]
    pub row: i32,
    #[schema(minimum = 1)]
    pub number: i32,
    pub price_tier: String,
    /// Best-available rank (lower is better); default: row ascending, then centre first.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub rank: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GaTierSpec {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,32}$")]
    pub tier: String,
    /// integer minor units
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    pub price: i64,
    #[schema(minimum = 0, maximum = 10_000_000)]
    pub capacity: i32,
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 64, default = 1)]
    pub shards: i32,
}

fn one() -> i32 {
    1
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventCreated {
    pub id: String,
    pub name: String,
    pub venue: String,
    pub sale_start: DateTime<Utc>,
    pub hold_ttl_s: i32,
    pub max_tickets_per_account: i32,
    pub seats: u64,
    pub price_tiers: Vec<PriceTier>,
    pub ga_tiers: Vec<GaTierSpec>,
    pub refund_stock: RefundStock,
    pub no_orphans: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doors_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub venue_address: Option<String>,
    pub ticket_code: TicketCode,
    pub reentry: bool,
    pub transfers: bool,
}

/// Section and tier names: 1..=32 ASCII letters, digits, `-`, `_` (they become part of seat ids).
fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn invalid(field: &'static str, message: impl Into<String>) -> Invalid {
    Invalid::field(field, message)
}

/// Checks everything that can be checked without the database; returns the seat count.
pub fn validate(req: &CreateEvent) -> Result<u64, Invalid> {
    if let Some(id) = &req.id
        && !shared::ids::is_valid_slug(id)
    {
        return Err(invalid(
            "id",
            "id must be 1-64 characters of a-z, 0-9, - and _",
        ));
    }
    if req.name.trim().is_empty() || req.name.chars().count() > 200 {
        return Err(invalid("name", "name must be 1-200 characters"));
    }
    if req.venue.chars().count() > 200 {
        return Err(invalid("venue", "venue must be at most 200 characters"));
    }
    validate_date(
        req.starts_at,
        req.doors_at,
        req.timezone.as_deref(),
        req.venue_address.as_deref(),
    )?;
    if !(10..=86_400).contains(&req.hold_ttl_s) {
        return Err(invalid("hold_ttl_s", "hold_ttl_s must be 10..=86400"));
    }
    if !(1..=100).contains(&req.max_tickets_per_account) {
        return Err(invalid(
            "max_tickets_per_account",
            "max_tickets_per_account must be 1..=100",
        ));
    }
    let mut tiers = HashSet::new();
    for t in &req.price_tiers {
        if !is_valid_name(&t.tier) {
            return Err(invalid(
                "price_tiers",
                "tier names are 1-32 of A-Z a-z 0-9 - _",
            ));
        }
        if !(0..=MAX_PRICE).contains(&t.price) {
            return Err(
                invalid("price_tiers", "price must be 0..=10^12 minor units")
                    .with("tier", t.tier.clone()),
            );
        }
        if !tiers.insert(t.tier.as_str()) {
            return Err(invalid("price_tiers", "duplicate price tier").with("tier", t.tier.clone()));
        }
    }
    let mut total: u64 = 0;
    let mut sections = HashSet::new();
    for s in &req.seat_map.sections {
        if !is_valid_name(&s.name) {
            return Err(invalid(
                "seat_map.sections",
                "section names are 1-32 of A-Z a-z 0-9 - _",
            ));
        }
        if !sections.insert(s.name.as_str()) {
            return Err(invalid("seat_map.sections", "duplicate section name")
                .with("section", s.name.clone()));
        }
        if !(1..=MAX_SECTION_DIM).contains(&s.rows)
            || !(1..=MAX_SECTION_DIM).contains(&s.seats_per_row)
        {
            return Err(invalid(
                "seat_map.sections",
                format!("rows and seats_per_row must be 1..={MAX_SECTION_DIM}"),
            )
            .with("section", s.name.clone()));
        }
        if !tiers.contains(s.price_tier.as_str()) {
            return Err(invalid("seat_map.sections", "unknown price tier")
                .with("section", s.name.clone())
                .with("tier", s.price_tier.clone()));
        }
        total += s.rows as u64 * s.seats_per_row as u64;
        if total > MAX_SEATS {
            return Err(invalid(
                "seat_map",
                format!("an event has at most {MAX_SEATS} seats"),
            ));
        }
    }
    let mut ids = HashSet::with_capacity(req.seat_map.seats.len());
    for s in &req.seat_map.seats {
        if !is_valid_seat_id(&s.seat_id) {
            return Err(invalid("seat_map.seats", "malformed seat id")
                .with("seat", s.seat_id.chars().take(80).collect::<String>()));
        }
        if !is_valid_name(&s.section) || s.row < 1 || s.number < 1 {
            return Err(invalid(
                "seat_map.seats",
                "each seat needs a valid section and row/number >= 1",
            )
            .with("seat", s.seat_id.clone()));
        }
        if !tiers.contains(s.price_tier.as_str()) {
            return Err(invalid("seat_map.seats", "unknown price tier")
                .with("seat", s.seat_id.clone())
                .with("tier", s.price_tier.clone()));
        }
        if !ids.insert(s.seat_id.as_str()) {
            return Err(
                invalid("seat_map.seats", "duplicate seat id").with("seat", s.seat_id.clone())
            );
        }
        if s.rank.is_some_and(|r| !(0..=MAX_RANK).contains(&r)) {
            return Err(
                invalid("seat_map.seats", format!("rank must be 0..={MAX_RANK}"))
                    .with("seat", s.seat_id.clone()),
            );
        }
        total += 1;
        if total > MAX_SEATS {
            return Err(invalid(
                "seat_map",
                format!("an event has at most {MAX_SEATS} seats"),
            ));
        }
    }
    if req.seat_map.ranks.len() > MAX_RANKS {
        return Err(invalid(
            "seat_map.ranks",
            format!("at most {MAX_RANKS} ranks"),
        ));
    }
    for (seat, rank) in &req.seat_map.ranks {
        if !is_valid_seat_id(seat) {
            return Err(invalid("seat_map.ranks", "malformed seat id")
                .with("seat", seat.chars().take(80).collect::<String>()));
        }
        if !(0..=MAX_RANK).contains(rank) {
            return Err(
                invalid("seat_map.ranks", format!("rank must be 0..={MAX_RANK}"))
                    .with("seat", seat.clone()),
            );
        }
    }
    let mut ga = HashSet::new();
    for t in &req.ga_tiers {
        if !is_valid_name(&t.tier) {
            return Err(invalid(
                "ga_tiers",
                "tier names are 1-32 of A-Z a-z 0-9 - _",
            ));
        }
        if !ga.insert(t.tier.as_str()) {
            return Err(invalid("ga_tiers", "duplicate GA tier").with("tier", t.tier.clone()));
        }
        if !(0..=MAX_PRICE).contains(&t.price) {
            return Err(invalid("ga_tiers", "price must be 0..=10^12 minor units")
                .with("tier", t.tier.clone()));
        }
        if !(0..=MAX_GA_CAPACITY).contains(&t.capacity) {
            return Err(invalid(
                "ga_tiers",
                format!("capacity must be 0..={MAX_GA_CAPACITY}"),
            )
            .with("tier", t.tier.clone()));
        }
        if !(1..=MAX_GA_SHARDS).contains(&t.shards) || t.shards > t.capacity.max(1) {
            return Err(invalid(
                "ga_tiers",
                format!("shards must be 1..={MAX_GA_SHARDS} and at most the capacity"),
            )
            .with("tier", t.tier.clone()));
        }
    }
    // An event without seats or GA tiers is fine: a flash sale of products or an auction day
    // is an event too (its products and auctions belong to it).
    Ok(total)
}
#[cfg(test)]
mod tests;
