-- pgbench baseline for GA holds: exactly the SQL booking runs for one
-- POST /api/events/{event}/ga-holds {"tier": "FLOOR", "quantity": 1} (THE GA hold statement
-- of booking/src/inventory/ga/repo.rs, HOLD_FROM_A_FREE_SHARD: usage, hold row, one shard from
-- a random start with SKIP LOCKED, waiting only when the tier has one shard, the allocation,
-- the price; booking's fallbacks when every shard is busy are not here) followed by the
-- DELETE /api/holds/{id} that releases it (RELEASE_OWN of holds/release.rs), like loadgen's GA
-- cycle. Run against a tier of 1 shard or of 8. A hold that finds no units writes nothing (as in
-- booking; never with the bench's 10M units); holds.sh counts released holds. Parameters are
-- inlined as pgbench variables. Booking's hold connections carry their settings (take.rs
-- hold_pool: plan_cache_mode, enable_seqscan, synchronous_commit) as startup options;
-- holds.sh sets the same for pgbench's sessions (PGOPTIONS). Each statement here is, like
-- booking's, one autocommit statement (no BEGIN/COMMIT).
-- Variables: -D event=<id> (-D async is unused: see above).
\set acct random(1, 2000000000)
\set hid random(1, 9000000000000000000)
\set start random(0, 63)
WITH got AS (
    SELECT shard, available, 1 AS take FROM (
        SELECT shard, available FROM ga_counters
        WHERE event_id = :event AND tier = 'FLOOR' AND available >= 1
        ORDER BY (shard + 64 - :start) % 64
        LIMIT 1
        FOR UPDATE SKIP LOCKED) free
    UNION ALL
    SELECT shard, available, 1 FROM (
        SELECT shard, available FROM ga_counters
        WHERE event_id = :event AND tier = 'FLOOR' AND available >= 1
          AND NOT EXISTS (SELECT 1 FROM ga_counters o
                          WHERE o.event_id = :event AND o.tier = 'FLOOR' AND o.shard <> 0)
        FOR UPDATE) only_shard
    LIMIT 1),
usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, ('pg-' || :acct), 1 FROM events e
    WHERE e.id = :event AND 1 <= e.max_tickets_per_account
      AND e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL
      AND (SELECT sum(take) FROM got) = 1
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = :event)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
    SELECT ('pg-' || :hid), e.id, ('pg-' || :acct), 'ga', 'FLOOR', 1, clock_timestamp() + make_interval(secs => e.hold_ttl_s)
    FROM events e, usage
    WHERE e.id = :event
    RETURNING expires_at),
took AS (
    UPDATE ga_counters c SET available = g.available - g.take
    FROM got g, hold
    WHERE c.event_id = :event AND c.tier = 'FLOOR' AND c.shard = g.shard AND g.take > 0
    RETURNING c.shard, g.take),
item AS (
    INSERT INTO hold_ga_items (hold_id, shard, quantity)
    SELECT ('pg-' || :hid), shard, take FROM took
    RETURNING quantity)
SELECT (SELECT expires_at FROM hold) AS exp,
       ((SELECT sum(quantity) FROM item) IS NOT NULL)::int AS took,
       (SELECT price FROM ga_tiers WHERE event_id = :event AND tier = 'FLOOR') AS price,
       CASE WHEN NOT EXISTS (SELECT 1 FROM item) THEN
           (SELECT sum(available)::bigint FROM ga_counters WHERE event_id = :event AND tier = 'FLOOR')
       END AS left_units,
       CASE WHEN NOT EXISTS (SELECT 1 FROM item) THEN
           (SELECT max(available) FROM ga_counters WHERE event_id = :event AND tier = 'FLOOR')
       END AS most,
       (SELECT e.sale_start <= clock_timestamp() AND e.cancelled_at IS NULL FROM events e WHERE e.id = :event) AS on_sale,
       (SELECT COALESCE(a.tickets, 0) + 1 <= e.max_tickets_per_account
          FROM events e LEFT JOIN account_event_usage a
            ON a.event_id = e.id AND a.account_id = ('pg-' || :acct)
         WHERE e.id = :event) AS limit_ok,
       COALESCE((SELECT sum(take) FROM got) = 1, false) AS found,
       COALESCE(ceil(extract(epoch FROM GREATEST((SELECT expires_at FROM hold), (SELECT max(expires_at) FILTER (WHERE status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM holds WHERE account_id = ('pg-' || :acct) AND event_id = :event), (SELECT max(expires_at) FILTER (WHERE status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM orders WHERE account_id = ('pg-' || :acct) AND (event_id = :event OR event_id IS NULL)))) * 1000)::bigint, 0) AS until \gset
\if :took
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
\endif
