//! `HERALD_FAULT`: the one parser every role uses.
//!
//! ```text
//! hang:<point>           stop forever at <point>, after printing a marker line
//! fail:<point>           fail there, as an infrastructure failure would
//! pause-after-commit:N   stop forever after the N-th committed batch (N ≥ 1)
//! ```
//!
//! The marker, `herald-fault: hang at <point> <site>` (for
//! `pause-after-commit`, `herald-fault: paused after commit of batch N`), is
//! written to stdout and stderr, flushed: that line is how a drill or a test
//! knows the exact moment to SIGKILL the process. A spec names one point; a
//! process with several roles acts at that point only. For drills and tests
//! only; unset in production.

use std::io::Write;

use crate::{Action, Hook, Point, Site};

/// The variable the spec is read from.
pub const ENV: &str = "HERALD_FAULT";

/// What to do at the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Hang,
    Fail,
}

/// A parsed `HERALD_FAULT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub mode: Mode,
    pub point: Point,
    /// Only the site with this number (`pause-after-commit:N`); `None`: every one.
    pub nth: Option<i64>,
}

/// A `HERALD_FAULT` that does not parse: bad input (the binary exits 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{ENV} `{0}` is not mode:point (hang:<point>, fail:<point> or pause-after-commit:N)")]
    Shape(String),
    #[error("{ENV} `{spec}`: unknown mode `{mode}` (hang, fail or pause-after-commit)")]
    UnknownMode { spec: String, mode: String },
    #[error("{ENV} `{spec}`: unknown point `{point}` (one of {})", point_names())]
    UnknownPoint { spec: String, point: String },
    #[error("{ENV} `{spec}`: nothing can fail at {point}; use hang:{point}")]
    CannotFail { spec: String, point: Point },
    #[error("{ENV} `{0}`: expected pause-after-commit:N with N ≥ 1")]
    BadCount(String),
}

fn point_names() -> String {
    Point::ALL.map(Point::name).join(", ")
}

impl Spec {
    pub fn parse(spec: &str) -> Result<Spec, SpecError> {
        let (mode, arg) = spec.split_once(':').ok_or_else(|| SpecError::Shape(spec.to_owned()))?;
        if mode == "pause-after-commit" {
            let n = arg.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| SpecError::BadCount(spec.to_owned()))?;
            return Ok(Spec { mode: Mode::Hang, point: Point::AfterCommit, nth: Some(n) });
        }
        let mode = match mode {
            "hang" => Mode::Hang,
            "fail" => Mode::Fail,
            other => return Err(SpecError::UnknownMode { spec: spec.to_owned(), mode: other.to_owned() }),
        };
        let point = Point::parse(arg).ok_or_else(|| SpecError::UnknownPoint { spec: spec.to_owned(), point: arg.to_owned() })?;
        if mode == Mode::Fail && !point.can_fail() {
            return Err(SpecError::CannotFail { spec: spec.to_owned(), point });
        }
        Ok(Spec { mode, point, nth: None })
    }

    /// The marker line printed when the spec stops a process at `site`.
    pub fn marker(&self, site: &Site) -> String {
        match self.nth {
            Some(n) if self.point == Point::AfterCommit => format!("herald-fault: paused after commit of batch {n}"),
            _ => format!("herald-fault: hang at {} {site}", self.point),
        }
    }

    /// The hook that carries the spec out.
    pub fn hook(self) -> Hook {
        Hook::new(move |site: Site| {
            let spec = self.clone();
            async move {
                if site.point != spec.point || spec.nth.is_some_and(|n| n != site.n) {
                    return Action::Continue;
                }
                match spec.mode {
                    Mode::Fail => Action::Fail(format!("{ENV} at {}", spec.point)),
                    Mode::Hang => {
                        let marker = spec.marker(&site);
                        println!("{marker}");
                        let _ = std::io::stdout().flush();
                        eprintln!("{marker}");
                        std::future::pending::<Action>().await
                    }
                }
            }
        })
    }
}

/// The hook `HERALD_FAULT` asks for; no faults when it is unset or empty.
pub fn from_env() -> Result<Hook, SpecError> {
    match std::env::var(ENV) {
        Ok(spec) if !spec.trim().is_empty() => Ok(Spec::parse(spec.trim())?.hook()),
        _ => Ok(Hook::none()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_specs_drills_and_tests_use_parse() {
        assert_eq!(Spec::parse("hang:artifact-written"), Ok(Spec { mode: Mode::Hang, point: Point::ArtifactWritten, nth: None }));
        assert_eq!(Spec::parse("fail:before-start"), Ok(Spec { mode: Mode::Fail, point: Point::BeforeStart, nth: None }));
        assert_eq!(
            Spec::parse("hang:after-provider-response"),
            Ok(Spec { mode: Mode::Hang, point: Point::AfterProviderResponse, nth: None })
        );
        assert_eq!(Spec::parse("pause-after-commit:2"), Ok(Spec { mode: Mode::Hang, point: Point::AfterCommit, nth: Some(2) }));
        assert_eq!(Spec::parse("hang:before-progress").map(|s| s.point), Ok(Point::BeforeProgress));
    }

    #[test]
    fn bad_specs_are_refused_with_what_was_wrong() {
        let cases = [
            ("hang", "is not mode:point"),
            ("", "is not mode:point"),
            ("crash:artifact-written", "unknown mode `crash`"),
            ("hang:artifact_written", "unknown point `artifact_written` (one of intake-checked,"),
            ("hang:", "unknown point ``"),
            ("fail:after-commit", "nothing can fail at after-commit"),
            ("pause-after-commit:0", "pause-after-commit:N with N ≥ 1"),
            ("pause-after-commit:x", "pause-after-commit:N with N ≥ 1"),
        ];
        for (spec, expected) in cases {
            let err = Spec::parse(spec).expect_err(spec).to_string();
            assert!(err.starts_with(&format!("HERALD_FAULT `{spec}`")), "{err}");
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }

    #[tokio::test]
    async fn the_hook_acts_at_its_point_only() {
        let fail = Spec::parse("fail:artifact-written").expect("spec").hook();
        assert_eq!(fail.at(Point::ArtifactWritten, "j", 1).await, Action::Fail("HERALD_FAULT at artifact-written".into()));
        assert_eq!(fail.at(Point::BeforeStart, "j", 0).await, Action::Continue);

        let pause = Spec::parse("pause-after-commit:2").expect("spec").hook();
        assert_eq!(pause.at(Point::AfterCommit, "stats", 1).await, Action::Continue);
        let second = tokio::time::timeout(Duration::from_millis(50), pause.at(Point::AfterCommit, "stats", 2)).await;
        assert!(second.is_err(), "the second batch stops forever");
    }

    #[test]
    fn markers_name_the_site() {
        let hang = Spec::parse("hang:artifact-written").expect("spec");
        let site = Site { point: Point::ArtifactWritten, subject: "j1".into(), n: 1 };
        assert_eq!(hang.marker(&site), "herald-fault: hang at artifact-written job=j1 generation=1");
        let pause = Spec::parse("pause-after-commit:2").expect("spec");
        let site = Site { point: Point::AfterCommit, subject: "stats".into(), n: 2 };
        assert_eq!(pause.marker(&site), "herald-fault: paused after commit of batch 2");
    }
}
