-- Pruning (issue 19): rows that have done their job go, in small batches,
-- once older than a retention; the audit and rebuilds need to know how far
-- down rows may be missing.

-- Per kind of row (outbox, inbox, intents, dead_letters, tombstones,
-- intake_keys): rows whose time (each kind's own column, see
-- herald-store's `prune`) is below `horizon_ms` may be gone. Only ever
-- raised: rows below an earlier horizon are gone whatever a later, longer
-- retention says. Raised before the first row of a prune goes, so a prune
-- that stops half way leaves a horizon that covers what it removed.
CREATE TABLE prune_horizons (
    kind          TEXT   PRIMARY KEY,
    horizon_ms    BIGINT NOT NULL,
    removed       BIGINT NOT NULL DEFAULT 0,
    updated_at_ms BIGINT NOT NULL
);

-- Tombstones by age: few rows, so a partial index costs little and a
-- prune never scans the documents.
CREATE INDEX search_documents_tombstones ON search_documents (deleted_at_ms) WHERE deleted_at_ms IS NOT NULL;

-- Intake keys by age.
CREATE INDEX export_intents_by_age ON export_intents (created_at_ms);

-- Settled dead letters by age.
CREATE INDEX dead_letters_by_age ON dead_letters (status, updated_at_ms);
