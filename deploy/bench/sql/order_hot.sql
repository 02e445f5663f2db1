-- pgbench: the statements booking runs for one cart order of 1 unit of one hot SKU, in the
-- same order (see booking/src/orders/repo.rs create_cart_order_tx): the idempotency claim (its own
-- asynchronously committed transaction, as booking does), then one transaction that reads the
-- price, writes the order, its item, the outbox row and the stored response, and only then
-- reserves the unit on the shared inventory row.
-- -D sku=<SKU> -D async=0|1. No HTTP, no Redis: the raw rate the service is compared with.
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
UPDATE inventory SET available = available - 1, reserved = reserved + 1
 WHERE sku = :sku AND available >= 1;
COMMIT;
