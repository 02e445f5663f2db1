-- One admission, one event (DESIGN.md section 8): every product and auction belongs to an
-- event, and booking refuses an admission token of another event on it (`403 WRONG_EVENT`).
--
-- Written for live tables:
--   * the columns are nullable and have no default, so adding them is a catalogue change (no
--     table rewrite, no scan) that holds its lock for milliseconds;
--   * the foreign keys are added NOT VALID: no scan of the existing rows under the lock. They
--     are still enforced for every row inserted or updated from now on, and every existing row
--     is NULL, which a foreign key accepts, so they hold for the whole table anyway (ops may run
--     `ALTER TABLE ... VALIDATE CONSTRAINT` at any time; it takes no lock that blocks traffic);
--   * lock_timeout: if a long transaction holds one of these tables, the migration fails fast
--     (retry it later) instead of queueing every request behind its lock request;
--   * NO ACTION on delete: an event with products or auctions cannot be deleted by accident.
--
-- Existing rows keep event_id NULL. Booking treats such a product or auction as belonging to no
-- event: no admission token opens it (fail closed) until ops assign its event
-- (`PUT /admin/products/{sku} {"event"}`, or SQL; docs/operations.md). Pending cart orders
-- created before this migration have no event either; they stay payable by their owner and
-- expire as before.
SET LOCAL lock_timeout = '5s';

ALTER TABLE products ADD COLUMN event_id TEXT;
ALTER TABLE products
    ADD CONSTRAINT products_event_id_fkey FOREIGN KEY (event_id) REFERENCES events (id) NOT VALID;

ALTER TABLE auctions ADD COLUMN event_id TEXT;
ALTER TABLE auctions
    ADD CONSTRAINT auctions_event_id_fkey FOREIGN KEY (event_id) REFERENCES events (id) NOT VALID;
