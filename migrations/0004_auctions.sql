-- Auctions (DESIGN.md section 5). `auctions` holds the current state, denormalised so that a
-- bid is decided by ONE conditional UPDATE of one row; `bids` is the append-only log of
-- accepted bids. Money is BIGINT minor units; every time comes from clock_timestamp().
--
-- status: OPEN -> CLOSED, exactly once (the closer's `UPDATE ... WHERE status = 'OPEN'`).
-- A bid is only ever accepted while status = 'OPEN' AND end_time > clock_timestamp(), so an
-- auction whose end has passed takes no bid even before the closer has run.
--
-- Hot auctions (hot = true) are decided in Redis (one Lua script); the bid consumer copies
-- accepted bids here and moves current_price/leader_id/end_time forward monotonically; the
-- closer freezes the auction in Redis and then records the final result here.
CREATE TABLE auctions (
    id             TEXT PRIMARY KEY,
    seller_id      TEXT NOT NULL,
    title          TEXT NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    -- The ceiling (10^15) keeps `current_price + min_increment` far from BIGINT overflow and
    -- exact in Redis Lua (doubles are exact below 2^53).
    start_price    BIGINT NOT NULL CHECK (start_price > 0 AND start_price <= 1000000000000000),
    min_increment  BIGINT NOT NULL CHECK (min_increment > 0 AND min_increment <= 1000000000000000),
    current_price  BIGINT NOT NULL CHECK (current_price >= start_price),
    leader_id      TEXT,
    bid_count      BIGINT NOT NULL DEFAULT 0 CHECK (bid_count >= 0),
    hot            BOOLEAN NOT NULL DEFAULT false,
    status         TEXT NOT NULL DEFAULT 'OPEN' CHECK (status IN ('OPEN', 'CLOSED')),
    end_time       TIMESTAMPTZ NOT NULL,
    extensions     INTEGER NOT NULL DEFAULT 0 CHECK (extensions >= 0),
    max_extensions INTEGER NOT NULL CHECK (max_extensions BETWEEN 0 AND 1000),
    -- When the latest accepted bid was placed and whether it extended the end (written by
    -- the bid statement itself, so the bid row can copy them in the same statement).
    last_bid_at       TIMESTAMPTZ,
    last_bid_extended BOOLEAN NOT NULL DEFAULT false,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    closed_at      TIMESTAMPTZ,
    CHECK (extensions <= max_extensions),
    CHECK ((status = 'CLOSED') = (closed_at IS NOT NULL)),
    -- No leader means no bid yet, so the price is still the start price.
    CHECK (leader_id IS NOT NULL OR current_price = start_price)
);
-- The closer scans only open auctions, oldest end first.
CREATE INDEX auctions_open_end ON auctions (end_time) WHERE status = 'OPEN';
-- The hot-bid consumer polls the open hot auctions.
CREATE INDEX auctions_hot_open ON auctions (id) WHERE hot AND status = 'OPEN';

-- Accepted bids only (a refused bid changes nothing). request_id is the bidder-scoped
-- Idempotency-Key; UNIQUE (auction_id, request_id) makes a retried bid land at most once,
-- whether it comes from the cold path (same statement as the price change) or from the hot
-- path's stream consumer (redelivery after a crash).
CREATE TABLE bids (
    id           TEXT PRIMARY KEY,
    auction_id   TEXT NOT NULL REFERENCES auctions (id),
    bidder_id    TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    amount       BIGINT NOT NULL CHECK (amount > 0),
    placed_at    TIMESTAMPTZ NOT NULL,
    -- The auction's end time right after this bid (it may have extended it): part of the
    -- response that an idempotent replay returns unchanged.
    end_time     TIMESTAMPTZ NOT NULL,
    extended     BOOLEAN NOT NULL,
    path         TEXT NOT NULL CHECK (path IN ('cold', 'hot')),
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (auction_id, request_id)
);
CREATE INDEX bids_auction_amount ON bids (auction_id, amount DESC);
