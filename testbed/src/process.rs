//! Child processes with deadlines: waiting on a pidfd (no sleep loops), signals, dying
//! with the parent, and running a command to completion with its output captured.

use std::{
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::process::CommandExt as _,
    },
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{Error, Result, cmd};

/// Waits until `child` exits or `timeout` passes; `None` on timeout (the child is left
/// running).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = i32::try_from(raw).map_err(io::Error::other)?;
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(remaining.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd, count 1. A pidfd polls readable at exit.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if remaining.is_zero() {
            return Ok(None);
        }
    }
}

/// Sends `signal` to process `pid`.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes the kernel kill the child (SIGKILL) when this process dies, crash or signal, so
/// no agent or server outlives its test or bench. `ip netns exec` execs its command,
/// which keeps the setting.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure only calls prctl, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts the child with `soft` and `hard` open-files limits (`ulimit -Sn`/`-Hn`), as
/// a container runtime would. Inherited through `ip netns exec`'s exec.
pub fn limit_open_files(command: &mut Command, soft: u64, hard: u64) {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe, on a value
    // it owns.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The result of [`run_with_timeout`].
#[derive(Debug)]
pub struct CapturedRun {
    /// Exit status; `None` when it overran the deadline and was killed.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
}

impl CapturedRun {
    /// The exit code, if it exited normally in time.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

/// Runs `command` with no stdin and captured output; kills it (SIGKILL) if it has not
/// exited after `timeout`.
pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> Result<CapturedRun> {
    let start = Instant::now();
    let line = cmd::display(command);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: line.clone(),
            source,
        })?;
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let status = wait_timeout(&mut child, timeout);
    let elapsed = start.elapsed();
    if !matches!(status, Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
    }
    let status = status.map_err(|e| Error::io(format!("waiting for `{line}`"), e))?;
    let joined =
        |h: Option<thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(CapturedRun {
        status,
        stdout: joined(out),
        stderr: joined(err),
        elapsed,
    })
}

fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}
