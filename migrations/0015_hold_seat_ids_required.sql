-- Every seat hold records its seats (issue 16: a purchase at the database's limit).
--
-- Since 0014 every path finds a seat hold's seats by primary key from `holds.seat_ids`, with a
-- fallback for a hold written without the list by a process from before 0014 (during a
-- rolling upgrade): a scan of the event's seats for the hold's id. That fallback never ran
-- after the rollout, but the planner priced it into the seat lookup of the order's pin, the
-- pay statements, release and expiry; with a seats table of a few thousand rows their generic
-- plans read every seat of the event instead of the hold's few (5,017 rows for a one-seat pin
-- in `seat_plans::a_new_events_seats_are_read_by_seat_under_generic_plans`). The fallback is
-- gone, so the list is required.
--
-- Upgrading from a release before 0014: go through a release with 0014 first (its processes
-- write the list); the check below refuses a listless seat hold from an older process rather
-- than leave seats held that no order could pin.
SET LOCAL lock_timeout = '5s';

-- Any seat hold still without a list: the seats that still carry its id, in seat order.
UPDATE holds h SET seat_ids = COALESCE(
         (SELECT array_agg(s.seat_id ORDER BY s.seat_id)
            FROM seats s WHERE s.event_id = h.event_id AND s.hold_id = h.id), '{}')
 WHERE h.kind = 'seats' AND h.seat_ids IS NULL;

-- Checking the existing rows reads the table once under the ALTER's lock: run this migration
-- before a sale, not during one (as 0014).
ALTER TABLE holds ADD CONSTRAINT holds_seat_ids_recorded
  CHECK (kind <> 'seats' OR seat_ids IS NOT NULL);
