-- Hot SKUs split like GA tiers (issue 16). One `inventory` row per SKU serialised every order
-- of a hot SKU behind its row lock and commit flush; a product's stock may now be spread over
-- `stock_shards` rows (shard 0..n-1), each with its own CHECK (available >= 0), summed for
-- reads. An order line takes from one shard (recorded in `order_stock`), so payment, expiry,
-- cancellation and refund move exactly those units on exactly those rows.
--
-- Shard rows are never deleted: lowering `stock_shards` moves the available units of the
-- rows above it onto the remaining ones (their reserved/sold/held_back stay for the record and
-- for the orders that took from them).

ALTER TABLE products
    ADD COLUMN stock_shards INTEGER NOT NULL DEFAULT 1
        CONSTRAINT products_stock_shards_check CHECK (stock_shards BETWEEN 1 AND 64);

ALTER TABLE inventory
    ADD COLUMN shard INTEGER NOT NULL DEFAULT 0
        CONSTRAINT inventory_shard_check CHECK (shard BETWEEN 0 AND 63);
ALTER TABLE inventory DROP CONSTRAINT inventory_pkey;
ALTER TABLE inventory ADD PRIMARY KEY (sku, shard);

-- Which shard rows an order's SKU lines took their units from (one row per SKU and shard).
CREATE TABLE order_stock (
    order_id TEXT NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    sku      TEXT NOT NULL,
    shard    INTEGER NOT NULL,
    quantity BIGINT NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku, shard)
);

-- Orders placed before the split took from the single row, shard 0.
INSERT INTO order_stock (order_id, sku, shard, quantity)
SELECT order_id, sku, 0, sum(quantity)::bigint
  FROM order_items WHERE kind = 'sku'
 GROUP BY order_id, sku;
