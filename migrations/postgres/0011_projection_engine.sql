-- How far each live subscription has applied each partition, written first
-- in the transaction of every batch it applies. A rebuild reads it under a
-- lock when it opens a new generation: records below a generation's
-- boundary are the replay's, records at or above it are live traffic's, and
-- no record is applied to a generation by both.
CREATE TABLE subscription_positions (
    subscription    TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    next_offset     BIGINT  NOT NULL,
    PRIMARY KEY (subscription, topic, kafka_partition)
);

-- Stats counters in generations, like search documents: rebuildable.
ALTER TABLE stats_counters ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
ALTER TABLE stats_counters DROP CONSTRAINT stats_counters_pkey;
ALTER TABLE stats_counters ADD PRIMARY KEY (generation, day, caller, format);
INSERT INTO active_generations (projection, generation) VALUES ('stats', 1);
INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms) VALUES ('stats', 1, 'active', 0, 0);

-- How a generation's boundary was set (`live`: at the live subscription's
-- positions; `offline`: at least the end of the topic), and for offline
-- ones the database time before the end was read: facts delivered before
-- it are surely below the boundary (what verification against the source
-- of truth may demand).
ALTER TABLE projection_generations ADD COLUMN boundary_mode TEXT;
ALTER TABLE projection_generations ADD COLUMN settled_before_ms BIGINT;
