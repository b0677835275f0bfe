//! The record of a `cargo xtask test` run: each step's start, wall time, result and, for
//! the steps that run tests, how many passed, failed and were ignored. Steps may run at
//! once (the VM guests beside the host's steps), so each row says when it started, from
//! the run's start. The table is printed at the end, failed or not, and written with
//! the JSON beside it in the run's output directory, so the next change can see what
//! it costs.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;
use serde::Serialize;

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Skipped,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "FAILED",
            Self::Skipped => "skipped",
        }
    }
}

/// Tests counted from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Test binaries (one `test result:` line each).
    pub binaries: u64,
}

impl Counts {
    /// Adds the counts of `line` when it is libtest's summary of one binary
    /// (`test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 5 filtered out; ...`).
    /// Returns whether it was.
    pub fn add_line(&mut self, line: &str) -> bool {
        let Some((_, rest)) = line.split_once("test result: ") else {
            return false;
        };
        let mut seen = false;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => continue,
            }
            seen = true;
        }
        if seen {
            self.binaries += 1;
        }
        seen
    }

    /// The counts in every summary line of `text`.
    pub fn from_text(text: &str) -> Counts {
        let mut counts = Counts::default();
        for line in text.lines() {
            counts.add_line(line);
        }
        counts
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
        self.binaries += other.binaries;
    }
}

/// One step of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    /// Seconds from the run's start to this step's.
    pub start_seconds: f64,
    pub seconds: f64,
    pub status: Status,
    /// The tests it ran, for the steps that run tests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests: Option<Counts>,
    /// Why it was skipped or failed, or what it was (the guest's kernel).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The steps of one run, shared by the threads that run them.
pub struct Record {
    started: Instant,
    wall_clock_start: u64,
    steps: Mutex<Vec<Step>>,
}

/// A step under way: [`Record::finish`] records it.
pub struct Started {
    name: String,
    at: Instant,
}

impl Record {
    pub fn new() -> Record {
        Record {
            started: Instant::now(),
            wall_clock_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            steps: Mutex::new(Vec::new()),
        }
    }

    /// Starts step `name` now.
    pub fn start(&self, name: impl Into<String>) -> Started {
        Started {
            name: name.into(),
            at: Instant::now(),
        }
    }

    /// Records `step` as ended now with `status`.
    pub fn finish(
        &self,
        step: Started,
        status: Status,
        tests: Option<Counts>,
        note: Option<String>,
    ) {
        self.push(
            step.name,
            step.at.duration_since(self.started).as_secs_f64(),
            step.at.elapsed().as_secs_f64(),
            status,
            tests,
            note,
        );
    }

    /// Records a step that ran elsewhere: from `start_seconds` (since the run's start)
    /// for `seconds`.
    pub fn push(
        &self,
        name: impl Into<String>,
        start_seconds: f64,
        seconds: f64,
        status: Status,
        tests: Option<Counts>,
        note: Option<String>,
    ) {
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Step {
                name: name.into(),
                start_seconds: round(start_seconds),
                seconds: round(seconds),
                status,
                tests,
                note,
            });
    }

    /// Records a step that did not run.
    pub fn skip(&self, name: impl Into<String>, why: impl Into<String>) {
        let step = self.start(name);
        self.finish(step, Status::Skipped, None, Some(why.into()));
    }

    /// Runs `f` as step `name`: its result's `Ok` is passed (with the tests it counted).
    pub fn run<T>(
        &self,
        name: impl Into<String>,
        f: impl FnOnce() -> Result<(T, Option<Counts>)>,
    ) -> Result<T> {
        let step = self.start(name);
        match f() {
            Ok((value, tests)) => {
                self.finish(step, Status::Passed, tests, None);
                Ok(value)
            }
            Err(err) => {
                self.finish(step, Status::Failed, None, Some(format!("{err:#}")));
                Err(err)
            }
        }
    }

    /// The steps so far, in the order they started.
    pub fn steps(&self) -> Vec<Step> {
        let mut steps = self
            .steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        steps.sort_by(|a, b| a.start_seconds.total_cmp(&b.start_seconds));
        steps
    }

    /// Seconds since the run started.
    pub fn elapsed(&self) -> f64 {
        round(self.started.elapsed().as_secs_f64())
    }

    /// The summary: the wall time, every step, and the tests run by kind.
    pub fn summary(&self, passed: bool) -> Summary {
        let steps = self.steps();
        let mut tests = Counts::default();
        for step in &steps {
            if let Some(counts) = step.tests {
                tests.add(counts);
            }
        }
        Summary {
            started_unix: self.wall_clock_start,
            seconds: self.elapsed(),
            passed,
            tests,
            steps,
        }
    }
}

/// What the run writes as JSON.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// When the run started (seconds since the Unix epoch).
    pub started_unix: u64,
    /// Its wall time.
    pub seconds: f64,
    pub passed: bool,
    /// Every test every step ran.
    pub tests: Counts,
    pub steps: Vec<Step>,
}

impl Summary {
    /// The steps as a markdown table, with a total row.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| step | start | wall time | result | tests passed / failed / ignored |\n| --- | ---: | ---: | --- | ---: |\n",
        );
        for s in &self.steps {
            let tests = s
                .tests
                .map(|c| format!("{} / {} / {}", c.passed, c.failed, c.ignored))
                .unwrap_or_default();
            let result = match &s.note {
                Some(note) if s.status != Status::Passed => {
                    format!("{} ({})", s.status.label(), first_line(note, 60))
                }
                _ => s.status.label().to_owned(),
            };
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} |",
                s.name,
                clock(s.start_seconds),
                clock(s.seconds),
                result,
                tests
            );
        }
        let _ = writeln!(
            t,
            "| **total** | | **{}** | {} | {} / {} / {} |",
            clock(self.seconds),
            if self.passed { "passed" } else { "FAILED" },
            self.tests.passed,
            self.tests.failed,
            self.tests.ignored
        );
        t
    }

    /// Writes `steps.json` and `steps.md` into `dir`; returns the JSON's path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir)?;
        let json = dir.join("steps.json");
        fs::write(&json, serde_json::to_string_pretty(self)? + "\n")?;
        fs::write(dir.join("steps.md"), self.table())?;
        Ok(json)
    }
}

/// `m:ss`.
fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

fn round(seconds: f64) -> f64 {
    (seconds * 10.0).round() / 10.0
}

/// The first line of `text`, cut at `max` characters.
fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_owned()
    } else {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_counted_and_other_lines_are_not() {
        let text = "\
running 3 tests
test a ... ok
test result: ok. 354 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.87s
[vm 6.1] test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 90 filtered out; finished in 30.00s
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; finished in 0.00s
the test result: was fine
";
        let counts = Counts::from_text(text);
        assert_eq!(
            counts,
            Counts {
                passed: 358,
                failed: 1,
                ignored: 2,
                binaries: 3,
            }
        );
    }

    #[test]
    fn the_table_lists_steps_by_start_with_a_total() {
        let record = Record::new();
        record.skip("cross builds", "--filter");
        let _: () = record
            .run("unit tests", || {
                Ok((
                    (),
                    Some(Counts {
                        passed: 5,
                        failed: 0,
                        ignored: 1,
                        binaries: 2,
                    }),
                ))
            })
            .unwrap();
        let err = record
            .run::<()>("host suite", || anyhow::bail!("a test failed\nmore"))
            .unwrap_err();
        assert_eq!(err.to_string(), "a test failed\nmore");
        let summary = record.summary(false);
        assert_eq!(summary.steps.len(), 3);
        assert_eq!(summary.tests.passed, 5);
        let table = summary.table();
        assert!(table.contains("| cross builds | 0:00 | 0:00 | skipped (--filter) |  |"));
        assert!(table.contains("| unit tests | 0:00 | 0:00 | passed | 5 / 0 / 1 |"));
        assert!(table.contains("| host suite | 0:00 | 0:00 | FAILED (a test failed) |  |"));
        assert!(
            table
                .trim_end()
                .ends_with("| **total** | | **0:00** | FAILED | 5 / 0 / 1 |")
        );
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["steps"][1]["tests"]["passed"], 5);
        assert_eq!(json["steps"][0]["status"], "skipped");
    }
}
