-- Provider-side refunds and disputes (issue 14 item 7).
--
-- A refund or dispute made in the provider's dashboard reverses a PAID order once:
--   PAID -> REFUNDED | DISPUTED  (one `UPDATE orders ... WHERE status = 'PAID'`)
-- in the same transaction its tickets are voided (kept, never deleted), the account's usage
-- is given back, and the stock goes back on sale or is held back per the event's
-- `refund_stock` setting.
--
-- For live tables: new columns are nullable or have a constant default (a catalogue change,
-- no rewrite). The two widened status CHECKs replace the old ones in this transaction, which
-- scans orders and seats once under the lock (every existing row passes: the new sets only
-- add values). lock_timeout makes the migration fail fast instead of queueing traffic behind
-- its lock request.
SET LOCAL lock_timeout = '5s';

-- What a refund or dispute does with the units of a reversed order: back on sale, or held
-- back (not sold, not on sale) for ops to decide.
ALTER TABLE events
    ADD COLUMN refund_stock TEXT NOT NULL DEFAULT 'release'
        CONSTRAINT events_refund_stock_check CHECK (refund_stock IN ('release', 'hold_back'));

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'EXPIRED', 'CANCELLED', 'REFUNDED',
                      'DISPUTED'));
-- When a paid order was reversed (refund or dispute).
ALTER TABLE orders ADD COLUMN reversed_at TIMESTAMPTZ;

-- The dispute a succeeded payment is under (its money is with the card network).
ALTER TABLE payments ADD COLUMN dispute_id TEXT;

-- Voided tickets stay (audit, support) but no longer count: at most one VALID ticket per
-- seat, so a seat whose ticket was voided by a refund can be sold again, and the index still
-- refuses a second valid ticket for it whatever the code above does.
ALTER TABLE tickets
    ADD COLUMN voided_at   TIMESTAMPTZ,
    ADD COLUMN void_reason TEXT,
    ADD CONSTRAINT tickets_void_check
        CHECK ((voided_at IS NULL) = (void_reason IS NULL)
               AND (void_reason IS NULL OR void_reason IN ('refunded', 'disputed')));
CREATE UNIQUE INDEX tickets_one_valid_per_seat ON tickets (event_id, seat_id)
    WHERE seat_id IS NOT NULL AND voided_at IS NULL;
DROP INDEX tickets_one_per_seat;

-- A seat held back after a refund/dispute: not sold, not on sale (order_id keeps the
-- reversed order for the record).
ALTER TABLE seats DROP CONSTRAINT seats_status_check;
ALTER TABLE seats ADD CONSTRAINT seats_status_check
    CHECK (status IN ('available', 'held', 'sold', 'held_back'));

-- GA units and SKU stock held back the same way (counted apart from available and sold).
ALTER TABLE ga_counters
    ADD COLUMN held_back INTEGER NOT NULL DEFAULT 0
        CONSTRAINT ga_counters_held_back_check CHECK (held_back >= 0);
ALTER TABLE inventory
    ADD COLUMN held_back BIGINT NOT NULL DEFAULT 0
        CONSTRAINT inventory_held_back_check CHECK (held_back >= 0);

-- Delivery catch-up scans the order.paid events published within its window for ones that
-- were never delivered (a stream entry lost to a Redis rollback or trim).
CREATE INDEX outbox_order_paid_published ON outbox (published_at) WHERE topic = 'order.paid';
