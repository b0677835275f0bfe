//! The progress lines of every task: `[task] what`, one per step, so that a long run
//! reads as a log of its steps and a task's lines can be picked out of it. The prefix
//! lives here only, so every task spells it the same way.

use std::fmt::Display;

/// `[task] what`.
pub(crate) fn say(task: &str, what: impl Display) {
    println!("[{task}] {what}");
}

/// `[task] step: state`, where one step of a task stands.
pub(crate) fn step(task: &str, step: &str, state: impl Display) {
    say(task, format_args!("{step}: {state}"));
}

/// A line of `cargo xtask integration`: the matrix, its kernels and its guests.
pub(crate) fn integration(what: impl Display) {
    say("integration", what);
}

/// A step of `cargo xtask prereqs` (and of every task that checks them first).
pub(crate) fn prereqs(step_: &str, state: impl Display) {
    step("prereqs", step_, state);
}

/// A line of `cargo xtask test`.
pub(crate) fn test(what: impl Display) {
    say("test", what);
}

/// A line of `cargo xtask test`'s cross builds step.
pub(crate) fn cross_builds(what: impl Display) {
    step("test", "cross builds", what);
}

/// A line of `cargo xtask bench`.
pub(crate) fn bench(what: impl Display) {
    say("bench", what);
}
