//! `node-diag run`'s command line: its options, their parsing, and what is derived
//! from them before the agent starts (the node's name, the web configs, the HTTP
//! connection cap).

use super::*;

/// `node-diag run`'s options, as the command line gives them.
#[derive(clap::Args)]
pub(crate) struct RunOptions {
    /// Address of the scrape listener: /metrics, /healthz, /readyz (and /findings only
    /// over TLS with client certificates verified, see --web-config-file).
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR")]
    pub(super) listen: SocketAddr,
    /// Address of the findings listener (/findings, /healthz, /readyz), loopback by
    /// default: the findings name pods, Services and their addresses. `none` serves no
    /// findings listener.
    #[arg(long, default_value = "127.0.0.1:9465", value_name = "ADDR|none", value_parser = parse_findings_listen)]
    pub(super) findings_listen: FindingsListen,
    /// Web config of the scrape listener in Prometheus exporter-toolkit's format
    /// (tls_server_config, basic_auth_users, http_server_config.headers), re-read when it
    /// or the files it names change.
    #[arg(long, value_name = "PATH")]
    pub(super) web_config_file: Option<PathBuf>,
    /// Web config of the findings listener, same format; without it that listener
    /// speaks plain HTTP (loopback by default, where the probes and `node-diag findings`
    /// reach it).
    #[arg(long, value_name = "PATH")]
    pub(super) findings_web_config_file: Option<PathBuf>,
    /// Time a client has to send a request head (from its connection, or from the
    /// previous answer on a kept-alive connection) and to finish a TLS handshake.
    #[arg(long, default_value = "10s", value_parser = parse_timeout, value_name = "DURATION")]
    pub(super) http_header_timeout: Duration,
    /// A connection that moves no byte either way for this long is closed (e.g. a client
    /// that stopped reading its answer).
    #[arg(long, default_value = "60s", value_parser = parse_timeout, value_name = "DURATION")]
    pub(super) http_idle_timeout: Duration,
    /// Connections open at once on each listener; more are closed as soon as accepted
    /// (counted in node_diag_http_connections_rejected_total).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536), value_name = "N")]
    pub(super) http_max_connections: u32,
    /// Output format of findings on stdout.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    pub(super) format: OutputFormat,
    /// File written once every program is attached and the HTTP endpoints are up (the
    /// scrape listener's address on its first line, the findings listener's on the
    /// second when there is one); removed on exit.
    #[arg(long, value_name = "PATH")]
    pub(super) ready_file: Option<PathBuf>,
    /// SYN retransmits after which a connect is reported as timing out (2 ≈ 3 s).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10), value_name = "N")]
    pub(super) syn_retries: u32,
    /// Report for every network namespace on this kernel. By default the agent reports for
    /// its own namespace and the pod namespaces attached to it by veth.
    #[arg(long)]
    pub(super) all_netns: bool,
    /// Minimum seconds between repeated prints of the same aggregated finding.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub(super) repeat_interval: u64,
    /// Log level of the eBPF programs themselves, forwarded to stderr under the target
    /// node_diag::ebpf (whatever --log-level says). They log only verdicts and lost
    /// events. `off` leaves the log calls out of the verified programs entirely.
    #[arg(long, value_enum, default_value = "off", value_name = "LEVEL")]
    pub(crate) ebpf_log: crate::kernel::ebpf_log::Level,
    /// How the TC ingress classifier is attached: `auto` uses TCX where the kernel has it
    /// (6.6+) and a netlink filter under a clsact qdisc elsewhere; `netlink` always uses
    /// the latter (the pre-6.6 path, to test it, or where TCX misbehaves).
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    pub(super) tc_attach: tc::AttachMode,
    /// When ICMP errors arriving from the network (frag-needed, unreachable, prohibited)
    /// are watched, by the TC ingress classifier. `on-trouble` attaches it once something
    /// shows trouble ICMP could explain (a failed connect other than a plain refusal, SYN
    /// or full-size retransmits, oversize drops) and detaches it after --icmp-watch-hold
    /// quiet seconds: no per-packet cost on a healthy node, but the first error of an
    /// episode goes unseen (its finding says so). `always` keeps it attached.
    #[arg(long, value_enum, default_value = "on-trouble", value_name = "WHEN")]
    pub(super) icmp_watch: icmp_watch::Mode,
    /// With --icmp-watch on-trouble: seconds the classifier stays attached after the last
    /// trouble.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86_400), value_name = "SECONDS")]
    pub(super) icmp_watch_hold: u64,
    /// The container runtime's CRI socket, to name the pods of findings. By default the
    /// first of /run/containerd/containerd.sock and /var/run/crio/crio.sock that is a socket.
    /// Without one, findings carry network namespaces and addresses only.
    #[arg(long, value_name = "PATH")]
    pub(super) cri_socket: Option<PathBuf>,
    /// Seconds between two probe runs of one peer's path, and so between the probes of
    /// an open path black hole's path that can resolve it. Hidden: the default fits
    /// production; tests shorten it to see a healed path resolve within their time.
    #[arg(long, hide = true, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), value_name = "SECONDS")]
    pub(super) path_probe_window: u64,
    /// This node's name, carried by every finding (`node`). The DaemonSet sets NODE_NAME
    /// from the downward API (`spec.nodeName`); without either, the hostname.
    #[arg(long, env = "NODE_NAME", hide_env_values = true, value_name = "NAME")]
    pub(super) node_name: Option<String>,
}

/// `--node-name` when given (and not blank), else the hostname.
pub(super) fn node_name(given: Option<&str>) -> String {
    given.map(str::trim).filter(|n| !n.is_empty()).map_or_else(
        || {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        },
        str::to_owned,
    )
}

/// The listeners' web configs as read at start.
pub(super) struct WebConfigs {
    pub(super) scrape: Option<(PathBuf, serve::web_config::Loaded)>,
    pub(super) findings: Option<(PathBuf, serve::web_config::Loaded)>,
}

/// Reads a web config given on the command line; its warnings logged.
pub(super) fn load_web_config(
    path: Option<&Path>,
) -> Result<Option<(PathBuf, serve::web_config::Loaded)>, AgentError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let loaded = serve::web_config::load(path)?;
    for w in &loaded.warnings {
        warn!(file = %path.display(), "web config: {w}");
    }
    Ok(Some((path.to_owned(), loaded)))
}

/// Each listener's connection cap: `--http-max-connections`, but no more than its
/// share of the files HTTP may hold ([`fds::connection_budget`]), so that connections
/// on every listener together never take the files the agent's own work needs.
pub(super) fn connection_cap(flag: u32, budget: u64, listeners: usize) -> usize {
    let share = budget / (listeners.max(1) as u64);
    usize::try_from(share.min(u64::from(flag)))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// `--findings-listen`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FindingsListen(pub(super) Option<SocketAddr>);

pub(super) fn parse_findings_listen(s: &str) -> Result<FindingsListen, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(FindingsListen(None));
    }
    s.parse()
        .map(|a| FindingsListen(Some(a)))
        .map_err(|e| format!("{e}: expected ADDR:PORT (e.g. 127.0.0.1:9465) or none"))
}

pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 10s, 500ms, 1m)"))?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::{connection_cap, node_name};

    #[test]
    fn the_connection_cap_stays_within_the_open_files_budget() {
        // A raised limit: the flag decides.
        assert_eq!(connection_cap(256, (1 << 20) - 256, 2), 256);
        // A hard limit of 1,024 (budget 768): each of two listeners gets its half.
        assert_eq!(connection_cap(1000, 768, 2), 384);
        assert_eq!(connection_cap(1000, 768, 1), 768);
        assert_eq!(connection_cap(256, 768, 2), 256);
        assert_eq!(connection_cap(256, 16, 2), 8);
        assert_eq!(connection_cap(256, 0, 2), 1, "never none at all");
    }

    #[test]
    fn the_node_name_is_the_flag_else_the_hostname() {
        assert_eq!(node_name(Some(" worker-1 ")), "worker-1");
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        assert_eq!(node_name(None), host);
        assert_eq!(node_name(Some("  ")), host, "blank is not a name");
    }
}
