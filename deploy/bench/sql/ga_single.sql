-- pgbench: GA units from ONE counter row (the naive design): every buyer queues on the same
-- row lock, held until its transaction commits. -D event=<id> (tier FLOOR, 1 shard).
\set acct random(1, 2000000000)
BEGIN;
\if :async
SET LOCAL synchronous_commit = off;
\endif
INSERT INTO holds (id, event_id, account_id, kind, ga_tier, quantity, expires_at)
VALUES (replace(gen_random_uuid()::text, '-', ''), :event, 'pg-' || :acct, 'ga', 'FLOOR', 1,
        clock_timestamp() + interval '600 seconds')
RETURNING id AS hold_id \gset
UPDATE ga_counters SET available = available - 1
WHERE event_id = :event AND tier = 'FLOOR' AND shard = 0 AND available >= 1;
INSERT INTO hold_ga_items (hold_id, shard, quantity) VALUES (:hold_id, 0, 1);
COMMIT;
