-- Fenced job lifecycle: every attempt runs under a processing generation and a
-- lease deadline; completion is conditional on both. Candidate artifacts are
-- registered before they are written, so cleanup can find every orphan.

ALTER TABLE export_jobs ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE export_jobs ADD COLUMN lease_owner TEXT;
-- running: the attempt's lease; pending: when the scanner re-issues the command.
ALTER TABLE export_jobs ADD COLUMN lease_expires_at_ms BIGINT;
ALTER TABLE export_jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE export_jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE export_jobs ADD COLUMN last_error TEXT;

CREATE INDEX export_jobs_open_deadline ON export_jobs (lease_expires_at_ms)
    WHERE status IN ('pending', 'running');
CREATE INDEX export_jobs_caller_status ON export_jobs (caller, status);

CREATE TABLE export_artifacts (
    result_id     TEXT PRIMARY KEY,
    job_id        TEXT   NOT NULL REFERENCES export_jobs (job_id),
    generation    BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    UNIQUE (job_id, generation)
);
