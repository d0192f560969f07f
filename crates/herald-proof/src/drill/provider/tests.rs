use super::*;

fn provider(mode: ProviderMode, duplicates: i64, ambiguous_calls: i64) -> ProviderReport {
    ProviderReport { mode, requests: 100, effects: 90, duplicates, ambiguous_calls, ambiguous_by_kind: BTreeMap::new() }
}

fn intents(unanswered: i64, interrupted: i64) -> IntentReport {
    IntentReport { total: 90, unknown_unanswered: unanswered, unknown_interrupted: interrupted, ..IntentReport::default() }
}

fn unseen(n: i64) -> IntentReport {
    IntentReport { unknown_unseen: n, ..intents(0, 0) }
}

fn deaths(dispatchers: u64, providers: u64) -> Deaths {
    Deaths { dispatchers, providers }
}

fn unmet(targets: &[Target]) -> Vec<&'static str> {
    targets.iter().filter(|t| !t.met).map(|t| t.name).collect()
}

#[test]
fn keyed_modes_allow_no_unknown_and_no_duplicate() {
    assert!(unmet(&targets(&provider(ProviderMode::Keyed, 0, 0), &intents(0, 0), deaths(5, 0))).is_empty());
    assert_eq!(unmet(&targets(&provider(ProviderMode::Keyed, 0, 4), &intents(0, 1), deaths(5, 0))), ["no unknown after the drain"]);
    assert_eq!(unmet(&targets(&provider(ProviderMode::SlowKeyed, 1, 4), &intents(0, 0), deaths(5, 0))), ["no duplicate effect"]);
}

#[test]
fn unkeyed_modes_bound_unknown_by_what_was_ambiguous() {
    let slow = provider(ProviderMode::SlowUnkeyed, 0, 7);
    assert!(unmet(&targets(&slow, &intents(7, 2), deaths(2, 0))).is_empty(), "as many unknown as ambiguous calls and interrupted calls");
    assert_eq!(
        unmet(&targets(&slow, &intents(8, 0), deaths(2, 0))),
        ["unknown only after an ambiguous call"],
        "marking more unknown is not a pass"
    );
    assert_eq!(unmet(&targets(&slow, &intents(0, 3), deaths(2, 0))), ["unknown only after an interrupted call"]);
    assert_eq!(
        unmet(&targets(&provider(ProviderMode::Unkeyed, 0, 0), &intents(1, 0), deaths(0, 0))),
        ["unknown only after an ambiguous call"]
    );
}

#[test]
fn unknown_under_a_key_the_provider_never_saw_is_bounded_by_its_deaths() {
    let unkeyed = provider(ProviderMode::Unkeyed, 0, 0);
    let most = i64::try_from(2 * DISPATCHERS).expect("small");
    assert!(unmet(&targets(&unkeyed, &unseen(most), deaths(0, 2))).is_empty(), "one call in flight per dispatcher at each death");
    assert_eq!(
        unmet(&targets(&unkeyed, &unseen(most + 1), deaths(0, 2))),
        ["unknown only after a call the provider never saw because it died"]
    );
    assert_eq!(
        unmet(&targets(&unkeyed, &unseen(1), deaths(5, 0))),
        ["unknown only after a call the provider never saw because it died"],
        "dispatcher deaths do not count"
    );
    assert_eq!(unseen(1).unknown(), 1);
    assert_eq!(unmet(&targets(&provider(ProviderMode::Keyed, 0, 0), &unseen(1), deaths(0, 3))), ["no unknown after the drain"]);
}

#[test]
fn a_slow_run_without_an_ambiguous_call_proves_nothing() {
    assert_eq!(unmet(&targets(&provider(ProviderMode::SlowKeyed, 0, 0), &intents(0, 0), deaths(0, 0))), ["the provider was ambiguous"]);
    assert!(unmet(&targets(&provider(ProviderMode::Keyed, 0, 0), &intents(0, 0), deaths(0, 0))).is_empty(), "prompt modes need none");
}

#[test]
fn reasons_are_grouped_without_their_particulars() {
    assert_eq!(
        reason_class(
            "no answer within the call timeout (1s); the provider does not honour keys, so it is never resent without an operator"
        ),
        "no answer within the call timeout; the provider does not honour keys, so it is never resent without an operator"
    );
    assert_eq!(
        reason_class("no answer: error sending request for url (http://127.0.0.1:1/v1/notifications): connection closed"),
        "no answer: the connection ended"
    );
    let interrupted = format!("{EARLIER_ATTEMPT}; the provider does not honour keys");
    assert_eq!(reason_class(&interrupted), interrupted);
}

#[test]
fn modes_declare_only_what_the_provider_does() {
    let unkeyed = ProviderMode::SlowUnkeyed.dispatch_args("http://p");
    assert!(unkeyed.windows(2).any(|w| w == ["--notify-idempotent", "false"]), "{unkeyed:?}");
    assert!(ProviderMode::SlowUnkeyed.sim_args().windows(2).any(|w| w == ["--slow-around", "1s"]));
    assert_eq!(ProviderMode::Keyed.sim_args(), ["--mode", "keyed"]);
    assert!(ProviderMode::Keyed.dispatch_args("http://p").windows(2).any(|w| w == ["--notify-idempotent", "true"]));
}
