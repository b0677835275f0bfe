//! A cluster's control network around node namespaces: a management namespace with a
//! real DNS server (dnsmasq) serving the agents' headless Service, and a link from every
//! node to it.
//!
//! ```text
//!   mgmt namespace: dnsmasq on 10.77.0.254:53, the client runs here
//!     md0 (macvlan, bridge mode, on a veth pair kept in mgmt) 10.77.0.254/24
//!        |-- md0 in node 1  10.77.0.1/24
//!        |-- md0 in node 2  10.77.0.2/24
//!        `-- md0 in node 3  10.77.0.3/24
//! ```
//!
//! The nodes join it by macvlan, not veth: the agent takes a namespace linked to its own
//! by a veth for a pod of its node, and the management namespace is nobody's pod.
//!
//! The Service name's A records are every node's address, and `_findings._tcp.NAME` an
//! SRV record with the agents' port, as Kubernetes' DNS serves a headless Service with a
//! port named `findings` (`--local` makes dnsmasq authoritative for the zone, so a
//! missing AAAA is an empty answer rather than a refusal).
//!
//! Dropping it stops dnsmasq, then deletes the management namespace (with the parent
//! veth and its macvlans) and the namespaces it created; nodes it was given keep theirs.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    AgentHost, Error, Result, cmd,
    netns::Netns,
    process::{die_with_parent, send_signal, wait_timeout},
};

/// The headless Service's name.
pub const SERVICE: &str = "node-diag.node-diag.svc.cluster.local";
/// The agents' findings port, in the SRV record.
pub const FINDINGS_PORT: u16 = 9465;
/// The management device in every namespace.
const DEV: &str = "md0";

/// One node on the management network.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its network namespace.
    pub netns: String,
    /// Its management address.
    pub addr: Ipv4Addr,
}

impl Node {
    /// Where its agent serves findings: `addr:FINDINGS_PORT`.
    pub fn listen(&self) -> String {
        format!("{}:{FINDINGS_PORT}", self.addr)
    }
}

impl AgentHost for Node {
    fn agent_netns(&self) -> &str {
        &self.netns
    }
}

/// dnsmasq in the management namespace, stopped on drop.
struct Dnsmasq(Child);

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = send_signal(self.0.id(), libc::SIGTERM);
        if !matches!(
            wait_timeout(&mut self.0, Duration::from_secs(3)),
            Ok(Some(_))
        ) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The management network, its DNS server and its nodes.
pub struct ClusterNet {
    /// The management namespace: the DNS server's, where a client runs.
    pub mgmt: String,
    /// The DNS server.
    pub dns: SocketAddr,
    /// Every node, in address order.
    pub nodes: Vec<Node>,
    // Dropped in this order: dnsmasq, then the namespaces.
    dnsmasq: Option<Dnsmasq>,
    namespaces: Vec<Netns>,
}

impl ClusterNet {
    /// Joins the existing node namespaces `nodes` and `extra` new ones
    /// (`<base>-n<i>`, empty but for their management link) to a new management
    /// namespace `<base>-mg`, and starts dnsmasq there with `SERVICE` resolving to
    /// every node. Waits until it answers.
    pub fn build(base: &str, nodes: &[&str], extra: usize) -> Result<ClusterNet> {
        crate::require_root()?;
        let mgmt = Netns::create(&format!("{base}-mg"))?;
        let mut namespaces = vec![mgmt];
        let mut names: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        for i in 0..extra {
            let ns = Netns::create(&format!("{base}-n{}", nodes.len() + i + 1))?;
            names.push(ns.name().to_owned());
            namespaces.push(ns);
        }
        let mgmt = namespaces[0].name().to_owned();
        let gateway = Ipv4Addr::new(10, 77, 0, 254);
        let ip = |args: &[&str]| {
            let mut argv = vec!["ip", "-n", &mgmt];
            argv.extend_from_slice(args);
            cmd::run(&argv).map(|_| ())
        };
        // A veth pair inside mgmt is the macvlans' parent: it needs a carrier.
        ip(&[
            "link", "add", "mgp0", "type", "veth", "peer", "name", "mgp1",
        ])?;
        ip(&["link", "set", "mgp0", "up"])?;
        ip(&["link", "set", "mgp1", "up"])?;
        let macvlan = |name: &str| {
            ip(&[
                "link", "add", name, "link", "mgp0", "type", "macvlan", "mode", "bridge",
            ])
        };
        macvlan(DEV)?;
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", DEV])?;
        ip(&["link", "set", DEV, "up"])?;
        let mut members = Vec::new();
        for (i, node) in names.iter().enumerate() {
            let addr = Ipv4Addr::new(10, 77, 0, i as u8 + 1);
            let tmp = format!("md{}", i + 1);
            macvlan(&tmp)?;
            ip(&["link", "set", &tmp, "netns", node])?;
            let in_node = |args: &[&str]| {
                let mut argv = vec!["ip", "-n", node.as_str()];
                argv.extend_from_slice(args);
                cmd::run(&argv).map(|_| ())
            };
            in_node(&["link", "set", &tmp, "name", DEV])?;
            in_node(&["addr", "add", &format!("{addr}/24"), "dev", DEV])?;
            in_node(&["link", "set", DEV, "up"])?;
            members.push(Node {
                netns: node.clone(),
                addr,
            });
        }

        let mut argv: Vec<String> = [
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--pid-file=",
            "--bind-interfaces",
            "--port=53",
            "--user=root",
            "--log-facility=-",
            "--log-queries",
            "--local=/cluster.local/",
        ]
        .map(String::from)
        .to_vec();
        argv.push(format!("--listen-address={gateway}"));
        for m in &members {
            argv.push(format!("--host-record={SERVICE},{}", m.addr));
        }
        argv.push(format!(
            "--srv-host=_findings._tcp.{SERVICE},{SERVICE},{FINDINGS_PORT}"
        ));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut command = cmd::exec_in(&mgmt, &argv);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        let child = spawn(&mut command)?;
        let net = ClusterNet {
            mgmt,
            dns: SocketAddr::from((gateway, 53)),
            nodes: members,
            dnsmasq: Some(Dnsmasq(child)),
            namespaces,
        };
        net.wait_dns(Duration::from_secs(5))?;
        Ok(net)
    }

    /// Waits until dnsmasq answers on its port (it binds after parsing its options).
    fn wait_dns(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = cmd::try_run_in(&self.mgmt, &["ss", "-Hlun", "sport", "= :53"])?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Unreachable {
                    from: self.mgmt.clone(),
                    to: self.dns.to_string(),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The namespaces it made (management, then the extra nodes).
    pub fn netns_names(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// Stops the DNS server now (it is stopped on drop anyway).
    pub fn stop_dns(&mut self) {
        self.dnsmasq = None;
    }
}

fn spawn(command: &mut Command) -> Result<Child> {
    command.spawn().map_err(|source| Error::Spawn {
        command: cmd::display(command),
        source,
    })
}
