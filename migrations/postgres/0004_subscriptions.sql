-- Issue 5: independent subscriptions. Dead letters (poison set aside with its
-- reason, redrivable), the stats projection's counters, notification intents
-- for the dispatcher, and an index that lets inbox retention delete by age.

CREATE TABLE dead_letters (
    id              BIGSERIAL PRIMARY KEY,
    subscription    TEXT    NOT NULL,
    -- Identity when the record decoded far enough to have one; NULL for bytes
    -- that are not an event at all.
    source          TEXT,
    event_id        TEXT,
    event_type      TEXT,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    BIGINT  NOT NULL,
    record_key      BYTEA,
    -- JSON array of [name, hex value or null]: the record's headers, verbatim.
    headers         TEXT    NOT NULL,
    record_value    BYTEA,
    error           TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    -- dead | redriven
    status          TEXT    NOT NULL DEFAULT 'dead',
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL,
    -- A redelivered poison record (crash before its offset commit) is the same
    -- dead letter, not a second one.
    UNIQUE (subscription, topic, kafka_partition, kafka_offset)
);
CREATE INDEX dead_letters_by_subscription ON dead_letters (subscription, status, id);

CREATE TABLE stats_counters (
    day           TEXT   NOT NULL,
    caller        TEXT   NOT NULL,
    format        TEXT   NOT NULL,
    exports       BIGINT NOT NULL,
    bytes         BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (day, caller, format)
);

CREATE TABLE notification_intents (
    -- Stable: derived from the event's (source, id) and the recipient, so every
    -- delivery of the same fact names the same intent.
    idempotency_key TEXT   PRIMARY KEY,
    source          TEXT   NOT NULL,
    event_id        TEXT   NOT NULL,
    recipient       TEXT   NOT NULL,
    kind            TEXT   NOT NULL,
    job_id          TEXT   NOT NULL,
    body            TEXT   NOT NULL,
    status          TEXT   NOT NULL DEFAULT 'pending',
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    UNIQUE (source, event_id, recipient)
);
CREATE INDEX notification_intents_by_status ON notification_intents (status, created_at_ms);

CREATE INDEX inbox_by_age ON inbox (processed_at_ms);
