-- History completeness: per generation and partition, the first offset its
-- documents derive from (where the live group first started, where a
-- rebuild's replay started, or the positions of the snapshot it loaded).
-- A rebuild refuses when the broker no longer retains that offset, unless a
-- snapshot covers the gap. A partition without a row needs offset 0.
CREATE TABLE projection_history (
    projection      TEXT    NOT NULL,
    generation      BIGINT  NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    first_offset    BIGINT  NOT NULL,
    recorded_at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (projection, generation, topic, kafka_partition)
);
