-- pgbench baseline for GA holds: exactly the SQL booking runs for one
-- POST /api/events/{event}/ga-holds {"tier": "FLOOR", "quantity": 1} (THE GA hold statement
-- of booking/src/inventory/ga/repo.rs, HOLD_FROM_A_FREE_SHARD: usage, hold row, one shard from
-- a random start with SKIP LOCKED, waiting only when the tier has one shard, the allocation,
-- the price; booking's fallbacks when every shard is busy are not here) followed by the
-- DELETE /api/holds/{id} that releases it (RELEASE_OWN of holds/release.rs), like loadgen's GA
-- cycle. Run against a tier of 1 shard or of 8. A hold that finds no units rolls back (as in
-- booking; never with the bench's 10M units); holds.sh counts released holds. Parameters are inlined as
-- pgbench variables. Booking sends its transaction settings
-- (begin_hold_tx: plan_cache_mode, enable_seqscan, synchronous_commit) in BEGIN's round trip;
-- pgbench cannot in prepared mode, so holds.sh sets them for the session (PGOPTIONS) and each
-- transaction here is, like booking's, BEGIN + one statement + COMMIT.
-- Variables: -D event=<id> (-D async is unused: see above).
\set acct random(1, 2000000000)
\set hid random(1, 9000000000000000000)
\set start random(0, 63)
BEGIN;
WITH usage AS (
    INSERT INTO account_event_usage AS u (event_id, account_id, tickets)
    SELECT e.id, ('pg-' || :acct), 1 FROM events e
    WHERE e.id = :event AND 1 <= e.max_tickets_per_account
    ON CONFLICT (event_id, account_id) DO UPDATE
        SET tickets = u.tickets + EXCLUDED.tickets
        WHERE u.tickets + EXCLUDED.tickets
              <= (SELECT max_tickets_per_account FROM events WHERE id = :event)
    RETURNING u.tickets),
hold AS (
    INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
    SELECT ('pg-' || :hid), e.id, ('pg-' || :acct), 'ga', 'FLOOR', 1, clock_timestamp() + make_interval(secs => e.hold_ttl_s)
    FROM events e, usage
    WHERE e.id = :event AND e.sale_start <= clock_timestamp()
    RETURNING expires_at),
pick AS (
    SELECT shard FROM (
        SELECT shard FROM ga_counters
        WHERE event_id = :event AND tier = 'FLOOR' AND available >= 1
        ORDER BY (shard + 64 - :start) % 64
        LIMIT 1
        FOR UPDATE SKIP LOCKED) free
    UNION ALL
    SELECT shard FROM (
        SELECT shard FROM ga_counters
        WHERE event_id = :event AND tier = 'FLOOR' AND available >= 1
          AND NOT EXISTS (SELECT 1 FROM ga_counters o
                          WHERE o.event_id = :event AND o.tier = 'FLOOR' AND o.shard <> 0)
        FOR UPDATE) only_shard
    LIMIT 1),
took AS (
    UPDATE ga_counters c SET available = c.available - 1
    FROM pick, hold
    WHERE c.event_id = :event AND c.tier = 'FLOOR' AND c.shard = pick.shard
    RETURNING c.shard),
item AS (
    INSERT INTO hold_ga_items (hold_id, shard, quantity)
    SELECT ('pg-' || :hid), shard, 1 FROM took
    RETURNING shard)
SELECT EXISTS (SELECT 1 FROM usage),
       (SELECT expires_at FROM hold),
       ((SELECT shard FROM item) IS NOT NULL)::int AS took,
       (SELECT price FROM ga_tiers WHERE event_id = :event AND tier = 'FLOOR'),
       COALESCE(ceil(extract(epoch FROM GREATEST((SELECT expires_at FROM hold), (SELECT max(expires_at) FROM holds WHERE account_id = ('pg-' || :acct) AND event_id = :event AND status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL), (SELECT max(expires_at) FROM orders WHERE account_id = ('pg-' || :acct) AND (event_id = :event OR event_id IS NULL) AND status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp()))) * 1000)::bigint, 0) AS until \gset
\if :took
COMMIT;
BEGIN;
WITH h AS (
    UPDATE holds SET status = 'released'
    WHERE id = ('pg-' || :hid) AND account_id = ('pg-' || :acct) AND status = 'active'
    RETURNING event_id, account_id, kind, ga_tier, quantity),
doomed AS (
    SELECT s.event_id, s.seat_id FROM seats s, h
    WHERE h.kind = 'seats' AND s.hold_id = ('pg-' || :hid)
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
       COALESCE(ceil(extract(epoch FROM GREATEST(NULL::timestamptz, (SELECT max(expires_at) FROM holds WHERE account_id = ('pg-' || :acct) AND event_id = :event AND status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM ('pg-' || :hid)), (SELECT max(expires_at) FROM orders WHERE account_id = ('pg-' || :acct) AND (event_id = :event OR event_id IS NULL) AND status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp()))) * 1000)::bigint, 0)
FROM h;
COMMIT;
\else
ROLLBACK;
\endif
