-- Where a consumer group without a committed offset was decided to start,
-- per partition, recorded before the offsets are committed to Kafka. A
-- process that dies between the decision and the commit leaves the decision
-- here: its successor commits the same positions instead of deciding again
-- on a topic that has since gained records (which, for notifications, it
-- would have to refuse for good).

CREATE TABLE start_positions (
    consumer_group  TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    start_offset    BIGINT  NOT NULL,
    decided_at_ms   BIGINT  NOT NULL,
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);
