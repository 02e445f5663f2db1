-- Ops refunds and event cancellation (issue 18, "Ops API" part 2).
--
-- `order_refunds` is the durable record of a refund booking itself asks the provider for
-- (an operator's refund or cancel of a paid order, or an event's cancellation). The row is
-- written *before* the provider is called and names the provider idempotency key
-- (`refund-<id>`), so a retry, a crash between the provider's answer and our commit, or two
-- booking processes working the same row all replay the same refund at the provider: money
-- goes back at most once. At most one live full refund per order (partial unique index), so
-- two concurrent requests share one row, hence one provider key.
SET LOCAL lock_timeout = '5s';

CREATE TABLE order_refunds (
    id                 TEXT PRIMARY KEY,
    order_id           TEXT NOT NULL REFERENCES orders (id),
    event_id           TEXT,
    -- The paying attempt (payments.id) and its provider payment.
    payment_id         TEXT NOT NULL,
    provider_payment_id TEXT NOT NULL,
    amount             BIGINT NOT NULL CHECK (amount >= 0),
    -- What happens to the order's seats/units: back on sale, or killed (held back).
    stock              TEXT NOT NULL CHECK (stock IN ('release', 'kill')),
    origin             TEXT NOT NULL CHECK (origin IN ('ops', 'event_cancel')),
    status             TEXT NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider_refund_id TEXT,
    actor              TEXT NOT NULL,
    reason             TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    -- A worker (the ops request or the refund job) owns a pending row until then; an
    -- expired lease (crashed worker) lets the job take it over with the same provider key.
    leased_until       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    created_at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    CHECK (status <> 'succeeded' OR provider_refund_id IS NOT NULL)
);
-- One live (pending or done) full refund per order, whoever asked for it.
CREATE UNIQUE INDEX order_refunds_one_per_order ON order_refunds (order_id)
    WHERE status <> 'failed';
CREATE INDEX order_refunds_pending ON order_refunds (leased_until) WHERE status = 'pending';
CREATE INDEX order_refunds_event ON order_refunds (event_id, status) WHERE event_id IS NOT NULL;

-- A cancelled event: no new holds, orders or payments; every paid order is refunded by the
-- refund job.
ALTER TABLE events
    ADD COLUMN cancelled_at TIMESTAMPTZ,
    ADD COLUMN cancelled_by TEXT,
    ADD COLUMN cancel_reason TEXT;
