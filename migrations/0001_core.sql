-- Floodgate core schema: events, reserved seats, general admission, holds, tickets, the
-- per-account ticket limit, and the outbox. Postgres is the source of truth; the constraints
-- here are the last line of defence against selling anything twice.

CREATE TABLE events (
    id                      TEXT PRIMARY KEY,
    name                    TEXT NOT NULL,
    venue                   TEXT NOT NULL DEFAULT '',
    sale_start              TIMESTAMPTZ NOT NULL,
    hold_ttl_s              INTEGER NOT NULL CHECK (hold_ttl_s BETWEEN 10 AND 86400),
    max_tickets_per_account INTEGER NOT NULL CHECK (max_tickets_per_account BETWEEN 1 AND 100),
    created_at              TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE price_tiers (
    event_id TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    tier     TEXT NOT NULL,
    price    BIGINT NOT NULL CHECK (price >= 0),
    PRIMARY KEY (event_id, tier)
);

-- One row per reserved seat. status/hold_id/held_until/order_id move together:
--   available: hold_id, held_until NULL
--   held:      hold_id, held_until set (a hold past held_until is as good as available:
--              the hold statement reclaims it; the sweeper only tidies)
--   sold:      order_id set
CREATE TABLE seats (
    event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    seat_id    TEXT NOT NULL,
    section    TEXT NOT NULL,
    row_no     INTEGER NOT NULL,
    number     INTEGER NOT NULL,
    tier       TEXT NOT NULL,
    status     TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'held', 'sold')),
    hold_id    TEXT,
    held_until TIMESTAMPTZ,
    order_id   TEXT,
    PRIMARY KEY (event_id, seat_id),
    CHECK (status <> 'held' OR (hold_id IS NOT NULL AND held_until IS NOT NULL)),
    CHECK (status <> 'available' OR (hold_id IS NULL AND held_until IS NULL)),
    CHECK (status <> 'sold' OR order_id IS NOT NULL)
);
CREATE INDEX seats_held_until ON seats (held_until) WHERE status = 'held';
CREATE INDEX seats_hold_id ON seats (hold_id) WHERE hold_id IS NOT NULL;

-- General admission: a tier's capacity is split over `shards` counter rows so concurrent
-- buyers do not all queue on one row lock.
CREATE TABLE ga_tiers (
    event_id TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    tier     TEXT NOT NULL,
    price    BIGINT NOT NULL CHECK (price >= 0),
    capacity INTEGER NOT NULL CHECK (capacity >= 0),
    shards   INTEGER NOT NULL CHECK (shards BETWEEN 1 AND 64),
    PRIMARY KEY (event_id, tier)
);

CREATE TABLE ga_counters (
    event_id  TEXT NOT NULL,
    tier      TEXT NOT NULL,
    shard     INTEGER NOT NULL,
    available INTEGER NOT NULL CHECK (available >= 0),
    sold      INTEGER NOT NULL DEFAULT 0 CHECK (sold >= 0),
    PRIMARY KEY (event_id, tier, shard),
    FOREIGN KEY (event_id, tier) REFERENCES ga_tiers (event_id, tier) ON DELETE CASCADE
);

-- A hold on seats or GA units. status:
--   active   -> released (fan let go) | expired (TTL passed) | ordered (an order owns it)
--   ordered  -> sold (paid) | expired (order expired/cancelled; units returned)
CREATE TABLE holds (
    id         TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    account_id TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('seats', 'ga')),
    ga_tier    TEXT,
    quantity   INTEGER NOT NULL CHECK (quantity > 0),
    status     TEXT NOT NULL DEFAULT 'active'
               CHECK (status IN ('active', 'released', 'expired', 'ordered', 'sold')),
    expires_at TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    CHECK (kind <> 'ga' OR ga_tier IS NOT NULL)
);
CREATE INDEX holds_active_expiry ON holds (expires_at) WHERE status = 'active';
CREATE INDEX holds_account ON holds (account_id, event_id);

-- Which GA shard(s) a GA hold took its units from, so release returns them exactly.
CREATE TABLE hold_ga_items (
    hold_id  TEXT NOT NULL REFERENCES holds (id) ON DELETE CASCADE,
    shard    INTEGER NOT NULL,
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (hold_id, shard)
);

-- Tickets per account per event (active holds + sold), kept by one conditional upsert so the
-- per-account limit cannot be raced.
CREATE TABLE account_event_usage (
    event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    account_id TEXT NOT NULL,
    tickets    INTEGER NOT NULL CHECK (tickets >= 0),
    PRIMARY KEY (event_id, account_id)
);

-- Issued tickets. UNIQUE (event_id, seat_id) refuses a second ticket for a seat even if
-- every check above it had a bug. GA tickets have seat_id NULL (not constrained by it).
CREATE TABLE tickets (
    id         TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL REFERENCES events (id),
    seat_id    TEXT,
    ga_tier    TEXT,
    order_id   TEXT NOT NULL,
    account_id TEXT NOT NULL,
    issued_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    CHECK ((seat_id IS NULL) <> (ga_tier IS NULL))
);
CREATE UNIQUE INDEX tickets_one_per_seat ON tickets (event_id, seat_id) WHERE seat_id IS NOT NULL;
CREATE INDEX tickets_order ON tickets (order_id);

-- Transactional outbox: written in the same transaction as the state change it announces,
-- relayed to Redis Streams by the outbox relay (at least once; consumers dedupe by id).
CREATE TABLE outbox (
    id           BIGSERIAL PRIMARY KEY,
    event_id     TEXT NOT NULL UNIQUE,
    topic        TEXT NOT NULL,
    aggregate_id TEXT NOT NULL,
    payload      JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    published_at TIMESTAMPTZ
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
