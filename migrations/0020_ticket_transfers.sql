-- Transfer at face value (issue 44; DESIGN section 9, "Transfer"): the holder offers a ticket
-- to an e-mail address, the receiver signs in and accepts. No money moves.
--
-- One row per offer. `status` moves offered -> accepted | cancelled | expired and never back;
-- every move is one conditional UPDATE (`booking::tickets::transfer::repo`). An offer past
-- `expires_at` is treated as expired by every statement even before it is marked so (the
-- mark is made lazily, by the next offer of the same ticket).
--
-- Addresses: `to_email` (the offer's address), `from_email` (where the sender's copy of the
-- ticket went, for the "transferred" notice) and `receiver_email` (the address the receiver
-- gave at accept) live here and nowhere else, like `order_contacts.email`, and are erased by
-- the same rules (`tickets::mail::retention`: the order's retention date and ops "forget"):
-- the row stays, its addresses become NULL, `erased_at` is set.
CREATE TABLE ticket_transfers (
    id               TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    ticket_id        TEXT NOT NULL REFERENCES tickets (id),
    event_id         TEXT NOT NULL,
    order_id         TEXT NOT NULL,
    from_account     TEXT NOT NULL,
    from_email       TEXT CHECK (from_email IS NULL OR length(from_email) BETWEEN 3 AND 254),
    to_email         TEXT CHECK (to_email IS NULL OR length(to_email) BETWEEN 3 AND 254),
    -- The ticket's version when offered: the accept moves the ticket only if it is unchanged.
    version_at_offer INTEGER NOT NULL CHECK (version_at_offer >= 1),
    status           TEXT NOT NULL DEFAULT 'offered'
        CHECK (status IN ('offered', 'accepted', 'cancelled', 'expired')),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at       TIMESTAMPTZ NOT NULL,
    accepted_at      TIMESTAMPTZ,
    ended_at         TIMESTAMPTZ,
    receiver_account TEXT,
    receiver_email   TEXT CHECK (receiver_email IS NULL OR length(receiver_email) BETWEEN 3 AND 254),
    erased_at        TIMESTAMPTZ,
    CHECK ((status = 'accepted') = (accepted_at IS NOT NULL AND receiver_account IS NOT NULL)),
    CHECK (status = 'offered' OR ended_at IS NOT NULL),
    CHECK (erased_at IS NOT NULL OR to_email IS NOT NULL),
    CHECK (receiver_account IS NULL OR receiver_account <> from_account)
);

-- One live offer per ticket: a second offer while one is open fails its insert (409).
CREATE UNIQUE INDEX ticket_transfers_open ON ticket_transfers (ticket_id) WHERE status = 'offered';
-- A ticket's transfer history (the current holder's address: the last accepted transfer).
CREATE INDEX ticket_transfers_ticket ON ticket_transfers (ticket_id, accepted_at)
    WHERE status = 'accepted';
-- Retention and forget find an order's transfers.
CREATE INDEX ticket_transfers_order ON ticket_transfers (order_id) WHERE erased_at IS NULL;

-- The transfer e-mails, keyed by the transfer id, one each: the offer to `to_email`
-- (`transfer_offer`), the ticket with its new code to the receiver (`transfer_ticket`), the
-- notice to the sender (`transferred`).
ALTER TABLE mail_deliveries DROP CONSTRAINT mail_deliveries_kind_check;
ALTER TABLE mail_deliveries ADD CONSTRAINT mail_deliveries_kind_check
    CHECK (kind IN ('tickets', 'resend', 'void', 'transfer_offer', 'transfer_ticket',
                    'transferred'));
