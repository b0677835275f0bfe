//! Reading the rules: which dump tools exist on this node, running each with a deadline,
//! and a record of what could and could not be read.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;
use tracing::debug;

use super::{
    ServiceCatalog, ServicesError,
    nft_netlink::{self, Family},
    nftables,
};

/// How long one dump may take. `iptables-save` of a large cluster (tens of thousands of
/// rules) takes about a second; past this something is stuck (the xtables lock, a hung
/// nft), and the agent must not wait on it.
const DEADLINE: Duration = Duration::from_secs(5);

/// Where the tools live besides `$PATH`: a DaemonSet's image or a login shell may leave
/// the sbin directories out of it.
const SBIN_DIRS: [&str; 3] = ["/usr/sbin", "/sbin", "/usr/local/sbin"];

/// One place the catalog is read from, and what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Source {
    /// The command, as run (`iptables-nft-save`...), or the table (`nft ip kube-proxy`).
    pub(crate) name: String,
    #[serde(flatten)]
    pub(crate) status: SourceStatus,
}

/// What came of reading one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum SourceStatus {
    /// Read; `services` Service ports found in it (0 when kube-proxy does not use it).
    Read { services: usize },
    /// The tool ran, and there is nothing of kube-proxy's to read: no `kube-proxy` table
    /// in that family, or no legacy iptables tables at all.
    Absent,
    /// Not read: the tool is not installed, failed (first line of its stderr), timed
    /// out, or printed what could not be parsed.
    Unavailable { reason: String },
}

impl Source {
    fn new(name: impl Into<String>, status: SourceStatus) -> Self {
        Self {
            name: name.into(),
            status,
        }
    }

    /// Whether the source was read (including a kube-proxy table that is not there).
    pub(crate) fn is_read(&self) -> bool {
        !matches!(self.status, SourceStatus::Unavailable { .. })
    }
}

/// Reads every kube-proxy ruleset in the calling thread's network namespace: the
/// nft-backed iptables (`iptables-nft-save`, `ip6tables-nft-save`, or plain
/// `iptables-save` where the `-nft` ones do not exist), the legacy iptables when legacy
/// tables are in use, and kube-proxy's nftables tables `{ip,ip6} kube-proxy`; merged into one
/// catalog, with what became of each source.
///
/// Missing tools and tables are not errors. To read another namespace, call it from a
/// thread that entered it: the tools run as children of the calling thread, in its
/// namespace.
///
/// # Errors
///
/// [`ServicesError::NothingReadable`] when no source at all could be read: then the
/// node's Services are unknown, which is not the same as "none".
pub(crate) fn read() -> Result<(ServiceCatalog, Vec<Source>), ServicesError> {
    let mut catalog = ServiceCatalog::new();
    let mut sources = Vec::new();
    for kind in Kind::ALL {
        let (found, source) = read_one(kind);
        catalog.merge(&found);
        sources.push(source);
    }
    if sources.iter().any(Source::is_read) {
        Ok((catalog, sources))
    } else {
        Err(ServicesError::NothingReadable(sources))
    }
}

/// One of the rulesets [`read`] reads, which [`read_one`] reads alone: what a change
/// notification of one table asks to read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `iptables-nft-save` (or `iptables-save`): nftables tables `filter`, `nat`...
    /// of family `ip`.
    IptablesNft4,
    IptablesNft6,
    /// `iptables-legacy-save`: x_tables, which send no notification.
    IptablesLegacy4,
    IptablesLegacy6,
    /// Table `ip kube-proxy`: its maps by `nft -j list map`, its rules by netlink.
    Nft4,
    Nft6,
}

impl Kind {
    pub(crate) const ALL: [Kind; 6] = [
        Kind::IptablesNft4,
        Kind::IptablesNft6,
        Kind::IptablesLegacy4,
        Kind::IptablesLegacy6,
        Kind::Nft4,
        Kind::Nft6,
    ];
}

/// Reads the one ruleset `kind` in the calling thread's network namespace.
pub(crate) fn read_one(kind: Kind) -> (ServiceCatalog, Source) {
    let mut catalog = ServiceCatalog::new();
    let source = match kind {
        Kind::IptablesNft4 | Kind::IptablesNft6 => {
            let (nft_tool, plain_tool, family) = if kind == Kind::IptablesNft4 {
                ("iptables-nft-save", "iptables-save", Family::Ip)
            } else {
                ("ip6tables-nft-save", "ip6tables-save", Family::Ip6)
            };
            match find_tool(nft_tool) {
                // iptables-nft prints only its family's nftables tables: with none, it
                // would print nothing, and is not run (a process start is the read's
                // whole cost on a node without rules).
                Some(_) if nft_table(|t| t.family == family.name()) == Some(false) => {
                    Source::new(nft_tool, SourceStatus::Read { services: 0 })
                }
                Some(path) => dump(nft_tool, Some(path), &[], &mut catalog),
                // Plain iptables-save may be the legacy one: always run.
                None => dump(plain_tool, find_tool(plain_tool), &[], &mut catalog),
            }
        }
        Kind::IptablesLegacy4 | Kind::IptablesLegacy6 => {
            let (tool, names_file) = if kind == Kind::IptablesLegacy4 {
                ("iptables-legacy-save", "ip_tables_names")
            } else {
                ("ip6tables-legacy-save", "ip6_tables_names")
            };
            match find_tool(tool) {
                None => unavailable(tool, "not installed"),
                Some(path) => {
                    // Legacy tables are in use only when the kernel lists some for this
                    // namespace. Not running the tool otherwise also keeps it from
                    // loading ip_tables modules.
                    if legacy_table_names(names_file).is_empty() {
                        Source::new(tool, SourceStatus::Absent)
                    } else {
                        dump(tool, Some(path), &[], &mut catalog)
                    }
                }
            }
        }
        Kind::Nft4 => nft_kube_proxy(Family::Ip, &mut catalog),
        Kind::Nft6 => nft_kube_proxy(Family::Ip6, &mut catalog),
    };
    (catalog, source)
}

/// kube-proxy's nftables table of `family`: its maps printed by `nft -j list map`, one
/// run each, and the backends from a netlink dump of its rules. Absent when none of the
/// maps exists (no table, or not kube-proxy's).
fn nft_kube_proxy(family: Family, catalog: &mut ServiceCatalog) -> Source {
    let fam = family.name();
    let name = format!("nft {fam} {}", nftables::TABLE);
    let Some(nft) = find_tool("nft") else {
        return unavailable(&name, "nft is not installed");
    };
    // No table, no maps: not one `nft` run per map to hear it (an iptables-mode node's
    // every read).
    if nft_table(|t| t.family == fam && t.name == nftables::TABLE) == Some(false) {
        return Source::new(name, SourceStatus::Absent);
    }
    let mut found = ServiceCatalog::new();
    let mut maps = 0;
    for map in nftables::MAPS {
        let args = ["-j", "list", "map", fam, nftables::TABLE, map];
        let out = match run(&nft, &args, DEADLINE) {
            Ok(out) => out,
            Err(reason) => return unavailable(&name, format!("map {map}: {reason}")),
        };
        if !out.status.success() {
            let first = out.stderr.lines().next().unwrap_or("").trim();
            // nft's answer for a table or map that does not exist, in every version
            // seen: "Error: No such file or directory".
            if first.contains("No such file or directory") {
                continue;
            }
            return unavailable(&name, format!("map {map}: {first} ({})", out.status));
        }
        match ServiceCatalog::parse_nft_json(&out.stdout) {
            Ok(part) => found.merge(&part),
            Err(e) => return unavailable(&name, format!("map {map}: {e}")),
        }
        maps += 1;
    }
    if maps == 0 {
        return Source::new(name, SourceStatus::Absent);
    }
    match nft_netlink::dnat_targets(
        family,
        nftables::TABLE,
        nftables::is_endpoint_chain,
        DEADLINE,
    ) {
        Ok(dnats) => nftables::add_backends(&dnats, &mut found),
        Err(e) => return unavailable(&name, format!("rules: {e}")),
    }
    let services = found.len();
    debug!(source = name, services, "read kube-proxy rules");
    catalog.merge(&found);
    Source::new(name, SourceStatus::Read { services })
}

/// Whether an nftables table `which` accepts exists in the calling thread's network
/// namespace; `None` when the table list cannot be dumped (the tools are run then).
fn nft_table(which: impl Fn(&nft_netlink::Table) -> bool) -> Option<bool> {
    nft_netlink::tables(DEADLINE)
        .ok()
        .map(|tables| tables.iter().any(which))
}

/// The legacy x_tables tables the kernel lists for the calling thread's namespace
/// (`ip_tables_names` or `ip6_tables_names`); none when the module is not loaded.
pub(super) fn legacy_table_names(names_file: &str) -> Vec<String> {
    let names = Path::new("/proc/thread-self/net").join(names_file);
    std::fs::read_to_string(names)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn unavailable(name: &str, reason: impl Into<String>) -> Source {
    Source::new(
        name,
        SourceStatus::Unavailable {
            reason: reason.into(),
        },
    )
}

/// Runs one `iptables-save` and merges what it printed into `catalog`.
fn dump(name: &str, path: Option<PathBuf>, args: &[&str], catalog: &mut ServiceCatalog) -> Source {
    let Some(path) = path else {
        return unavailable(name, "not installed");
    };
    let out = match run(&path, args, DEADLINE) {
        Ok(out) => out,
        Err(reason) => return unavailable(name, reason),
    };
    if !out.status.success() {
        let first = out.stderr.lines().next().unwrap_or("").trim();
        let reason = if first.is_empty() {
            format!("exited with {}", out.status)
        } else {
            first.to_owned()
        };
        return unavailable(name, reason);
    }
    let found = ServiceCatalog::parse_iptables_save(&out.stdout);
    let services = found.len();
    debug!(source = name, services, "read kube-proxy rules");
    catalog.merge(&found);
    Source::new(name, SourceStatus::Read { services })
}

/// `tool` in `$PATH` or one of [`SBIN_DIRS`].
pub(super) fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[derive(Debug)]
pub(super) struct Output {
    pub(super) status: ExitStatus,
    pub(super) stdout: String,
    stderr: String,
}

/// Runs `path args` and collects its output, killing it at `deadline`. The error is a
/// sentence for [`SourceStatus::Unavailable`].
pub(super) fn run(path: &Path, args: &[&str], deadline: Duration) -> Result<Output, String> {
    let mut child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // C messages: the "No such file or directory" test above reads them.
        .env("LC_ALL", "C")
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    // Drained on threads: a dump larger than the pipe buffer would otherwise block the
    // child while we wait for it to exit.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {deadline:?}"));
            }
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    };
    let join = |h: thread::JoinHandle<String>| h.join().unwrap_or_default();
    Ok(Output {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_collects_output_and_status() {
        let out = run(
            Path::new("/bin/sh"),
            &["-c", "echo out; echo err >&2; exit 3"],
            DEADLINE,
        )
        .unwrap();
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn run_kills_at_the_deadline() {
        let start = Instant::now();
        let err = run(Path::new("/bin/sleep"), &["10"], Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("timed out"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn missing_tool_is_unavailable_not_an_error() {
        let mut catalog = ServiceCatalog::new();
        let s = dump(
            "no-such-tool",
            find_tool("no-such-tool-nd"),
            &[],
            &mut catalog,
        );
        assert_eq!(
            s.status,
            SourceStatus::Unavailable {
                reason: "not installed".into()
            }
        );
    }

    #[test]
    fn failing_tool_keeps_its_first_stderr_line() {
        let mut catalog = ServiceCatalog::new();
        let s = dump(
            "sh",
            Some(PathBuf::from("/bin/sh")),
            &["-c", "echo 'first line' >&2; echo second >&2; exit 1"],
            &mut catalog,
        );
        assert_eq!(
            s.status,
            SourceStatus::Unavailable {
                reason: "first line".into()
            }
        );
    }
}
