-- pgbench baseline for the seat-hold benchmark: exactly the SQL booking runs for one
-- POST /api/events/{event}/holds (4 adjacent seats, fresh account: THE seat hold statement of
-- booking/src/inventory/holds/take.rs, with the checkout end it reads: platform/session_until.rs)
-- followed by the DELETE /api/holds/{id} that releases it
-- (RELEASE_OWN of holds/release.rs), so the 60,000-seat event never fills up. Parameters are
-- inlined as pgbench variables. Booking's hold connections carry their settings
-- (take.rs hold_pool: plan_cache_mode, enable_seqscan, synchronous_commit) as startup options;
-- holds.sh sets the same for pgbench's sessions (PGOPTIONS). Each statement here is, like
-- booking's, one autocommit statement (no BEGIN/COMMIT).
-- Variables: -D event=<id> (30 sections S1..S30 x 40 rows x 50 seats). -D async is unused (see above).
\set sec random(1, 30)
\set row random(1, 40)
\set n1 random(1, 47)
\set n2 :n1 + 1
\set n3 :n1 + 2
\set n4 :n1 + 3
\set acct random(1, 2000000000)
\set hid random(1, 9000000000000000000)
WITH wanted AS (
    SELECT s.seat_id, s.hold_id AS prev_hold, p.price
    FROM seats s JOIN price_tiers p ON p.event_id = s.event_id AND p.tier = s.tier
    WHERE s.event_id = :event AND s.seat_id = ANY(ARRAY['S' || :sec || '-R' || :row || '-' || :n1, 'S' || :sec || '-R' || :row || '-' || :n2,
                     'S' || :sec || '-R' || :row || '-' || :n3, 'S' || :sec || '-R' || :row || '-' || :n4])
      AND (s.status = 'available' OR (s.status = 'held' AND s.held_until <= clock_timestamp()))
    ORDER BY s.seat_id
    FOR UPDATE OF s),
usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, ('pg-' || :acct), 4 FROM events e
    WHERE e.id = :event AND 4 <= e.max_tickets_per_account
      AND e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
      AND (SELECT count(*) FROM wanted) = 4
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = :event)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at, seat_ids)
    SELECT ('pg-' || :hid), e.id, ('pg-' || :acct), 'seats', NULL, 4,
           clock_timestamp() + make_interval(secs => e.hold_ttl_s),
           (SELECT array_agg(seat_id ORDER BY seat_id) FROM wanted)
    FROM events e, usage
    WHERE e.id = :event
    RETURNING expires_at),
took AS (
    UPDATE seats s SET status = 'held', hold_id = ('pg-' || :hid), held_until = h.expires_at
    FROM hold h, wanted w
    WHERE s.event_id = :event AND s.seat_id = w.seat_id
    RETURNING s.seat_id)
SELECT (SELECT expires_at FROM hold), (SELECT count(*) FROM took),
       w.seat_id, w.prev_hold, w.price,
       (SELECT e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL FROM events e WHERE e.id = :event),
       (SELECT COALESCE(a.tickets, 0) + 4 <= e.max_tickets_per_account
          FROM events e LEFT JOIN account_event_usage a
            ON a.event_id = e.id AND a.account_id = ('pg-' || :acct)
         WHERE e.id = :event),
       COALESCE(ceil(extract(epoch FROM GREATEST((SELECT expires_at FROM hold), (SELECT max(expires_at) FILTER (WHERE status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM holds WHERE account_id = ('pg-' || :acct) AND event_id = :event), (SELECT max(expires_at) FILTER (WHERE status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM orders WHERE account_id = ('pg-' || :acct) AND (event_id = :event OR event_id IS NULL)))) * 1000)::bigint, 0),
       NULL::text[]
FROM (VALUES (1)) AS one (x) LEFT JOIN wanted w ON true;
WITH h AS (
    UPDATE holds SET status = 'released'
    WHERE id = ('pg-' || :hid) AND account_id = ('pg-' || :acct) AND status = 'active'
    RETURNING id, event_id, account_id, kind, ga_tier, quantity, seat_ids),
doomed AS (
    SELECT s.event_id, s.seat_id FROM seats s, h
    WHERE h.kind = 'seats' AND s.event_id = h.event_id
      AND s.seat_id = ANY(h.seat_ids)
      AND s.hold_id = ('pg-' || :hid)
    ORDER BY s.event_id, s.seat_id
    FOR UPDATE OF s),
seats_back AS (
    UPDATE seats s SET status = 'available', hold_id = NULL, held_until = NULL
    FROM doomed d
    WHERE s.event_id = d.event_id AND s.seat_id = d.seat_id
      AND s.status = 'held' AND s.hold_id = ('pg-' || :hid)
    RETURNING 1),
units AS (
    SELECT c.shard, i.quantity FROM h, hold_ga_items i, ga_counters c
    WHERE h.kind = 'ga' AND i.hold_id = ('pg-' || :hid)
      AND c.event_id = h.event_id AND c.tier = h.ga_tier AND c.shard = i.shard
    ORDER BY c.shard
    FOR UPDATE OF c),
units_back AS (
    UPDATE ga_counters c SET available = c.available + u.quantity
    FROM h, units u
    WHERE c.event_id = h.event_id AND c.tier = h.ga_tier AND c.shard = u.shard
    RETURNING u.quantity),
usage AS (
    UPDATE account_event_usage u SET tickets = u.tickets - h.quantity
    FROM h
    WHERE u.event_id = h.event_id AND u.account_id = h.account_id
    RETURNING 1)
SELECT h.event_id, h.kind = 'seats',
       (SELECT count(*) FROM seats_back) + (SELECT COALESCE(sum(quantity), 0) FROM units_back),
       COALESCE(ceil(extract(epoch FROM GREATEST(NULL::timestamptz, (SELECT max(expires_at) FILTER (WHERE status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM ('pg-' || :hid)) FROM holds WHERE account_id = ('pg-' || :acct) AND event_id = :event), (SELECT max(expires_at) FILTER (WHERE status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM orders WHERE account_id = ('pg-' || :acct) AND (event_id = :event OR event_id IS NULL)))) * 1000)::bigint, 0)
FROM h;
