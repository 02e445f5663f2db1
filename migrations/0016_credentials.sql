-- Operator and scanner credentials (issue 42; DESIGN section 9, "Credentials"). A credential is
-- a random 256-bit secret with a type prefix (`fgop_`, `fgsc_`), shown once at creation and
-- stored only as its SHA-256: the secret is random, so a fast hash is as strong as a password
-- hash and cheap enough to check on every admin request. Rows are never deleted: a revoked or
-- expired credential stays listed (and in the audit log) as who did what.
CREATE SEQUENCE credential_generation;

CREATE TABLE credentials (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('operator', 'scanner')),
    -- An operator's name (the audit log's actor) or a scanner's label.
    name        TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- Operators only.
    role        TEXT CHECK (role IN ('viewer', 'support', 'admin')),
    -- Scanners only (check-in, a later issue): the event and gate they scan for.
    event_id    TEXT,
    gate        TEXT,
    hash        BYTEA NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by  TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ,
    revoked_by  TEXT,
    -- Bumped on every change: the Redis copy the gateway reads is written only by a snapshot
    -- at least as new as the one there (`shared::credentials::Published::generation`).
    generation  BIGINT NOT NULL DEFAULT nextval('credential_generation'),
    CHECK ((kind = 'operator') = (role IS NOT NULL)),
    CHECK (kind = 'operator' OR event_id IS NOT NULL)
);

CREATE INDEX credentials_live ON credentials (kind, expires_at) WHERE revoked_at IS NULL;

-- Who acted, beyond the name: the operator's role and credential id, and for the bootstrap
-- admin secret the name it sent in `X-Floodgate-Actor` (kept as a note, never trusted as the
-- actor). Entries written before this have none of them.
ALTER TABLE ops_audit
    ADD COLUMN role        TEXT,
    ADD COLUMN operator_id TEXT,
    ADD COLUMN note        TEXT;

CREATE INDEX ops_audit_actor ON ops_audit (actor, id);

-- A refund the refund job finishes later is recorded under the operator who asked for it
-- (an event cancellation's refunds: under the operator who cancelled the event).
ALTER TABLE order_refunds ADD COLUMN actor_detail JSONB;
ALTER TABLE events ADD COLUMN cancelled_by_detail JSONB;
