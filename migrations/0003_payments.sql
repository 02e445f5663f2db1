-- Payments, provider webhooks, outbox relaying and ticket delivery.
--
-- The money invariants live here as constraints, below whatever the code does:
--   * one provider idempotency key per payment attempt (UNIQUE provider_key), so a retried
--     attempt can never become a second charge;
--   * at most one attempt in flight per order and at most one successful payment per order
--     (partial unique indexes);
--   * each provider event is applied once (payment_webhook_events primary key, written in the
--     same transaction as the state change it causes);
--   * each outbox event is delivered once (deliveries primary key = outbox event id).

-- One row per payment attempt. status:
--   pending        -> succeeded (order PAID by this attempt)
--                   | declined (card refused; the next attempt gets a new key)
--                   | failed (the provider never saw it / never charged it)
--                   | refund_pending (money taken but the order could not be fulfilled)
--   refund_pending -> refunded
CREATE TABLE payments (
    id                  TEXT PRIMARY KEY,
    order_id            TEXT NOT NULL REFERENCES orders (id),
    account_id          TEXT NOT NULL,
    attempt             INTEGER NOT NULL CHECK (attempt >= 1),
    -- Sent to the provider as Idempotency-Key: "<order id>-<attempt>". Recorded before the
    -- provider is called; every retry of this attempt sends the same key.
    provider_key        TEXT NOT NULL UNIQUE,
    amount              BIGINT NOT NULL CHECK (amount >= 0),
    currency            TEXT NOT NULL,
    payment_method      TEXT NOT NULL,
    status              TEXT NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'succeeded', 'declined', 'failed',
                                          'refund_pending', 'refunded')),
    provider_payment_id TEXT UNIQUE,
    decline_code        TEXT,
    refund_id           TEXT,
    -- When the reconciliation job should next ask the provider about this attempt.
    next_check_at       TIMESTAMPTZ NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (order_id, attempt),
    CHECK (status NOT IN ('succeeded', 'refund_pending', 'refunded')
           OR provider_payment_id IS NOT NULL),
    CHECK (status <> 'refunded' OR refund_id IS NOT NULL)
);
CREATE UNIQUE INDEX payments_one_pending_per_order ON payments (order_id) WHERE status = 'pending';
CREATE UNIQUE INDEX payments_one_success_per_order ON payments (order_id) WHERE status = 'succeeded';
CREATE INDEX payments_to_reconcile ON payments (next_check_at)
    WHERE status IN ('pending', 'refund_pending');

-- Provider events already applied (providers retry for days). Inserted in the same
-- transaction as the change the event causes: a rolled-back change leaves no record, so the
-- provider's retry is applied; a committed one makes every repeat a no-op.
CREATE TABLE payment_webhook_events (
    provider_event_id TEXT PRIMARY KEY,
    event_type        TEXT NOT NULL,
    payment_id        TEXT,
    received_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- The relay claims outbox rows with a short lease (claimed_until) in one statement and
-- publishes after that transaction committed, so no transaction stays open across the Redis
-- call. A relay that dies after publishing leaves the lease to run out and the row is
-- published again (at least once; consumers dedupe by event_id).
ALTER TABLE outbox
    ADD COLUMN claimed_until    TIMESTAMPTZ,
    ADD COLUMN publish_attempts INTEGER NOT NULL DEFAULT 0;

-- Ticket deliveries, one per outbox event id, however often the stream hands it over.
CREATE TABLE deliveries (
    event_id     TEXT PRIMARY KEY,
    order_id     TEXT NOT NULL,
    account_id   TEXT NOT NULL,
    tickets      JSONB NOT NULL,
    stream_entry TEXT NOT NULL,
    consumer     TEXT NOT NULL,
    delivered_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX deliveries_order ON deliveries (order_id);
