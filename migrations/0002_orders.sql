-- Carts live in Redis; everything here is the source of truth for products, stock, orders and
-- idempotency keys. The CHECK constraints are the last line of defence: whatever bug sits above
-- them, `available` never goes negative and a key never maps to two orders.

-- Idempotency keys (IETF Idempotency-Key draft), scoped per account. A row is claimed
-- `in_flight` by one committed INSERT before any business work starts, and completed (`done`,
-- with the response bytes) inside the business transaction, so a stored response exists iff
-- the business change committed. `claim_id` identifies the attempt that owns the claim: a stale
-- claim (crashed process) can be taken over, and the old attempt can then no longer complete.
CREATE TABLE idempotency_keys (
    account_id      TEXT NOT NULL,
    key             TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint     BYTEA NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    claim_id        TEXT NOT NULL,
    locked_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    response_status SMALLINT,
    response_body   BYTEA,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    completed_at    TIMESTAMPTZ,
    PRIMARY KEY (account_id, key),
    CHECK (state <> 'done' OR (response_status IS NOT NULL AND response_body IS NOT NULL))
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- Catalogue. Kept apart from `inventory` so a price or name change never waits behind (or
-- blocks) the stock row locks of a flash sale.
CREATE TABLE products (
    sku        TEXT PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price      BIGINT NOT NULL CHECK (price >= 0),
    hot        BOOLEAN NOT NULL DEFAULT false,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Stock per SKU: available (sellable), reserved (in PENDING_PAYMENT orders), sold (paid).
-- Every change is one conditional UPDATE; CHECK (available >= 0) refuses an oversell even
-- if a check above it is wrong.
CREATE TABLE inventory (
    sku       TEXT PRIMARY KEY REFERENCES products (sku) ON DELETE CASCADE,
    available BIGINT NOT NULL CHECK (available >= 0),
    reserved  BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold      BIGINT NOT NULL DEFAULT 0 CHECK (sold >= 0)
);

-- Orders. status transitions (see booking/src/orders.rs):
--   PENDING_PAYMENT -> PAID | EXPIRED | CANCELLED;  PAID -> REFUNDED
-- Each transition is one `UPDATE ... WHERE status = <from>`, so of two racing transitions
-- exactly one wins.
CREATE TABLE orders (
    id              TEXT PRIMARY KEY,
    account_id      TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'PENDING_PAYMENT'
                    CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'EXPIRED', 'CANCELLED',
                                      'REFUNDED')),
    source          TEXT NOT NULL CHECK (source IN ('cart', 'hold')),
    hold_id         TEXT,
    event_id        TEXT,
    total           BIGINT NOT NULL CHECK (total >= 0),
    currency        TEXT NOT NULL DEFAULT 'JPY',
    expires_at      TIMESTAMPTZ NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    paid_at         TIMESTAMPTZ,
    UNIQUE (account_id, idempotency_key),
    CHECK ((source = 'hold') = (hold_id IS NOT NULL)),
    CHECK (status <> 'PAID' OR paid_at IS NOT NULL)
);
CREATE INDEX orders_pending_expiry ON orders (expires_at) WHERE status = 'PENDING_PAYMENT';
CREATE INDEX orders_account ON orders (account_id, created_at);
-- A hold becomes at most one order.
CREATE UNIQUE INDEX orders_one_per_hold ON orders (hold_id) WHERE hold_id IS NOT NULL;

-- Order lines with the unit price snapshotted at order time (later price changes do not
-- touch existing orders). kind: sku (cart), seat, ga (from a hold).
CREATE TABLE order_items (
    order_id   TEXT NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line       INTEGER NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('sku', 'seat', 'ga')),
    sku        TEXT,
    seat_id    TEXT,
    ga_tier    TEXT,
    name       TEXT NOT NULL,
    quantity   INTEGER NOT NULL CHECK (quantity > 0),
    unit_price BIGINT NOT NULL CHECK (unit_price >= 0),
    PRIMARY KEY (order_id, line),
    CHECK (kind <> 'sku' OR sku IS NOT NULL),
    CHECK (kind <> 'seat' OR seat_id IS NOT NULL),
    CHECK (kind <> 'ga' OR ga_tier IS NOT NULL)
);
