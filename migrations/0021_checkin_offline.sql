-- Offline check-in (issue 44, "Offline"; DESIGN section 9, "Check-in"): scanners fetch a
-- snapshot of an event's tickets, incrementally with a cursor, decide alone while the network
-- is down, and upload their decisions (`POST /api/checkin/{event}/scans:batch`).
--
-- The cursor (docs/decisions.md, "The offline snapshot's cursor"): every write of a ticket row
-- stamps it with the writing transaction's id (`door_xid`, set by a trigger, so no writer —
-- refunds, check-in, later transfers — can forget it). A snapshot read in one REPEATABLE READ
-- transaction answers the rows it sees and, as the new cursor, the xmin of its own snapshot:
-- every transaction below it had finished, so its writes were visible to that read. The next
-- read asks for `door_xid >= cursor`, which covers every transaction that was still running
-- (or not yet begun) then, however out of order they commit. Rows seen twice are sent twice
-- (a small overlap); a row is never missed.
ALTER TABLE tickets ADD COLUMN door_xid xid8 NOT NULL DEFAULT '1';

CREATE FUNCTION tickets_stamp_door_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.door_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;

CREATE TRIGGER tickets_door_xid BEFORE INSERT OR UPDATE ON tickets
    FOR EACH ROW EXECUTE FUNCTION tickets_stamp_door_xid();

-- An event's tickets changed since a cursor.
CREATE INDEX tickets_door_xid ON tickets (event_id, door_xid);

-- Offline decisions uploaded in a batch are logged in `checkins` like online scans, with what
-- the device decided (`offline_decided`: `ENTRY`, `EXIT` or its refusal code), whether the
-- server's decision differs from an admission the device made (`conflict`: a ticket let in
-- offline that was inside already, void, or not a valid code), and whether the scanner had
-- been revoked by the time it uploaded (`from_revoked_scanner`: kept as a fact, alerted).
ALTER TABLE checkins
    ADD COLUMN offline_decided      TEXT CHECK (offline_decided IS NULL
                                                OR offline_decided IN (
                                                    'ENTRY', 'EXIT', 'ALREADY_INSIDE',
                                                    'REENTRY_NOT_ALLOWED', 'NOT_INSIDE',
                                                    'VOIDED', 'WRONG_EVENT', 'INVALID_CODE',
                                                    'CODE_EXPIRED')),
    ADD COLUMN conflict             BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN from_revoked_scanner BOOLEAN NOT NULL DEFAULT false,
    ADD CONSTRAINT checkins_conflict_offline CHECK (NOT conflict OR offline_decided IS NOT NULL);

-- An event's conflicts, newest first (`GET /admin/events/{event}/checkin/conflicts`).
CREATE INDEX checkins_conflicts ON checkins (event_id, id DESC) WHERE conflict;
