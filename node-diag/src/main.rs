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
use output::OutputFormat;

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
    #[arg(long, global = true, env = "NODE_DIAG_LOG", default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: load the eBPF programs, print findings, serve /metrics and /findings.
    Run(agent::RunOptions),
    /// Print the findings of a running agent.
    Findings(FindingsArgs),
    /// Check which kernel features the agent can use on this node.
    Doctor(DoctorArgs),
    /// Find the path MTU to DST by a DF binary search (ICMP echo, like `ping -M do -s N`),
    /// tell a working PMTUD from a black hole, and optionally check a TCP port.
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
            iptables when legacy tables are in use, and nftables (nft -j list table \
            ip/ip6 kube-proxy). Each Service port is named as kube-proxy names it \
            (namespace/name:port-name, or namespace/name for an unnamed port), with its \
            ClusterIP, external and load-balancer IPs, its endpoints, or \"no endpoints\" \
            when kube-proxy rejects it for lack of any. Then what came of each ruleset.\n\n\
            Exits non-zero only when no ruleset could be read at all.",
        after_help = "Examples:\n  node-diag services\n  node-diag services --lookup 10.96.0.10:53 --proto udp\n  ip netns exec NODE node-diag services -o json | jq '.services[].name'"
    )]
    Services(ServicesArgs),
}

#[derive(clap::Args)]
struct FindingsArgs {
    /// URL of the agent's findings listener (its --findings-listen).
    #[arg(long, default_value = "http://127.0.0.1:9465", value_name = "URL")]
    server: String,
    /// Keep polling and print findings as they appear or grow.
    #[arg(short, long)]
    follow: bool,
    /// Output format.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
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
    let cli = Cli::parse();
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
            eprintln!("node-diag: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => {
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
            client::run(
                &args.server,
                args.follow,
                args.format,
                Duration::from_secs(1),
            )?;
            Ok(ExitCode::SUCCESS)
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
            Ok(ExitCode::SUCCESS)
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
