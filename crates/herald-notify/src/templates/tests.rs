use serde_json::json;

use super::*;

fn completed_view() -> Value {
    let data =
        json!({"job_id": "job-1", "caller": "alice", "format": "csv", "query": "q", "result_id": "r", "size_bytes": 42, "version": 2});
    view("e-1", "/herald/exports", "herald.export.completed", Some("job-1"), None, data, json!({}))
}

#[test]
fn the_built_in_rule_renders_what_the_export_domain_always_sent() {
    let rendered = NotifyRules::exports().render("herald.export.completed", &completed_view()).unwrap().unwrap();
    assert_eq!(rendered.kind, "export.completed");
    assert_eq!(rendered.recipient, "alice");
    assert_eq!(rendered.reference, "job-1");
    // The body the hard-coded handler wrote, byte for byte (keys sorted, size a number).
    let before = json!({"job_id": "job-1", "format": "csv", "query": "q", "result_id": "r", "size_bytes": 42});
    assert_eq!(rendered.body.to_string(), before.to_string());
    assert_eq!(NotifyRules::exports().render("herald.export.failed", &completed_view()).unwrap(), None);
}

const SHOP: &str = r#"
[[notify]]
type = "shop.order.shipped"
kind = "order.shipped"
recipient = "{data.customer}"
[notify.body]
order_id = "{data.order_id}"
text = "Order {data.order_id} ({data.items} items) has shipped to {ext.region}"

[[notify]]
type = "shop.*"
kind = "shop.other"
recipient = "ops@{source}"
"#;

#[test]
fn rules_from_a_file_match_exact_then_prefix_and_render_text_and_values() {
    let rules = NotifyRules::parse(SHOP).unwrap();
    let data = json!({"order_id": "o-7", "customer": "bob", "items": 3});
    let shipped = view("e-2", "/shop/orders", "shop.order.shipped", Some("o-7"), None, data, json!({"region": "eu"}));
    let rendered = rules.render("shop.order.shipped", &shipped).unwrap().unwrap();
    assert_eq!((rendered.kind.as_str(), rendered.recipient.as_str(), rendered.reference.as_str()), ("order.shipped", "bob", "o-7"));
    assert_eq!(rendered.body, json!({"order_id": "o-7", "text": "Order o-7 (3 items) has shipped to eu"}));
    let other = rules.render("shop.refund", &shipped).unwrap().unwrap();
    assert_eq!((other.kind.as_str(), other.recipient.as_str()), ("shop.other", "ops@/shop/orders"));
    assert!(!rules.handles("herald.export.completed"), "a file replaces the built-in rules");
}

#[test]
fn an_event_without_a_named_field_is_a_render_error_naming_it() {
    let rules = NotifyRules::parse(SHOP).unwrap();
    let missing = view("e-3", "/shop/orders", "shop.order.shipped", None, None, json!({"order_id": "o-8"}), json!({"region": "eu"}));
    let err = rules.render("shop.order.shipped", &missing).unwrap_err();
    assert!(err.reason.contains("data.customer"), "{err}");
}

#[test]
fn a_bad_file_is_refused_naming_the_rule() {
    assert!(matches!(NotifyRules::parse("[[notify]]\ntype = 1"), Err(RulesError::Syntax(_))));
    let unknown_root = "[[notify]]\ntype = \"a\"\nkind = \"k\"\nrecipient = \"{payload.to}\"";
    let err = NotifyRules::parse(unknown_root).unwrap_err();
    assert!(matches!(&err, RulesError::Rule { rule: 1, reason } if reason.contains("payload.to")), "{err}");
    let unclosed = "[[notify]]\ntype = \"a\"\nkind = \"k\"\nrecipient = \"{data.to\"";
    assert!(NotifyRules::parse(unclosed).unwrap_err().to_string().contains("unclosed"));
    assert!(NotifyRules::parse("[[notify]]\ntype = \"a\"\nkind = \"k\"\nrecipient = \"x\"\ncolour = 1").is_err());
}
