//! kube-proxy's rules for a ClusterIP Service, installed into a namespace as kube-proxy
//! itself writes them, in its iptables mode (nft-backed or legacy iptables) or its
//! nftables mode. They really forward: a connect to the ClusterIP reaches a backend
//! (DNAT, one backend picked at random), or is rejected with an ICMP port unreachable
//! when the Service has no endpoints.
//!
//! The shapes follow kubernetes/kubernetes `pkg/proxy/iptables/proxier.go` (and the
//! rules its `proxier_test.go` expects) and `pkg/proxy/nftables/proxier.go`, chain
//! names and hashes included. Left out: NodePorts, external and load-balancer IPs,
//! session affinity, and the masquerade of traffic from outside the cluster CIDR
//! (kube-proxy needs the cluster CIDR for it); the masquerade mark chains and the
//! hairpin mark of each endpoint are there.
//!
//! The rules live in the namespace and go with it; [`remove_kube_proxy_rules`] takes them
//! out earlier (a Service deleted, or a mode switched).

use std::{
    io::Write as _,
    net::{Ipv4Addr, SocketAddrV4},
    process::Stdio,
};

use crate::{Error, Result, cmd};

/// Which iptables kube-proxy's iptables mode writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesBackend {
    /// `iptables-nft`: iptables rules kept in nftables (Debian's default).
    Nft,
    /// `iptables-legacy`: the kernel's x_tables.
    Legacy,
}

impl IptablesBackend {
    fn iptables(self) -> &'static str {
        match self {
            IptablesBackend::Nft => "iptables-nft",
            IptablesBackend::Legacy => "iptables-legacy",
        }
    }

    fn restore(self) -> &'static str {
        match self {
            IptablesBackend::Nft => "iptables-nft-restore",
            IptablesBackend::Legacy => "iptables-legacy-restore",
        }
    }

    fn save(self) -> &'static str {
        match self {
            IptablesBackend::Nft => "iptables-nft-save",
            IptablesBackend::Legacy => "iptables-legacy-save",
        }
    }
}

/// A Service port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// As iptables, nft and kube-proxy's chain names write it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// One port of a ClusterIP Service, and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub namespace: String,
    pub name: String,
    /// The port's name; empty for an unnamed port.
    pub port_name: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub proto: Protocol,
    /// Endpoints (pod address and target port); empty: the Service has none and
    /// kube-proxy rejects connections to it.
    pub backends: Vec<SocketAddrV4>,
}

impl ServiceSpec {
    /// kube-proxy's name of the Service port (`ServicePortName.String()`):
    /// `ns/name:port` or, unnamed, `ns/name`.
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }
}

/// Masquerade mark, kube-proxy's default (`--iptables-masquerade-bit` 14).
const MASQ_MARK: &str = "0x4000";

/// Installs `svc` in network namespace `netns` as kube-proxy's iptables mode does,
/// through `backend`; the shared chains and jumps are created on first use.
pub fn install_iptables_service(
    netns: &str,
    backend: IptablesBackend,
    svc: &ServiceSpec,
) -> Result<()> {
    ensure_iptables_base(netns, backend)?;
    restore(netns, backend.restore(), &iptables_service_rules(svc))
}

/// The `iptables-restore --noflush` input for one Service: its REJECT in the filter
/// table, or its KUBE-SVC and KUBE-SEP chains in the nat table.
fn iptables_service_rules(svc: &ServiceSpec) -> String {
    let name = svc.port_name_string();
    let proto = svc.proto.name();
    let (ip, port) = (svc.cluster_ip, svc.port);
    if svc.backends.is_empty() {
        return format!(
            "*filter\n\
             -A KUBE-SERVICES -m comment --comment \"{name} has no endpoints\" -m {proto} -p {proto} -d {ip} --dport {port} -j REJECT\n\
             COMMIT\n"
        );
    }
    let svc_chain = format!("KUBE-SVC-{}", hash(&format!("{name}{proto}"), 16));
    let seps: Vec<(String, SocketAddrV4)> = svc
        .backends
        .iter()
        .map(|ep| {
            let chain = format!("KUBE-SEP-{}", hash(&format!("{name}{proto}{ep}"), 16));
            (chain, *ep)
        })
        .collect();
    let mut out = String::from("*nat\n");
    out += &format!(":{svc_chain} - [0:0]\n");
    for (chain, _) in &seps {
        out += &format!(":{chain} - [0:0]\n");
    }
    out += &format!(
        "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {ip} --dport {port} -j {svc_chain}\n"
    );
    let n = seps.len();
    for (i, (chain, ep)) in seps.iter().enumerate() {
        // Each rule takes 1/(remaining) of what reaches it: uniform over all endpoints.
        let statistic = if i + 1 < n {
            format!(
                " -m statistic --mode random --probability {:.10}",
                1.0 / (n - i) as f64
            )
        } else {
            String::new()
        };
        out += &format!(
            "-A {svc_chain} -m comment --comment \"{name} -> {ep}\"{statistic} -j {chain}\n"
        );
    }
    for (chain, ep) in &seps {
        out += &format!(
            "-A {chain} -m comment --comment {name} -s {} -j KUBE-MARK-MASQ\n",
            ep.ip()
        );
        out += &format!(
            "-A {chain} -m comment --comment {name} -m {proto} -p {proto} -j DNAT --to-destination {ep}\n"
        );
    }
    out += "COMMIT\n";
    out
}

/// kube-proxy's shared chains and the jumps to them from the built-in chains, unless
/// already there.
fn ensure_iptables_base(netns: &str, backend: IptablesBackend) -> Result<()> {
    let ipt = backend.iptables();
    for (table, chain) in [
        ("nat", "KUBE-SERVICES"),
        ("nat", "KUBE-MARK-MASQ"),
        ("nat", "KUBE-POSTROUTING"),
        ("filter", "KUBE-SERVICES"),
    ] {
        if !cmd::try_run_in(netns, &[ipt, "-t", table, "-n", "-L", chain])?
            .status
            .success()
        {
            cmd::run_in(netns, &[ipt, "-t", table, "-N", chain])?;
        }
    }
    for (table, rule) in base_rules() {
        let check = iptables_rule(ipt, table, "-C", &rule);
        if !cmd::try_run_in(netns, &check)?.status.success() {
            cmd::run_in(netns, &iptables_rule(ipt, table, "-A", &rule))?;
        }
    }
    Ok(())
}

/// The rules kube-proxy keeps in shared and built-in chains: the jumps to
/// KUBE-SERVICES (nat: every packet; filter: new connections, where the REJECTs
/// are), and masquerading of marked packets. Each is its table and its arguments in
/// the order kube-proxy writes them, which `iptables -C` needs to find it.
fn base_rules() -> [(&'static str, Vec<&'static str>); 8] {
    const NEW: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];
    const PORTALS: &str = "kubernetes service portals";
    // (table, chain, matches, comment, target with its options)
    let rules: [(_, _, &[&str], _, &[&str]); 8] = [
        ("nat", "PREROUTING", &[], Some(PORTALS), &["KUBE-SERVICES"]),
        ("nat", "OUTPUT", &[], Some(PORTALS), &["KUBE-SERVICES"]),
        (
            "nat",
            "POSTROUTING",
            &[],
            Some("kubernetes postrouting rules"),
            &["KUBE-POSTROUTING"],
        ),
        (
            "nat",
            "KUBE-MARK-MASQ",
            &[],
            None,
            &["MARK", "--or-mark", MASQ_MARK],
        ),
        (
            "nat",
            "KUBE-POSTROUTING",
            &["-m", "mark", "!", "--mark", "0x4000/0x4000"],
            None,
            &["RETURN"],
        ),
        (
            "nat",
            "KUBE-POSTROUTING",
            &[],
            Some("kubernetes service traffic requiring SNAT"),
            &["MASQUERADE"],
        ),
        ("filter", "FORWARD", NEW, Some(PORTALS), &["KUBE-SERVICES"]),
        ("filter", "OUTPUT", NEW, Some(PORTALS), &["KUBE-SERVICES"]),
    ];
    rules.map(|(table, chain, matches, comment, target)| {
        let mut rule = vec![chain];
        rule.extend_from_slice(matches);
        if let Some(comment) = comment {
            rule.extend(["-m", "comment", "--comment", comment]);
        }
        rule.push("-j");
        rule.extend_from_slice(target);
        (table, rule)
    })
}

/// `<ipt> -t <table> <op> <rule...>`, e.g. `-C` to check for a base rule.
fn iptables_rule<'a>(ipt: &'a str, table: &'a str, op: &'a str, rule: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec![ipt, "-t", table, op];
    argv.extend_from_slice(rule);
    argv
}

/// Installs `svc` in network namespace `netns` as kube-proxy's nftables mode does
/// (table `ip kube-proxy`); the table, its base chains and maps are created on first
/// use.
pub fn install_nftables_service(netns: &str, svc: &ServiceSpec) -> Result<()> {
    if !cmd::try_run_in(netns, &["nft", "list", "table", "ip", "kube-proxy"])?
        .status
        .success()
    {
        nft(netns, NFT_BASE)?;
    }
    nft(netns, &nft_service_rules(svc))
}

/// kube-proxy's table for IPv4 as `setupNFTables` builds it (the parts a ClusterIP
/// needs), in the `add ...` form its nftables library writes. Priorities are numbers:
/// nft 1.0.6 refuses `dstnat` on the input and output hooks.
const NFT_BASE: &str = r#"add table ip kube-proxy { comment "rules for kube-proxy" ; }
add chain ip kube-proxy filter-input { type filter hook input priority -110 ; policy accept ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; policy accept ; }
add chain ip kube-proxy filter-output { type filter hook output priority -110 ; policy accept ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; policy accept ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; policy accept ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; policy accept ; }
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
"#;

/// One Service's elements, chains and rules in table `ip kube-proxy`.
fn nft_service_rules(svc: &ServiceSpec) -> String {
    let name = svc.port_name_string();
    let proto = svc.proto.name();
    let (ip, port) = (svc.cluster_ip, svc.port);
    if svc.backends.is_empty() {
        return format!(
            "add element ip kube-proxy no-endpoint-services {{ {ip} . {proto} . {port} comment \"{name}\" : goto reject-chain }}\n"
        );
    }
    // `<ns>/<name>/<proto>/<port name>`, prefixed with 8 characters of its own hash.
    let base = format!("{}/{}/{proto}/{}", svc.namespace, svc.name, svc.port_name);
    let svc_chain = format!("service-{}-{base}", hash(&base, 8));
    let mut out = format!("add chain ip kube-proxy {svc_chain}\n");
    let mut vmap = Vec::new();
    for (i, ep) in svc.backends.iter().enumerate() {
        let ep_base = format!("{base}__{}/{}", ep.ip(), ep.port());
        let chain = format!("endpoint-{}-{ep_base}", hash(&ep_base, 8));
        out += &format!("add chain ip kube-proxy {chain}\n");
        out += &format!(
            "add rule ip kube-proxy {chain} ip saddr {} jump mark-for-masquerade\n",
            ep.ip()
        );
        out += &format!("add rule ip kube-proxy {chain} meta l4proto {proto} dnat to {ep}\n");
        vmap.push(format!("{i} : goto {chain}"));
    }
    out += &format!(
        "add rule ip kube-proxy {svc_chain} numgen random mod {} vmap {{ {} }}\n",
        svc.backends.len(),
        vmap.join(" , ")
    );
    out += &format!(
        "add element ip kube-proxy service-ips {{ {ip} . {proto} . {port} : goto {svc_chain} }}\n"
    );
    out
}

/// kube-proxy's REJECT for the IPv6 ClusterIP `ip`:`port` (TCP) of Service port `name`
/// (`ns/name:port`) without endpoints, as its IPv6 proxier writes it in `netns`: through
/// ip6tables with `backend` (`-j REJECT --reject-with icmp6-port-unreachable` in the
/// filter table's KUBE-SERVICES, jumped to from OUTPUT and FORWARD for new connections),
/// or, with `None`, in nftables' table `ip6 kube-proxy` (`no-endpoint-services`, whose
/// `reject-chain` answers with ICMPv6 port unreachable). Only the filter side: a Service
/// without endpoints has no NAT rules.
pub fn install_ipv6_no_endpoints(
    netns: &str,
    backend: Option<IptablesBackend>,
    name: &str,
    ip: std::net::Ipv6Addr,
    port: u16,
) -> Result<()> {
    let Some(backend) = backend else {
        return nft(
            netns,
            &format!(
                r#"add table ip6 kube-proxy {{ comment "rules for kube-proxy" ; }}
add chain ip6 kube-proxy filter-forward {{ type filter hook forward priority -110 ; policy accept ; }}
add chain ip6 kube-proxy filter-output {{ type filter hook output priority -110 ; policy accept ; }}
add chain ip6 kube-proxy service-endpoints-check
add chain ip6 kube-proxy reject-chain {{ comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }}
add map ip6 kube-proxy no-endpoint-services {{ type ipv6_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }}
add rule ip6 kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip6 kube-proxy reject-chain reject
add rule ip6 kube-proxy service-endpoints-check ip6 daddr . meta l4proto . th dport vmap @no-endpoint-services
add element ip6 kube-proxy no-endpoint-services {{ {ip} . tcp . {port} comment "{name}" : goto reject-chain }}
"#
            ),
        );
    };
    let tool = match backend {
        IptablesBackend::Nft => "ip6tables-nft-restore",
        IptablesBackend::Legacy => "ip6tables-legacy-restore",
    };
    restore(
        netns,
        tool,
        &format!(
            "*filter\n\
             :KUBE-SERVICES - [0:0]\n\
             -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A KUBE-SERVICES -d {ip}/128 -p tcp -m comment --comment \"{name} has no endpoints\" -m tcp --dport {port} -j REJECT --reject-with icmp6-port-unreachable\n\
             COMMIT\n"
        ),
    )
}

/// Removes every kube-proxy rule from `netns`: the `ip kube-proxy` table, and the
/// KUBE-* chains and the jumps to them from both iptables backends.
pub fn remove_kube_proxy_rules(netns: &str) -> Result<()> {
    if cmd::try_run_in(netns, &["nft", "list", "table", "ip", "kube-proxy"])?
        .status
        .success()
    {
        cmd::run_in(netns, &["nft", "delete", "table", "ip", "kube-proxy"])?;
    }
    for backend in [IptablesBackend::Nft, IptablesBackend::Legacy] {
        let ipt = backend.iptables();
        let saved = cmd::try_run_in(netns, &[backend.save()])?;
        if !String::from_utf8_lossy(&saved.stdout).contains("KUBE-") {
            continue;
        }
        for (table, rule) in base_rules() {
            let check = iptables_rule(ipt, table, "-C", &rule);
            while cmd::try_run_in(netns, &check)?.status.success() {
                cmd::run_in(netns, &iptables_rule(ipt, table, "-D", &rule))?;
            }
        }
        for table in ["filter", "nat"] {
            let listing = cmd::run_in(netns, &[ipt, "-t", table, "-S"])?;
            let chains: Vec<&str> = listing
                .lines()
                .filter_map(|l| l.strip_prefix("-N "))
                .filter(|c| c.starts_with("KUBE-"))
                .collect();
            // Flush them all first: KUBE-SERVICES jumps to KUBE-SVC-*, which can go
            // only once nothing refers to it.
            for chain in &chains {
                cmd::run_in(netns, &[ipt, "-t", table, "-F", chain])?;
            }
            for chain in &chains {
                cmd::run_in(netns, &[ipt, "-t", table, "-X", chain])?;
            }
        }
    }
    Ok(())
}

/// Installs every Service of `svcs` in `netns` at once, as one kube-proxy sync writes
/// them: one `iptables-restore --noflush` (through `backend`) or, with `None`, one
/// `nft -f` input (table `ip kube-proxy`). For thousands of Services (the bench's
/// scale workload), where one command per Service would take minutes.
pub fn install_services(
    netns: &str,
    backend: Option<IptablesBackend>,
    svcs: &[ServiceSpec],
) -> Result<()> {
    let Some(backend) = backend else {
        let mut input = String::new();
        if !cmd::try_run_in(netns, &["nft", "list", "table", "ip", "kube-proxy"])?
            .status
            .success()
        {
            input += NFT_BASE;
        }
        for svc in svcs {
            input += &nft_service_rules(svc);
        }
        return nft(netns, &input);
    };
    ensure_iptables_base(netns, backend)?;
    // One block per table: its chain declarations first, then its rules.
    let mut tables: [(&str, String, String); 2] = [
        ("nat", String::new(), String::new()),
        ("filter", String::new(), String::new()),
    ];
    for svc in svcs {
        let mut table = None;
        for line in iptables_service_rules(svc).lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = tables.iter().position(|(t, _, _)| *t == name);
            } else if line == "COMMIT" {
                table = None;
            } else if let Some(i) = table {
                let part = if line.starts_with(':') {
                    &mut tables[i].1
                } else {
                    &mut tables[i].2
                };
                part.push_str(line);
                part.push('\n');
            }
        }
    }
    let mut input = String::new();
    for (table, chains, rules) in &tables {
        if !chains.is_empty() || !rules.is_empty() {
            input += &format!("*{table}\n{chains}{rules}COMMIT\n");
        }
    }
    restore(netns, backend.restore(), &input)
}

/// Removes every kube-proxy rule [`install_services`] wrote with `backend` at once: the
/// `nat` and `filter` tables flushed whole (every chain in them, not only KUBE-*), or
/// table `ip kube-proxy` deleted. For namespaces that hold nothing else there.
pub fn flush_services(netns: &str, backend: Option<IptablesBackend>) -> Result<()> {
    match backend {
        Some(backend) => pipe(
            netns,
            &[backend.restore()],
            "*nat\nCOMMIT\n*filter\nCOMMIT\n",
        ),
        None => {
            if cmd::try_run_in(netns, &["nft", "list", "table", "ip", "kube-proxy"])?
                .status
                .success()
            {
                cmd::run_in(netns, &["nft", "delete", "table", "ip", "kube-proxy"])?;
            }
            Ok(())
        }
    }
}

/// Runs `restore --noflush` in `netns` with `input` on stdin: only the chains the input
/// declares are flushed, everything else stays.
fn restore(netns: &str, restore: &str, input: &str) -> Result<()> {
    pipe(netns, &[restore, "--noflush"], input)
}

/// Runs `nft -f -` in `netns` with `input` on stdin.
fn nft(netns: &str, input: &str) -> Result<()> {
    pipe(netns, &["nft", "-f", "-"], input)
}

fn pipe(netns: &str, argv: &[&str], input: &str) -> Result<()> {
    let mut command = cmd::exec_in(netns, argv);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = cmd::display(&command);
    let mut child = command.spawn().map_err(|source| Error::Spawn {
        command: shown.clone(),
        source,
    })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| Error::io(format!("writing to {shown}"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for {shown}"), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
            stdout: format!("(input)\n{input}"),
        });
    }
    Ok(())
}

/// kube-proxy's chain-name hash: the first `len` characters of the base32 (RFC 4648,
/// upper case) of the SHA-256 of `s`.
fn hash(s: &str, len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = sha256(s.as_bytes());
    let mut out = String::with_capacity(len);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &byte in &digest {
        if out.len() == len {
            break;
        }
        acc = (acc << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 && out.len() < len {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
        acc &= (1 << bits) - 1;
    }
    out
}

/// SHA-256 (FIPS 180-4), for the chain-name hash only: a dependency would be more code
/// than this.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_hashes_are_kube_proxys() {
        // kube-dns's chain on every cluster, and names checked against Python's
        // hashlib + base64.b32encode.
        assert_eq!(hash("kube-system/kube-dns:dnsudp", 16), "TCOU7JCQXEZGVUNU");
        assert_eq!(
            hash("default/web:httptcp10.244.1.5:8080", 16),
            "AFGSLHOD2HFNCBX4"
        );
        assert_eq!(hash("default/web/tcp/http", 8), "SUSTUHLJ");
        assert_eq!(hash("", 8), "4OYMIQUY");
    }

    #[test]
    fn iptables_rules_of_two_endpoints() {
        let svc = ServiceSpec {
            namespace: "default".into(),
            name: "web".into(),
            port_name: "http".into(),
            cluster_ip: Ipv4Addr::new(10, 96, 0, 20),
            port: 80,
            proto: Protocol::Tcp,
            backends: vec![
                "10.244.1.5:8080".parse().unwrap(),
                "10.244.2.6:8080".parse().unwrap(),
            ],
        };
        let rules = iptables_service_rules(&svc);
        assert!(rules.contains(
            "-A KUBE-SERVICES -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.20 --dport 80 -j KUBE-SVC-CDGGSHYLG3RE2FKL\n"
        ), "{rules}");
        assert!(rules.contains(
            "-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-AFGSLHOD2HFNCBX4\n"
        ), "{rules}");
        assert!(rules.contains(
            "-A KUBE-SEP-3OLK2YUW6LHBC4UX -m comment --comment default/web:http -m tcp -p tcp -j DNAT --to-destination 10.244.2.6:8080\n"
        ), "{rules}");
    }
}
