//! IPv6: the connect verdicts on an IPv6 path. Node A (the agent's own namespace) and
//! node B get IPv6 addresses on the underlay veth; node B's firewall rejects with the
//! ICMPv6 errors real filters send. A refusal without a RST, or an administratively
//! prohibited, is a firewall, never the listener.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test ipv6 -- --test-threads=1`.

use std::net::{Ipv6Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_testbed::kube_proxy::{IptablesBackend, install_ipv6_no_endpoints};
use node_diag_testbed::metrics::parse_exposition;
use node_diag_tests::finding::{assert_shape, field};
use node_diag_tests::tcp::connect_taking_error_on_another_cpu;
use node_diag_tests::tunnel::{kernel_release, tunnels_required};
use node_diag_tests::{
    Agent, BULK, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, ok, tcp_connect, tcp_request,
};
use serde_json::Value;
use std::io::Write as _;

const NODE_A_V6: &str = "fd00:200::1";
const NODE_B_V6: &str = "fd00:200::2";
/// Refused verdicts come within a second of the connect.
const REFUSED_WITHIN: Duration = Duration::from_secs(1);
const STEP: Duration = Duration::from_secs(3);

const REFUSED: &str = r#"node_diag_tcp_connect_failures_total{reason="refused"}"#;
const UNREACHABLE: &str = r#"node_diag_tcp_connect_failures_total{reason="unreachable"}"#;
const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;

/// Node A and node B on an IPv6 subnet over the underlay veth; node B rejects
/// connections from node A to `port` with `reject_with` (an nft reject statement).
fn ipv6_topology(reject: Option<(u16, &str)>) -> Topology {
    let topo = Topology::new();
    add_v6_addresses(&topo);
    // The first packet waits for neighbour discovery: make sure the path is up before a
    // test's connect, so its outcome is the rule's and not a startup race.
    let reachable = (0..50).any(|_| {
        let out = cmd::try_run_in(
            &topo.node_a,
            &["ping", "-6", "-n", "-q", "-c", "1", "-W", "1", NODE_B_V6],
        );
        out.status.success() || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(reachable, "node B's IPv6 address never answered node A");
    if let Some((port, reject_with)) = reject {
        cmd::run_in(&topo.node_b, &["nft", "add table inet ndv6"]);
        cmd::run_in(
            &topo.node_b,
            &[
                "nft",
                "add chain inet ndv6 input { type filter hook input priority 0; }",
            ],
        );
        cmd::run_in(
            &topo.node_b,
            &[
                "nft",
                &format!(
                    "add rule inet ndv6 input ip6 saddr {NODE_A_V6} tcp dport {port} {reject_with}"
                ),
            ],
        );
    }
    topo
}

/// Node A's and node B's IPv6 addresses on the underlay, nothing sent between them yet.
fn add_v6_addresses(topo: &Topology) {
    for (node, addr) in [(&topo.node_a, NODE_A_V6), (&topo.node_b, NODE_B_V6)] {
        cmd::run_in(
            node,
            &[
                "ip",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                "ul0",
                "nodad",
            ],
        );
    }
}

fn node_b(port: u16) -> SocketAddr {
    SocketAddr::new(NODE_B_V6.parse::<Ipv6Addr>().unwrap().into(), port)
}

fn on_flow<'a>(kind: &'a str, layer: &'a str, dport: u16) -> impl Fn(&Value) -> bool + 'a {
    move |f| {
        field(f, "kind") == kind
            && field(f, "layer") == layer
            && field(f, "dst") == NODE_B_V6
            && f["dport"] == dport
    }
}

#[test]
fn ipv6_port_unreachable_reject_is_a_firewall_not_the_listener() {
    let topo = ipv6_topology(Some((8090, "reject with icmpv6 type port-unreachable")));
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(REFUSED);

    let outcome = tcp_connect(&topo.node_a, node_b(8090), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(on_flow("tcp_refused", "firewall", 8090), REFUSED_WITHIN);
    assert_shape(&f);
    assert_eq!(f["evidence"]["rst_received"], false, "{f:#}");
    assert_eq!(f["src"], NODE_A_V6, "{f:#}");
    agent.expect_no_finding(on_flow("tcp_refused", "listener", 8090), STEP);
    agent.wait_counter_at_least(REFUSED, before + 1.0, STEP);
}

#[test]
fn ipv6_admin_prohibited_is_a_firewall() {
    let topo = ipv6_topology(Some((8091, "reject with icmpv6 type admin-prohibited")));
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(UNREACHABLE);

    let outcome = tcp_connect(&topo.node_a, node_b(8091), STEP);
    // EACCES: not one of the named outcomes.
    assert!(
        matches!(&outcome, ConnectOutcome::Other(e) if e.raw_os_error() == Some(libc::EACCES)),
        "{outcome:?}"
    );
    let f = agent.wait_finding(on_flow("tcp_unreachable", "firewall", 8091), REFUSED_WITHIN);
    assert_shape(&f);
    assert_eq!(f["evidence"]["errno"], "EACCES", "{f:#}");
    agent.wait_counter_at_least(UNREACHABLE, before + 1.0, STEP);
}

#[test]
fn ipv6_closed_port_is_the_listener() {
    let topo = ipv6_topology(None);
    let agent = Agent::start_ready(&topo);

    let outcome = tcp_connect(&topo.node_a, node_b(8092), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(on_flow("tcp_refused", "listener", 8092), REFUSED_WITHIN);
    assert_shape(&f);
    assert_eq!(f["evidence"]["rst_received"], true, "{f:#}");
}

/// [`ipv6_topology`] with pod A on IPv6 (`fd00:1::7`) routed through node A to node B's
/// IPv6 address, node B routing it back (with `back`'s extra route options), and the
/// link between the nodes at 1400: pod A's full-size packets (its link is 1450) are too
/// big for it.
fn pod_a_v6_through_node_a(back: &[&str]) -> Topology {
    let topo = ipv6_topology(None);
    let (pod_a, node_a) = (&topo.pod_a, &topo.node_a);
    cmd::run_in(
        pod_a,
        &["ip", "addr", "add", "fd00:1::7/64", "dev", "eth0", "nodad"],
    );
    cmd::run_in(
        node_a,
        &["ip", "addr", "add", "fd00:1::1/64", "dev", "vpod0", "nodad"],
    );
    cmd::run_in(
        pod_a,
        &[
            "ip",
            "-6",
            "route",
            "add",
            "fd00:200::/64",
            "via",
            "fd00:1::1",
        ],
    );
    let mut route = vec!["ip", "-6", "route", "add", "fd00:1::/64", "via", NODE_A_V6];
    route.extend_from_slice(back);
    cmd::run_in(&topo.node_b, &route);
    cmd::run_in(node_a, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    cmd::run_in(node_a, &["ip", "link", "set", "ul0", "mtu", "1400"]);
    cmd::run_in(&topo.node_b, &["ip", "link", "set", "ul0", "mtu", "1400"]);
    topo
}

/// An IPv6 packet too big for the next link, forwarded by this node: the kernel drops it
/// and answers with a packet-too-big no tracepoint shows. With nothing dropping that
/// answer here, PMTUD works: an `info` finding, never "no frag-needed went back".
#[test]
fn ipv6_oversize_drop_with_pmtud_working_is_info() {
    let topo = pod_a_v6_through_node_a(&[]);
    let pod_a = &topo.pod_a;
    let agent = Agent::start_ready(&topo);

    // 1380 bytes of payload + 8 ICMPv6 + 40 IPv6 = 1428: fits the pod (1450), not the
    // 1400 link beyond node A, which drops it.
    let _ = cmd::try_run_in(
        pod_a,
        &[
            "ping", "-6", "-n", "-q", "-c", "2", "-W", "1", "-M", "do", "-s", "1380", NODE_B_V6,
        ],
    );
    let f = agent.wait_finding(
        |f| field(f, "kind") == "df_oversize_drop" && field(f, "dst") == NODE_B_V6,
        STEP,
    );
    assert_eq!(field(&f, "severity"), "info", "{f:#}");
    assert_eq!(f["evidence"]["egress_mtu"], 1400, "{f:#}");
    assert!(field(&f, "summary").contains("packet-too-big"), "{f:#}");
    assert!(
        !field(&f, "summary").contains("no ICMP frag-needed went back"),
        "{f:#}"
    );
}

/// The IPv6 ClusterIP of the Service without endpoints in the kube-proxy tests.
const SERVICE_V6: &str = "fd00:96::30";

/// kube-proxy's IPv6 REJECT for a Service without endpoints (`backend`: ip6tables
/// through it; `None`: nftables' `ip6 kube-proxy`), node A connecting to the ClusterIP:
/// the Service's layer, as for IPv4, never a firewall.
fn ipv6_no_endpoints_is_the_service(backend: Option<IptablesBackend>) {
    let topo = ipv6_topology(None);
    let vip: Ipv6Addr = SERVICE_V6.parse().unwrap();
    // The Service range routed towards node B, as a node routes it by default.
    cmd::run_in(
        &topo.node_a,
        &[
            "ip",
            "-6",
            "route",
            "add",
            "fd00:96::/112",
            "via",
            NODE_B_V6,
            "dev",
            "ul0",
        ],
    );
    ok(install_ipv6_no_endpoints(
        &topo.node_a,
        backend,
        "shop/cart:http",
        vip,
        80,
    ));
    let agent = Agent::start_ready(&topo);
    let series = r#"node_diag_findings_total{kind="tcp_refused",layer="service",severity="warning",namespace=""}"#;

    let outcome = tcp_connect(&topo.node_a, SocketAddr::new(vip.into(), 80), STEP);
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{backend:?}: {outcome:?}"
    );
    let f = agent.wait_finding(
        |f| field(f, "kind") == "tcp_refused" && field(f, "dst") == SERVICE_V6 && f["dport"] == 80,
        REFUSED_WITHIN,
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "service", "{backend:?}: {f:#}");
    assert_eq!(field(&f, "service"), "shop/cart:http", "{f:#}");
    assert!(field(&f, "summary").contains("no ready endpoints"), "{f:#}");
    agent.wait_counter_at_least(series, 1.0, STEP);
}

#[test]
fn ipv6_kube_proxy_reject_without_endpoints_is_the_service_ip6tables_nft() {
    ipv6_no_endpoints_is_the_service(Some(IptablesBackend::Nft));
}

#[test]
fn ipv6_kube_proxy_reject_without_endpoints_is_the_service_ip6tables_legacy() {
    ipv6_no_endpoints_is_the_service(Some(IptablesBackend::Legacy));
}

#[test]
fn ipv6_kube_proxy_reject_without_endpoints_is_the_service_nftables() {
    ipv6_no_endpoints_is_the_service(None);
}

/// The destination itself answers with ICMPv6 administratively prohibited (firewalld's
/// reject on the server): its firewall, and the evidence says the destination sent it.
#[test]
fn ipv6_admin_prohibited_from_the_destination_is_its_firewall() {
    let topo = ipv6_topology(Some((8093, "reject with icmpv6 type admin-prohibited")));
    let agent = Agent::start_ready_watching_icmp(&topo);

    let outcome = tcp_connect(&topo.node_a, node_b(8093), STEP);
    assert!(
        matches!(&outcome, ConnectOutcome::Other(e) if e.raw_os_error() == Some(libc::EACCES)),
        "{outcome:?}"
    );
    let f = agent.wait_finding(on_flow("tcp_unreachable", "firewall", 8093), REFUSED_WITHIN);
    assert_shape(&f);
    assert_eq!(f["evidence"]["icmp_received_from"], NODE_B_V6, "{f:#}");
    assert_eq!(f["evidence"]["icmp_from_destination"], true, "{f:#}");
    assert!(field(&f, "summary").contains("the destination"), "{f:#}");
}

/// An IPv6 PMTUD black hole made on node A: pod A's full-size segments are too big for
/// node A's 1400 link to node B (node B's route advertises an MSS for 1500), node A drops
/// them and sends a packet-too-big, which node A's own output chain drops. No tracepoint
/// shows an IPv6 packet-too-big being sent: the hook named must still be `output`, where
/// node A's locally generated ICMPv6 is dropped, not `forward`.
#[test]
fn ipv6_packet_too_big_dropped_in_output_names_the_output_hook() {
    let topo = pod_a_v6_through_node_a(&["advmss", "1440"]);
    let (pod_a, node_a) = (&topo.pod_a, &topo.node_a);
    cmd::run_in(node_a, &["nft", "add table inet ndptb"]);
    cmd::run_in(
        node_a,
        &[
            "nft",
            "add chain inet ndptb out { type filter hook output priority 0; }",
        ],
    );
    cmd::run_in(
        node_a,
        &[
            "nft",
            "add rule inet ndptb out icmpv6 type packet-too-big drop",
        ],
    );
    let port = 9004;
    let _server = TcpServer::start(&topo.node_b, node_b(port), ServerMode::Echo);
    let agent = Agent::start_ready(&topo);

    let (ns, to) = (pod_a.clone(), node_b(port));
    let client =
        std::thread::spawn(move || tcp_request(&ns, to, &vec![0x5a; BULK], Duration::from_secs(8)));
    let f = agent.wait_finding(
        |f| {
            field(f, "kind") == "pmtud_blackhole"
                && field(f, "dst") == NODE_B_V6
                && f["dport"] == port
        },
        Duration::from_secs(6),
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "icmp_filtered", "{f:#}");
    assert_eq!(f["evidence"]["netfilter_hook"], "output", "{f:#}");
    assert!(field(&f, "summary").contains("output hook"), "{f:#}");
    let _ = client.join();
}

/// Connect failures as the two contract counters count them: the sum of
/// `node_diag_tcp_connect_failures_total` over its reasons, and of
/// `node_diag_findings_total` over the connect kinds.
fn connect_failures_counted(agent: &Agent) -> (f64, f64) {
    let samples = parse_exposition(&agent.metrics_text()).expect("/metrics parses");
    let sum = |name: &str, keep: &dyn Fn(&str) -> bool| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name && keep(s.labels.get("kind").map_or("", |k| k)))
            .map(|s| s.value)
            .sum()
    };
    (
        sum("node_diag_tcp_connect_failures_total", &|_| true),
        sum("node_diag_findings_total", &|kind| {
            ["tcp_timeout", "tcp_refused", "tcp_unreachable"].contains(&kind)
        }),
    )
}

/// Node A and node B with IPv6 addresses and no neighbour entry for each other (the
/// first packet waits on discovery); node A sends `solicitations` before giving up.
fn fresh_v6_topology(solicitations: u32) -> Topology {
    let topo = Topology::new();
    add_v6_addresses(&topo);
    cmd::run_in(
        &topo.node_a,
        &[
            "sysctl",
            "-qw",
            &format!("net.ipv6.neigh.ul0.mcast_solicit={solicitations}"),
        ],
    );
    topo
}

/// Whether the agent attached its fentry program on `icmp6_send`. When not: a
/// `SKIPPED` line, or a panic under the VM runner (`NODE_DIAG_REQUIRE_TUNNELS=1`), whose
/// Debian kernels allow fentry.
fn icmp6_fentry_attached(agent: &Agent) -> bool {
    let series = r#"node_diag_program_attached{program="nd_icmp6_send"}"#;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if agent.metric(series) == Some(1.0) {
            return true;
        }
        thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !tunnels_required(),
        "nd_icmp6_send not attached under the VM runner:\n{}",
        agent.metrics_text()
    );
    let _ = writeln!(
        std::io::stderr(),
        "\nSKIPPED: kernel {} refuses fentry on icmp6_send",
        kernel_release()
    );
    false
}

/// A connect from node A to `dst:port` in the background.
fn connect_in_background(
    topo: &Topology,
    dst: &str,
    port: u16,
) -> thread::JoinHandle<ConnectOutcome> {
    let (ns, addr) = (
        topo.node_a.clone(),
        SocketAddr::new(dst.parse::<Ipv6Addr>().unwrap().into(), port),
    );
    thread::spawn(move || tcp_connect(&ns, addr, Duration::from_secs(12)))
}

/// Whether the attempt to `dst:port` was reported as timing out: the second SYN
/// retransmit (at about 3 s) makes it one on this machine's kernel. Older kernels
/// (Debian's 6.1) skip, untraced, the retransmit of a SYN whose first copy still waits in
/// the neighbour's queue: there no timeout is reported, and the attempt has one verdict
/// from the start. Asked once the attempt's last word was seen: the timeout comes first.
fn reported_timing_out(agent: &Agent, dst: &str, port: u16) -> bool {
    agent
        .try_wait_finding(
            |f| field(f, "kind") == "tcp_timeout" && field(f, "dst") == dst && f["dport"] == port,
            Duration::ZERO,
        )
        .is_some()
}

/// One attempt's verdicts after it ended: its timeout, if one was reported, printed again
/// as superseded; no timeout active on `/findings`, `last` the only active finding of
/// the flow, and the attempt counted once in both counters (as the timeout when one was
/// reported).
fn assert_one_verdict(
    agent: &Agent,
    (dst, port): (&str, u16),
    last: &Value,
    timed_out: bool,
    before: (f64, f64),
) {
    let on = |f: &Value| field(f, "dst") == dst && f["dport"] == port;
    let timeout = |f: &Value| on(f) && field(f, "kind") == "tcp_timeout";
    if timed_out {
        let superseded =
            agent.wait_finding(|f| timeout(f) && field(f, "status") == "superseded", STEP);
        assert!(superseded["resolved_at"].is_string(), "{superseded:#}");
    } else {
        agent.expect_no_finding(timeout, Duration::ZERO);
    }
    let active: Vec<Value> = agent
        .findings_endpoint()
        .into_iter()
        .filter(|f| on(f) && field(f, "status") == "active")
        .collect();
    assert_eq!(active.len(), 1, "one verdict for one attempt: {active:#?}");
    assert_eq!(active[0]["kind"], last["kind"], "{active:#?}");
    assert_eq!(active[0]["layer"], last["layer"], "{active:#?}");
    // The counters are synced on the agent's 500 ms tick: wait for one, then for any
    // second count to show.
    let counted = if timed_out {
        TIMEOUT
    } else {
        last_reason(last)
    };
    agent.wait_counter_at_least(counted, 1.0, STEP);
    thread::sleep(Duration::from_millis(1500));
    let after = connect_failures_counted(agent);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1.0, 1.0),
        "one attempt counted once\n{}",
        agent.metrics_text()
    );
}

/// The connect failure series `finding`'s kind counts in.
fn last_reason(finding: &Value) -> &'static str {
    match field(finding, "kind") {
        "tcp_refused" => REFUSED,
        _ => UNREACHABLE,
    }
}

/// The first connect to a new neighbour: node B ignores neighbour solicitations for the
/// first seconds, so the SYN and its retransmits wait on neighbour discovery past the
/// timeout threshold; then discovery completes, the queued SYNs go out and node B's
/// kernel refuses them (no listener). One attempt, one verdict: the listener's; the
/// timeout is withdrawn as superseded.
#[test]
fn ipv6_refusal_delayed_by_neighbour_discovery_is_one_listener_verdict() {
    // Node A keeps soliciting while node B is deaf (15 probes, a second apart).
    let topo = fresh_v6_topology(15);
    cmd::run_in(&topo.node_b, &["nft", "add table ip6 ndv6deaf"]);
    cmd::run_in(
        &topo.node_b,
        &[
            "nft",
            "add chain ip6 ndv6deaf input { type filter hook input priority 0; }",
        ],
    );
    cmd::run_in(
        &topo.node_b,
        &[
            "nft",
            "add rule ip6 ndv6deaf input icmpv6 type nd-neighbor-solicit drop",
        ],
    );
    let agent = Agent::start_ready(&topo);
    let before = connect_failures_counted(&agent);
    let port = 8093;

    let start = Instant::now();
    let client = connect_in_background(&topo, NODE_B_V6, port);
    // Past the second SYN retransmit (at about 3 s): node B hears the next solicitation.
    thread::sleep(Duration::from_millis(3600).saturating_sub(start.elapsed()));
    cmd::run_in(&topo.node_b, &["nft", "delete table ip6 ndv6deaf"]);
    let outcome = client.join().expect("client thread");
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    assert!(
        start.elapsed() >= Duration::from_secs(3),
        "refused before discovery"
    );

    let refused = agent.wait_finding(on_flow("tcp_refused", "listener", port), STEP);
    assert_shape(&refused);
    assert_eq!(refused["evidence"]["rst_received"], true, "{refused:#}");
    let timed_out = reported_timing_out(&agent, NODE_B_V6, port);
    assert_one_verdict(&agent, (NODE_B_V6, port), &refused, timed_out, before);
    agent.expect_no_finding(on_flow("tcp_refused", "firewall", port), Duration::ZERO);
}

/// A connect to an address on node A's subnet that nobody holds: neighbour discovery
/// fails after the SYN was retransmitted past the timeout threshold, and the kernel fails
/// the connect with EHOSTUNREACH. One verdict: unreachable, routing; the timeout is
/// withdrawn as superseded.
#[test]
fn ipv6_failed_neighbour_connect_is_one_unreachable_verdict() {
    failed_neighbour_connect_is_one_unreachable_verdict(
        8094,
        |topo, dst, port| {
            connect_in_background(topo, dst, port)
                .join()
                .expect("client thread")
        },
        false,
    );
}

/// The same, by a client that takes the connect's error (SO_ERROR) the moment its socket
/// reports it, as Go's runtime does: on another CPU it can take it before the kernel's
/// error report runs, which then reads no error. The address unreachable this node
/// generated for the SYN still says what the error was.
/// That error is known from the ICMPv6 address unreachable the kernel sent, seen by fentry
/// on `icmp6_send`: on kernels that refuse fentry (this repository's build machines; the
/// VM runner's Debian kernels allow it) the test is skipped.
#[test]
fn ipv6_failed_neighbour_connect_whose_error_the_client_takes_first_is_one_unreachable_verdict() {
    failed_neighbour_connect_is_one_unreachable_verdict(
        8095,
        |topo, dst, port| {
            let addr = SocketAddr::new(dst.parse::<Ipv6Addr>().unwrap().into(), port);
            connect_taking_error_on_another_cpu(&topo.node_a, addr, Duration::from_secs(12))
        },
        true,
    );
}

fn failed_neighbour_connect_is_one_unreachable_verdict(
    port: u16,
    connect: impl FnOnce(&Topology, &str, u16) -> ConnectOutcome,
    needs_icmp6_fentry: bool,
) {
    // Discovery gives up after 5 probes, a second apart: after the timeout at ~3 s.
    let topo = fresh_v6_topology(5);
    // ICMP watched from the start: the address unreachable this node answers its own
    // failed discovery with is then seen, and names routing.
    let agent = Agent::start_ready_watching_icmp(&topo);
    if needs_icmp6_fentry && !icmp6_fentry_attached(&agent) {
        return;
    }
    let before = connect_failures_counted(&agent);
    let dst = "fd00:200::9";
    let on = |kind: &'static str| {
        move |f: &Value| field(f, "kind") == kind && field(f, "dst") == dst && f["dport"] == port
    };

    let outcome = connect(&topo, dst, port);
    assert!(outcome.is_icmp_failure(), "{outcome:?}");
    let unreachable = agent.wait_finding(on("tcp_unreachable"), STEP);
    assert_shape(&unreachable);
    assert_eq!(
        field(&unreachable, "layer"),
        "cni_routing",
        "{unreachable:#}"
    );
    // The SYN the failed entry held is freed without a reason: its site names the entry.
    if unreachable["evidence"]["drop_reason"] == "NOT_SPECIFIED" {
        let entry = field(&unreachable["evidence"], "neighbour");
        assert!(
            entry.starts_with(dst) && (entry.ends_with("failed") || entry.ends_with("incomplete")),
            "{unreachable:#}"
        );
    }
    let timed_out = reported_timing_out(&agent, dst, port);
    assert_one_verdict(&agent, (dst, port), &unreachable, timed_out, before);
}
