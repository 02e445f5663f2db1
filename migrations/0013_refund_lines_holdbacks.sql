-- Per-line refunds of paid orders (issue 18, ops).
--
-- A refund booking asks for takes order lines: each line is refunded at most once, because
-- `order_refund_lines` has one row per (order, line) while the refund that took it is live
-- (a refund the provider refused gives its lines back by deleting their rows). The refund
-- that takes an order's last lines is the one that `reverses_order`: applying it reverses the order
-- (`PAID -> REFUNDED`), as a full refund always did; earlier ones return their lines' stock
-- and void their tickets and leave the order `PAID`. At most one live such refund per order
-- (the index that used to allow one live refund of any kind).
--
-- New columns have constant defaults (a catalogue change, no rewrite); every existing row is
-- a full refund: it reverses its order and asks the provider for the whole payment.
SET LOCAL lock_timeout = '5s';

ALTER TABLE order_refunds
    -- Takes the order's last lines: applying it reverses the order.
    ADD COLUMN reverses_order BOOLEAN NOT NULL DEFAULT true,
    -- The provider is asked for the whole payment (no amount); false: for `amount`.
    ADD COLUMN whole_payment  BOOLEAN NOT NULL DEFAULT true;

DROP INDEX order_refunds_one_per_order;
CREATE UNIQUE INDEX order_refunds_one_final_per_order ON order_refunds (order_id)
    WHERE status <> 'failed' AND reverses_order;
CREATE INDEX order_refunds_order ON order_refunds (order_id);

CREATE TABLE order_refund_lines (
    order_id    TEXT NOT NULL,
    line        INTEGER NOT NULL,
    refund_id   TEXT NOT NULL REFERENCES order_refunds (id),
    -- unit price x quantity (what the line cost; the refund's amount is capped by what the
    -- provider still holds).
    amount      BIGINT NOT NULL CHECK (amount >= 0),
    -- When the line's seats/units went back on sale or were held back, and its tickets were
    -- voided: once per line, whoever (this refund or the order's reversal) does it first.
    returned_at TIMESTAMPTZ,
    PRIMARY KEY (order_id, line),
    FOREIGN KEY (order_id, line) REFERENCES order_items (order_id, line) ON DELETE CASCADE
);
CREATE INDEX order_refund_lines_refund ON order_refund_lines (refund_id);

-- The lines of the live full refunds made before this migration.
INSERT INTO order_refund_lines (order_id, line, refund_id, amount, returned_at)
SELECT i.order_id, i.line, r.id, i.unit_price * i.quantity,
       CASE WHEN r.status = 'succeeded' THEN r.updated_at END
  FROM order_refunds r
  JOIN order_items i ON i.order_id = r.order_id
 WHERE r.status <> 'failed';

-- GA hold-backs by ops: units of a GA tier taken out of sale (counted in
-- ga_counters.held_back, like the units a refund held back) and released later, exactly once.
-- The shards each took from are kept, so a release gives back exactly those units.
CREATE TABLE ga_holdbacks (
    id          TEXT PRIMARY KEY,
    event_id    TEXT NOT NULL,
    tier        TEXT NOT NULL,
    quantity    INTEGER NOT NULL CHECK (quantity > 0),
    reason      TEXT NOT NULL,
    note        TEXT,
    actor       TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'released')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    released_at TIMESTAMPTZ,
    released_by TEXT,
    FOREIGN KEY (event_id, tier) REFERENCES ga_tiers (event_id, tier) ON DELETE CASCADE,
    CHECK ((status = 'released') = (released_at IS NOT NULL))
);
CREATE INDEX ga_holdbacks_event ON ga_holdbacks (event_id, created_at);

CREATE TABLE ga_holdback_items (
    holdback_id TEXT NOT NULL REFERENCES ga_holdbacks (id) ON DELETE CASCADE,
    shard       INTEGER NOT NULL,
    quantity    INTEGER NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (holdback_id, shard)
);
