-- Per-key order (a subscription run with `order = per-key`): the records of
-- a Kafka record key that came after one of its records was dead-lettered,
-- parked behind that letter, in the transaction that would have applied
-- them. They are applied in offset order, through the inbox and handler,
-- when the letter is redriven or discarded (dead_letters.status: dead |
-- redriven | discarded).
--
-- A table of their own rather than dead-letter rows with a `parked`
-- status: a dead letter is a record at fault, waiting for an operator
-- (listed, counted, redriven one by one or all at once); a parked record is
-- not at fault and is never acted on alone. Kept apart, `dlq redrive
-- --subscription` cannot apply one out of order, and nothing that reads
-- dead letters has to learn to skip them.
CREATE TABLE parked_records (
    subscription    TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    BIGINT  NOT NULL,
    -- Records without a key have no per-key order and are never parked.
    record_key      BYTEA   NOT NULL,
    -- As in dead_letters: JSON array of [name, hex value or null].
    headers         TEXT    NOT NULL,
    record_value    BYTEA,
    parked_at_ms    BIGINT  NOT NULL,
    -- A redelivered record (crash before its offset commit) is parked once.
    PRIMARY KEY (subscription, topic, kafka_partition, kafka_offset)
);
-- A key's parked records in offset order (release), and a partition's
-- parked keys (every batch of a per-key subscription asks).
CREATE INDEX parked_records_by_key ON parked_records (subscription, topic, kafka_partition, record_key, kafka_offset);
