//! THE seat hold statement with the orphan guard: what best available and the explicit holds
//! of `no_orphans` events run. It is [`super::take`]'s `HOLD_SEATS` (same parameters, same
//! usage → hold → seats steps, same all-or-nothing), except for what it locks and one more
//! condition:
//!
//! - `locked` locks, in `seat_id` order like every seat path, the requested seats AND their
//!   row neighbours up to two numbers away (`near`: per section and row, the requested
//!   numbers' range widened by 2), without any status condition, so it returns every such
//!   seat's latest committed version (READ COMMITTED re-reads a row it waited for);
//! - `stranded` is, from those locked rows, every seat that would be free after the hold,
//!   with no free neighbour after it, next to a requested seat: a seat this hold strands
//!   (a gap in the numbering is a row end, like in `holds/best.rs`);
//! - the usage, and so the hold and its seats, is written only when `stranded` is empty.
//!
//! Why this is race-free: a seat `c` ends up stranded only if a hold takes one of its
//! neighbours while its other side is taken or an end. Every hold that takes a neighbour of
//! `c` locks `c` and both of `c`'s neighbours (two numbers from its own seat), so two such
//! holds serialise on those rows and the later one sees the earlier one's seats taken.
//! The last column lists the stranded seats (sorted) for the `409 ORPHAN_SEAT` answer.

pub(crate) const HOLD_SEATS_GUARDED: &str = concat!(
    "
WITH near AS (
    SELECT s.section, s.row_no, min(s.number) - 2 AS lo, max(s.number) + 2 AS hi
    FROM seats s
    WHERE s.event_id = $1 AND s.seat_id = ANY($4)
    GROUP BY s.section, s.row_no),
locked AS (
    SELECT s.seat_id, s.section, s.row_no, s.number, s.tier, s.hold_id AS prev_hold,
           s.seat_id = ANY($4) AS mine,
           (s.status = 'available'
            OR (s.status = 'held' AND s.held_until <= clock_timestamp())) AS free
    FROM seats s JOIN near n
      ON s.section = n.section AND s.row_no = n.row_no AND s.number BETWEEN n.lo AND n.hi
    WHERE s.event_id = $1
    ORDER BY s.seat_id
    FOR UPDATE OF s),
wanted AS (
    SELECT l.seat_id, l.prev_hold, p.price
    FROM locked l JOIN price_tiers p ON p.event_id = $1 AND p.tier = l.tier
    WHERE l.mine AND l.free),
after AS (
    SELECT l.seat_id, l.section, l.row_no, l.number, l.mine, l.free AND NOT l.mine AS free_after
    FROM locked l),
stranded AS (
    SELECT a.seat_id FROM after a
    WHERE a.free_after
      AND NOT EXISTS (
          SELECT 1 FROM after b
          WHERE b.section = a.section AND b.row_no = a.row_no
            AND b.number IN (a.number - 1, a.number + 1) AND b.free_after)
      AND EXISTS (
          SELECT 1 FROM after b
          WHERE b.section = a.section AND b.row_no = a.row_no
            AND b.number IN (a.number - 1, a.number + 1) AND b.mine)),",
    crate::seat_hold_writes_sql!(
        "AND NOT EXISTS (SELECT 1 FROM stranded)",
        "(SELECT array_agg(seat_id ORDER BY seat_id) FROM stranded)"
    )
);
