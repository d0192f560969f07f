use super::*;

const V1: &str = r#"{"type":"record","name":"E","namespace":"t","fields":[
    {"name":"id","type":"string"},{"name":"size","type":"long"},{"name":"version","type":"long"}]}"#;

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect()
}

fn with_fields(extra: &str) -> String {
    format!(r#"{{"type":"record","name":"E","namespace":"t","fields":[{extra}]}}"#)
}

#[test]
fn added_field_with_default_is_full_compatible() {
    let v2 = with_fields(
        r#"{"name":"id","type":"string"},{"name":"size","type":"long"},{"name":"version","type":"long"},
           {"name":"note","type":"string","default":""}"#,
    );
    let report = check(&files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2)]), "[subjects]\ne = \"full-transitive\"").unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.subjects[0].versions, vec![1, 2]);
}

#[test]
fn removal_without_default_and_narrowing_are_both_named() {
    // `id` removed (v1 has no default for it), `size` narrowed long → int.
    let v2 = with_fields(r#"{"name":"size","type":"int"},{"name":"version","type":"long"}"#);
    let report = check(&files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2)]), "default = \"full\"").unwrap();
    let all = report.violations.join("\n");
    assert_eq!(report.violations.len(), 2, "{all}");
    assert!(all.contains("v2 readers cannot read v1 data: field `size` is \"long\" in v1 but \"int\" in v2"), "{all}");
    assert!(all.contains("v1 readers cannot read v2 data: v2 removes field `id`, which has no default in v1"), "{all}");
}

#[test]
fn the_mode_decides_which_direction_counts() {
    // Removing a field breaks old readers only: fine under backward.
    let v2 = with_fields(r#"{"name":"size","type":"long"},{"name":"version","type":"long"}"#);
    let set = files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2)]);
    assert!(check(&set, "").unwrap().violations.is_empty(), "default backward-transitive");
    assert_eq!(check(&set, "default = \"forward\"").unwrap().violations.len(), 1);
    // Adding a field without a default breaks new readers of old data.
    let v2 = with_fields(V1_FIELDS_PLUS_REQUIRED);
    let violations = check(&files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2)]), "").unwrap().violations;
    assert_eq!(violations, vec!["e (backward-transitive): v2 readers cannot read v1 data: v2 adds field `owner` without a default"]);
}

const V1_FIELDS_PLUS_REQUIRED: &str = r#"{"name":"id","type":"string"},{"name":"size","type":"long"},
    {"name":"version","type":"long"},{"name":"owner","type":"string"}"#;

#[test]
fn transitive_checks_every_predecessor_and_plain_only_the_last() {
    // v2 drops `size` (fine under backward); v3 brings it back without a
    // default, so v3 cannot read v2 data. v1 has `size`, so v3 reads v1.
    let v2 = with_fields(r#"{"name":"id","type":"string"},{"name":"version","type":"long"}"#);
    let v3 = with_fields(r#"{"name":"id","type":"string"},{"name":"size","type":"long"},{"name":"version","type":"long"}"#);
    let set = files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2), ("e.v3.avsc", &v3)]);
    let v = check(&set, "default = \"backward\"").unwrap().violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("v3 readers cannot read v2 data"), "{v:?}");
    // A v3 that narrows `size` breaks against v1 only: transitive sees it,
    // plain backward (v3 against v2) does not.
    let v3 = with_fields(r#"{"name":"id","type":"string"},{"name":"size","type":"int","default":0},{"name":"version","type":"long"}"#);
    let set = files(&[("e.v1.avsc", V1), ("e.v2.avsc", &v2), ("e.v3.avsc", &v3)]);
    assert!(check(&set, "default = \"backward\"").unwrap().violations.is_empty());
    let v = check(&set, "default = \"backward-transitive\"").unwrap().violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("v3 readers cannot read v1 data: field `size`"), "{v:?}");
}

#[test]
fn herald_rules_version_field_gaps_and_unknown_subjects() {
    let no_version = with_fields(r#"{"name":"id","type":"string"}"#);
    let set = files(&[("e.v1.avsc", &no_version), ("e.v3.avsc", V1)]);
    let v = check(&set, "versioned = [\"e*\"]\n[subjects]\nghost = \"full\"").unwrap().violations;
    let all = v.join("\n");
    assert!(all.contains("compatibility.toml names subject ghost"), "{all}");
    assert!(all.contains("e: v2 is missing"), "{all}");
    assert!(all.contains("e v1: has no field `version`"), "{all}");
    let unversioned = check(&set, "").unwrap().violations.join("\n");
    assert!(!unversioned.contains("has no field `version`"), "only subjects declared versioned need it: {unversioned}");
}

#[test]
fn bad_input_is_an_input_error_not_a_violation() {
    assert!(matches!(check(&files(&[("e.v1.avsc", "{not json")]), ""), Err(CheckInputError::Parse { .. })));
    assert!(matches!(check(&files(&[("e.v01.avsc", V1)]), ""), Err(CheckInputError::FileName(_))));
    assert!(matches!(check(&files(&[("e.avsc", V1)]), ""), Err(CheckInputError::FileName(_))));
    assert!(matches!(check(&[], "default = \"sideways\""), Err(CheckInputError::Compatibility(_))));
    assert!(matches!(check(&[], "defualt = \"full\""), Err(CheckInputError::Compatibility(_))));
}

#[test]
fn file_names_parse_to_subject_and_version() {
    assert_eq!(parse_file_name("export.completed.v12.avsc"), Some(("export.completed", 12)));
    assert_eq!(parse_file_name("export.completed.v0.avsc"), None);
    assert_eq!(parse_file_name(".v1.avsc"), None);
    assert_eq!(parse_file_name("x.v1a.avsc"), None);
}
