-- Status figures that stay fast on big tables (issue 19): every count the
-- status monitor takes is now a range of an index, never a whole table.

-- Rows the relay set aside (`failed`, `dead_lettered`), one row each,
-- written in the same transaction as the outbox row's status and removed
-- by the redrive that re-appends it. The outbox itself keeps no index on
-- `status`: one would make every delivery a non-HOT update (see 0003), and
-- set-aside rows are rare, so they get a table of their own instead.
CREATE TABLE outbox_set_aside (
    seq           BIGINT PRIMARY KEY,
    status        TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL
);
INSERT INTO outbox_set_aside (seq, status, created_at_ms)
    SELECT seq, status, created_at_ms FROM outbox WHERE status IN ('failed', 'dead_lettered');
CREATE INDEX outbox_set_aside_by_status ON outbox_set_aside (status);

-- Jobs by status and by when they ended: per-status counts and the most
-- recent finished jobs (the latency sample) are index ranges. A job's
-- status already has an index (caller, status), so this adds no HOT loss.
CREATE INDEX export_jobs_by_status_done ON export_jobs (status, (COALESCE(completed_at_ms, updated_at_ms)));
