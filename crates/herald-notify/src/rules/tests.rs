use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn facts(attempts: i32) -> AttemptFacts {
    AttemptFacts { attempts, first_attempt_at_ms: 0, now_ms: 1_000, earlier_may_have_executed: false }
}

fn unknown() -> SendOutcome {
    SendOutcome::Unknown { reason: "timeout".into() }
}

fn answered(status: u16) -> SendOutcome {
    SendOutcome::Answered { status, retry_after: None, detail: "x".into() }
}

fn transition(verdict: Verdict) -> Transition {
    match verdict {
        Verdict::Record { transition, .. } => transition,
        Verdict::Untouched { reason } => panic!("untouched: {reason}"),
    }
}

fn status_after(outcome: SendOutcome, caps: &Capabilities) -> &'static str {
    transition(after_attempt(outcome, caps, &RetryPolicy::default(), facts(1))).status()
}

#[test]
fn every_status_has_its_class() {
    let table = [
        (200, StatusClass::Accepted),
        (204, StatusClass::Accepted),
        (409, StatusClass::Conflict),
        (429, StatusClass::RetryLater),
        (408, StatusClass::RetryLater),
        (425, StatusClass::RetryLater),
        (401, StatusClass::Credentials),
        (403, StatusClass::Credentials),
        (400, StatusClass::Refused),
        (404, StatusClass::Refused),
        (422, StatusClass::Refused),
        (500, StatusClass::ServerError),
        (502, StatusClass::ServerError),
        (504, StatusClass::ServerError),
        (302, StatusClass::Unrecognised),
        (101, StatusClass::Unrecognised),
    ];
    for (status, class) in table {
        assert_eq!(status_class(status), class, "{status}");
    }
}

#[test]
fn given_a_receipt_then_sent_and_nothing_else_is_sent() {
    let caps = Capabilities::keyed(HOUR);
    assert_eq!(status_after(SendOutcome::Accepted { receipt: "r".into() }, &caps), SENT);
    for outcome in [unknown(), SendOutcome::NotSent { reason: "refused".into() }, answered(200), answered(503)] {
        assert_ne!(status_after(outcome, &caps), SENT);
    }
}

#[test]
fn given_429_408_425_then_retry_not_before_retry_after() {
    let p = RetryPolicy::default();
    for status in [429, 408, 425] {
        for caps in [Capabilities::keyed(HOUR), Capabilities::unkeyed()] {
            let outcome = SendOutcome::Answered { status, retry_after: Some(Duration::from_secs(120)), detail: "slow down".into() };
            let t = transition(after_attempt(outcome, &caps, &p, facts(1)));
            assert_eq!(t, Transition::Retry { at_ms: 121_000, reason: format!("{status}: slow down") });
        }
        // Without Retry-After the backoff applies.
        assert!(matches!(
            transition(after_attempt(answered(status), &Capabilities::unkeyed(), &p, facts(1))),
            Transition::Retry { at_ms: 1_500, .. }
        ));
    }
}

#[test]
fn given_a_retry_later_after_an_unanswered_attempt_then_only_inside_retention() {
    let caps = Capabilities::keyed(Duration::from_secs(60));
    let earlier = AttemptFacts { earlier_may_have_executed: true, ..facts(2) };
    let soon = SendOutcome::Answered { status: 429, retry_after: Some(Duration::from_secs(10)), detail: String::new() };
    assert_eq!(transition(after_attempt(soon, &caps, &RetryPolicy::default(), earlier)).status(), PENDING);
    let late = SendOutcome::Answered { status: 429, retry_after: Some(Duration::from_secs(120)), detail: String::new() };
    assert_eq!(transition(after_attempt(late, &caps, &RetryPolicy::default(), earlier)).status(), UNKNOWN);
}

#[test]
fn given_401_or_403_then_the_intent_is_untouched() {
    for status in [401, 403] {
        for caps in [Capabilities::keyed(HOUR), Capabilities::unkeyed()] {
            let verdict = after_attempt(answered(status), &caps, &RetryPolicy::default(), facts(1));
            assert!(matches!(verdict, Verdict::Untouched { .. }), "{status}: {verdict:?}");
        }
    }
}

#[test]
fn given_another_4xx_then_failed_and_409_conflict() {
    for caps in [Capabilities::keyed(HOUR), Capabilities::unkeyed()] {
        for status in [400, 404, 410, 422] {
            assert_eq!(status_after(answered(status), &caps), FAILED, "{status}");
        }
        assert_eq!(status_after(answered(409), &caps), CONFLICT);
    }
}

#[test]
fn given_5xx_then_unknown_without_keys_retry_with_keys_or_when_declared_safe() {
    for status in [500, 502, 503, 504] {
        let unkeyed = after_attempt(answered(status), &Capabilities::unkeyed(), &RetryPolicy::default(), facts(1));
        assert_eq!(unkeyed, Verdict::Record { transition: transition(unkeyed.clone()), may_have_executed: true });
        assert_eq!(transition(unkeyed).status(), UNKNOWN, "{status}: may have executed, no resend");
        let keyed = after_attempt(answered(status), &Capabilities::keyed(HOUR), &RetryPolicy::default(), facts(1));
        assert!(matches!(keyed, Verdict::Record { transition: Transition::Retry { .. }, may_have_executed: true }), "{keyed:?}");
        let safe = Capabilities { server_errors_safe: true, ..Capabilities::unkeyed() };
        let declared = after_attempt(answered(status), &safe, &RetryPolicy::default(), facts(1));
        assert!(matches!(declared, Verdict::Record { transition: Transition::Retry { .. }, may_have_executed: false }), "{declared:?}");
    }
}

#[test]
fn given_a_keyed_provider_when_the_answer_is_lost_then_retry_inside_retention_only() {
    let long = Capabilities::keyed(HOUR);
    assert_eq!(status_after(unknown(), &long), PENDING);
    let short = Capabilities::keyed(Duration::from_millis(1_200));
    assert_eq!(status_after(unknown(), &short), UNKNOWN, "retry would land past retention");
}

#[test]
fn given_an_unkeyed_provider_when_the_answer_is_lost_then_never_resend() {
    assert_eq!(status_after(unknown(), &Capabilities::unkeyed()), UNKNOWN);
}

#[test]
fn given_the_provider_keeps_refusing_then_dead_after_the_budget() {
    let p = RetryPolicy { max_attempts: 3, ..RetryPolicy::default() };
    let caps = Capabilities::unkeyed();
    let refused = || SendOutcome::NotSent { reason: "refused".into() };
    assert!(matches!(transition(after_attempt(refused(), &caps, &p, facts(2))), Transition::Retry { at_ms: 2_000, .. }));
    assert_eq!(transition(after_attempt(refused(), &caps, &p, facts(3))).status(), DEAD);
}

#[test]
fn before_a_call_an_unanswered_earlier_attempt_is_resent_only_to_a_key_it_still_remembers() {
    let p = RetryPolicy::default();
    let clean = facts(1);
    assert_eq!(before_call(&Capabilities::unkeyed(), &p, clean), None, "nothing may have executed yet");
    let earlier = AttemptFacts { earlier_may_have_executed: true, ..clean };
    assert_eq!(before_call(&Capabilities::unkeyed(), &p, earlier).map(|t| t.status()), Some(UNKNOWN));
    assert_eq!(before_call(&Capabilities::keyed(HOUR), &p, earlier), None);
    let expired = AttemptFacts { now_ms: 3_600_000, ..earlier };
    assert_eq!(before_call(&Capabilities::keyed(HOUR), &p, expired).map(|t| t.status()), Some(UNKNOWN));
}

#[test]
fn a_not_found_requeues_only_inside_retention() {
    let caps = Capabilities::keyed(Duration::from_secs(60));
    assert_eq!(after_query(KeyStatus::NotFound, &caps, Some(0), 59_999), QueryVerdict::Requeue);
    assert!(matches!(after_query(KeyStatus::NotFound, &caps, Some(0), 60_000), QueryVerdict::PastRetention { .. }));
    assert!(matches!(after_query(KeyStatus::NotFound, &caps, None, 1), QueryVerdict::StaysUnknown { .. }));
    assert!(matches!(after_query(KeyStatus::NotFound, &Capabilities::unkeyed(), Some(0), 1), QueryVerdict::StaysUnknown { .. }));
    let found = after_query(KeyStatus::Accepted { receipt: "r".into() }, &caps, Some(0), 10_000_000);
    assert_eq!(found, QueryVerdict::Sent { receipt: "r".into() }, "a receipt is evidence at any age");
}
