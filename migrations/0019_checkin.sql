-- Check-in at the door (issue 44, first part; DESIGN section 9, "Check-in"): scanners scan
-- ticket codes online and Postgres decides each scan in one conditional statement
-- (`booking::checkin::scan`), so a ticket enters once however many gates scan it at once.
--
-- Per event: whether a ticket that went out may come back in (`reentry`, default no) and
-- whether tickets may be transferred (`transfers`, default yes; the transfer itself is a later
-- part of the issue).
ALTER TABLE events
    ADD COLUMN reentry   BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN transfers BOOLEAN NOT NULL DEFAULT true;

-- The door state of a ticket: inside or not, the entry in force (when, which gate), how many
-- times it entered, when it last went out. Written only by the check-in statement.
ALTER TABLE tickets
    ADD COLUMN inside       BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN entered_at   TIMESTAMPTZ,
    ADD COLUMN entered_gate TEXT,
    ADD COLUMN entries      INTEGER NOT NULL DEFAULT 0 CHECK (entries >= 0),
    ADD COLUMN exited_at    TIMESTAMPTZ,
    ADD CONSTRAINT tickets_inside_entered
        CHECK (NOT inside OR (entered_at IS NOT NULL AND entered_gate IS NOT NULL
                              AND entries >= 1));

-- Who is inside, and who entered, per event (the gate counts: `checkin::gauges`).
CREATE INDEX tickets_inside ON tickets (event_id) WHERE inside;
CREATE INDEX tickets_entered ON tickets (event_id, entered_gate) WHERE entries > 0;

-- Every scan decision, refusals included, as the server received it: the scanner and its
-- gate, the ticket and the version its code carried (NULL when the code named no ticket this
-- deployment signed), the direction, the answer and its reason. `received_at` (server time)
-- orders them; `device_time` is what the scanner's clock said, kept as information only.
-- `entry_at`/`entry_gate`: the entry in force when the answer was made (the new entry for an
-- `ENTRY`, the earlier one for `ALREADY_INSIDE`), so a replayed `scan_id` answers the same.
CREATE TABLE checkins (
    id           BIGSERIAL PRIMARY KEY,
    event_id     TEXT NOT NULL,
    scanner_id   TEXT NOT NULL,
    gate         TEXT NOT NULL CHECK (length(gate) BETWEEN 1 AND 64),
    ticket_id    TEXT,
    version_seen INTEGER,
    direction    TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    result       TEXT NOT NULL CHECK (result IN ('ENTRY', 'EXIT', 'ALREADY_INSIDE',
                                                 'REENTRY_NOT_ALLOWED', 'NOT_INSIDE', 'VOIDED',
                                                 'WRONG_EVENT', 'INVALID_CODE', 'CODE_EXPIRED')),
    reason       TEXT CHECK (reason IS NULL OR length(reason) <= 64),
    -- The scanner's own id of this scan (1..=128 visible characters): the same id from the
    -- same scanner is the same scan, answered once.
    scan_id      TEXT CHECK (scan_id IS NULL OR length(scan_id) BETWEEN 1 AND 128),
    device_time  TIMESTAMPTZ,
    received_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    entry_at     TIMESTAMPTZ,
    entry_gate   TEXT,
    CHECK (result NOT IN ('ENTRY', 'EXIT') OR ticket_id IS NOT NULL)
);

-- One row per (scanner, scan_id): a replay fails its insert, and with it the whole statement.
CREATE UNIQUE INDEX checkins_scan_id ON checkins (scanner_id, scan_id) WHERE scan_id IS NOT NULL;
-- A ticket's history at the door.
CREATE INDEX checkins_ticket ON checkins (ticket_id, received_at) WHERE ticket_id IS NOT NULL;
-- An event's scans in the order received (ops, the later offline conflicts).
CREATE INDEX checkins_event ON checkins (event_id, received_at);

-- A scanner's credential is found by its hash (`credentials.hash` is unique); the scanners of
-- an event are listed by event.
CREATE INDEX credentials_scanners ON credentials (event_id, created_at)
    WHERE kind = 'scanner';
