//! Spawning child processes, privileges and workspace paths.
//!
//! Every spawn goes through [`run`] or [`output`], whose errors name the command line.

use std::{
    env,
    ffi::{OsStr, OsString},
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// A command with `PATH` extended by cargo's bin directory, so tools installed with
/// `cargo install` (bpf-linker) are found even when the shell's `PATH` lacks it.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    if let Some(path) = search_path() {
        cmd.env("PATH", path);
    }
    cmd
}

/// The cargo that runs this xtask (`$CARGO`), so every step uses the same toolchain.
pub fn cargo() -> Command {
    command(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// [`cargo`] with `args`.
pub fn cargo_with(args: &[&str]) -> Command {
    let mut cargo = cargo();
    cargo.args(args);
    cargo
}

/// Runs `cmd` with inherited stdio; fails unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("failed to spawn `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` as [`run`] does, its standard output echoed line by line and libtest's
/// summaries in it counted: the tests it ran, whether it succeeded or not.
pub fn run_counting(cmd: &mut Command) -> (crate::steps::Counts, Result<()>) {
    let mut counts = crate::steps::Counts::default();
    let line = display(cmd);
    let mut child = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(err) => {
            return (
                counts,
                Err(err).context(format!("failed to spawn `{line}`")),
            );
        }
    };
    if let Some(stdout) = child.stdout.take() {
        for text in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{text}");
            counts.add_line(&text);
        }
    }
    let result = match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(anyhow::anyhow!("`{line}` failed ({status})")),
        Err(err) => Err(err).context(format!("failed to wait for `{line}`")),
    };
    (counts, result)
}

/// Runs `cmd` (and its children) at scheduling niceness `niceness`: the steps that only
/// need CPU give way to the tests that run beside them and wait on time.
pub fn lower_priority(cmd: &mut Command, niceness: i32) -> &mut Command {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; setpriority is a plain system call that
    // touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpriority(libc::PRIO_PROCESS, 0, niceness) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

/// Runs `cmd` and returns its standard output; fails (with its stderr) unless it succeeds.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("failed to spawn `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed invalid UTF-8"))
}

/// `cmd` as a shell-like line, for messages (`$CARGO` shows as `cargo`).
pub fn display(cmd: &Command) -> String {
    let program = cmd.get_program();
    let mut line = if env::var_os("CARGO").is_some_and(|cargo| cargo == program) {
        "cargo".to_owned()
    } else {
        program.to_string_lossy().into_owned()
    };
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// How to run something that needs root.
pub enum Privilege {
    /// Already root: run it directly.
    Root,
    /// Not root: prefix it with `sudo -E` (the path of sudo).
    Sudo(PathBuf),
}

impl Privilege {
    /// Root as is, else sudo when installed; the error names `what` needs root and
    /// ends with `hint`.
    pub fn acquire(what: &str, hint: &str) -> Result<Self> {
        if is_root() {
            return Ok(Self::Root);
        }
        match which::which("sudo") {
            Ok(sudo) => Ok(Self::Sudo(sudo)),
            Err(_) => bail!("running {what} needs root and sudo is not installed: {hint}"),
        }
    }

    /// A command running `program` with root privileges.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match self {
            Self::Root => command(program),
            Self::Sudo(sudo) => {
                let mut cmd = command(sudo);
                cmd.arg("-E").arg(program);
                cmd
            }
        }
    }
}

/// cargo's bin directory: `$CARGO_HOME/bin`, else `~/.cargo/bin`.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::home_dir().map(|home| home.join(".cargo")))
        .map(|cargo_home| cargo_home.join("bin"))
}

/// `PATH` with cargo's bin directory appended when it is missing; `None` if unchanged.
fn search_path() -> Option<OsString> {
    let bin = cargo_bin_dir()?;
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = env::split_paths(&path).collect();
    if dirs.contains(&bin) {
        return None;
    }
    dirs.push(bin);
    env::join_paths(dirs).ok()
}

/// The workspace's target directory, from `cargo metadata --format-version 1 --no-deps`.
pub fn target_dir() -> Result<PathBuf> {
    Ok(metadata()?.target_directory.into_std_path_buf())
}

/// The workspace metadata (no dependencies).
pub fn metadata() -> Result<cargo_metadata::Metadata> {
    cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("failed to run `cargo metadata --format-version 1 --no-deps`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_joins_program_and_args() {
        let mut cmd = Command::new("cargo");
        cmd.args(["fmt", "--all", "--", "--check"]);
        assert_eq!(display(&cmd), "cargo fmt --all -- --check");
    }

    #[test]
    fn sudo_prefixes_the_program() {
        let cmd = Privilege::Sudo("/usr/bin/sudo".into()).command("/x/node-diag");
        assert_eq!(display(&cmd), "/usr/bin/sudo -E /x/node-diag");
    }
}
