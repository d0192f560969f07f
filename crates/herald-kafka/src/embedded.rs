//! The embedded default broker: librdkafka's in-process mock cluster.
//!
//! The mock cluster handle is not `Send`, so it lives on a thread of its own
//! for as long as the [`EmbeddedKafka`] value; every client in the process
//! connects to it over loopback through its bootstrap address like to any
//! broker.
//!
//! It is also the fault-injection bench: [`EmbeddedKafka::broker_down`],
//! [`EmbeddedKafka::produce_errors`] and friends forward to the cluster's
//! thread over a channel and return once the cluster applied them.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// An in-process Kafka-protocol cluster; dropped, it stops.
pub struct EmbeddedKafka {
    bootstrap: String,
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

/// A fault for the cluster's thread and where to send how applying it went.
type Command = (Fault, mpsc::Sender<Result<(), KafkaError>>);

/// A fault to inject into the running cluster.
#[derive(Debug, Clone)]
enum Fault {
    RequestErrors(RDKafkaApiKey, Vec<RDKafkaRespErr>),
    BrokerDown(i32),
    BrokerUp(i32),
    RoundTripTime(i32, Duration),
}

fn apply<C: rdkafka::ClientContext>(cluster: &MockCluster<'_, C>, fault: Fault) -> Result<(), KafkaError> {
    match fault {
        Fault::RequestErrors(api, errors) => {
            cluster.request_errors(api, &errors);
            Ok(())
        }
        Fault::BrokerDown(id) => cluster.broker_down(id),
        Fault::BrokerUp(id) => cluster.broker_up(id),
        Fault::RoundTripTime(id, rtt) => cluster.broker_round_trip_time(id, rtt),
    }
}

impl EmbeddedKafka {
    /// Starts `brokers` mock brokers with `topics` created up front, since the
    /// mock cluster does not implement CreateTopics.
    pub fn start(brokers: i32, topics: &[&str], partitions: i32) -> Result<Self, KafkaError> {
        let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (command_tx, command_rx) = mpsc::channel::<Command>();
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
                // Serves faults until the sender is dropped, which stops it.
                for (fault, reply) in command_rx {
                    let _ = reply.send(apply(&cluster, fault));
                }
            })
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
        let bootstrap = ready_rx.recv().map_err(|_| KafkaError::ClientCreation("embedded kafka thread died".into()))??;
        Ok(EmbeddedKafka { bootstrap, commands: Some(command_tx), thread: Some(thread) })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// The next produce requests (to any broker) fail with `errors`, one per
    /// request, in order.
    pub fn produce_errors(&self, errors: &[RDKafkaRespErr]) -> Result<(), KafkaError> {
        self.request_errors(RDKafkaApiKey::Produce, errors)
    }

    /// The next requests of kind `api` fail with `errors`, one per request.
    pub fn request_errors(&self, api: RDKafkaApiKey, errors: &[RDKafkaRespErr]) -> Result<(), KafkaError> {
        self.inject(Fault::RequestErrors(api, errors.to_vec()))
    }

    /// Broker `id` (1-based) stops answering: its connections are closed and
    /// new ones refused until [`EmbeddedKafka::broker_up`].
    pub fn broker_down(&self, id: i32) -> Result<(), KafkaError> {
        self.inject(Fault::BrokerDown(id))
    }

    pub fn broker_up(&self, id: i32) -> Result<(), KafkaError> {
        self.inject(Fault::BrokerUp(id))
    }

    /// Delays every answer of broker `id` by `rtt`.
    pub fn round_trip_time(&self, id: i32, rtt: Duration) -> Result<(), KafkaError> {
        self.inject(Fault::RoundTripTime(id, rtt))
    }

    fn inject(&self, fault: Fault) -> Result<(), KafkaError> {
        let gone = || KafkaError::ClientCreation("embedded kafka thread is gone".into());
        let (reply_tx, reply_rx) = mpsc::channel();
        self.commands.as_ref().ok_or_else(gone)?.send((fault, reply_tx)).map_err(|_| gone())?;
        reply_rx.recv().map_err(|_| gone())?
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        drop(self.commands.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
