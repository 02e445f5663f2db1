-- The ops audit log (issue 18): every ops action and configuration change made through
-- booking's admin API — refunds, cancellations, event edits and cancellations, seat kills and
-- hold-backs, events and products created — with who, when and what. An entry is written in
-- the same transaction as the change it records, so the log never shows a change that did not
-- happen, nor misses one that did. Entries are never updated or deleted by booking.
CREATE TABLE ops_audit (
    id       BIGSERIAL PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The operator's name as given in `X-Floodgate-Actor` (the admin bearer secret is shared,
    -- so the name is what tells operators apart).
    actor    TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    -- A stable dotted name, e.g. `order.refund`, `event.cancel`, `seats.kill`.
    action   TEXT NOT NULL CHECK (length(action) BETWEEN 1 AND 100),
    -- What was acted on, e.g. `order:ord_...`, `event:demo`, `product:sku-1`.
    target   TEXT NOT NULL CHECK (length(target) BETWEEN 1 AND 300),
    event_id TEXT,
    -- The request as the operator sent it (validated) and what it changed.
    detail   JSONB NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX ops_audit_target ON ops_audit (target, id);
CREATE INDEX ops_audit_event ON ops_audit (event_id, id) WHERE event_id IS NOT NULL;
CREATE INDEX ops_audit_at ON ops_audit (at, id);
