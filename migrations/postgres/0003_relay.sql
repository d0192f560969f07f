-- The relay (issue 4): claims over slices of the key space with fenced
-- cursors, instead of per-row claims on a queue table.
--
-- Why: per-row claims need an index on the status columns, and every claim
-- and every mark then rewrites that index (the design brief measured a 4x
-- loss). Here a relay claims a *slice* (hash of the partition key mod 16)
-- and reads it forward; the only per-row write is the final status update by
-- primary key, which touches no indexed column and so stays a HOT update.

-- The status index is what made every status change an index write.
DROP INDEX outbox_pending;
-- Leave room on each page so the status update stays on the same page (HOT).
ALTER TABLE outbox SET (fillfactor = 80);

-- Slice of the key space the row belongs to: all rows of one partition key
-- are in one slice, so one lease holder orders them.
ALTER TABLE outbox ADD COLUMN slice INTEGER NOT NULL DEFAULT 0;
-- Transaction that wrote (or redrove) the row. The relay reads a slice as
-- the rows that became visible between two snapshots, so a row whose
-- transaction commits late is read in a later step instead of being skipped.
ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
-- When a row that failed with a retryable error may be tried again.
ALTER TABLE outbox ADD COLUMN next_attempt_at_ms BIGINT;
-- A slice is read in (xid, seq) order from its cursor: one range scan.
CREATE INDEX outbox_slice_xid_seq ON outbox (slice, xid, seq);

-- One row per slice: the claim (seed 004's owner, token, claimed at, expires
-- at, attempt count) and the fenced cursor. Progress is written only with
-- the current token and an unexpired lease.
CREATE TABLE relay_slices (
    slice               INTEGER PRIMARY KEY,
    claim_owner         TEXT,
    claim_token         TEXT,
    claimed_at_ms       BIGINT,
    claim_expires_at_ms BIGINT NOT NULL DEFAULT 0,
    claim_attempt_count BIGINT NOT NULL DEFAULT 0,
    -- Snapshot whose rows are all published (PostgreSQL; unused on SQLite).
    cursor_lo           TEXT   NOT NULL DEFAULT '1:1:',
    -- Snapshot being worked through, if any (PostgreSQL; unused on SQLite).
    cursor_hi           TEXT,
    -- Within (lo, hi]: rows up to (cursor_xid, cursor_seq) are done. On
    -- SQLite, whose single writer commits in sequence order, cursor_seq is
    -- the whole cursor.
    cursor_xid          BIGINT NOT NULL DEFAULT 0,
    cursor_seq          BIGINT NOT NULL DEFAULT 0,
    progress_at_ms      BIGINT NOT NULL DEFAULT 0
);
INSERT INTO relay_slices (slice) SELECT generate_series(0, 15);

-- Relay processes that are alive, so each can take its share of slices.
CREATE TABLE relay_members (
    owner         TEXT PRIMARY KEY,
    expires_at_ms BIGINT NOT NULL
);

-- Wake relays when rows commit (NOTIFY is delivered at commit). One
-- notification per statement; identical ones in a transaction fold into one.
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
