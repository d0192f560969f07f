-- The relay (issue 4): claims over slices of the key space with fenced
-- cursors; see migrations/postgres/0003_relay.sql for the reasons. SQLite's
-- single writer commits rows in sequence order, so a sequence cursor per
-- slice never skips a row that commits late: there is no such row.

DROP INDEX outbox_pending;
ALTER TABLE outbox ADD COLUMN slice INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN next_attempt_at_ms BIGINT;
CREATE INDEX outbox_slice_seq ON outbox (slice, seq);

CREATE TABLE relay_slices (
    slice               INTEGER PRIMARY KEY,
    claim_owner         TEXT,
    claim_token         TEXT,
    claimed_at_ms       BIGINT,
    claim_expires_at_ms BIGINT NOT NULL DEFAULT 0,
    claim_attempt_count BIGINT NOT NULL DEFAULT 0,
    cursor_lo           TEXT   NOT NULL DEFAULT '1:1:',
    cursor_hi           TEXT,
    cursor_xid          BIGINT NOT NULL DEFAULT 0,
    cursor_seq          BIGINT NOT NULL DEFAULT 0,
    progress_at_ms      BIGINT NOT NULL DEFAULT 0
);
INSERT INTO relay_slices (slice) VALUES (0), (1), (2), (3), (4), (5), (6), (7),
    (8), (9), (10), (11), (12), (13), (14), (15);

CREATE TABLE relay_members (
    owner         TEXT PRIMARY KEY,
    expires_at_ms BIGINT NOT NULL
);
