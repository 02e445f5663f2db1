-- pgbench: the statements booking runs for one cart order of 1 unit of one hot SKU whose stock
-- is split over several rows (issue 16; `stock_shards` of the product): the same transaction
-- as order_hot.sql, but the unit is taken from ONE of the SKU's shard rows in one statement
-- (rows in random order, locked rows skipped) and recorded in order_stock; when every row is
-- locked it waits for one. Booking (booking/src/orders/stock.rs, StockWay) waits in a NEW
-- transaction instead, so that no order waits while keeping a row out of (sku, shard) order;
-- with one unit per order and ample stock no row here ever fails its re-check, so waiting in
-- the same transaction cannot deadlock and costs the raw path less than booking's retry.
-- Run it on a product with N shards for the raw split rate.
-- -D sku=<SKU> -D async=0|1. No HTTP, no Redis.
\set r random(1, 2000000000)
BEGIN;
SET LOCAL synchronous_commit = off;
INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id)
VALUES ('pg-' || :client_id || '-' || :r, 'k', '\x00', 'in_flight', 'c')
ON CONFLICT DO NOTHING;
COMMIT;
BEGIN;
\if :async
SET LOCAL synchronous_commit = off;
\endif
SELECT sku, name, price, event_id FROM products WHERE sku = ANY(ARRAY[:sku]);
INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, currency,
                    expires_at)
VALUES ('pg-' || :client_id || '-' || :r, 'pg-' || :client_id || '-' || :r, 'k', 'cart', 'shop',
        100, 'JPY', clock_timestamp() + interval '900 seconds')
ON CONFLICT DO NOTHING;
INSERT INTO order_items (order_id, line, kind, sku, name, quantity, unit_price)
VALUES ('pg-' || :client_id || '-' || :r, 1, 'sku', :sku, 'x', 1, 100)
ON CONFLICT DO NOTHING;
INSERT INTO outbox (event_id, topic, aggregate_id, payload)
VALUES (replace(gen_random_uuid()::text, '-', ''), 'order.created',
        'pg-' || :client_id || '-' || :r, '{}');
UPDATE idempotency_keys SET state = 'done', response_status = 201, response_body = '\x00',
       completed_at = clock_timestamp()
 WHERE account_id = 'pg-' || :client_id || '-' || :r AND key = 'k' AND claim_id = 'c'
   AND state = 'in_flight';
WITH pick AS (
    SELECT shard FROM inventory
     WHERE sku = :sku AND available >= 1
     ORDER BY random() LIMIT 1
     FOR UPDATE SKIP LOCKED),
took AS (
    UPDATE inventory i SET available = i.available - 1, reserved = i.reserved + 1
      FROM pick WHERE i.sku = :sku AND i.shard = pick.shard
    RETURNING i.shard),
ins AS (
    INSERT INTO order_stock (order_id, sku, shard, quantity)
    SELECT 'pg-' || :client_id || '-' || :r, :sku, shard, 1 FROM took
    RETURNING shard)
SELECT count(*) AS got FROM ins \gset
-- Every row with units locked by others: wait for one, as booking does next.
\if :got = 0
WITH pick AS (
    SELECT shard FROM inventory
     WHERE sku = :sku AND available >= 1
     ORDER BY random() LIMIT 1
     FOR UPDATE),
took AS (
    UPDATE inventory i SET available = i.available - 1, reserved = i.reserved + 1
      FROM pick WHERE i.sku = :sku AND i.shard = pick.shard
    RETURNING i.shard)
INSERT INTO order_stock (order_id, sku, shard, quantity)
SELECT 'pg-' || :client_id || '-' || :r, :sku, shard, 1 FROM took;
\endif
COMMIT;
