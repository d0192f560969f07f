-- Projection generations: a rebuild fills generation N+1 beside N, each with
-- its own state, read positions and dedup scope; reads follow
-- `active_generations`, switched in one transaction.

CREATE TABLE projection_generations (
    projection     TEXT   NOT NULL,
    generation     BIGINT NOT NULL,
    -- building | catching_up | ready | active | retired | failed
    state          TEXT   NOT NULL,
    -- Live subscriptions write every generation in a non-terminal state, so a
    -- generation keeps up with live traffic from the moment it exists.
    documents      BIGINT,
    checksum       TEXT,
    detail         TEXT,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL,
    switched_at_ms BIGINT,
    PRIMARY KEY (projection, generation)
);
INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms)
    SELECT projection, generation, 'active', 0, 0 FROM active_generations;

-- A generation's own read position per partition, and the boundary (the end
-- offset when the rebuild started) its replay runs to.
CREATE TABLE generation_positions (
    projection      TEXT    NOT NULL,
    generation      BIGINT  NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    next_offset     BIGINT  NOT NULL,
    boundary_offset BIGINT  NOT NULL,
    PRIMARY KEY (projection, generation, topic, kafka_partition)
);
