//! `node-diag run --ebpf-log LEVEL`: the kernel programs' own log lines (`aya-log`),
//! forwarded into `tracing` under the target [`TARGET`].
//!
//! The level is decided at load time: the loader writes it into the programs' read-only
//! global `AYA_LOG_LEVEL` ([`Level::global`]), which every log call in the programs checks
//! first, so with `off` (the default) the verifier prunes every log branch and the
//! programs cost what they cost without logging. Only when logging is on does the agent
//! take the log ring buffer ([`init`]) and drain it ([`drain`]).

use std::io;

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::{Interest, unix::AsyncFd};
use tracing_subscriber::filter::Directive;

/// `tracing` target of the forwarded eBPF log lines.
pub(crate) const TARGET: &str = "node_diag::ebpf";

/// Most verbose eBPF log level that reaches user space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Level {
    /// No eBPF logging (the log calls are dead code to the verifier).
    #[default]
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    /// The value of the programs' `AYA_LOG_LEVEL` global: `aya_log::Level` numbers
    /// (error 1 … trace 5), a call being live when its level is at most this.
    pub(crate) fn global(self) -> u8 {
        match self {
            Level::Off => 0,
            Level::Error => aya_log::Level::Error as u8,
            Level::Warn => aya_log::Level::Warn as u8,
            Level::Info => aya_log::Level::Info as u8,
            Level::Debug => aya_log::Level::Debug as u8,
            Level::Trace => aya_log::Level::Trace as u8,
        }
    }

    /// The `tracing` filter directive that lets the forwarded lines through whatever
    /// `--log-level` says: the eBPF side already filtered them.
    pub(crate) fn directive(self) -> Option<Directive> {
        (self != Level::Off).then(|| {
            format!("{TARGET}=trace")
                .parse()
                .expect("a literal target=level directive parses")
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum EbpfLogError {
    #[error("eBPF log ring buffer unusable: {0}")]
    Init(#[from] aya_log::Error),
}

/// The programs' log ring buffer, taken from the loaded object.
pub(crate) struct Logs(EbpfLogger<ToTracing>);

/// Takes the log ring buffer out of `ebpf` when `level` is not off.
pub(crate) fn init(ebpf: &mut Ebpf, level: Level) -> Result<Option<Logs>, EbpfLogError> {
    if level == Level::Off {
        return Ok(None);
    }
    Ok(Some(Logs(EbpfLogger::init_with_logger(ebpf, ToTracing)?)))
}

/// Forwards log records as they arrive, until the task is aborted.
pub(crate) async fn drain(logs: Logs) -> io::Result<()> {
    // SAFETY: the AsyncFd owns the logger, which owns the ring buffer's map fd, so the fd
    // stays open and unchanged for as long as it is registered.
    let mut fd = unsafe { AsyncFd::register_with_interest(logs.0, Interest::READABLE) }?;
    loop {
        let mut guard = fd.readable_mut().await?;
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

/// A `log::Log` that re-emits aya-log records as `tracing` events.
struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        // The program's source location: which hook, and which call in it.
        let source = format_args!(
            "{}:{}",
            record.file().unwrap_or("?"),
            record.line().unwrap_or(0)
        );
        match record.level() {
            log::Level::Error => tracing::error!(target: TARGET, %source, "{message}"),
            log::Level::Warn => tracing::warn!(target: TARGET, %source, "{message}"),
            log::Level::Info => tracing::info!(target: TARGET, %source, "{message}"),
            log::Level::Debug => tracing::debug!(target: TARGET, %source, "{message}"),
            log::Level::Trace => tracing::trace!(target: TARGET, %source, "{message}"),
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_is_zero_and_levels_follow_aya_log() {
        assert_eq!(Level::Off.global(), 0);
        assert_eq!(Level::Error.global(), 1);
        assert_eq!(Level::Trace.global(), 5);
        assert!(Level::Off.directive().is_none());
        assert_eq!(
            Level::Debug.directive().map(|d| d.to_string()),
            Some("node_diag::ebpf=trace".to_string())
        );
    }
}
