use rdkafka::ClientConfig;

/// A producer whose acknowledgements mean the broker has the record for good.
pub fn producer_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Bounded so an unreachable broker surfaces as a failed delivery the
        // relay can record and retry, instead of a future that never resolves.
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5")
        .set("compression.type", "lz4");
    config
}

/// A consumer in `group` whose committed offsets never pass a record the
/// application has not finished: librdkafka commits in the background only
/// offsets the application *stored*, and Herald stores an offset only after
/// the record's effect committed in the database.
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // Low so a consumer that died without leaving frees its partitions soon.
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("isolation.level", "read_committed");
    config
}
