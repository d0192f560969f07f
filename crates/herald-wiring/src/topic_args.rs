//! How the topics Herald creates are laid out: one set of flags for every
//! role that may create them.

use clap::Args;
use herald_kafka::TopicSettings;

#[derive(Debug, Clone, Args)]
pub struct TopicArgs {
    /// Partitions of topics Herald creates when they are missing.
    #[arg(long, env = "HERALD_KAFKA_PARTITIONS", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,
    /// Replication factor of topics Herald creates; default 3 on a cluster
    /// of three or more brokers, else 1 (with a warning).
    #[arg(long, env = "HERALD_KAFKA_REPLICATION_FACTOR", value_parser = clap::value_parser!(i32).range(1..))]
    pub replication_factor: Option<i32>,
    /// `min.insync.replicas` of topics Herald creates; default 2 with three
    /// replicas, else 1. An `acks=all` write is acknowledged once this many
    /// replicas have it.
    #[arg(long, env = "HERALD_KAFKA_MIN_INSYNC_REPLICAS", value_parser = clap::value_parser!(i32).range(1..))]
    pub min_insync_replicas: Option<i32>,
}

impl TopicArgs {
    pub fn settings(&self) -> TopicSettings {
        TopicSettings {
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            min_insync_replicas: self.min_insync_replicas,
        }
    }
}

/// Where the relay sends rows appended without a topic (the outbox
/// contract), and where consumers resolve Herald's schemas: one set of
/// flags for `herald relay` and `herald serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct RouteArgs {
    /// Topic of events appended without one, by event type: `TYPE=TOPIC` or
    /// `PREFIX*=TOPIC` (repeatable; comma-separated in the variable). An
    /// exact rule wins, then the longest prefix, then --default-topic.
    #[arg(long = "route", env = "HERALD_ROUTES", value_delimiter = ',')]
    pub routes: Vec<String>,
    /// Topic of events appended without one that no --route matches;
    /// default: Herald's events topic.
    #[arg(long, env = "HERALD_DEFAULT_TOPIC")]
    pub default_topic: Option<String>,
    /// Absolute http(s) URL where consumers resolve Herald's schemas, e.g.
    /// `https://herald.example/schemas/` (`herald serve`'s `GET
    /// /schemas/{file}`): a record's `dataschema` is put under it instead
    /// of `herald:schemas/`.
    #[arg(long, env = "HERALD_DATASCHEMA_BASE")]
    pub dataschema_base: Option<String>,
}

impl RouteArgs {
    /// The routing table, unmatched rows going to `--default-topic` or else
    /// to `events_topic`.
    pub fn routes(&self, events_topic: &str) -> Result<herald_relay::Routes, crate::connection::BadConnection> {
        let default = self.default_topic.as_deref().unwrap_or(events_topic);
        herald_relay::Routes::parse(&self.routes, default).map_err(|e| crate::connection::BadConnection(format!("--route: {e}")))
    }

    /// `--dataschema-base` as the prefix of a `dataschema`: an absolute
    /// http(s) URL, with the `/` its files go after.
    pub fn dataschema_base(&self) -> Result<Option<String>, crate::connection::BadConnection> {
        let Some(base) = self.dataschema_base.as_deref() else { return Ok(None) };
        let bad = |reason: String| crate::connection::BadConnection(format!("--dataschema-base: {reason}"));
        let url = url::Url::parse(base).map_err(|e| bad(format!("`{base}` is not an absolute URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.query().is_some() || url.fragment().is_some() {
            return Err(bad(format!("`{base}` must be an http(s) URL without query or fragment")));
        }
        Ok(Some(if base.ends_with('/') { base.to_owned() } else { format!("{base}/") }))
    }
}

/// Creates Herald's topics and those `routes` name, laid out by `settings`.
pub async fn ensure_routed(
    kafka: &herald_kafka::KafkaConfig,
    herald: &herald_kafka::Topics,
    routes: &herald_relay::Routes,
    settings: TopicSettings,
) -> Result<(), herald_kafka::TopicError> {
    let routed = routes.topics();
    let mut all: Vec<&str> = herald.all().to_vec();
    all.extend(routed.iter().map(String::as_str).filter(|t| !herald.all().contains(t)));
    herald_kafka::ensure_topics(kafka, &all, settings).await
}

#[cfg(test)]
mod tests {
    use super::RouteArgs;

    #[test]
    fn a_schema_base_is_an_http_url_ending_in_a_slash() {
        let base = |b: &str| RouteArgs { dataschema_base: Some(b.to_owned()), ..RouteArgs::default() }.dataschema_base();
        assert_eq!(base("https://h.example/schemas").unwrap().as_deref(), Some("https://h.example/schemas/"));
        assert_eq!(base("http://h:8080/schemas/").unwrap().as_deref(), Some("http://h:8080/schemas/"));
        assert!(base("schemas/").is_err());
        assert!(base("ftp://h/schemas/").is_err());
        assert!(base("https://h/schemas/?v=1").is_err());
    }

    #[test]
    fn unmatched_rows_go_to_the_default_topic_or_the_events_topic() {
        let args = RouteArgs { routes: vec!["a.*=t-a".into()], ..RouteArgs::default() };
        assert_eq!(args.routes("p.export.events").unwrap().topic_for("b", ""), "p.export.events");
        let args = RouteArgs { default_topic: Some("other".into()), ..args };
        assert_eq!(args.routes("p.export.events").unwrap().topic_for("b", ""), "other");
        assert!(RouteArgs { routes: vec!["nonsense".into()], ..RouteArgs::default() }.routes("e").is_err());
    }
}
