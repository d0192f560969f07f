//! Which topic a row goes to. A row that names its topic (Herald's own
//! domain, or an application that passes one) goes there; a row appended
//! with an empty topic through the outbox contract is routed by event type:
//! an exact rule first, then the longest matching prefix rule (`orders.*`),
//! then the default topic. Pure: the relay asks, nothing here does IO.

use herald_envelope::pattern::{NamePattern, PatternMap};
use thiserror::Error;

/// A routing rule that cannot be used: fix the configuration (exit 2).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("route `{0}`: expected EVENT_TYPE=TOPIC or PREFIX*=TOPIC")]
    Shape(String),
    #[error("route `{rule}`: `{topic}` is not a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)")]
    Topic { rule: String, topic: String },
    #[error("route `{0}`: its event type (or prefix) already has a route")]
    Twice(String),
}

/// The routing table of one relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    by_type: PatternMap<String>,
    default: String,
}

impl Routes {
    /// No rules: every unnamed row goes to `default`.
    pub fn to(default: &str) -> Routes {
        Routes { by_type: PatternMap::default(), default: default.to_owned() }
    }

    /// Rules as `--route` gives them (`type=topic`, `prefix*=topic`).
    pub fn parse(rules: &[String], default: &str) -> Result<Routes, RouteError> {
        let mut routes = Routes::to(default);
        if !is_topic_name(default) {
            return Err(RouteError::Topic { rule: format!("default={default}"), topic: default.to_owned() });
        }
        for rule in rules {
            let (pattern, topic) = rule.split_once('=').ok_or_else(|| RouteError::Shape(rule.clone()))?;
            let pattern = NamePattern::parse(pattern).map_err(|_| RouteError::Shape(rule.clone()))?;
            let topic = topic.trim();
            if !is_topic_name(topic) {
                return Err(RouteError::Topic { rule: rule.clone(), topic: topic.to_owned() });
            }
            routes.by_type.insert(pattern, topic.to_owned()).map_err(|_| RouteError::Twice(rule.clone()))?;
        }
        Ok(routes)
    }

    /// The topic of a row of `event_type` whose own topic is `named`.
    pub fn topic_for<'a>(&'a self, event_type: &str, named: &'a str) -> &'a str {
        if !named.is_empty() {
            return named;
        }
        self.by_type.get(event_type).unwrap_or(&self.default)
    }

    /// Every topic a rule or the default names (for creating them).
    pub fn topics(&self) -> Vec<String> {
        let mut all: Vec<String> = self.by_type.values().cloned().collect();
        all.push(self.default.clone());
        all.sort();
        all.dedup();
        all
    }
}

fn is_topic_name(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        let rules = ["orders.placed=orders-placed", "orders.*=orders", "orders.refund.*=refunds", "billing.*=billing"];
        Routes::parse(&rules.map(str::to_owned), "events").unwrap()
    }

    #[test]
    fn exact_then_longest_prefix_then_default() {
        let routes = routes();
        assert_eq!(routes.topic_for("orders.placed", ""), "orders-placed");
        assert_eq!(routes.topic_for("orders.refund.issued", ""), "refunds");
        assert_eq!(routes.topic_for("orders.shipped", ""), "orders");
        assert_eq!(routes.topic_for("billing.invoice", ""), "billing");
        assert_eq!(routes.topic_for("users.created", ""), "events");
    }

    #[test]
    fn a_row_that_names_its_topic_keeps_it() {
        assert_eq!(routes().topic_for("orders.placed", "export.events"), "export.events");
    }

    #[test]
    fn bad_rules_are_named() {
        let parse = |rule: &str| Routes::parse(&[rule.to_owned()], "events").unwrap_err();
        assert_eq!(parse("orders.placed"), RouteError::Shape("orders.placed".into()));
        assert_eq!(parse("*=all"), RouteError::Shape("*=all".into()));
        assert!(matches!(parse("orders.*=bad topic"), RouteError::Topic { .. }));
        let twice = Routes::parse(&["a=x".to_owned(), "a=y".to_owned()], "events").unwrap_err();
        assert_eq!(twice, RouteError::Twice("a=y".into()));
        assert!(matches!(Routes::parse(&[], "no/slash").unwrap_err(), RouteError::Topic { .. }));
    }

    #[test]
    fn topics_lists_each_once() {
        assert_eq!(routes().topics(), ["billing", "events", "orders", "orders-placed", "refunds"]);
    }
}
