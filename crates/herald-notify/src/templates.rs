//! Which events create notification intents, for whom, with which body:
//! configuration, not code. A rules file (`--notify-rules FILE`) lists, per
//! event type (exact, or a prefix ending in `*`), the intent's kind, its
//! recipient and its body as templates over the event:
//!
//! ```toml
//! [[notify]]
//! type = "shop.order.shipped"
//! kind = "order.shipped"
//! recipient = "{data.customer}"
//! reference = "{data.order_id}"          # optional, default "{subject}"
//! [notify.body]
//! order_id = "{data.order_id}"
//! text = "Your order {data.order_id} has shipped"
//! ```
//!
//! A placeholder names a field of the event's view: `id`, `source`, `type`,
//! `subject`, `time`, `data.<path>` (the data as JSON, Avro converted),
//! `ext.<name>`. A body value that is one placeholder keeps the field's JSON
//! type; anything else renders as text. Without a file the rules are
//! Herald's own example, [`NotifyRules::exports`]: the export's caller is
//! told it completed.
//!
//! Not a template engine (no loops, no conditions, no escaping modes): a
//! notification body is a handful of named values the provider formats, and
//! a placeholder substitution over a JSON view is all the rules need, with
//! every placeholder checked when the file is loaded.

use std::collections::BTreeMap;

use herald_envelope::pattern::{NamePattern, PatternMap};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

/// A rules file that cannot be used: fix it (the command exits 2).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RulesError {
    #[error("notify rules: {0}")]
    Syntax(String),
    #[error("notify rules, rule {rule}: {reason}")]
    Rule { rule: usize, reason: String },
}

/// What an event cannot be rendered into: permanent for that event (its
/// record is dead-lettered naming the field).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("notify rule for {event_type}: {reason}")]
pub struct RenderError {
    pub event_type: String,
    pub reason: String,
}

/// One intent as the rules render it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub kind: String,
    pub recipient: String,
    /// Shown beside the intent (`job_id` for Herald's exports).
    pub reference: String,
    pub body: Value,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    kind: String,
    recipient: Template,
    reference: Template,
    body: BTreeMap<String, Template>,
}

/// The rules of one process.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifyRules {
    by_type: PatternMap<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    notify: Vec<RuleText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    #[serde(rename = "type")]
    event_type: String,
    kind: String,
    recipient: String,
    reference: Option<String>,
    #[serde(default)]
    body: BTreeMap<String, String>,
}

impl NotifyRules {
    /// Herald's own example: a completed export tells its caller.
    pub fn exports() -> NotifyRules {
        let text = r#"
            [[notify]]
            type = "herald.export.completed"
            kind = "export.completed"
            recipient = "{data.caller}"
            reference = "{data.job_id}"
            [notify.body]
            job_id = "{data.job_id}"
            format = "{data.format}"
            query = "{data.query}"
            result_id = "{data.result_id}"
            size_bytes = "{data.size_bytes}"
        "#;
        NotifyRules::parse(text).expect("the built-in rules parse")
    }

    pub fn parse(text: &str) -> Result<NotifyRules, RulesError> {
        let file: File = toml::from_str(text).map_err(|e| RulesError::Syntax(e.to_string()))?;
        let mut by_type = PatternMap::default();
        for (i, r) in file.notify.into_iter().enumerate() {
            let bad = |reason: String| RulesError::Rule { rule: i + 1, reason };
            let pattern = NamePattern::parse(&r.event_type).map_err(|reason| bad(format!("`type`: {reason}")))?;
            if r.kind.is_empty() {
                return Err(bad("`kind` must not be empty".to_owned()));
            }
            let body = r.body.iter().map(|(k, v)| Ok((k.clone(), template(v).map_err(&bad)?))).collect::<Result<_, RulesError>>()?;
            let rule = Rule {
                kind: r.kind,
                recipient: template(&r.recipient).map_err(&bad)?,
                reference: template(r.reference.as_deref().unwrap_or("{subject}")).map_err(&bad)?,
                body,
            };
            by_type.insert(pattern, rule).map_err(|_| bad(format!("`type` {} has a rule already", r.event_type)))?;
        }
        Ok(NotifyRules { by_type })
    }

    /// Whether any rule takes `event_type`.
    pub fn handles(&self, event_type: &str) -> bool {
        self.by_type.get(event_type).is_some()
    }

    /// The intent `view` (see [`view`]) of an event of `event_type` creates;
    /// `None` when no rule takes it.
    pub fn render(&self, event_type: &str, view: &Value) -> Result<Option<Rendered>, RenderError> {
        let Some(rule) = self.by_type.get(event_type) else { return Ok(None) };
        let bad = |reason: String| RenderError { event_type: event_type.to_owned(), reason };
        let recipient = rule.recipient.text(view).map_err(bad)?;
        if recipient.is_empty() {
            return Err(bad("the recipient renders empty".to_owned()));
        }
        let reference = rule.reference.text(view).map_err(bad)?;
        let body = rule.body.iter().map(|(k, t)| Ok((k.clone(), t.value(view).map_err(bad)?))).collect::<Result<_, RenderError>>()?;
        Ok(Some(Rendered { kind: rule.kind.clone(), recipient, reference, body: Value::Object(body) }))
    }
}

/// The event as the templates see it.
pub fn view(id: &str, source: &str, event_type: &str, subject: Option<&str>, time: Option<String>, data: Value, ext: Value) -> Value {
    serde_json::json!({
        "id": id, "source": source, "type": event_type, "subject": subject.unwrap_or_default(),
        "time": time.unwrap_or_default(), "data": data, "ext": ext,
    })
}

const ROOTS: [&str; 7] = ["id", "source", "type", "subject", "time", "data", "ext"];

fn template(text: &str) -> Result<Template, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_owned()));
        }
        let close = rest[open..].find('}').ok_or_else(|| format!("unclosed `{{` in `{text}`"))? + open;
        let path: Vec<String> = rest[open + 1..close].split('.').map(|s| s.trim().to_owned()).collect();
        if path.iter().any(String::is_empty) || !ROOTS.contains(&path[0].as_str()) {
            return Err(format!("`{{{}}}` in `{text}`: a placeholder names one of {}", &rest[open + 1..close], ROOTS.join(", ")));
        }
        parts.push(Part::Field(path));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_owned()));
    }
    Ok(Template(parts))
}

impl Template {
    fn field<'v>(path: &[String], view: &'v Value) -> Result<&'v Value, String> {
        path.iter().try_fold(view, |at, key| at.get(key).ok_or_else(|| format!("the event has no `{}`", path.join("."))))
    }

    /// One placeholder alone keeps its JSON type; anything else is text.
    fn value(&self, view: &Value) -> Result<Value, String> {
        match &self.0[..] {
            [Part::Field(path)] => Ok(Self::field(path, view)?.clone()),
            _ => Ok(Value::String(self.text(view)?)),
        }
    }

    fn text(&self, view: &Value) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.0 {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(path) => match Self::field(path, view)? {
                    Value::String(s) => out.push_str(s),
                    Value::Null => return Err(format!("`{}` is null", path.join("."))),
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
