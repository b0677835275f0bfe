//! node-diag: eBPF network diagnostics for Kubernetes nodes.
//!
//! Data flows one way, from the kernel to the user:
//!
//! - `kernel`: loads and attaches the eBPF programs (offsets from tracefs and BTF), drains
//!   verdict events from the ring buffer and reads the aggregate maps.
//! - `host_network`: the node's interfaces, routes and pod namespaces over rtnetlink.
//! - `mtu`: the MTU model of the node and its pods, from a `host_network` snapshot.
//! - `services`: the Kubernetes Services of the node, from kube-proxy's rules
//!   (`node-diag services`).
//! - `pods`: the pods of this node from its container runtime (CRI), to name them in
//!   findings.
//! - `findings`: turns a kernel event into a finding naming the failing layer
//!   (`correlate`), names kernel numbers, and aggregates repeats (`store`).
//! - `agent`: `node-diag run`, the loop that ties them together, the metrics and HTTP.
//! - `output`: how findings are printed; `client` (`node-diag findings`), `doctor`,
//!   `probe` (`node-diag probe`): the other commands.

mod agent;
mod cli_reference;
mod client;
mod doctor;
mod findings;
mod host_network;
mod kernel;
#[cfg(test)]
mod layering;
mod mtu;
mod output;
mod pods;
mod probe;
mod services;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use node_diag_common::ipproto;
use output::{ColorChoice, FindingsFormat, OutputFormat};

#[derive(Parser)]
#[command(
    name = "node-diag",
    version,
    about = "eBPF network diagnostics for Kubernetes nodes",
    long_about = "eBPF network diagnostics for Kubernetes nodes.\n\n\
        Watches every TCP connect on this node in the kernel and, when one fails, says whether \
        it was refused or timed out, and which layer failed it: the app's listener, a firewall, \
        CNI routing or the peer, with the kernel evidence.",
    after_help = "Examples:\n  node-diag run                      # run the agent (root), findings on stdout\n  node-diag run --format json --listen 0.0.0.0:9464\n  node-diag findings --follow        # tail a running agent's findings\n  node-diag doctor                   # what this kernel supports"
)]
struct Cli {
    /// Log filter for stderr logs (e.g. info, debug, node_diag=trace).
    #[arg(
        long,
        global = true,
        env = "NODE_DIAG_LOG",
        default_value = "info",
        hide_env_values = true,
        value_parser = parse_log_filter,
        value_name = "FILTER"
    )]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: load the eBPF programs, print findings, serve /metrics and /findings.
    Run(agent::RunOptions),
    /// Print the findings of a running agent: compact lines, filtered, or followed.
    #[command(
        long_about = "Print the findings of a running agent (its /findings endpoint).\n\n\
            Each finding is one line of about 120 columns: the time of its last occurrence \
            (HH:MM:SS, UTC), its severity, kind/layer, its pods (namespace/name) or flow \
            (src → dst:port) with the interface or listener it is about, how many times it \
            was seen and a short summary. A resolved or superseded finding shows when it \
            ended and RESOLVED or SUPERSEDED. -o wide adds the full summary, the evidence, \
            the fix, the node and the status under it; -o json prints each finding as the \
            agent sent it, one JSON object per line.\n\n\
            The filters are applied by the agent (query parameters) and again here. \
            Without --follow every matching finding is printed (up to 10,000, the most \
            recent; stderr says when more matched); with it, the last --last ones (default \
            10), then each new finding, each repeat and each status change (resolved, \
            superseded, active again) once a second, riding out an agent restart.",
        after_help = "Examples:\n  node-diag findings --follow\n  node-diag findings --severity warning --namespace shop --since 10m\n  node-diag findings --kind tcp_timeout,tcp_refused --pod shop/cart-7d9f -o wide\n  node-diag findings -o json | jq -r 'select(.status == \"active\") | .summary'"
    )]
    Findings(FindingsArgs),
    /// Check which kernel features the agent can use on this node.
    Doctor(DoctorArgs),
    /// Find the path MTU to DST by a DF binary search (ICMP echo, like `ping -M do -s N`),
    /// tell a working PMTUD from a black hole, and optionally check a TCP port.
    #[command(after_help = probe::EXIT_HELP)]
    Probe(ProbeArgs),
    /// Print this node's MTU model (no eBPF needed): each interface, its overlay and
    /// underlay, the encapsulation overhead, expected MTU, headroom and verdict.
    #[command(
        long_about = "Print this node's MTU model from netlink alone (no eBPF is loaded, no \
            traffic is sent).\n\n\
            Covers this network namespace and every pod namespace attached to it by a veth. \
            Each overlay device (vxlan, geneve, wireguard, ipip, gre...) is held to its \
            underlay's MTU minus the encapsulation overhead (VXLAN 50 over IPv4, 70 over \
            IPv6; Geneve 50/70 plus options; WireGuard 60/80; IPIP 20; GRE 24; ...); each pod \
            interface and its node-side veth to the smallest limit of the node's overlays. \
            Then the PMTUD sysctls (net.ipv4.ip_no_pmtu_disc, net.ipv4.tcp_mtu_probing) of \
            each namespace, and the resulting overlay_mtu_mismatch and pmtud_disabled \
            findings.\n\n\
            Exits 0 whatever it finds; non-zero only when netlink cannot be read.",
        after_help = "Examples:\n  node-diag mtu\n  node-diag mtu -o json | jq '.findings'"
    )]
    Mtu(MtuArgs),
    /// List the Kubernetes Services kube-proxy programmed in this network namespace,
    /// read from its iptables or nftables rules (no API access needed).
    #[command(
        long_about = "List the Kubernetes Services kube-proxy programmed in this network \
            namespace, read from its rules alone: no API credentials, nothing changed.\n\n\
            Reads every ruleset present: the nft-backed iptables (iptables-nft-save, \
            ip6tables-nft-save, or iptables-save where those do not exist), the legacy \
            iptables when legacy tables are in use, and nftables' table ip/ip6 \
            kube-proxy (its maps by nft -j list map, its rules by a netlink dump). Each Service port is named as kube-proxy names it \
            (namespace/name:port-name, or namespace/name for an unnamed port), with its \
            ClusterIP, external and load-balancer IPs, its endpoints, or \"no endpoints\" \
            when kube-proxy rejects it for lack of any. Then what came of each ruleset.\n\n\
            Exits non-zero only when no ruleset could be read at all.",
        after_help = "Examples:\n  node-diag services\n  node-diag services --lookup 10.96.0.10:53 --proto udp\n  ip netns exec NODE node-diag services -o json | jq '.services[].name'"
    )]
    Services(ServicesArgs),
    /// Print a shell completion script: `node-diag completion bash > /etc/bash_completion.d/node-diag`.
    #[command(
        after_help = "Examples:\n  node-diag completion bash > /etc/bash_completion.d/node-diag\n  node-diag completion zsh > \"${fpath[1]}/_node-diag\"\n  node-diag completion fish > ~/.config/fish/completions/node-diag.fish"
    )]
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (node-diag.1 and one per subcommand) into DIR.
    #[command(hide = true)]
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct FindingsArgs {
    /// URL of the agent's findings endpoint: HOST:PORT (https:// with TLS flags), or
    /// http:// or https:// [default: 127.0.0.1:9465, else http://127.0.0.1:9464 for an
    /// agent serving findings beside its metrics].
    #[arg(long, value_name = "URL", conflicts_with = "cluster")]
    server: Option<String>,
    /// Every agent behind this headless Service (all its A and AAAA records), merged
    /// into one stream with a node column; e.g. node-diag.node-diag.svc.cluster.local.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// With --cluster: the agents' findings port [default: from the SRV record
    /// _findings._tcp.NAME, a Service port named `findings`].
    #[arg(long, value_name = "PORT", requires = "cluster")]
    port: Option<u16>,
    /// With --cluster: resolve NAME with this DNS server (IP or IP:PORT) instead of
    /// /etc/resolv.conf's.
    #[arg(long, value_name = "ADDR", requires = "cluster", value_parser = parse_dns_server)]
    dns_server: Option<std::net::SocketAddr>,
    /// TLS: the CA that signed the agents' certificates (PEM). Any TLS flag makes
    /// servers without a scheme https://.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// TLS: the client certificate (PEM) presented to agents that verify client
    /// certificates; with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// TLS: the client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// TLS: check the agents' certificates for this name (and send it as SNI) instead
    /// of their addresses, e.g. the Service's name every agent's certificate carries.
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Basic auth: the user, with --basic-auth-password-file.
    #[arg(long, value_name = "USER", requires = "basic_auth_password_file")]
    basic_auth_user: Option<String>,
    /// Basic auth: a file holding the password (a trailing newline is ignored).
    #[arg(long, value_name = "FILE", requires = "basic_auth_user")]
    basic_auth_password_file: Option<std::path::PathBuf>,
    /// Keep polling and print findings as they appear, grow or change status.
    #[arg(short, long)]
    follow: bool,
    /// Print only the N most recent findings first (default with --follow: 10; 0 prints
    /// only what comes next).
    #[arg(long, value_name = "N")]
    last: Option<usize>,
    /// Only these kinds (repeat, or separate with commas), e.g. tcp_timeout,tcp_refused.
    #[arg(long, value_name = "KIND", value_delimiter = ',', value_parser = parse_kind)]
    kind: Vec<findings::Kind>,
    /// Only findings at least this severe.
    #[arg(long, value_name = "info|warning|critical", value_parser = parse_severity)]
    severity: Option<findings::Severity>,
    /// Only findings whose pod or peer pod is in this Kubernetes namespace.
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Only findings whose pod or peer pod is POD (NAME or NAMESPACE/NAME).
    #[arg(long, value_name = "POD")]
    pod: Option<String>,
    /// Only findings seen since: a duration back (10m, 2h) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = client::query::parse_since)]
    since: Option<client::query::Since>,
    /// Only findings in these states (repeat, or separate with commas): active,
    /// resolved, superseded.
    #[arg(long, value_name = "STATUS", value_delimiter = ',', value_parser = parse_status)]
    status: Vec<findings::Status>,
    /// Output format: compact lines, those with detail under each, or JSON lines.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: FindingsFormat,
    /// Colour by severity: on a terminal unless NO_COLOR is set (auto), or always, or
    /// never.
    #[arg(long, value_enum, default_value = "auto", value_name = "WHEN")]
    color: ColorChoice,
}

impl FindingsArgs {
    fn options(self) -> Result<client::Options, client::transport::TransportError> {
        let no_color = std::env::var("NO_COLOR").ok();
        let color = output::use_color(
            self.color,
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
            no_color.as_deref(),
        );
        let client = client::transport::Client::new(&client::transport::TransportOptions {
            ca: self.tls_ca,
            cert: self.tls_cert,
            key: self.tls_key,
            server_name: self.tls_server_name,
            basic_auth: self.basic_auth_user.zip(self.basic_auth_password_file),
        })?;
        Ok(client::Options {
            server: self.server,
            follow: self.follow,
            last: self.last,
            filters: client::query::Filters {
                kinds: self.kind,
                severity: self.severity,
                namespace: self.namespace,
                pod: self.pod,
                since: self.since,
                statuses: self.status,
            },
            format: self.format,
            color,
            poll: Duration::from_secs(1),
            cluster: self.cluster.map(|name| client::cluster::Cluster {
                name,
                port: self.port,
                dns_server: self.dns_server,
            }),
            client,
        })
    }
}

/// `--dns-server`: `IP`, `IP:PORT` or `[IPv6]:PORT`; port 53 when not given.
fn parse_dns_server(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse::<std::net::SocketAddr>() {
        return Ok(addr);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT"))
}

fn parse_kind(s: &str) -> Result<findings::Kind, String> {
    client::query::parse_name(
        "kind",
        "a finding kind such as tcp_refused, tcp_timeout, pmtud_blackhole",
        s,
    )
}

fn parse_severity(s: &str) -> Result<findings::Severity, String> {
    client::query::parse_name("severity", "info, warning or critical", s)
}

fn parse_status(s: &str) -> Result<findings::Status, String> {
    client::query::parse_name("status", "active, resolved or superseded", s)
}

/// `--log-level`: a tracing filter, refused when it does not parse rather than quietly
/// replaced by `info`.
fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e} (expected a level such as info or debug, or target=level)"))
}

#[derive(clap::Args)]
struct DoctorArgs {
    /// The container runtime's CRI socket to check (default: the usual ones, as `run`).
    #[arg(long, value_name = "PATH")]
    cri_socket: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
}

#[derive(clap::Args)]
struct ProbeArgs {
    #[command(flatten)]
    probe: probe::ProbeOptions,
    /// Output format.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
}

#[derive(clap::Args)]
struct MtuArgs {
    /// Output format: a table, or one JSON object with `interfaces`, `sysctls` and
    /// `findings`.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
}

#[derive(clap::Args)]
struct ServicesArgs {
    /// Show only the Service answering on ADDR (IP:PORT), or whose endpoint it is.
    #[arg(long, value_name = "ADDR")]
    lookup: Option<SocketAddr>,
    /// Protocol of --lookup.
    #[arg(long, value_enum, default_value = "tcp", requires = "lookup")]
    proto: ServiceProto,
    /// Output format: a table, or one JSON object with `services` and `sources`.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ServiceProto {
    Tcp,
    Udp,
    Sctp,
}

impl ServiceProto {
    fn number(self) -> u8 {
        match self {
            ServiceProto::Tcp => ipproto::TCP,
            ServiceProto::Udp => ipproto::UDP,
            ServiceProto::Sctp => ipproto::SCTP,
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    // Checked by clap already.
    let mut filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if let Command::Run(args) = &cli.command
        && let Some(directive) = args.ebpf_log.directive()
    {
        filter = filter.add_directive(directive);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("node-diag: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Prints a command-line error as clap does; `probe` exits 1 for it, since its 2 means
/// "refused".
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = e.print();
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return ExitCode::SUCCESS;
    }
    if subcommand_of(std::env::args().skip(1)).as_deref() == Some("probe") {
        return ExitCode::from(probe::Exit::Error as u8);
    }
    ExitCode::from(e.exit_code().clamp(0, 255) as u8)
}

/// The subcommand named in `args`: the first word that is neither a flag nor the value
/// of `--log-level`.
fn subcommand_of(args: impl Iterator<Item = String>) -> Option<String> {
    let mut skip_value = false;
    for a in args {
        if skip_value {
            skip_value = false;
        } else if a == "--log-level" {
            skip_value = true;
        } else if !a.starts_with('-') {
            return Some(a);
        }
    }
    None
}

/// An error and its causes, `: `-separated, each once: a cause whose text the message
/// before it already carries is left out.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => {
            // Before the runtime's threads exist (see `agent::allocator`).
            agent::allocator::limit_arenas();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(agent::run(args))?;
            // Stop lingering blocking tasks instead of waiting for them.
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(ExitCode::SUCCESS)
        }
        Command::Findings(args) => {
            let some_unreachable = client::run(args.options()?)?;
            Ok(if some_unreachable {
                ExitCode::from(client::EXIT_SOME_UNREACHABLE)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Doctor(args) => {
            let report = doctor::run(args.cri_socket.as_deref());
            match args.format {
                OutputFormat::Text => print!("{}", report.text()),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(if report.verdict == "cannot_run" {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Probe(args) => {
            let report = probe::run(&args.probe)?;
            match args.format {
                OutputFormat::Text => print!("{}", report.text()),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(ExitCode::from(report.exit() as u8))
        }
        Command::Mtu(args) => {
            let snapshot = host_network::snapshot()
                .map_err(|e| anyhow::anyhow!("cannot read this node's interfaces: {e}"))?;
            let report = mtu::report(&snapshot, std::time::SystemTime::now());
            match args.format {
                OutputFormat::Text => print!("{}", report.text()),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Completion { shell } => {
            use clap::CommandFactory as _;
            cli_reference::completion(&mut Cli::command(), shell, &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir } => {
            use clap::CommandFactory as _;
            for page in cli_reference::man_pages(&Cli::command(), &dir)? {
                println!("{}", page.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Services(args) => {
            let (catalog, sources) = services::read()?;
            let report = match args.lookup {
                Some(addr) => {
                    services::Report::lookup(&catalog, sources, addr, args.proto.number())
                }
                None => services::Report::new(&catalog, sources),
            };
            match args.format {
                OutputFormat::Text => print!("{}", report.text()),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn findings_args(args: &[&str]) -> FindingsArgs {
        let argv = ["node-diag", "findings"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Findings(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn findings_flags_become_the_query() {
        let opts = findings_args(&[
            "--kind",
            "tcp_refused,tcp_timeout",
            "--kind",
            "pmtud_blackhole",
            "--severity",
            "warning",
            "--namespace",
            "shop",
            "--pod",
            "shop/cart",
            "--since",
            "10m",
            "--status",
            "active",
            "--status",
            "resolved",
            "--color",
            "never",
        ])
        .options()
        .unwrap();
        assert_eq!(
            opts.filters.query(10_000),
            "kind=tcp_refused,tcp_timeout,pmtud_blackhole&severity=warning&namespace=shop\
             &pod=shop/cart&since=10m&status=active,resolved&limit=10000"
        );
        assert!(!opts.color);
        assert_eq!(opts.server, None, "the default servers are tried in turn");
        assert_eq!(findings_args(&["-o", "wide"]).format, FindingsFormat::Wide);
        assert_eq!(findings_args(&["--follow", "--last", "0"]).last, Some(0));
    }

    #[test]
    fn invalid_values_are_errors() {
        for args in [
            &["node-diag", "--log-level", "info,=bogus[", "doctor"][..],
            &["node-diag", "findings", "--kind", "tcp_refsued"],
            &["node-diag", "findings", "--severity", "high"],
            &["node-diag", "findings", "--status", "gone"],
            &["node-diag", "findings", "--since", "yesterday"],
            &["node-diag", "findings", "--color", "sometimes"],
        ] {
            let err = Cli::try_parse_from(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?}"));
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{args:?}: {err}"
            );
        }
        for level in ["info", "debug", "node_diag=trace,warn"] {
            assert!(
                Cli::try_parse_from(["node-diag", "--log-level", level, "doctor"]).is_ok(),
                "{level}"
            );
        }
    }

    #[test]
    fn the_subcommand_is_found_past_global_flags() {
        let args = |a: &[&str]| subcommand_of(a.iter().map(|s| s.to_string()));
        assert_eq!(args(&["probe", "--bogus"]).as_deref(), Some("probe"));
        assert_eq!(
            args(&["--log-level", "debug", "probe", "x"]).as_deref(),
            Some("probe")
        );
        assert_eq!(args(&["--log-level=debug", "run"]).as_deref(), Some("run"));
        assert_eq!(args(&["--help"]), None);
    }

    #[test]
    fn each_cause_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot reach the agent: {0}")]
        struct Embeds(#[source] std::io::Error);
        let e = anyhow::Error::from(Embeds(std::io::Error::other("connection refused")));
        assert_eq!(
            error_chain(&e),
            "cannot reach the agent: connection refused"
        );
        let e = anyhow::anyhow!("refused").context("outer");
        assert_eq!(error_chain(&e), "outer: refused");
    }
}
