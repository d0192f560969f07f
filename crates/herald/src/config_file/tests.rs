use super::*;

/// A small command tree shaped like herald's: globals, a role, a command
/// with subcommands, a switch, a list, an action flag.
fn cli() -> Command {
    Command::new("herald")
        .arg(Arg::new("config").long("config").global(true).value_parser(clap::value_parser!(PathBuf)))
        .arg(Arg::new("database").long("database").global(true).env("HERALD_TEST_CONFIG_FILE_UNSET_DB").hide_env_values(true))
        .subcommand(
            Command::new("relay")
                .arg(Arg::new("lease-ms").long("lease-ms").default_value("30000").value_parser(clap::value_parser!(u64)))
                .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
                .arg(Arg::new("topic").long("topic").action(ArgAction::Append)),
        )
        .subcommand(
            Command::new("inbox").subcommand(
                Command::new("cleanup")
                    .arg(Arg::new("older-than-days").long("older-than-days").value_parser(clap::value_parser!(u64)))
                    .arg(Arg::new("force").long("force").action(ArgAction::SetTrue)),
            ),
        )
}

fn file(text: &str) -> ConfigFile {
    ConfigFile::parse(Path::new("herald.toml"), text).expect("valid TOML")
}

fn argv(words: &[&str]) -> Vec<OsString> {
    std::iter::once("herald").chain(words.iter().copied()).map(OsString::from).collect()
}

/// (value, source) of `long` when `words` run with `text` as the file.
fn effective(text: &str, words: &[&str], long: &str) -> (Option<String>, Source) {
    let (cli, file) = (cli(), file(text));
    let resolved = resolve(&cli, argv(words), &file).expect("resolves");
    let matches = parse(&cli, &resolved, Some(&file)).expect("parses");
    let found = sources(&cli, &matches, &resolved).into_iter().find(|s| s.key == long).expect("the setting is listed");
    (found.values.map(|v| v.join(",")), found.source)
}

#[test]
fn a_flag_beats_the_file_and_the_file_beats_the_default() {
    let text = "lease-ms = 500";
    assert_eq!(effective(text, &["relay"], "lease-ms"), (Some("500".into()), Source::File));
    assert_eq!(effective(text, &["relay", "--lease-ms", "7"], "lease-ms"), (Some("7".into()), Source::Flag));
    assert_eq!(effective("", &["relay"], "lease-ms"), (Some("30000".into()), Source::Default));
}

#[test]
fn a_command_table_wins_over_the_top_level_and_applies_only_to_its_command() {
    let text = "database = \"postgres://top/db\"\n[inbox.cleanup]\ndatabase = \"postgres://inbox/db\"\nolder-than-days = 9\n";
    assert_eq!(effective(text, &["inbox", "cleanup"], "database").0.as_deref(), Some("postgres://inbox/db"));
    assert_eq!(effective(text, &["inbox", "cleanup"], "older-than-days"), (Some("9".into()), Source::File));
    assert_eq!(effective(text, &["relay"], "database").0.as_deref(), Some("postgres://top/db"));
}

#[test]
fn switches_and_lists_take_toml_booleans_and_arrays() {
    assert_eq!(effective("json = true", &["relay"], "json").1, Source::File);
    assert_eq!(effective("json = false", &["relay"], "json"), (Some("false".into()), Source::File));
    assert_eq!(effective("topic = [\"a\", \"b\"]", &["relay"], "topic").0.as_deref(), Some("a,b"));
    let err = resolve(&cli(), argv(&["relay"]), &file("json = \"yes\"")).expect_err("a switch takes a boolean");
    assert!(err.to_string().contains("`json`"), "{err}");
}

#[test]
fn unknown_keys_action_flags_and_unknown_tables_are_refused_by_name() {
    for (text, key) in
        [("lease-msec = 1", "lease-msec"), ("[relay]\nolder-than-days = 1", "older-than-days"), ("[relays]\nx = 1", "relays")]
    {
        let err = resolve(&cli(), argv(&["relay"]), &file(text)).expect_err("refused");
        assert!(matches!(&err, ConfigError::UnknownKey { key: k, .. } if k == key), "{text}: {err}");
    }
    let err = resolve(&cli(), argv(&["relay"]), &file("[inbox.cleanup]\nforce = true")).expect_err("refused");
    assert!(matches!(err, ConfigError::Action { ref key, .. } if key == "force"), "{err}");
}

#[test]
fn a_bad_value_is_reported_as_the_files_key() {
    let (cli, file) = (cli(), file("lease-ms = \"soon\""));
    let resolved = resolve(&cli, argv(&["relay"]), &file).expect("resolves");
    let err = parse(&cli, &resolved, Some(&file)).expect_err("not a number").to_string();
    assert!(err.contains("herald.toml") && err.contains("`lease-ms`") && err.contains("soon"), "{err}");
}

#[test]
fn a_typed_flag_also_wins_over_a_file_value_that_conflicts_with_it() {
    let cli = Command::new("herald").subcommand(
        Command::new("drill").arg(Arg::new("minutes").long("minutes").conflicts_with("seconds")).arg(Arg::new("seconds").long("seconds")),
    );
    let file = file("[drill]\nminutes = 5\n");
    let resolved = resolve(&cli, argv(&["drill", "--seconds", "30"]), &file).expect("resolves");
    assert!(resolved.from_file.is_empty(), "{:?}", resolved.argv);
    parse(&cli, &resolved, Some(&file)).expect("the typed flag alone");
}

#[test]
fn the_config_flag_is_found_before_the_full_parse() {
    let found = locate(&cli(), &argv(&["relay", "--config", "/etc/herald.toml", "--lease-ms", "x"]));
    assert_eq!(found, Some(PathBuf::from("/etc/herald.toml")));
    assert_eq!(locate(&cli(), &argv(&["relay"])), None);
}

#[test]
fn added_flags_go_before_a_double_dash() {
    let spliced = splice(argv(&["relay", "--", "rest"]), vec!["--lease-ms=1".into()]);
    assert_eq!(spliced, argv(&["relay", "--lease-ms=1", "--", "rest"]));
}
