//! Running external commands, in the test's own namespaces or inside a named
//! network namespace (`ip netns exec NS ...`), with failures that say what ran
//! and what it printed.

use std::process::{Command, Output};

/// Runs `argv` and returns its output whatever its exit status.
/// Panics only when the program cannot be started at all.
pub fn try_run(argv: &[&str]) -> Output {
    let (program, args) = argv.split_first().expect("try_run: empty command line");
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", argv.join(" ")))
}

/// Runs `argv`, panics (showing stdout and stderr) unless it exits 0, and
/// returns its stdout.
pub fn run(argv: &[&str]) -> String {
    let out = try_run(argv);
    if !out.status.success() {
        panic!(
            "command `{}` failed ({}):\nstderr: {}\nstdout: {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end(),
            String::from_utf8_lossy(&out.stdout).trim_end(),
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn in_ns<'a>(netns: &'a str, argv: &[&'a str]) -> Vec<&'a str> {
    let mut full = vec!["ip", "netns", "exec", netns];
    full.extend_from_slice(argv);
    full
}

/// Runs `argv` inside network namespace `netns`; see [`try_run`].
pub fn try_run_in(netns: &str, argv: &[&str]) -> Output {
    try_run(&in_ns(netns, argv))
}

/// Runs `argv` inside network namespace `netns`; see [`run`].
pub fn run_in(netns: &str, argv: &[&str]) -> String {
    run(&in_ns(netns, argv))
}
