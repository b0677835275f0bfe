//! The testbed's one error type: every fallible step says what it ran or read, and an
//! agent failure carries the agent's own output so the caller can show it.

use std::{io, process::ExitStatus, time::Duration};

/// Result of every testbed operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the testbed needs root (network namespaces, eBPF); run it as root")]
    NotRoot,
    #[error("cannot start `{command}`: {source}")]
    Spawn { command: String, source: io::Error },
    #[error("command `{command}` failed ({status}):\nstderr: {stderr}\nstdout: {stdout}")]
    Command {
        command: String,
        status: ExitStatus,
        stderr: String,
        stdout: String,
    },
    /// The kernel does not know a device kind (its module is missing): callers skip
    /// what needs it, or fail where every kind must be there.
    #[error("kernel {release} has no {kind} support: `{command}`: {stderr}")]
    MissingKind {
        kind: String,
        release: String,
        command: String,
        stderr: String,
    },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("topology: {from} cannot ping {to} within {timeout:?}")]
    Unreachable {
        from: String,
        to: String,
        timeout: Duration,
    },
    #[error("{netns}: IPv6 addresses still tentative after {timeout:?}: {addrs}")]
    Tentative {
        netns: String,
        addrs: String,
        timeout: Duration,
    },
    #[error("GET {url} failed: {source}")]
    Http {
        url: String,
        source: Box<ureq::Error>,
    },
    #[error("GET {url} answered {status}: {body}")]
    HttpStatus {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{what}\n{diagnostics}")]
    Agent { what: String, diagnostics: String },
    #[error("bad exposition: {0}")]
    Exposition(String),
    #[error("{what}: not JSON: {source}")]
    Json {
        what: String,
        source: serde_json::Error,
    },
}

impl Error {
    /// An [`Error::Io`] with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
