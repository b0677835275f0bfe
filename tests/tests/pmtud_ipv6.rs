//! Issue 37 over IPv6: the black holes of `mtu.rs`, `path_mtu.rs` and `path_probe.rs`
//! with the pods talking IPv6 through the overlay ([`node_diag_testbed::pod_ipv6`]).
//! Packet-too-big instead of frag-needed, ICMPv6 echo for the path probes, IPv6 sockets
//! in sock_diag. The pods' IPv6 is never pinged first: the measured connect is the
//! first packet, and waits for neighbour discovery like a real first connect does.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test pmtud_ipv6 -- --test-threads=1`.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_testbed::RoutedTopology;
use node_diag_testbed::pod_ipv6::{self, POD_A_V6, POD_B_V6, pod_b_v6_addr};
use node_diag_tests::agent::scaled;
use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::topology::{POD_IF, UNDERLAY_IF};
use node_diag_tests::{
    Agent, BULK, ServerMode, TcpServer, Topology, cmd, in_netns, ok, tcp_request, unique_name,
};
use serde_json::Value;

use node_diag_tests::agent::BLACKHOLES;

/// A topology whose pods also talk IPv6 through the overlay.
fn v6_topology() -> Topology {
    let topo = Topology::new();
    topo.add_pod_ipv6();
    topo
}

fn on_flow(kind: &str, dport: u16) -> impl Fn(&Value) -> bool + '_ {
    move |f| field(f, "kind") == kind && flow_is(f, POD_A_V6, POD_B_V6, dport)
}

fn num(f: &Value, key: &str) -> u64 {
    f["evidence"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("evidence {key}: {f:#}"))
}

/// Sends [`BULK`] bytes from `pod` to pod B's IPv6 echo server on `port`, in the
/// background.
fn bulk_v6(
    pod: &str,
    port: u16,
    timeout: Duration,
) -> thread::JoinHandle<std::io::Result<Vec<u8>>> {
    let ns = pod.to_owned();
    thread::spawn(move || tcp_request(&ns, pod_b_v6_addr(port), &vec![0x5a; BULK], timeout))
}

/// Pod A's 1500-byte packets forwarded into node A's 1450 overlay: node A drops them
/// and its packet-too-big is dropped by its own OUTPUT chain. The client holds the
/// stuck flow for `hold`.
fn black_hole_held(
    topo: &Topology,
    port: u16,
    hold: Duration,
) -> thread::JoinHandle<std::io::Result<Vec<u8>>> {
    topo.set_pod_mtu(1500);
    topo.drop_frag_needed(&topo.node_a);
    bulk_v6(&topo.pod_a, port, hold)
}

#[test]
fn ipv6_black_hole_held_stays_open_while_its_flow_is_stuck() {
    let topo = v6_topology();
    let agent = Agent::start_ready(&topo);
    let port = 9611;
    let _server = TcpServer::start(&topo.pod_b, pod_b_v6_addr(port), ServerMode::Echo);
    let client = black_hole_held(&topo, port, Duration::from_secs(80));
    let f = agent.wait_finding(on_flow("pmtud_blackhole", port), Duration::from_secs(8));
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "icmp_filtered", "{f:#}");
    assert_eq!(field(&f, "severity"), "critical", "{f:#}");
    assert_eq!(f["evidence"]["netfilter_hook"], "output", "{f:#}");
    assert!(num(&f, "frag_needed_dropped") >= 1, "{f:#}");
    assert!(num(&f, "fullsize_retransmits") >= 3, "{f:#}");
    agent.wait_counter_at_least(BLACKHOLES, 1.0, Duration::from_secs(2));
    agent.assert_held(
        BLACKHOLES,
        Duration::from_secs(60),
        on_flow("pmtud_blackhole", port),
    );
    // The client gives up on its own timeout, in the background.
    drop(client);
}

/// An agent started 14 s into an IPv6 black hole reports it from the socket's retransmit
/// state at the flow's next retransmit.
#[test]
fn ipv6_agent_started_during_a_black_hole_reports_it_at_the_next_retransmit() {
    let topo = v6_topology();
    let port = 9612;
    let _server = TcpServer::start(&topo.pod_b, pod_b_v6_addr(port), ServerMode::Echo);
    let client = black_hole_held(&topo, port, Duration::from_secs(70));
    thread::sleep(Duration::from_secs(14));
    let agent = Agent::start_ready(&topo);
    agent.assert_black_hole_found_mid_stall(on_flow("pmtud_blackhole", port));
    drop(client);
}

/// PMTUD worked over IPv6 (node A's packet-too-big reached pod A, its MSS shrank), then
/// the peer went silent: a stall, not a black hole.
#[test]
fn ipv6_stall_after_pmtud_worked_is_no_black_hole() {
    let topo = v6_topology();
    topo.set_pod_mtu(1500);
    let agent = Agent::start_ready(&topo);
    let port = 9613;
    let _server = TcpServer::start(&topo.pod_b, pod_b_v6_addr(port), ServerMode::Echo);
    let addr = pod_b_v6_addr(port);
    let mut stream = in_netns(&topo.pod_a, || {
        TcpStream::connect_timeout(&addr, scaled(Duration::from_secs(5)))
    })
    .expect("connect to pod B");
    stream
        .set_read_timeout(Some(scaled(Duration::from_secs(10))))
        .unwrap();
    let chunk = vec![0x5au8; 64 * 1024];
    stream.write_all(&chunk).unwrap();
    let mut echoed = vec![0u8; chunk.len()];
    stream
        .read_exact(&mut echoed)
        .expect("PMTUD recovers the transfer");

    topo.drop_forwarded_tcp(&topo.node_b, port);
    stream.write_all(&chunk).unwrap();
    let f = agent.wait_finding(on_flow("tcp_stall", port), Duration::from_secs(10));
    assert_eq!(field(&f, "layer"), "unknown", "{f:#}");
    assert!(
        field(&f, "summary").contains("PMTUD already worked"),
        "{f:#}"
    );
    agent.expect_no_finding(on_flow("pmtud_blackhole", port), Duration::from_secs(4));
    assert_eq!(agent.metric(BLACKHOLES), Some(0.0));
}

/// Node B's underlay at 1400 drops node A's full-size tunnel packets silently (see
/// `path_probe.rs`); pod A talks IPv6. The agent's ICMPv6 echo probes towards pod B
/// find the limit.
#[test]
fn ipv6_black_hole_beyond_the_node_is_found_by_probing() {
    let topo = v6_topology();
    let node_b_ul = ["ip", "-n", &topo.node_b, "link", "set", UNDERLAY_IF];
    cmd::run(&[&node_b_ul[..], &["mtu", "1400"]].concat());
    // One segment per skb on node A's underlay, so the veth meets every full-size
    // packet (see the IPv4 test).
    let node_a_ul = ["ip", "-n", &topo.node_a, "link", "set", UNDERLAY_IF];
    cmd::run(&[&node_a_ul[..], &["gso_max_segs", "1"]].concat());
    let agent = Agent::start_ready(&topo);
    let port = 9614;
    let _server = TcpServer::start(&topo.pod_b, pod_b_v6_addr(port), ServerMode::Echo);

    let started = Instant::now();
    let transfer = bulk_v6(&topo.pod_a, port, Duration::from_secs(25));
    let f = agent.wait_finding(
        |f| on_flow("pmtud_blackhole", port)(f) && field(f, "layer") == "path",
        scaled(Duration::from_secs(15)),
    );
    let took = started.elapsed();
    assert_shape(&f);
    assert_eq!(field(&f, "severity"), "critical", "{f:#}");
    assert_eq!(f["evidence"]["path_probe"], "blackhole", "{f:#}");
    assert_eq!(
        f["evidence"]["path_probe_target"],
        POD_B_V6.to_string(),
        "{f:#}"
    );
    let (largest, lost) = (
        num(&f, "path_probe_largest_ok"),
        num(&f, "path_probe_smallest_lost"),
    );
    // 1400 − 50 of VXLAN = 1350 for the inner IPv6 packet, + 4 of veth slack; every
    // size probed is at least IPv6's 1280.
    assert!(
        (1280..=1354).contains(&largest) && lost > 1354 && lost - largest <= 16,
        "{f:#}"
    );
    assert!(num(&f, "path_probe_packets") <= 20, "{f:#}");
    assert!(
        f["evidence"]["path_mtu"]
            .as_u64()
            .is_some_and(|m| m == largest),
        "the path MTU named: {f:#}"
    );
    assert_eq!(
        f["evidence"]["underlay_probe_target"],
        topo.node_b_underlay.to_string(),
        "{f:#}"
    );
    assert!(took < scaled(Duration::from_secs(15)), "took {took:?}");
    let served = agent.findings_endpoint();
    assert!(
        !served
            .iter()
            .any(|s| on_flow("tcp_stall", port)(s) && field(s, "status") == "active"),
        "an active stall remains beside the black hole: {served:#?}"
    );
    drop(transfer);
}

/// The control: MTUs right end to end, pod B's interface down mid-transfer. The IPv6
/// stall stays a stall; no ICMPv6 echo is answered and the evidence says so.
#[test]
fn ipv6_dead_peer_behind_the_tunnel_is_still_a_stall() {
    let topo = v6_topology();
    let agent = Agent::start_ready(&topo);
    let port = 9615;
    let _server = TcpServer::start(&topo.pod_b, pod_b_v6_addr(port), ServerMode::Echo);
    let addr = pod_b_v6_addr(port);
    let pod_b = topo.pod_b.clone();
    let sent = in_netns(&topo.pod_a, move || {
        let mut s = TcpStream::connect_timeout(&addr, scaled(Duration::from_secs(5)))?;
        s.write_all(b"hello\n")?;
        thread::sleep(Duration::from_millis(200));
        cmd::run(&["ip", "-n", &pod_b, "link", "set", POD_IF, "down"]);
        s.set_write_timeout(Some(scaled(Duration::from_secs(2))))?;
        // Full-size segments into the silence: what the send buffer takes before the
        // timeout is enough (an emulated guest's may not take 64 KiB at once).
        let taken = s.write(&vec![0x5a; 64 * 1024])?;
        Ok::<_, std::io::Error>((s, taken))
    })
    .expect("connect and write before the peer goes away");
    assert!(sent.1 >= 4 * 1450, "only {} bytes sent", sent.1);

    let stall = agent.wait_finding(
        |f| on_flow("tcp_stall", port)(f) && field(f, "layer") == "unknown",
        scaled(Duration::from_secs(15)),
    );
    assert!(
        num(&stall, "segment_len") >= num(&stall, "mss"),
        "full-size: {stall:#}"
    );
    let probed = agent.wait_served(
        |f| on_flow("tcp_stall", port)(f) && !f["evidence"]["path_probe"].is_null(),
        Duration::from_secs(10),
    );
    assert_eq!(probed["evidence"]["path_probe"], "no_reply", "{probed:#}");
    assert_eq!(
        probed["evidence"]["path_probe_target"],
        POD_B_V6.to_string(),
        "{probed:#}"
    );
    assert_eq!(field(&probed, "status"), "active", "{probed:#}");
    agent.expect_no_finding(
        |f| {
            matches!(
                field(f, "kind"),
                "pmtud_blackhole" | "df_oversize_drop" | "overlay_mtu_mismatch"
            )
        },
        Duration::from_secs(2),
    );
    drop(sent);
}

/// The router's narrow hop with its frag-needed filtered, pod A's IPv6 flow through the
/// tunnel, `tcp_mtu_probing=1` (it covers IPv6 TCP too): the kernel shrinks the MSS and
/// the transfer completes late. A recovered black hole.
#[test]
fn ipv6_black_hole_masked_by_mtu_probing_is_reported_recovered() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(pod_ipv6::add_to_routed(&topo));
    ok(topo.narrow_towards_b(1400));
    ok(topo.drop_router_frag_needed());
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=1"));
    // The echo crosses the narrow hop too, and the router's veth drops node B's
    // full-size tunnel packets that are not GSO without a word: pod B probes as well,
    // or its echo stalls for good whenever it sends one alone.
    ok(topo.sysctl(&topo.pod_b, "net.ipv4.tcp_mtu_probing=1"));
    let agent = Agent::start_ready_in(&topo);
    let port = 9616;
    let addr: SocketAddr = pod_b_v6_addr(port);
    let _server = TcpServer::start(&topo.pod_b, addr, ServerMode::Echo);
    let reply = tcp_request(
        &topo.pod_a,
        addr,
        &vec![0x5a; BULK],
        Duration::from_secs(30),
    )
    .expect("MTU probing gets the transfer through");
    assert_eq!(reply.len(), BULK);

    // 1450 − 40 of IPv6 − 20 of TCP − 12 of timestamps.
    agent.assert_recovered_then_resolved(on_flow("pmtud_blackhole", port), 1378);
    ok(topo.flush_route_cache(&topo.node_a));
}

/// Probing on, a clean IPv6 path: nothing stalls, nothing is reported.
#[test]
fn ipv6_clean_path_with_mtu_probing_reports_nothing() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(pod_ipv6::add_to_routed(&topo));
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=1"));
    let agent = Agent::start_ready_in(&topo);
    let port = 9617;
    let addr = pod_b_v6_addr(port);
    let _server = TcpServer::start(&topo.pod_b, addr, ServerMode::Echo);
    let reply = tcp_request(
        &topo.pod_a,
        addr,
        &vec![0x5a; BULK],
        Duration::from_secs(10),
    )
    .expect("a clean transfer");
    assert_eq!(reply.len(), BULK);
    agent.expect_no_finding(
        |f| matches!(field(f, "kind"), "pmtud_blackhole" | "tcp_stall"),
        Duration::from_secs(3),
    );
}
