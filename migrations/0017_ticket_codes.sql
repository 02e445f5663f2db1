-- Ticket codes (issue 43; DESIGN section 9, "Ticket codes", "Events gain a date").
--
-- A ticket's code is signed over its `version`: every void (refund, line refund, dispute,
-- cancellation) and, later, every transfer bumps it in the same statement, so a code signed
-- before is stale at the door. `holder_account` is who holds the ticket now (the buyer until a
-- transfer moves it); the code carries only an HMAC of it (the holder handle), never the
-- account itself. Backfilled from the buying account, then required.
ALTER TABLE tickets
    ADD COLUMN version        INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN holder_account TEXT;
UPDATE tickets SET holder_account = account_id WHERE holder_account IS NULL;
ALTER TABLE tickets ALTER COLUMN holder_account SET NOT NULL;
-- A fan's own tickets (`GET /api/tickets`).
CREATE INDEX tickets_holder ON tickets (holder_account, issued_at);

-- When and where an event happens (all optional), and how its codes are shown: `static` (one
-- signed code per ticket version) or `rotating` (that code plus a TOTP the fan's device
-- computes, which stops screenshots being passed on).
ALTER TABLE events
    ADD COLUMN starts_at     TIMESTAMPTZ,
    ADD COLUMN doors_at      TIMESTAMPTZ,
    ADD COLUMN timezone      TEXT CHECK (timezone IS NULL OR length(timezone) BETWEEN 1 AND 64),
    ADD COLUMN venue_address TEXT CHECK (venue_address IS NULL OR length(venue_address) <= 500),
    ADD COLUMN ticket_code   TEXT NOT NULL DEFAULT 'static'
        CHECK (ticket_code IN ('static', 'rotating')),
    ADD CONSTRAINT events_doors_before_start
        CHECK (doors_at IS NULL OR starts_at IS NULL OR doors_at <= starts_at);
