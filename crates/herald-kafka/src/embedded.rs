//! The embedded default broker: librdkafka's in-process mock cluster.
//!
//! The mock cluster handle is not `Send`, so it lives on a thread of its own
//! for as long as the [`EmbeddedKafka`] value; every client in the process
//! connects to it over loopback through its bootstrap address like to any
//! broker.

use std::sync::mpsc;
use std::thread::JoinHandle;

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;

/// An in-process Kafka-protocol cluster; dropped, it stops.
pub struct EmbeddedKafka {
    bootstrap: String,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EmbeddedKafka {
    /// Starts `brokers` mock brokers with `topics` created up front, since the
    /// mock cluster does not implement CreateTopics.
    pub fn start(brokers: i32, topics: &[&str], partitions: i32) -> Result<Self, KafkaError> {
        let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("herald-embedded-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(cluster) => cluster,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for topic in &topics {
                    if let Err(e) = cluster.create_topic(topic, partitions, brokers.min(3)) {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Blocks until stop is sent or the sender is dropped.
                let _ = stop_rx.recv();
            })
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| KafkaError::ClientCreation("embedded kafka thread died".into()))??;
        Ok(EmbeddedKafka { bootstrap, stop: Some(stop_tx), thread: Some(thread) })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
