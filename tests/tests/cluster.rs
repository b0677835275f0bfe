//! `node-diag findings --cluster`: three agents in three node namespaces behind a
//! headless-Service-shaped name that a real dnsmasq serves (A records for every node's
//! address, `_findings._tcp.NAME` SRV with their port), read by the real client in the
//! management namespace as an SRE's laptop or a debug pod would.
//!
//! Node 1 and node 2 are the testbed's two nodes (vxlan overlay, one pod each); node 3
//! has only its management link. Each agent is named (`--node-name`) node-a, node-b,
//! node-c and serves `/findings` on its management address (`--findings-listen`).
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask integration`), one test at a time:
//! `cargo test -p node-diag-tests --test cluster -- --test-threads=1`.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use node_diag_testbed::cluster::{ClusterNet, Node, SERVICE};
use node_diag_testbed::pki::{TempDir, make_pki};
use node_diag_tests::finding::{field, flow_is};
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, in_netns, node_diag_bin, ok,
    policy, tcp_connect, unique_name,
};
use serde_json::Value;
use socket2::Socket;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// Long enough for a connect's SYN and its retransmits at 1 s and 3 s.
const TIMING_OUT: Duration = Duration::from_secs(4);

/// The testbed topology, its cluster network around node A, node B and a third node.
fn cluster() -> (Topology, ClusterNet) {
    let topo = Topology::new();
    let net = ok(ClusterNet::build(
        &format!("{}c", unique_name()),
        &[&topo.node_a, &topo.node_b],
        1,
    ));
    (topo, net)
}

/// The agent of `node`, named `name`, serving `/findings` on its management address.
fn start_agent<'t>(node: &'t Node, name: &str) -> Agent<'t> {
    let listen = node.listen();
    Agent::start_ready_in_with_args(node, &["--node-name", name, "--findings-listen", &listen])
}

/// `node-diag findings --cluster SERVICE` run in the management namespace with `args`.
fn findings_cluster(net: &ClusterNet, args: &[&str]) -> Output {
    let dns = net.dns.to_string();
    let bin = node_diag_bin();
    let mut argv = vec![
        bin.to_str().unwrap(),
        "findings",
        "--cluster",
        SERVICE,
        "--dns-server",
        &dns,
        "--color",
        "never",
    ];
    argv.extend_from_slice(args);
    cmd::try_run_in(&net.mgmt, &argv)
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The JSON lines of an `-o json` run.
fn json_lines(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A connect from `node`'s own namespace to a closed port of its loopback: refused at
/// once, a `tcp_refused` / `listener` finding of that node's agent.
fn refuse_on(agent: &Agent, node: &Node, port: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let outcome = tcp_connect(&node.netns, addr, Duration::from_secs(2));
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    agent.wait_served(
        |f| field(f, "kind") == "tcp_refused" && f["dport"].as_u64() == Some(u64::from(port)),
        Duration::from_secs(4),
    );
}

/// Three agents, one finding each: one merged stream in text (the node column) and in
/// JSON, `--follow` across all of them; then node C's agent stops, and the other two
/// are still shown while node C's address is named and the exit status says so.
#[test]
fn three_agents_make_one_stream_and_a_down_agent_is_named() {
    let (_topo, net) = cluster();
    let mut agents: Vec<Agent> = net
        .nodes
        .iter()
        .zip(NODES)
        .map(|(n, name)| start_agent(n, name))
        .collect();
    for (i, (agent, node)) in agents.iter().zip(&net.nodes).enumerate() {
        refuse_on(agent, node, 7001 + i as u16);
    }

    let out = findings_cluster(&net, &[]);
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    for (i, name) in NODES.iter().enumerate() {
        let port = format!("127.0.0.1:{} ", 7001 + i);
        let line = stdout
            .lines()
            .find(|l| l.contains(&port))
            .unwrap_or_else(|| panic!("no line for {name}'s finding:\n{stdout}"));
        // `HH:MM:SS node SEV kind/layer ...`: the node column after the time.
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[1], *name, "{line}");
        assert_eq!(cols[3], "tcp_refused/listener", "{line}");
    }
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));

    let out = findings_cluster(&net, &["-o", "json", "--kind", "tcp_refused"]);
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&out);
    let nodes: BTreeSet<&str> = lines.iter().map(|f| field(f, "node")).collect();
    assert_eq!(nodes, NODES.into_iter().collect(), "{lines:#?}");
    assert!(lines.iter().all(|f| f["id"].is_string()), "{lines:#?}");

    // --follow across all: a finding made on node B after the start is printed.
    let bin = node_diag_bin();
    let dns = net.dns.to_string();
    let mut follow = node_diag_testbed::cmd::exec_in(
        &net.mgmt,
        &[
            bin.to_str().unwrap(),
            "findings",
            "--cluster",
            SERVICE,
            "--dns-server",
            &dns,
            "--follow",
            "--last",
            "0",
            "-o",
            "json",
        ],
    );
    let mut child = follow
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn findings --follow");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    thread::sleep(Duration::from_secs(2));
    refuse_on(&agents[1], &net.nodes[1], 7010);
    let deadline = Instant::now() + Duration::from_secs(6);
    let seen = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let f: Value = serde_json::from_str(&line).expect("a JSON line");
                assert_ne!(
                    f["dport"].as_u64(),
                    Some(7001),
                    "--last 0 prints only what comes next: {f:#}"
                );
                if f["dport"].as_u64() == Some(7010) {
                    break f;
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("--follow printed no finding for port 7010");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(field(&seen, "node"), "node-b", "{seen:#}");

    // Node C's agent goes away.
    agents[2].kill();
    let out = findings_cluster(&net, &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    for (i, name) in NODES[..2].iter().enumerate() {
        let port = format!("127.0.0.1:{} ", 7001 + i);
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(&port) && l.split_whitespace().nth(1) == Some(name)),
            "{name} still shown:\n{stdout}"
        );
    }
    assert!(!stdout.contains("node-c"), "{stdout}");
    let down = net.nodes[2].listen();
    assert!(
        stderr.contains(&format!("agent {down} did not answer")),
        "{stderr}"
    );
    let out = findings_cluster(&net, &["-o", "json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let lines = json_lines(&out);
    let unreachable: Vec<&Value> = lines
        .iter()
        .filter_map(|l| l.get("agent_unreachable"))
        .collect();
    assert_eq!(unreachable.len(), 1, "{lines:#?}");
    assert_eq!(unreachable[0]["agent"], down.as_str(), "{lines:#?}");
    let nodes: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l.get("kind").is_some())
        .map(|f| field(f, "node"))
        .collect();
    assert_eq!(nodes, NODES[..2].iter().copied().collect(), "{lines:#?}");
}

fn is_kind_to(f: &Value, kind: &str, topo: &Topology, port: u16) -> bool {
    field(f, "kind") == kind && flow_is(f, topo.pod_a_ip, topo.pod_b_ip, port)
}

/// Pod A (node A) connects to pod B (node B), whose ingress policy on node B drops the
/// SYNs: node A's agent has a `tcp_timeout` it cannot explain, node B's an inbound
/// `tcp_syn_dropped` naming the rule. The cluster view shows one joined verdict on node
/// A naming node B and the drop, both originals referenced by id. The control: a
/// connect to another port of pod B, its SYNs dropped inside pod B (no inbound drop of
/// that flow on node B) stays a plain, unjoined timeout.
#[test]
fn a_policy_drop_on_node_b_joins_the_clients_timeout_on_node_a() {
    let (topo, net) = cluster();
    // Each node routes the other's overlay address through the tunnel, as flannel's
    // VTEP addresses are routed (inside each node's pod CIDR): node A's path probe of
    // an unexplained timeout, sent from its overlay address, then gets pod B's echo
    // replies back, and judges the path as passing, not the overlay as lost.
    for (node, peer) in [
        (&topo.node_a, topo.node_b_overlay),
        (&topo.node_b, topo.node_a_overlay),
    ] {
        let peer = format!("{peer}/32");
        cmd::run_in(node, &["ip", "route", "add", &peer, "dev", "vx0"]);
    }
    let agents: Vec<Agent> = net
        .nodes
        .iter()
        .zip(NODES)
        .map(|(n, name)| start_agent(n, name))
        .collect();
    let (joined_port, control_port) = (9431, 9432);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(joined_port), ServerMode::Echo);
    let _control = TcpServer::start(&topo.pod_b, topo.pod_b_addr(control_port), ServerMode::Echo);
    // Node B's Calico-style ingress policy for pod B drops TCP to the port.
    policy::ingress(&topo.node_b, "iptables-nft", joined_port, &["DROP"]);
    cmd::run_in(
        &topo.pod_b,
        &[
            "nft",
            &format!(
                "add table inet podfw; add chain inet podfw input {{ type filter hook input priority 0; }}; add rule inet podfw input tcp dport {control_port} drop"
            ),
        ],
    );

    for port in [joined_port, control_port] {
        let target = SocketAddr::V4(SocketAddrV4::new(topo.pod_b_ip, port));
        let outcome = tcp_connect(&topo.pod_a, target, TIMING_OUT);
        assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    }
    // Each end as its own agent serves it.
    let client = agents[0].wait_served(
        |f| is_kind_to(f, "tcp_timeout", &topo, joined_port),
        Duration::from_secs(4),
    );
    assert_eq!(field(&client, "layer"), "unknown", "{client:#}");
    let server = agents[1].wait_served(
        |f| {
            is_kind_to(f, "tcp_syn_dropped", &topo, joined_port)
                && f["evidence"].get("rule").is_some()
        },
        Duration::from_secs(6),
    );
    let control = agents[0].wait_served(
        |f| is_kind_to(f, "tcp_timeout", &topo, control_port),
        Duration::from_secs(4),
    );
    assert_eq!(field(&control, "layer"), "unknown", "{control:#}");
    assert!(
        !agents[1].findings_endpoint().iter().any(|f| is_kind_to(
            f,
            "tcp_syn_dropped",
            &topo,
            control_port
        )),
        "the control's SYNs are dropped in pod B, not by node B's firewall"
    );

    let out = findings_cluster(&net, &["-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&out);
    let about = |port: u16| -> Vec<&Value> {
        lines
            .iter()
            .filter(|f| {
                flow_is(f, topo.pod_a_ip, topo.pod_b_ip, port)
                    && matches!(field(f, "kind"), "tcp_timeout" | "tcp_syn_dropped")
            })
            .collect()
    };
    let joined = about(joined_port);
    assert_eq!(joined.len(), 1, "one joined verdict: {lines:#?}");
    let j = joined[0];
    assert_eq!(field(j, "kind"), "tcp_timeout", "{j:#}");
    assert_eq!(field(j, "layer"), "firewall", "{j:#}");
    assert_eq!(field(j, "node"), "node-a", "{j:#}");
    let e = &j["evidence"];
    assert_eq!(e["drop_node"], "node-b", "{j:#}");
    assert_eq!(e["drop_reason"], "NETFILTER_DROP", "{j:#}");
    assert_eq!(e["policy"], "default/deny-db", "{j:#}");
    assert_eq!(e["rule"]["chain"], policy::INGRESS_CHAIN, "{j:#}");
    assert_eq!(e["pod_interface"], "vpod0", "{j:#}");
    assert_eq!(j["joined"]["client"]["id"], client["id"], "{j:#}");
    assert_eq!(j["joined"]["client"]["node"], "node-a", "{j:#}");
    assert_eq!(j["joined"]["server"]["id"], server["id"], "{j:#}");
    assert_eq!(j["joined"]["server"]["node"], "node-b", "{j:#}");
    assert!(field(j, "summary").contains("node node-b"), "{j:#}");

    let control_lines = about(control_port);
    assert_eq!(control_lines.len(), 1, "{lines:#?}");
    assert_eq!(field(control_lines[0], "layer"), "unknown", "{lines:#?}");
    assert!(control_lines[0].get("joined").is_none(), "{lines:#?}");

    // In text, on the client's node, naming node B; and through a kind filter, which
    // keeps the inbound half away from the agents' answers.
    for args in [&[][..], &["--kind", "tcp_timeout"][..]] {
        let out = findings_cluster(&net, args);
        assert!(out.status.success(), "{out:?}");
        let stdout = text(&out.stdout);
        let port = format!(":{joined_port} ");
        let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(&port)).collect();
        assert_eq!(lines.len(), 1, "{args:?}:\n{stdout}");
        let cols: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(cols[1], "node-a", "{}", lines[0]);
        assert_eq!(cols[3], "tcp_timeout/firewall", "{}", lines[0]);
        assert!(lines[0].contains("node node-b"), "{}", lines[0]);
    }

    // The README's examples are this test's outputs: `NODE_DIAG_PRINT_EXAMPLES=1 ...
    // --test cluster a_policy -- --nocapture` prints them.
    if std::env::var_os("NODE_DIAG_PRINT_EXAMPLES").is_some() {
        let bin = node_diag_bin();
        let bin = bin.to_str().unwrap();
        let server = format!("http://{}", net.nodes[1].listen());
        let probe_port = joined_port.to_string();
        let pod_b = topo.pod_b_ip.to_string();
        let runs: [(&str, Vec<&str>); 5] = [
            (
                &net.mgmt,
                vec![bin, "findings", "--server", &server, "--color", "never"],
            ),
            (
                &net.mgmt,
                vec![
                    bin,
                    "findings",
                    "--cluster",
                    SERVICE,
                    "--dns-server",
                    "10.77.0.254",
                    "--color",
                    "never",
                ],
            ),
            (&topo.node_a, vec![bin, "doctor"]),
            (&topo.node_a, vec![bin, "mtu"]),
            (
                &topo.pod_a,
                vec![bin, "probe", &pod_b, "--port", &probe_port],
            ),
        ];
        for (netns, argv) in runs {
            let out = cmd::try_run_in(netns, &argv);
            println!(
                "$ {}\n{}{}(exit {:?})\n",
                argv[1..].join(" "),
                text(&out.stdout),
                text(&out.stderr),
                out.status.code()
            );
        }
    }
}

/// The name every agent's certificate carries, as a Service's DNS name would be.
const SERVER_NAME: &str = "node-diag.node-diag.svc";

/// A CA, a server certificate for every node's address and [`SERVER_NAME`], a client
/// certificate (`sre`), and the three agents serving `/findings` on their scrape listener
/// under TLS with client certificates required.
fn tls_agents<'t>(net: &'t ClusterNet, dir: &TempDir) -> Vec<Agent<'t>> {
    let mut names: Vec<String> = net.nodes.iter().map(|n| n.addr.to_string()).collect();
    names.push(SERVER_NAME.to_string());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    make_pki(dir, "sre", Some(&names));
    let web = dir.path("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
            dir.arg("server.crt"),
            dir.arg("server.key"),
            dir.arg("sre-ca.crt"),
        ),
    )
    .expect("write web.yml");
    let web = web.display().to_string();
    net.nodes
        .iter()
        .zip(NODES)
        .map(|(n, name)| {
            Agent::start_ready_in_listening(
                n,
                &n.listen(),
                &["--node-name", name, "--web-config-file", &web],
            )
        })
        .collect()
}

/// Three agents serving `/findings` on their scrape listener (the SRV record's port)
/// under TLS that requires and verifies a client certificate, as the `cluster-view`
/// deploy component configures them. With the client certificate, checked against the
/// Service name or the agents' addresses, one merged stream; without it, every agent is
/// named with the cause (the handshake refused for the missing certificate), and the
/// exit status is 1 as none answered.
#[test]
fn the_cluster_view_over_tls_with_a_client_certificate() {
    let (_topo, net) = cluster();
    let dir = TempDir::new("cluster-tls");
    let agents = tls_agents(&net, &dir);
    for (i, (agent, node)) in agents.iter().zip(&net.nodes).enumerate() {
        refuse_on(agent, node, 7101 + i as u16);
    }
    let (ca, cert, key) = (
        dir.arg("sre-ca.crt"),
        dir.arg("sre.crt"),
        dir.arg("sre.key"),
    );
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];

    for server_name in [Some(SERVER_NAME), None] {
        let mut args = vec!["-o", "json", "--kind", "tcp_refused"];
        args.extend_from_slice(&tls);
        if let Some(name) = server_name {
            args.extend(["--tls-server-name", name]);
        }
        let out = findings_cluster(&net, &args);
        assert!(out.status.success(), "{server_name:?}: {out:?}");
        let lines = json_lines(&out);
        let got: BTreeSet<(String, u64)> = lines
            .iter()
            .map(|f| (field(f, "node").to_string(), f["dport"].as_u64().unwrap()))
            .collect();
        let want: BTreeSet<(String, u64)> = NODES
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), 7101 + i as u64))
            .collect();
        assert_eq!(got, want, "{server_name:?}: {lines:#?}");
        assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
    }

    // A name the certificates do not carry is refused.
    let mut args = tls.to_vec();
    args.extend(["--tls-server-name", "elsewhere.example"]);
    let out = findings_cluster(&net, &args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("certificate not valid for name \"elsewhere.example\""),
        "{}",
        text(&out.stderr)
    );

    // No client certificate: every agent refuses the handshake, each said once.
    let out = findings_cluster(&net, &["--tls-ca", &ca]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no agent of"), "{stderr}");
    for node in &net.nodes {
        let named = format!(
            "{}: the agent at {} requires a client certificate: give --tls-cert and --tls-key",
            node.listen(),
            node.listen()
        );
        assert_eq!(stderr.matches(&named).count(), 1, "{stderr}");
    }
    assert_eq!(stderr.matches("CertificateRequired").count(), 3, "{stderr}");

    // Plain HTTP to a TLS listener is not an answer either.
    let out = findings_cluster(&net, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// The agents' own endpoint is not the workload: `node-diag findings --cluster` over TLS,
/// run again and again, closes its connections without a TLS close_notify, so the
/// agent's own TLS close meets a closed socket and the client's kernel answers with a
/// reset; before the agent left its own listeners' connections out, every run left a
/// `tcp_reset` / `peer` "accepted by the listener ... reset by their clients" finding
/// about the agent's own port. None may appear, and the runs still answer. (The same
/// resets of a workload's listener are still reported:
/// `verdicts::server_side_resets_aggregate_per_listener`.)
#[test]
fn findings_over_tls_leave_no_finding_about_the_agents_own_listener() {
    let (_topo, net) = cluster();
    let dir = TempDir::new("cluster-own");
    let agents = tls_agents(&net, &dir);
    let (ca, cert, key) = (
        dir.arg("sre-ca.crt"),
        dir.arg("sre.crt"),
        dir.arg("sre.key"),
    );
    let args = [
        "-o",
        "json",
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    for run in 0..5 {
        let out = findings_cluster(&net, &args);
        assert!(out.status.success(), "run {run}: {out:?}");
    }
    // Clients that abort outright (SO_LINGER 0: a RST to the accepted socket), as a
    // scraper giving up would: the agent's own connections all the same.
    for node in &net.nodes {
        let addr: SocketAddr = node.listen().parse().unwrap();
        in_netns(&net.mgmt, || {
            for _ in 0..3 {
                let stream =
                    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
                // Accepted and waiting for its TLS hello when the reset comes.
                thread::sleep(Duration::from_millis(100));
                Socket::from(stream)
                    .set_linger(Some(Duration::ZERO))
                    .expect("linger");
            }
        });
    }
    for (agent, node) in agents.iter().zip(&net.nodes) {
        let own = node.listen();
        let port = own.rsplit(':').next().unwrap().parse::<u64>().unwrap();
        agent.expect_no_finding(
            |f| field(f, "listener") == own || f["sport"].as_u64() == Some(port),
            Duration::from_secs(3),
        );
    }
    // Nor does the next run serve one.
    let out = findings_cluster(&net, &args);
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&out);
    assert!(
        !lines.iter().any(|f| field(f, "kind") == "tcp_reset"),
        "{lines:#?}"
    );
}
