-- Ticket e-mail (issue 43; DESIGN section 9, "E-mail addresses").
--
-- The fan's address lives here and nowhere else: not in `orders`, the outbox payload, the
-- streams, the audit log or the logs. One row per order, written before the order itself
-- (no foreign key: the order id is chosen first, and a row whose order never committed is
-- removed by the retention job). Erasing keeps the row (the order had an address once) and
-- drops the address: `email` NULL, `erased_at` set.
CREATE TABLE order_contacts (
    order_id   TEXT PRIMARY KEY CHECK (length(order_id) BETWEEN 1 AND 64),
    email      TEXT CHECK (email IS NULL OR length(email) BETWEEN 3 AND 254),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    erased_at  TIMESTAMPTZ,
    CHECK ((email IS NULL) = (erased_at IS NOT NULL))
);
-- The retention job's scan: addresses not yet erased, oldest first.
CREATE INDEX order_contacts_live ON order_contacts (created_at) WHERE erased_at IS NULL;

-- One e-mail to send, exactly once per (kind, key): `tickets` keyed by the `order.paid`
-- outbox event id (written in the ticket-delivery consumer's transaction), `resend` by a
-- fresh id per resend, `void` (a void notice) by `<ticket id>.v<its new version>`, written in
-- the void's own transaction, so each void is announced once. The Message-ID derives from (key, kind), so a message sent twice
-- (SMTP accepted it, the sender died before `sent` committed) carries the same Message-ID.
--   pending --claim--> sending --250--> sent
--      ^                  |--4xx/timeout--> pending (backoff), or dead after max_attempts
--      '--lease expired---'--5xx--> dead
-- `last_error` and `smtp_reply` never hold the address (the sender writes them from SMTP
-- codes and fixed texts only).
CREATE TABLE mail_deliveries (
    id              BIGSERIAL PRIMARY KEY,
    kind            TEXT NOT NULL CHECK (kind IN ('tickets', 'resend', 'void')),
    key             TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 128),
    order_id        TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until     TIMESTAMPTZ,
    last_error      TEXT CHECK (last_error IS NULL OR length(last_error) <= 500),
    smtp_reply      TEXT CHECK (smtp_reply IS NULL OR length(smtp_reply) <= 500),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at         TIMESTAMPTZ,
    UNIQUE (kind, key),
    CHECK ((state = 'sending') = (lease_until IS NOT NULL)),
    CHECK ((state = 'sent') = (sent_at IS NOT NULL))
);
-- The sender's claim: due pending rows and expired leases.
CREATE INDEX mail_deliveries_due ON mail_deliveries (next_attempt_at)
    WHERE state IN ('pending', 'sending');
CREATE INDEX mail_deliveries_order ON mail_deliveries (order_id, created_at);
-- The ops list by state (`GET /admin/mail?state=dead`).
CREATE INDEX mail_deliveries_state ON mail_deliveries (state, created_at DESC);

-- Orders paid before e-mail existed get no mail (their tickets are on the ticket page): every
-- delivery recorded so far is marked, and only unmarked ones ever get a mail row.
ALTER TABLE deliveries ADD COLUMN before_email BOOLEAN NOT NULL DEFAULT true;
ALTER TABLE deliveries ALTER COLUMN before_email SET DEFAULT false;
