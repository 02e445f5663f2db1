-- Ops API, part one (issue 18): order search, seat kills and hold-backs.
--
-- Order search (`GET /admin/orders`) lists newest first with a keyset cursor on
-- (created_at, id). Each index below is one more write on the hot order insert, so only two
-- are added (docs/decisions.md, "Ops API: order search indexes"):
--   * (created_at, id): the unfiltered list and the status/time filters walk it backwards and
--     stop after `limit` rows (status is not indexed: five values, and a status index would be
--     rewritten on every transition);
--   * (event_id, created_at, id): an event's orders (the usual sale-day question).
-- The account filter uses the existing orders_account (account_id, created_at).
-- CONCURRENTLY is impossible inside the migrator's transaction; on a live table with millions
-- of rows create them by hand first with CREATE INDEX CONCURRENTLY under the same names
-- (IF NOT EXISTS makes this migration a no-op then; docs/operations.md).
SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS orders_created ON orders (created_at, id);
CREATE INDEX IF NOT EXISTS orders_event_created ON orders (event_id, created_at, id)
    WHERE event_id IS NOT NULL;
-- The order detail shows the provider events of its payments (one insert per webhook: cheap).
CREATE INDEX IF NOT EXISTS payment_webhook_events_payment ON payment_webhook_events (payment_id)
    WHERE payment_id IS NOT NULL;

-- Seat kills: a seat taken out of sale by ops is `held_back` (not sold, not on sale, shown as
-- sold in the seat map, never taken by a hold) with the reason and note of the kill. A seat
-- held back by a refund (0007) has order_id set and no kill_reason. Releasing either puts the
-- seat back to `available`.
ALTER TABLE seats
    ADD COLUMN kill_reason TEXT,
    ADD COLUMN kill_note   TEXT;
ALTER TABLE seats
    ADD CONSTRAINT seats_kill_check
        CHECK ((kill_reason IS NULL OR status = 'held_back')
               AND (kill_note IS NULL OR kill_reason IS NOT NULL)) NOT VALID;
