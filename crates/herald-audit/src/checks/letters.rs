//! Dead letters: a record a subscription set aside is either still parked —
//! holding its record, applied from nowhere — or was redriven once, its fact
//! applied exactly once in the subscription's inbox, or was discarded by an
//! operator and, like a parked one, applied from nowhere. ("Parked" here is
//! a letter still `dead`; the records parked *behind* a letter under
//! per-key order live in `parked_records` and are not dead letters.)

use std::collections::HashMap;

use super::canonical;
use crate::model::{COMPLETION_SUBSCRIPTIONS, DeadLetter, Horizons, InboxRow, Kind};
use crate::report::{CheckReport, Violation};

pub const DEAD_LETTERS_SETTLED: &str = "dead_letters_settled";
const INVARIANT: &str = "12: each dead letter still parked, or redriven and applied once, or discarded and never applied";

/// Letter states (`herald_store::dead_letter`).
const DEAD: &str = "dead";
const REDRIVEN: &str = "redriven";
const DISCARDED: &str = "discarded";

/// Where a record was read: (subscription, topic, partition, offset).
type Position<'a> = (&'a str, &'a str, i32, i64);

/// Every inbox row is looked up among the parked letters' positions: a redrive
/// applies a letter with the letter's own position, so a row there while the
/// letter still says `dead` is an effect applied behind the letter's back
/// (a redrive that did not mark it, or a mark undone). Every redriven letter
/// with an identity has exactly one inbox row for its fact.
pub fn dead_letters_settled(letters: &[DeadLetter], inbox: &[InboxRow], horizons: &Horizons) -> CheckReport {
    let mut below = 0;
    let unapplied: HashMap<Position<'_>, (i64, &str)> = letters
        .iter()
        .filter(|l| l.status == DEAD || l.status == DISCARDED)
        .map(|l| ((l.subscription.as_str(), l.topic.as_str(), l.partition, l.offset), (l.id, l.status.as_str())))
        .collect();
    let mut facts: HashMap<(&str, &str, &str), usize> = HashMap::new();
    let mut violations = Vec::new();
    for row in inbox {
        *facts.entry((row.subscription.as_str(), canonical(&row.source), row.event_id.as_str())).or_default() += 1;
        if let Some((id, status)) = unapplied.get(&(row.subscription.as_str(), row.topic.as_str(), row.partition, row.offset)) {
            let (kind, state) = if *status == DEAD { ("parked_but_applied", "parked") } else { ("discarded_but_applied", "discarded") };
            violations.push(Violation::new(
                kind,
                format!(
                    "dead letter {id} ({}) is {state}, yet {} {} was applied from its record {}/{}@{}",
                    row.subscription, row.source, row.event_id, row.topic, row.partition, row.offset
                ),
            ));
        }
    }
    for letter in letters {
        match letter.status.as_str() {
            DEAD if !letter.holds_record => violations.push(Violation::new(
                "parked_without_record",
                format!("dead letter {} ({}) keeps neither value nor headers: nothing left to redrive", letter.id, letter.subscription),
            )),
            DEAD | DISCARDED => {}
            // Its inbox row was written by the redrive, after the letter:
            // a letter from before the horizon may have lost it to a prune.
            REDRIVEN if horizons.below(Kind::Inbox, letter.created_at_ms) => below += 1,
            REDRIVEN => violations.extend(redriven_once(letter, &facts)),
            other => violations
                .push(Violation::new("unknown_letter_status", format!("dead letter {} ({}) is `{other}`", letter.id, letter.subscription))),
        }
    }
    let note = (!letters.is_empty()).then(|| {
        let mut note =
            "export-workers letters are checked for their state only; a redriven command's single completion is job_completion's"
                .to_owned();
        if let Some(below) = super::below_note(below, Kind::Inbox) {
            note = format!("{note}; {below}");
        }
        note
    });
    CheckReport::new(DEAD_LETTERS_SETTLED, INVARIANT, letters.len() + inbox.len(), violations).with_note(note)
}

/// A redriven letter of an inbox subscription: its fact has one inbox row.
/// Letters without an identity never decoded; what their redrive did leaves
/// no fact to count, and the export workers keep no inbox.
fn redriven_once(letter: &DeadLetter, facts: &HashMap<(&str, &str, &str), usize>) -> Option<Violation> {
    if !COMPLETION_SUBSCRIPTIONS.contains(&letter.subscription.as_str()) {
        return None;
    }
    let (Some(source), Some(id)) = (&letter.source, &letter.event_id) else { return None };
    let what = |n: usize| format!("dead letter {} ({}) was redriven; {n} inbox row(s) for {source} {id}", letter.id, letter.subscription);
    match facts.get(&(letter.subscription.as_str(), canonical(source), id.as_str())).copied().unwrap_or(0) {
        1 => None,
        0 => Some(Violation::new("redriven_not_applied", what(0))),
        n => Some(Violation::new("applied_twice", what(n))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_letters_settled(letters: &[DeadLetter], inbox: &[InboxRow]) -> CheckReport {
        super::dead_letters_settled(letters, inbox, &Horizons::default())
    }

    fn letter(id: i64, offset: i64, status: &str, event: Option<&str>) -> DeadLetter {
        DeadLetter {
            id,
            subscription: "search".into(),
            source: event.map(|_| "/herald/exports".to_owned()),
            event_id: event.map(str::to_owned),
            topic: "events".into(),
            partition: 0,
            offset,
            status: status.into(),
            holds_record: true,
            created_at_ms: 0,
        }
    }

    fn applied(source: &str, event: &str, offset: i64) -> InboxRow {
        InboxRow {
            subscription: "search".into(),
            source: source.into(),
            event_id: event.into(),
            topic: "events".into(),
            partition: 0,
            offset,
        }
    }

    #[test]
    fn parked_and_redriven_once_are_settled() {
        let letters = [letter(1, 5, DEAD, None), letter(2, 6, REDRIVEN, Some("e6")), letter(3, 7, REDRIVEN, None)];
        // e6 applied by its redrive, at the letter's position; e1 applied live.
        let inbox = [applied("/herald/exports", "e6", 6), applied("/herald/exports", "e1", 1)];
        let report = dead_letters_settled(&letters, &inbox);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.checked, 5);
        assert!(dead_letters_settled(&[], &inbox).violations.is_empty());
    }

    #[test]
    fn a_parked_letter_applied_from_its_position_is_named() {
        let letters = [letter(2, 6, DEAD, Some("e6"))];
        let report = dead_letters_settled(&letters, &[applied("/herald/exports", "e6", 6)]);
        assert_eq!(report.count("parked_but_applied"), 1);
        assert!(report.violations[0].detail.starts_with("dead letter 2 (search) is parked"), "{:?}", report.violations);
        // The same fact applied from another record (another envelope) is not the letter's doing.
        assert!(dead_letters_settled(&letters, &[applied("/herald/exports", "e6", 9)]).violations.is_empty());
    }

    #[test]
    fn a_discarded_letter_is_settled_unless_applied_from_its_position() {
        let letters = [letter(2, 6, DISCARDED, Some("e6"))];
        assert!(dead_letters_settled(&letters, &[]).violations.is_empty());
        let report = dead_letters_settled(&letters, &[applied("/herald/exports", "e6", 6)]);
        assert_eq!(report.count("discarded_but_applied"), 1, "{:?}", report.violations);
    }

    #[test]
    fn a_redriven_letter_applied_never_or_twice_is_named() {
        let letters = [letter(2, 6, REDRIVEN, Some("e6"))];
        assert_eq!(dead_letters_settled(&letters, &[]).count("redriven_not_applied"), 1);
        let twice = [applied("/herald/exports", "e6", 6), applied("urn:herald:exports", "e6", 9)];
        assert_eq!(dead_letters_settled(&letters, &twice).count("applied_twice"), 1);
        // The export workers keep no inbox: nothing to count for their letters.
        let worker = DeadLetter { subscription: "export-workers".into(), ..letters[0].clone() };
        assert!(dead_letters_settled(&[worker], &[]).violations.is_empty());
    }

    #[test]
    fn a_letter_with_nothing_to_redrive_or_an_unknown_state_is_named() {
        let emptied = DeadLetter { holds_record: false, ..letter(1, 5, DEAD, None) };
        let report = dead_letters_settled(&[emptied, letter(2, 6, "gone", None)], &[]);
        assert_eq!(report.count("parked_without_record"), 1);
        assert_eq!(report.count("unknown_letter_status"), 1);
    }
}
