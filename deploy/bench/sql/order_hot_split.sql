-- pgbench: the statement booking runs for one cart order of 1 unit of one hot SKU whose stock
-- is split over several rows (issue 16; `stock_shards` of the product): CART_ORDER of
-- booking/src/orders/repo/one_statement.rs with its parameters spelt as pgbench variables (a
-- unit test there checks this file runs exactly that text), as booking runs it for a one-line
-- cart (`Take::WaitForOne`: one row with enough units chosen from the snapshot, the update
-- waits for it).
-- Run it on a product with N shards for the raw split rate.
-- -D sku=<SKU> -D event=<EVENT> -D async=0|1. No HTTP, no Redis. The product must be named
-- 'bench <SKU>' at price 1000.
\set r random(1, 9000000000000000000)
\set wait 1
WITH now AS MATERIALIZED (
         SELECT clock_timestamp() AS t,
                CASE WHEN :async::bool THEN set_config('synchronous_commit', 'off', true) END AS sc),
     lines AS (
         SELECT * FROM unnest(ARRAY[:sku::text]::text[], ARRAY[1]::int[], ARRAY['bench ' || :sku::text]::text[], ARRAY[1000]::bigint[])
                       WITH ORDINALITY AS l(sku, q, name, price, line)),
     -- Copies of this request queue here, before anything is written (`wait_for_copies`).
     keylock AS MATERIALIZED (
         SELECT pg_advisory_xact_lock(17995, hashtext(('pg-' || :client_id::text || '-' || :r::text) || '/' || 'k')) AS held),
     priced AS MATERIALIZED (
         SELECT count(*) = cardinality(ARRAY[:sku::text]::text[]) AS ok
           FROM keylock, lines l
           JOIN products p ON p.sku = l.sku AND p.name = l.name AND p.price = l.price
                          AND p.event_id = :event::text),
     -- Every line has a row with enough units in the snapshot (no lock taken).
     seen AS MATERIALIZED (
         SELECT bool_and(EXISTS (SELECT 1 FROM inventory i
                                  WHERE i.sku = l.sku AND i.available >= l.q)) AS ok
           FROM lines l),
     o AS (
         INSERT INTO orders (id, account_id, idempotency_key, source, event_id, total, currency,
                             expires_at, created_at)
         SELECT ('pg-' || :client_id::text || '-' || :r::text), ('pg-' || :client_id::text || '-' || :r::text), 'k', 'cart', :event::text, 1000, 'JPY', now.t + make_interval(secs => 900), now.t
           FROM now
          WHERE cardinality(ARRAY[:sku::text]::text[]) > 0 AND (SELECT ok FROM priced) AND (SELECT ok FROM seen)
            AND NOT EXISTS (SELECT 1 FROM events e WHERE e.id = :event::text AND e.cancelled_at IS NOT NULL)
         RETURNING id, expires_at, created_at),
     items AS (
         INSERT INTO order_items (order_id, line, kind, sku, name, quantity, unit_price)
         SELECT o.id, l.line, 'sku', l.sku, l.name, l.q, l.price FROM o, lines l
         RETURNING 1),
     ts AS (
         SELECT (replace(to_char(o.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24.MI.SS'), '.', ':') ||
              CASE WHEN date_part('microseconds', o.expires_at AT TIME ZONE 'UTC')::bigint % 1000000 = 0 THEN ''
                   WHEN date_part('microseconds', o.expires_at AT TIME ZONE 'UTC')::bigint % 1000 = 0
                   THEN '.' || lpad((date_part('microseconds', o.expires_at AT TIME ZONE 'UTC')::bigint % 1000000 / 1000)::text, 3, '0')
                   ELSE '.' || lpad((date_part('microseconds', o.expires_at AT TIME ZONE 'UTC')::bigint % 1000000)::text, 6, '0') END || 'Z') AS expires, (replace(to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24.MI.SS'), '.', ':') ||
              CASE WHEN date_part('microseconds', o.created_at AT TIME ZONE 'UTC')::bigint % 1000000 = 0 THEN ''
                   WHEN date_part('microseconds', o.created_at AT TIME ZONE 'UTC')::bigint % 1000 = 0
                   THEN '.' || lpad((date_part('microseconds', o.created_at AT TIME ZONE 'UTC')::bigint % 1000000 / 1000)::text, 3, '0')
                   ELSE '.' || lpad((date_part('microseconds', o.created_at AT TIME ZONE 'UTC')::bigint % 1000000)::text, 6, '0') END || 'Z') AS created FROM o),
     e AS (
         INSERT INTO outbox (event_id, topic, aggregate_id, payload)
         SELECT ('pg-' || :client_id::text || '-' || :r::text), 'order.created', o.id, '{}'::jsonb || jsonb_build_object('expires_at', ts.expires)
           FROM o, ts
         RETURNING 1),
     k AS (
         INSERT INTO idempotency_keys (account_id, key, fingerprint, state, claim_id,
                                       response_status, response_body, completed_at)
         SELECT ('pg-' || :client_id::text || '-' || :r::text), 'k', '\x00'::bytea, 'done', o.id, 201,
                convert_to('{"id":"pg","expires_at":"' || ts.expires || '","created_at":"' || ts.created || '"}', 'UTF8'),
                clock_timestamp()
           FROM o, ts
         RETURNING response_body),
     pick AS MATERIALIZED (
         SELECT l.sku, l.q, r.shard, r.locked
           FROM lines l
           CROSS JOIN LATERAL (
               SELECT shard, available AS locked FROM (
                   SELECT shard, available FROM inventory
                    WHERE NOT :wait::bool AND sku = l.sku AND available >= l.q
                    ORDER BY random() LIMIT 1
                    FOR UPDATE SKIP LOCKED) free
               UNION ALL
               -- Waiting mode (one-line carts): one row with enough units as the snapshot has
               -- it; `took` waits for it alone (the statement holds no other stock row).
               SELECT shard, NULL FROM (
                   SELECT shard FROM inventory
                    WHERE :wait::bool AND sku = l.sku AND available >= l.q
                    ORDER BY random() LIMIT 1) chosen
               LIMIT 1) r
          WHERE EXISTS (SELECT 1 FROM o)),
     took AS (
         -- A row `pick` locked counts from its locked count (`p.locked`): this update's own
         -- read is the snapshot's, which Postgres filters and checks against
         -- `CHECK (available >= 0)` before it finds the newer version a return may have made.
         -- A row waited for here is re-checked: it may have fewer units once locked.
         UPDATE inventory i SET available = COALESCE(p.locked, i.available) - p.q,
                                reserved = i.reserved + p.q
           FROM pick p
          WHERE i.sku = p.sku AND i.shard = p.shard
            AND (p.locked IS NOT NULL OR i.available >= p.q)
         RETURNING i.sku, i.shard, i.available),
     rec AS (
         -- A line without a row has a NULL shard: the statement fails and writes nothing.
         INSERT INTO order_stock (order_id, sku, shard, quantity)
         SELECT o.id, l.sku, t.shard, l.q FROM o CROSS JOIN lines l LEFT JOIN took t USING (sku))
     SELECT COALESCE(ceil(extract(epoch FROM GREATEST((SELECT expires_at FROM o), (SELECT max(expires_at) FILTER (WHERE status = 'active' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM holds WHERE account_id = ('pg-' || :client_id::text || '-' || :r::text) AND event_id = :event::text), (SELECT max(expires_at) FILTER (WHERE status = 'PENDING_PAYMENT' AND expires_at > clock_timestamp() AND id IS DISTINCT FROM NULL) FROM orders WHERE account_id = ('pg-' || :client_id::text || '-' || :r::text) AND (event_id = :event::text OR event_id IS NULL)))) * 1000)::bigint, 0) AS live_until_ms, (SELECT response_body FROM k) AS body,
       (SELECT ok FROM priced) AS prices_ok, (SELECT ok FROM seen) AS units_seen,
       (SELECT count(*) FROM items) + (SELECT count(*) FROM e) AS written,
       -- Nothing written because a line is short over all its rows: that line and what is
       -- left of it, when the answer is certainly `409` (the key was never used, the event
       -- is not cancelled).
       short.sku AS short_sku, short.available AS short_available,
       ARRAY(SELECT sku FROM took WHERE available = 0 ORDER BY sku, shard) AS emptied_skus,
       ARRAY(SELECT shard FROM took WHERE available = 0 ORDER BY sku, shard) AS emptied_shards
       FROM (SELECT 1) one
       LEFT JOIN LATERAL (
           SELECT l.sku, l.q, a.available
             FROM lines l,
                  LATERAL (SELECT COALESCE(sum(i.available), 0)::bigint AS available
                             FROM inventory i WHERE i.sku = l.sku) a
            WHERE NOT (SELECT ok FROM seen) AND (SELECT ok FROM priced)
              AND a.available < l.q
              AND NOT EXISTS (SELECT 1 FROM idempotency_keys x WHERE x.account_id = ('pg-' || :client_id::text || '-' || :r::text) AND x.key = 'k')
              AND NOT EXISTS (SELECT 1 FROM events ev WHERE ev.id = :event::text AND ev.cancelled_at IS NOT NULL)
            ORDER BY l.sku LIMIT 1) short ON true;
