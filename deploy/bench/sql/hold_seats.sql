-- pgbench baseline for the seat-hold benchmark: exactly the SQL booking runs for one
-- POST /api/events/{event}/holds (4 adjacent seats, fresh account) followed by the
-- DELETE /api/holds/{id} that releases it, so the 60,000-seat event never fills up.
-- Variables: -D event=<id> (30 sections S1..S30 x 40 rows x 50 seats). -D async=1 uses synchronous_commit = off like booking's async_commit_holds.
\set sec random(1, 30)
\set row random(1, 40)
\set n1 random(1, 47)
\set n2 :n1 + 1
\set n3 :n1 + 2
\set n4 :n1 + 3
\set acct random(1, 2000000000)
BEGIN;
\if :async
SET LOCAL synchronous_commit = off;
\endif
INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
SELECT e.id, 'pg-' || :acct, 4 FROM events e
WHERE e.id = :event AND 4 <= e.max_tickets_per_account
ON CONFLICT (event_id, account_id) DO UPDATE
    SET tickets = u.tickets + EXCLUDED.tickets
    WHERE u.tickets + EXCLUDED.tickets
          <= (SELECT max_tickets_per_account FROM events WHERE id = :event)
RETURNING u.tickets;
INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
SELECT replace(gen_random_uuid()::text, '-', ''), e.id, 'pg-' || :acct, 'seats', NULL, 4,
       clock_timestamp() + make_interval(secs => e.hold_ttl_s)
FROM events e
WHERE e.id = :event AND e.sale_start <= clock_timestamp()
RETURNING id AS hold_id, expires_at AS hold_exp \gset
WITH wanted AS (
    SELECT seat_id, hold_id AS prev_hold FROM seats
    WHERE event_id = :event
      AND seat_id = ANY(ARRAY['S' || :sec || '-R' || :row || '-' || :n1,
                              'S' || :sec || '-R' || :row || '-' || :n2,
                              'S' || :sec || '-R' || :row || '-' || :n3,
                              'S' || :sec || '-R' || :row || '-' || :n4])
      AND (status = 'available' OR (status = 'held' AND held_until <= clock_timestamp()))
    ORDER BY seat_id
    FOR UPDATE)
UPDATE seats s SET status = 'held', hold_id = :hold_id, held_until = :hold_exp
FROM wanted w, price_tiers p
WHERE s.event_id = :event AND s.seat_id = w.seat_id
  AND p.event_id = :event AND p.tier = s.tier
RETURNING s.seat_id, w.prev_hold, p.price;
COMMIT;
BEGIN;
\if :async
SET LOCAL synchronous_commit = off;
\endif
UPDATE holds SET status = 'released'
WHERE id = :hold_id AND status = ANY('{active}') AND ('pg-' || :acct IS NULL OR account_id = 'pg-' || :acct)
RETURNING id, event_id, account_id, kind, quantity;
WITH doomed AS (
    SELECT event_id, seat_id FROM seats
    WHERE hold_id = ANY(ARRAY[:hold_id]) AND status = 'held'
    ORDER BY event_id, seat_id
    FOR UPDATE)
UPDATE seats s SET status = 'available', hold_id = NULL, held_until = NULL
FROM doomed d
WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id;
WITH d AS (
    SELECT e AS event_id, a AS account_id, sum(q)::int AS q
    FROM unnest(ARRAY[:event]::text[], ARRAY['pg-' || :acct]::text[], ARRAY[4]::int[]) AS t(e, a, q)
    GROUP BY 1, 2),
locked AS (
    SELECT u.event_id, u.account_id, d.q
    FROM account_event_usage u JOIN d USING (event_id, account_id)
    ORDER BY u.event_id, u.account_id
    FOR UPDATE OF u)
UPDATE account_event_usage u SET tickets = u.tickets - l.q
FROM locked l
WHERE u.event_id = l.event_id AND u.account_id = l.account_id;
COMMIT;
