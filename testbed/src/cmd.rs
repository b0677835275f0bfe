//! Running external commands, in the caller's namespaces or inside a named network
//! namespace (`ip netns exec NS ...`), with errors that say what ran and what it printed.

use std::process::{Command, Output};

use crate::{Error, Result};

/// `argv` as a command (the program and its arguments).
fn command(argv: &[&str]) -> Command {
    let (program, args) = argv.split_first().unwrap_or((&"", &[]));
    let mut command = Command::new(program);
    command.args(args);
    command
}

/// `ip netns exec <netns> <argv...>`, to spawn as the caller likes.
pub fn exec_in(netns: &str, argv: &[&str]) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", netns]).args(argv);
    command
}

/// Runs `command` and returns its output whatever its exit status; fails only when it
/// cannot be started.
pub fn try_output(command: &mut Command) -> Result<Output> {
    command.output().map_err(|source| Error::Spawn {
        command: display(command),
        source,
    })
}

/// Runs `command` and returns its stdout; fails (with its stdout and stderr) unless it
/// exits 0.
pub fn output(command: &mut Command) -> Result<String> {
    let out = try_output(command)?;
    if !out.status.success() {
        return Err(Error::Command {
            command: display(command),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `argv`; see [`try_output`].
pub fn try_run(argv: &[&str]) -> Result<Output> {
    try_output(&mut command(argv))
}

/// Runs `argv`; see [`output`].
pub fn run(argv: &[&str]) -> Result<String> {
    output(&mut command(argv))
}

/// Runs `argv` inside network namespace `netns`; see [`try_output`].
pub fn try_run_in(netns: &str, argv: &[&str]) -> Result<Output> {
    try_output(&mut exec_in(netns, argv))
}

/// Runs `argv` inside network namespace `netns`; see [`output`].
pub fn run_in(netns: &str, argv: &[&str]) -> Result<String> {
    output(&mut exec_in(netns, argv))
}

/// `command` as a shell-like line, for messages.
pub fn display(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `ip -n <netns> <args...>`; see [`output`].
pub fn ip(netns: &str, args: &[&str]) -> Result<()> {
    let mut argv = vec!["ip", "-n", netns];
    argv.extend_from_slice(args);
    run(&argv).map(drop)
}
