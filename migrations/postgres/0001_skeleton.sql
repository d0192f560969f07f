-- Walking skeleton: outbox, inbox, export intake and jobs, search projection.
-- Times are milliseconds since the Unix epoch (BIGINT) in both backends, so one
-- code path reads them the same way on PostgreSQL and SQLite.

CREATE TABLE outbox (
    seq             BIGSERIAL PRIMARY KEY,
    event_id        TEXT   NOT NULL,
    source          TEXT   NOT NULL,
    event_type      TEXT   NOT NULL,
    subject         TEXT   NOT NULL,
    event_time_ms   BIGINT NOT NULL,
    schema_file     TEXT   NOT NULL,
    data            BYTEA  NOT NULL,
    topic           TEXT   NOT NULL,
    partition_key   TEXT   NOT NULL,
    status          TEXT   NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at_ms   BIGINT NOT NULL,
    delivered_at_ms BIGINT,
    UNIQUE (source, event_id)
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE status = 'pending';

CREATE TABLE inbox (
    subscription    TEXT    NOT NULL,
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    BIGINT  NOT NULL,
    processed_at_ms BIGINT  NOT NULL,
    PRIMARY KEY (subscription, source, event_id)
);

CREATE TABLE export_jobs (
    job_id          TEXT PRIMARY KEY,
    caller          TEXT   NOT NULL,
    format          TEXT   NOT NULL,
    query           TEXT   NOT NULL,
    status          TEXT   NOT NULL,
    version         BIGINT NOT NULL,
    result_id       TEXT,
    result_size     BIGINT,
    result_sha256   TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    completed_at_ms BIGINT
);

CREATE TABLE export_intents (
    caller        TEXT   NOT NULL,
    operation     TEXT   NOT NULL,
    intent_key    TEXT   NOT NULL,
    fingerprint   TEXT   NOT NULL,
    job_id        TEXT   NOT NULL REFERENCES export_jobs (job_id),
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (caller, operation, intent_key)
);

CREATE TABLE search_documents (
    generation      BIGINT NOT NULL,
    job_id          TEXT   NOT NULL,
    caller          TEXT   NOT NULL,
    format          TEXT   NOT NULL,
    query           TEXT   NOT NULL,
    result_id       TEXT   NOT NULL,
    size_bytes      BIGINT NOT NULL,
    completed_at_ms BIGINT NOT NULL,
    version         BIGINT NOT NULL,
    PRIMARY KEY (generation, job_id)
);

-- Which generation of each projection serves reads. Switching is one UPDATE.
CREATE TABLE active_generations (
    projection TEXT PRIMARY KEY,
    generation BIGINT NOT NULL
);
INSERT INTO active_generations (projection, generation) VALUES ('search', 1);
