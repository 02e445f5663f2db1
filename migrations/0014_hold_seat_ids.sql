-- Seat state changes become HOT updates (issue 16: seat holds at the database's limit).
--
-- Every hold, pin, sale and release rewrites its seats' `status`, `hold_id` and `held_until`.
-- Two indexes named those columns (`seats_hold_id`, `seats_held_until`), so no such update
-- could be HOT: each wrote a new version of the row into all five of the table's indexes.
-- pgbench on THE seat hold statement plus its release, 32 clients, 60,000-seat event, same
-- box: 855-1,126 holds/s with the indexes, 1,430-1,612/s without them and with room on the
-- pages (97 % of the seat updates HOT).
--
-- - `seats_held_until` was read by nothing (every statement finds seats by event and id, or
--   by the event's layout indexes).
-- - `seats_hold_id` found a hold's seats. A seat hold now records its seats in the hold row
--   (`seat_ids`, sorted), and every path finds them by primary key with the same guard as
--   before: `s.hold_id = h.id` (a seat reclaimed by a later hold carries that hold's id and is
--   not this hold's any more).
-- - `fillfactor = 80`: room on each page for the new row version, which a HOT update must put
--   on the same page. New events' seats get it; existing pages gain room as they are vacuumed.
SET LOCAL lock_timeout = '5s';

ALTER TABLE holds ADD COLUMN seat_ids TEXT[];

-- Existing seat holds: the seats that still carry their id (none for a hold that ended).
UPDATE holds h SET seat_ids = x.ids
  FROM (SELECT hold_id, array_agg(seat_id ORDER BY seat_id) AS ids
          FROM seats WHERE hold_id IS NOT NULL GROUP BY hold_id) x
 WHERE h.id = x.hold_id AND h.kind = 'seats';
UPDATE holds SET seat_ids = '{}' WHERE kind = 'seats' AND seat_ids IS NULL;

-- No NOT NULL check: during a rolling upgrade the old processes still write seat holds without
-- a list, and the new ones find such a hold's seats by scanning its event's seats
-- (`hold_seat_ids_sql!` in booking/src/inventory/holds/repo.rs). The old processes find seats
-- by `hold_id` as before, without its index: correct, slower, for the length of the rollout.

DROP INDEX seats_hold_id;
DROP INDEX seats_held_until;
ALTER TABLE seats SET (fillfactor = 80);

-- The sweeper's index of live holds by expiry, under a predicate only the sweeper names.
-- `WHERE status = 'active'` alone is implied by every by-id statement on a live hold (release,
-- the order's pin, holdbacks: `id = $1 AND ... status = 'active'`), and their generic plans
-- (the hold and checkout connections use `force_generic_plan`) could pick a whole scan of this
-- index over the primary key when planned while few holds were active: reproduced with 5,000
-- ended holds analysed, then 5,000 live ones, 0.78 ms per release instead of a key lookup, for
-- as long as the plan stays cached. `kind IN ('seats', 'ga')` is always true (the table's
-- CHECK) and written only by the sweeper. Building it reads the table once: run this
-- migration before a sale, not during one.
DROP INDEX holds_active_expiry;
CREATE INDEX holds_sweep ON holds (expires_at) WHERE status = 'active' AND kind IN ('seats', 'ga');
