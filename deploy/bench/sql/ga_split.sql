-- pgbench: GA units from a tier split over several counter rows, with booking's fast-path
-- statement (random start shard, FOR UPDATE SKIP LOCKED, decrement, record the allocation).
-- A transaction that finds every shard busy takes nothing here (booking would fall back to
-- locking all shards); the script counts units actually taken, not transactions.
\set acct random(1, 2000000000)
\set start random(0, 63)
BEGIN;
\if :async
SET LOCAL synchronous_commit = off;
\endif
INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
VALUES (replace(gen_random_uuid()::text, '-', ''), :event, 'pg-' || :acct, 'ga', 'FLOOR', 1,
        clock_timestamp() + interval '600 seconds')
RETURNING id AS hold_id \gset
WITH pick AS (
    SELECT shard FROM ga_counters
    WHERE event_id = :event AND tier = 'FLOOR' AND available >= 1
    ORDER BY (shard + 64 - :start) % 64
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
took AS (
    UPDATE ga_counters c SET available = c.available - 1
    FROM pick
    WHERE c.event_id = :event AND c.tier = 'FLOOR' AND c.shard = pick.shard
    RETURNING c.shard)
INSERT INTO hold_ga_items (hold_id, shard, quantity)
SELECT :hold_id, shard, 1 FROM took
RETURNING shard;
COMMIT;
