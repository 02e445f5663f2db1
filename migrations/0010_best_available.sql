-- Best available (issue 19): a per-seat rank (lower is better) that the best-available pick
-- orders free seats by, and the event setting that refuses explicit holds stranding a seat.
--
-- `rank` is set for every seat at event creation (the seat map's own, or the default: row
-- ascending, then distance from the row's centre); rows that existed before this migration
-- get the default here, so the column can be NOT NULL.
ALTER TABLE events ADD COLUMN no_orphans BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE seats ADD COLUMN rank INTEGER;
UPDATE seats s SET rank = d.rank
FROM (SELECT event_id, seat_id,
             (row_no - 1) * 20001
             + abs(2 * number - (min(number) OVER w + max(number) OVER w)) AS rank
      FROM seats
      WINDOW w AS (PARTITION BY event_id, section, row_no)) d
WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id;
ALTER TABLE seats ALTER COLUMN rank SET NOT NULL;
ALTER TABLE seats ADD CONSTRAINT seats_rank_check CHECK (rank >= 0);

-- The pick reads free seats in rank order (a bounded window) and then whole rows; the orphan
-- guard of the hold statement locks a hold's row neighbours by position.
CREATE INDEX seats_best ON seats (event_id, rank, seat_id);
CREATE INDEX seats_position ON seats (event_id, section, row_no, number);
