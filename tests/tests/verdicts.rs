//! Verdicts that tell similar-looking failures apart: a dead peer from a PMTUD black hole,
//! a firewall's reject from a missing listener, an abandoned connect from a healthy one,
//! a connect that succeeded late (or by a simultaneous open) from one that never did, and
//! this node's namespaces from foreign ones. The real agent in node A, real faults in the
//! namespaces.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test verdicts -- --test-threads=1`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is, involves};
use node_diag_tests::netns::{Netns, enter_netns, netns_path};
use node_diag_tests::topology::{Reject, UNDERLAY_IF};
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, in_netns, ok, spawn_in_netns,
    tcp_connect, unique_name,
};
use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

/// One step of client traffic that should succeed or fail quickly.
const STEP: Duration = Duration::from_secs(3);

const REFUSED: &str = r#"node_diag_tcp_connect_failures_total{reason="refused"}"#;
const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;
use node_diag_tests::agent::BLACKHOLES;

/// The flow pod A -> pod B:`dport`.
fn pods_flow(topo: &Topology, dport: u16) -> (Ipv4Addr, Ipv4Addr, u16) {
    (topo.pod_a_ip, topo.pod_b_ip, dport)
}

/// Matches findings of `kind` about `src` -> `dst`:`dport`, whatever their layer (the
/// layer is asserted afterwards, so a wrong one shows the whole finding).
fn kind_on_flow(
    kind: &'static str,
    (src, dst, dport): (Ipv4Addr, Ipv4Addr, u16),
) -> impl Fn(&Value) -> bool {
    move |f| field(f, "kind") == kind && flow_is(f, src, dst, dport)
}

/// The time left of `budget` counted from `start`.
fn left(start: Instant, budget: Duration) -> Duration {
    budget.saturating_sub(start.elapsed())
}

/// The inode of named network namespace `name`: what findings carry as `netns`.
fn netns_inode(name: &str) -> u64 {
    let path = netns_path(name);
    std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .ino()
}

/// Panics unless `finding`'s layer is `layer`, showing the finding.
#[track_caller]
fn assert_layer(finding: &Value, layer: &str) {
    assert_eq!(field(finding, "layer"), layer, "layer of {finding:#}");
}

/// A refusal by a RST, as from a closed port (or a firewall answering in its name).
fn by_rst(outcome: &ConnectOutcome) -> bool {
    matches!(outcome, ConnectOutcome::Refused)
}

/// Connects pod A to pod B's `port`, which must be refused as `refused` says, and
/// returns the `tcp_refused` finding on that flow, checked for the contract's shape and
/// for `layer`, once the refused counter has counted it.
#[track_caller]
fn refused_connect(
    topo: &Topology,
    agent: &Agent,
    port: u16,
    refused: fn(&ConnectOutcome) -> bool,
    layer: &str,
) -> Value {
    let before = agent.counter(REFUSED);
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), STEP);
    assert!(refused(&outcome), "{outcome:?}");
    let flow = pods_flow(topo, port);
    let f = agent.wait_finding(kind_on_flow("tcp_refused", flow), Duration::from_secs(1));
    assert_shape(&f);
    assert_layer(&f, layer);
    agent.wait_counter_at_least(REFUSED, before + 1.0, STEP);
    f
}

/// Connects pod A to pod B's `port` and gives up after `after` (see
/// [`connect_and_abandon`]); returns the abandoned `tcp_timeout` finding on that flow,
/// checked for the contract's shape and for `layer`, once the timeout counter has
/// counted it.
#[track_caller]
fn abandoned_connect(
    topo: &Topology,
    agent: &Agent,
    port: u16,
    after: Duration,
    layer: &str,
) -> Value {
    let before = agent.counter(TIMEOUT);
    let start = Instant::now();
    let outcome = connect_and_abandon(&topo.pod_a, topo.pod_b_addr(port), after);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(
        kind_on_flow("tcp_timeout", pods_flow(topo, port)),
        left(start, Duration::from_secs(4)),
    );
    assert_shape(&f);
    assert_layer(&f, layer);
    assert_eq!(f["evidence"]["abandoned"], true, "{f:#}");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
    f
}

/// Connects from `netns` to `addr` with socket2's `connect_timeout(after)` and, when it
/// times out, closes the socket at once: an application giving up on its own deadline
/// (a kubelet probe), before the kernel's `ETIMEDOUT`.
fn connect_and_abandon(netns: &str, addr: SocketAddr, after: Duration) -> ConnectOutcome {
    in_netns(netns, || {
        let socket = match Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)) {
            Ok(s) => s,
            Err(e) => return ConnectOutcome::Other(e),
        };
        let outcome = match socket.connect_timeout(&addr.into(), after) {
            Ok(()) => ConnectOutcome::Connected,
            Err(e) => ConnectOutcome::from_error(e),
        };
        drop(socket);
        outcome
    })
}

/// Connects from `netns` to `addr` on a background thread (closing the connection at
/// once when made).
fn connect_in_background(
    netns: &str,
    addr: SocketAddr,
    timeout: Duration,
) -> JoinHandle<ConnectOutcome> {
    let ns = netns.to_owned();
    thread::spawn(move || tcp_connect(&ns, addr, timeout))
}

/// A receiver that never stops reading: serves one connection at a time inside a
/// namespace, discarding everything. Stops on drop.
struct SinkServer {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl SinkServer {
    fn start(netns: &str, addr: SocketAddr) -> SinkServer {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel();
        let ns = netns.to_owned();
        let thread = {
            let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
            thread::spawn(move || {
                let listener = enter_netns(&ns)
                    .map_err(|e| e.to_string())
                    .and_then(|()| TcpListener::bind(addr).map_err(|e| e.to_string()))
                    .and_then(|l| {
                        l.set_nonblocking(true)
                            .map(|()| l)
                            .map_err(|e| e.to_string())
                    });
                let listener = match listener {
                    Ok(l) => {
                        let _ = tx.send(Ok(()));
                        l
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let mut buf = vec![0u8; 256 * 1024];
                while !stop.load(Ordering::SeqCst) {
                    let mut stream = match listener.accept() {
                        Ok((s, _)) => s,
                        Err(_) => {
                            thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
                    while !stop.load(Ordering::SeqCst) {
                        match stream.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                received.fetch_add(n as u64, Ordering::SeqCst);
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock
                                        | ErrorKind::TimedOut
                                        | ErrorKind::Interrupted
                                ) => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        };
        match rx.recv() {
            Ok(Ok(())) => SinkServer {
                stop,
                received,
                thread: Some(thread),
            },
            Ok(Err(e)) => panic!("sink server in {netns} on {addr}: {e}"),
            Err(_) => panic!("sink server thread in {netns} died"),
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for SinkServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sender that keeps writing to `addr` from inside a namespace until stopped (on
/// drop) or its connection fails. Knows its local address, to target the flow.
struct BulkSender {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    local: SocketAddrV4,
    thread: Option<JoinHandle<Result<(), std::io::Error>>>,
}

impl BulkSender {
    fn start(netns: &str, addr: SocketAddr) -> BulkSender {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel();
        let ns = netns.to_owned();
        let thread = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            thread::spawn(move || {
                let connected = enter_netns(&ns)
                    .map_err(|e| std::io::Error::other(e.to_string()))
                    .and_then(|()| TcpStream::connect_timeout(&addr, STEP));
                let mut stream = match connected.and_then(|s| s.local_addr().map(|a| (s, a))) {
                    Ok((s, SocketAddr::V4(local))) => {
                        let _ = tx.send(Ok(local));
                        s
                    }
                    Ok((_, local)) => {
                        let _ = tx.send(Err(format!("not IPv4: {local}")));
                        return Ok(());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return Err(e);
                    }
                };
                stream.set_write_timeout(Some(Duration::from_millis(100)))?;
                let chunk = vec![0x5a_u8; 64 * 1024];
                while !stop.load(Ordering::SeqCst) {
                    match stream.write(&chunk) {
                        Ok(n) => {
                            sent.fetch_add(n as u64, Ordering::SeqCst);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::WouldBlock
                                    | ErrorKind::TimedOut
                                    | ErrorKind::Interrupted
                            ) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        };
        match rx.recv() {
            Ok(Ok(local)) => BulkSender {
                stop,
                sent,
                local,
                thread: Some(thread),
            },
            Ok(Err(e)) => panic!("bulk sender in {netns} to {addr}: {e}"),
            Err(_) => panic!("bulk sender thread in {netns} died"),
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Whether the sending thread ended (its connection failed).
    fn ended(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for BulkSender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until `sender` has pushed 8 MiB into `sink` (the transfer runs at full size);
/// panics after 5 s or if the sender's connection failed.
fn wait_flowing(sink: &SinkServer, sender: &BulkSender) {
    let flowing = Instant::now();
    while sink.received() < 8 * 1024 * 1024 {
        assert!(
            flowing.elapsed() < Duration::from_secs(5) && !sender.ended(),
            "bulk transfer not flowing: {} bytes received, {} sent",
            sink.received(),
            sender.sent()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn is_mtu_kind(f: &Value) -> bool {
    matches!(
        field(f, "kind"),
        "pmtud_blackhole" | "df_oversize_drop" | "overlay_mtu_mismatch"
    )
}

/// MTUs are right end to end; the peer simply goes silent mid-transfer. The sender
/// retransmits full-size segments with nothing coming back, as in a black hole, but with
/// no oversize drop and no frag-needed anywhere: a stall, not a PMTUD problem.
#[test]
fn dead_peer_bulk_transfer_is_a_stall_not_a_black_hole() {
    let topo = Topology::new();
    topo.set_pod_mtu(1450);
    let agent = Agent::start_ready(&topo);
    let port = 9101;
    let sink = SinkServer::start(&topo.pod_b, topo.pod_b_addr(port));
    let sender = BulkSender::start(&topo.pod_a, topo.pod_b_addr(port));

    // The transfer runs at full size before the peer goes away.
    wait_flowing(&sink, &sender);
    let server = SocketAddrV4::new(topo.pod_b_ip, port);
    topo.drop_forwarded_flow(&topo.node_b, sender.local, server);
    let cut = Instant::now();
    let (received_at_cut, sent_at_cut) = (sink.received(), sender.sent());

    // The gauge stays 0 throughout, sampled while waiting.
    let flow = pods_flow(&topo, port);
    let mut stall = None;
    let budget = node_diag_tests::agent::scaled(Duration::from_secs(15));
    while stall.is_none() && cut.elapsed() < budget {
        stall = agent.try_wait_finding(
            kind_on_flow("tcp_stall", flow),
            left(cut, budget).min(Duration::from_millis(250)),
        );
        let blackholes = agent.counter(BLACKHOLES);
        assert_eq!(
            blackholes,
            0.0,
            "{BLACKHOLES} is {blackholes} {:?} after the peer went silent\n{}",
            cut.elapsed(),
            agent.diagnostics()
        );
    }
    let stall = stall.unwrap_or_else(|| {
        panic!(
            "no tcp_stall on {flow:?} within {budget:?} of the peer going silent \
             (sink received {} bytes, {} after the cut; sender sent {}, {} after)\n{}",
            sink.received(),
            sink.received() - received_at_cut,
            sender.sent(),
            sender.sent() - sent_at_cut,
            agent.diagnostics()
        )
    });
    assert_shape(&stall);
    assert_eq!(field(&stall, "severity"), "warning", "{stall:#}");
    assert_eq!(field(&stall, "status"), "active", "{stall:#}");
    assert!(
        !matches!(field(&stall, "layer"), "icmp_filtered" | "overlay_mtu"),
        "a dead peer is no MTU layer: {stall:#}"
    );
    assert_eq!(
        stall["sport"].as_u64(),
        Some(u64::from(sender.local.port())),
        "{stall:#}"
    );

    // Nothing MTU-shaped, in the whole run (already printed included) and a bit more.
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(2));
    let served = agent.findings_endpoint();
    let mtu: Vec<&Value> = served.iter().filter(|f| is_mtu_kind(f)).collect();
    assert!(mtu.is_empty(), "GET /findings has MTU findings: {mtu:#?}");
    assert!(
        served.iter().any(kind_on_flow("tcp_stall", flow)),
        "GET /findings lacks the stall: {served:#?}"
    );
    assert_eq!(agent.counter(BLACKHOLES), 0.0, "{}", agent.metrics_text());
}

/// The MSS the socket `local` of `netns` sends with now (`ss -ti`), if it exists.
fn sender_mss(netns: &str, local: SocketAddrV4) -> Option<u32> {
    let out = node_diag_tests::cmd::run_in(netns, &["ss", "-tinH", "src", &local.to_string()]);
    out.split_whitespace()
        .find_map(|t| t.strip_prefix("mss:"))
        .and_then(|v| v.parse().ok())
}

/// The dead peer again, with `tcp_mtu_probing=1` in the sender's pod (Cilium sets it for
/// its pods). After a few seconds of timeouts the kernel's black-hole detection shrinks
/// the MSS and retries the segment smaller, as it does on a real black hole; but here the
/// smaller segment vanishes too. Segments sent smaller are not a black hole masked by MTU
/// probing unless the smaller one got through: this stays a stall, with no MTU finding.
#[test]
fn dead_peer_with_mtu_probing_on_is_a_stall_not_a_masked_black_hole() {
    let topo = Topology::new();
    topo.set_pod_mtu(1450);
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=1"));
    let agent = Agent::start_ready(&topo);
    let port = 9119;
    let sink = SinkServer::start(&topo.pod_b, topo.pod_b_addr(port));
    let sender = BulkSender::start(&topo.pod_a, topo.pod_b_addr(port));
    wait_flowing(&sink, &sender);
    let mss_before = sender_mss(&topo.pod_a, sender.local).expect("the sender's socket");
    let server = SocketAddrV4::new(topo.pod_b_ip, port);
    topo.drop_forwarded_flow(&topo.node_b, sender.local, server);
    let flow = pods_flow(&topo, port);
    let stall = agent.wait_finding(kind_on_flow("tcp_stall", flow), Duration::from_secs(15));
    assert_shape(&stall);

    // The kernel's black-hole detection comes 3 s into the timeouts (6 s at the latest
    // when a timer fires early): wait for the smaller segment, then for what follows it.
    let budget = node_diag_tests::agent::scaled(Duration::from_secs(20));
    let cut = Instant::now();
    let shrunk = loop {
        match sender_mss(&topo.pod_a, sender.local) {
            Some(mss) if mss < mss_before => break mss,
            _ if cut.elapsed() > budget => {
                panic!("the sender's MSS stayed {mss_before}: MTU probing never shrank it")
            }
            _ => thread::sleep(Duration::from_millis(100)),
        }
    };
    eprintln!(
        "MSS {mss_before} -> {shrunk} {:?} after the stall",
        cut.elapsed()
    );
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(4));
    let served = agent.findings_endpoint();
    let mtu: Vec<&Value> = served.iter().filter(|f| is_mtu_kind(f)).collect();
    assert!(mtu.is_empty(), "GET /findings has MTU findings: {mtu:#?}");
    let stalls: Vec<&Value> = served
        .iter()
        .filter(|f| kind_on_flow("tcp_stall", flow)(f))
        .collect();
    assert!(
        stalls.iter().all(|f| field(f, "status") == "active"),
        "the peer is still silent: the stall stands\n{stalls:#?}"
    );
    assert_eq!(agent.counter(BLACKHOLES), 0.0, "{}", agent.metrics_text());
}

/// A request smaller than the MSS sent to a peer that went silent: the sender retransmits
/// that short segment on its backed-off RTO. That is a stall too (the head of a bulk
/// transfer's queue is often such a segment, the tail of a partial write), and with a
/// segment below the MSS size cannot be the problem.
#[test]
fn dead_peer_short_request_is_a_stall() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9117;
    let sink = SinkServer::start(&topo.pod_b, topo.pod_b_addr(port));
    let addr = topo.pod_b_addr(port);
    let mut stream = in_netns(&topo.pod_a, || TcpStream::connect_timeout(&addr, STEP))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let SocketAddr::V4(local) = ok(stream.local_addr()) else {
        panic!("not IPv4")
    };
    ok(stream.write_all(b"hello before the cut\n"));
    let flowing = Instant::now();
    while sink.received() == 0 {
        assert!(flowing.elapsed() < STEP, "the first request never arrived");
        thread::sleep(Duration::from_millis(20));
    }

    let server = SocketAddrV4::new(topo.pod_b_ip, port);
    topo.drop_forwarded_flow(&topo.node_b, local, server);
    let request = vec![b'r'; 200];
    ok(stream.write_all(&request));

    let flow = pods_flow(&topo, port);
    let stall = agent.wait_finding(
        |f| kind_on_flow("tcp_stall", flow)(f) && f["sport"].as_u64() == Some(local.port().into()),
        node_diag_tests::agent::scaled(Duration::from_secs(15)),
    );
    assert_shape(&stall);
    assert_eq!(field(&stall, "severity"), "warning", "{stall:#}");
    let evidence = &stall["evidence"];
    assert_eq!(evidence["segment_len"].as_u64(), Some(200), "{stall:#}");
    assert!(
        evidence["retransmits"].as_u64() >= Some(3),
        "the stall needs repeated retransmits: {stall:#}"
    );
    assert!(
        field(&stall, "summary").contains("shorter than the MSS"),
        "{stall:#}"
    );
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(1));
    assert_eq!(agent.counter(BLACKHOLES), 0.0, "{}", agent.metrics_text());
    drop(stream);
}

/// `reject with tcp reset` on this node: the client sees a refused connect exactly as
/// from a closed port, but the RST is this node's netfilter answering for the pod.
#[test]
fn local_reject_with_tcp_reset_is_this_nodes_firewall() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9102;
    // The application listens: only the firewall refuses.
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.reject_forwarded_tcp(&topo.node_a, port, Reject::TcpReset);

    let f = refused_connect(&topo, &agent, port, by_rst, "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    let flow = pods_flow(&topo, port);
    agent.expect_no_finding(
        |f| kind_on_flow("tcp_refused", flow)(f) && field(f, "layer") == "listener",
        Duration::from_millis(500),
    );
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
}

/// `reject with icmpx type port-unreachable` on the other node: the client gets
/// `ECONNREFUSED` from an ICMP error, never a RST. No listener refused anything.
#[test]
fn remote_icmp_port_unreachable_is_a_firewall_not_the_listener() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9103;
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.reject_forwarded_tcp(&topo.node_b, port, Reject::IcmpPortUnreachable);

    let f = refused_connect(
        &topo,
        &agent,
        port,
        ConnectOutcome::is_refused_by_icmp,
        "firewall",
    );
    assert_eq!(f["evidence"]["rst_received"], false, "{f:#}");
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
}

/// The control for the test above: a closed port answers with a RST, and that is the
/// listener's doing.
#[test]
fn closed_port_answered_with_rst_is_the_listener() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9104;

    let f = refused_connect(&topo, &agent, port, by_rst, "listener");
    assert_eq!(f["evidence"]["rst_received"], true, "{f:#}");
}

/// This node's firewall drops the SYNs and the application gives up after 1 s, before
/// the kernel would: still a timeout, and this node's firewall is to blame.
#[test]
fn abandoned_connect_with_local_drop_is_a_timeout() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9105;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.drop_forwarded_tcp(&topo.node_a, port);

    let f = abandoned_connect(&topo, &agent, port, Duration::from_secs(1), "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
}

/// The other node drops the SYNs; the application gives up after 1.5 s (one SYN
/// retransmit). This node saw its SYNs leave and nothing come back: a timeout of
/// unknown layer, abandoned.
#[test]
fn abandoned_connect_with_remote_drop_is_a_timeout_of_unknown_layer() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9106;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.drop_forwarded_tcp(&topo.node_b, port);

    let f = abandoned_connect(&topo, &agent, port, Duration::from_millis(1500), "unknown");
    assert!(
        f["evidence"].get("drop_reason").is_none(),
        "no drop on this node: {f:#}"
    );
}

/// A listener with backlog 1 whose two queued connections are never accepted: its
/// accept queue is full, so the kernel drops further SYNs. The server accepts them later.
struct StuckListener {
    listener: Socket,
    /// Held open: they fill the queue until accepted.
    _fillers: Vec<TcpStream>,
    accepted: Vec<Socket>,
}

impl StuckListener {
    fn start(topo: &Topology, port: u16) -> StuckListener {
        let addr = topo.pod_b_addr(port);
        let listener = in_netns(&topo.pod_b, || -> std::io::Result<Socket> {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            s.set_reuse_address(true)?;
            s.bind(&addr.into())?;
            // Backlog 1: the accept queue takes two connections, then drops SYNs.
            s.listen(1)?;
            Ok(s)
        })
        .unwrap_or_else(|e| panic!("listener in {} on {addr}: {e}", topo.pod_b));
        let fillers = (0..2)
            .map(|i| {
                in_netns(&topo.pod_a, || TcpStream::connect_timeout(&addr, STEP))
                    .unwrap_or_else(|e| panic!("filler connection {i} to {addr}: {e}"))
            })
            .collect();
        StuckListener {
            listener,
            _fillers: fillers,
            accepted: Vec::new(),
        }
    }

    /// Accepts whatever is queued: the queue has room again.
    fn drain(&mut self) -> usize {
        ok(self
            .listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string()));
        while let Ok((s, _)) = self.listener.accept() {
            self.accepted.push(s);
        }
        self.accepted.len()
    }
}

/// The connect retransmits its SYN into a full accept queue long enough to be reported
/// as timing out, then gets through: the timeout is printed again as resolved and is no
/// longer active on `/findings`.
#[test]
fn connect_that_succeeds_late_resolves_its_timeout() {
    let topo = Topology::new();
    // Without SYN cookies the full queue drops the SYN, whatever the kernel's default.
    ok(topo.sysctl(&topo.pod_b, "net.ipv4.tcp_syncookies=0"));
    let agent = Agent::start_ready(&topo);
    let port = 9107;
    let mut stuck = StuckListener::start(&topo, port);
    let flow = pods_flow(&topo, port);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let client = connect_in_background(&topo.pod_a, topo.pod_b_addr(port), Duration::from_secs(10));
    // syn_retries 2: the second retransmit, at about 3 s, makes it a timeout.
    let active = agent.try_wait_finding(
        |f| kind_on_flow("tcp_timeout", flow)(f) && field(f, "status") == "active",
        left(start, Duration::from_millis(4500)),
    );
    let Some(active) = active else {
        let fill = cmd::run_in(&topo.pod_b, &["ss", "-ltn", &format!("sport = :{port}")]);
        drop(stuck);
        let outcome = client.join().expect("client thread");
        panic!(
            "no active tcp_timeout on {flow:?} within 4.5 s of the connect (client: \
             {outcome:?}; listener before release:\n{fill})\n{}",
            agent.diagnostics()
        );
    };
    assert_shape(&active);
    assert_layer(&active, "unknown");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
    assert!(
        !client.is_finished(),
        "the client finished before the queue was drained: {:?}",
        client.join()
    );

    // Let the server catch up (wait for the 4.5 s mark): the next SYN retransmit, at
    // about 7 s, gets through.
    thread::sleep(left(start, Duration::from_millis(4500)));
    let drained = stuck.drain();
    assert_eq!(drained, 2, "queued filler connections accepted");
    let outcome = client.join().expect("client thread");
    let connected_after = start.elapsed();
    assert!(
        matches!(outcome, ConnectOutcome::Connected),
        "late connect after {connected_after:?}: {outcome:?}\n{}",
        agent.diagnostics()
    );

    let resolved = agent.wait_finding(
        |f| kind_on_flow("tcp_timeout", flow)(f) && field(f, "status") == "resolved",
        Duration::from_secs(3),
    );
    assert_layer(&resolved, field(&active, "layer"));
    assert_eq!(resolved["netns"], active["netns"], "{resolved:#}");
    assert!(
        resolved["resolved_at"].is_string(),
        "resolved without resolved_at: {resolved:#}"
    );
    // One attempt timed out once: neither its later SYN retransmits nor its success count
    // again.
    assert_eq!(
        agent.counter(TIMEOUT),
        before + 1.0,
        "{}",
        agent.metrics_text()
    );
    // The path probe the timeout asked for may end after the late success (slowly, in a
    // TCG guest): it must not bring the timeout back.
    thread::sleep(node_diag_tests::agent::scaled(Duration::from_secs(2)));
    let served = agent.findings_endpoint();
    let still: Vec<&Value> = served
        .iter()
        .filter(|f| {
            field(f, "kind") == "tcp_timeout"
                && field(f, "dst") == topo.pod_b_ip.to_string()
                && f["dport"].as_u64() == Some(u64::from(port))
                && field(f, "status") != "resolved"
        })
        .collect();
    assert!(
        still.is_empty(),
        "GET /findings still holds an active tcp_timeout for {}:{port} after the \
         connect succeeded ({connected_after:?}): {still:#?}",
        topo.pod_b_ip
    );
}

/// A connect whose own SYNs are lost, reported as timing out, then completed by the
/// peer's SYN crossing it (a simultaneous open: the socket goes from SYN_SENT to SYN_RECV
/// and answers with a SYN-ACK, never receiving one of its own): the timeout is resolved,
/// as for a late SYN-ACK, and the attempt ends there. The connection's later reset by the
/// peer is a reset, not a refusal of the connect.
#[test]
fn connect_completed_by_a_simultaneous_open_resolves_its_timeout() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let (port, sport) = (9121, 41121);
    // Pod A's SYNs to pod B:port are lost in node A; pod B's SYN from that port, and the
    // SYN-ACK pod A answers it with, pass.
    topo.drop_forwarded_syn(&topo.node_a, port);
    let flow = pods_flow(&topo, port);
    let (client_addr, server_addr) = (
        SocketAddr::from((topo.pod_a_ip, sport)),
        topo.pod_b_addr(port),
    );
    let before = agent.counter(TIMEOUT);
    let bound = |local: SocketAddr| -> std::io::Result<Socket> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.bind(&local.into())?;
        Ok(socket)
    };

    let start = Instant::now();
    let client = spawn_in_netns(&topo.pod_a, move || {
        let socket = bound(client_addr)?;
        socket.connect_timeout(&server_addr.into(), Duration::from_secs(15))?;
        Ok::<Socket, std::io::Error>(socket)
    });
    // syn_retries 2: the second retransmit, at about 3 s, makes it a timeout.
    let active = agent.wait_finding(
        |f| kind_on_flow("tcp_timeout", flow)(f) && field(f, "status") == "active",
        left(start, Duration::from_millis(4500)),
    );
    assert_shape(&active);
    assert_layer(&active, "firewall");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
    assert!(
        !client.is_finished(),
        "the connect ended before the crossing SYN"
    );

    // Pod B connects from pod A's destination port to pod A's connecting port: its SYN
    // meets pod A's socket in SYN_SENT.
    let peer = in_netns(&topo.pod_b, || {
        let socket = bound(server_addr)?;
        socket.connect_timeout(&client_addr.into(), STEP)?;
        Ok::<Socket, std::io::Error>(socket)
    })
    .unwrap_or_else(|e| panic!("pod B's crossing connect: {e}\n{}", agent.diagnostics()));
    let client = client
        .join()
        .expect("client thread")
        .unwrap_or_else(|e| panic!("pod A's connect: {e}\n{}", agent.diagnostics()));

    let resolved = agent.wait_finding(
        |f| kind_on_flow("tcp_timeout", flow)(f) && field(f, "status") == "resolved",
        STEP,
    );
    assert_layer(&resolved, field(&active, "layer"));
    assert_eq!(resolved["netns"], active["netns"], "{resolved:#}");
    assert_eq!(
        agent.counter(TIMEOUT),
        before + 1.0,
        "{}",
        agent.metrics_text()
    );

    // SO_LINGER 0: pod B's close resets the connection pod A holds open.
    peer.set_linger(Some(Duration::ZERO)).expect("linger");
    drop(peer);
    let reset = agent.wait_finding(kind_on_flow("tcp_reset", flow), STEP);
    assert_shape(&reset);
    assert_layer(&reset, "peer");
    agent.expect_no_finding(
        kind_on_flow("tcp_refused", flow),
        Duration::from_millis(500),
    );
    drop(client);
}

/// Pins the calling thread, and the threads it starts from now on, to the first CPU it
/// may run on.
fn pin_to_one_cpu() {
    // SAFETY: cpu_set_t is plain data; the calls get a valid pointer and its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(
            libc::sched_getaffinity(0, size, &mut set),
            0,
            "sched_getaffinity"
        );
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("some CPU allowed");
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// Two namespaces joined only to each other by a veth (10.99.0.1 <-> 10.99.0.2): on the
/// kernel, but no pod of node A.
struct ForeignPair {
    a: Netns,
    b: Netns,
}

impl ForeignPair {
    const A_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
    const B_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

    fn new() -> ForeignPair {
        let base = unique_name();
        let a = ok(Netns::create(&format!("{base}-fa")));
        let b = ok(Netns::create(&format!("{base}-fb")));
        let (na, nb) = (a.name().to_owned(), b.name().to_owned());
        cmd::run(&[
            "ip", "-n", &na, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
            "netns", &nb,
        ]);
        for (ns, ip) in [(&na, Self::A_IP), (&nb, Self::B_IP)] {
            cmd::run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "eth0",
            ]);
            cmd::run(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
        }
        ForeignPair { a, b }
    }
}

/// Without `--all-netns` the agent reports for its node and its pods only: refused
/// connects in a namespace elsewhere on the kernel make no finding, and do not leak into
/// the next finding of a pod.
#[test]
fn foreign_namespace_connects_are_not_reported() {
    let topo = Topology::new();
    let foreign = ForeignPair::new();
    let agent = Agent::start_ready(&topo);
    let (fa, fb) = (foreign.a.name().to_owned(), foreign.b.name().to_owned());
    let foreign_inodes = [netns_inode(&fa), netns_inode(&fb)];
    let port = 9108;

    // The kernel reuses a freed socket's address for the next socket on that CPU, and
    // per-connection state is keyed by it. So first leave failed attempts of pod A
    // behind (abandoned after a SYN retransmit), on the CPU the foreign sockets below
    // are made on: a foreign socket must not inherit their namespace or counters.
    pin_to_one_cpu();
    let silent = 9109;
    topo.drop_forwarded_tcp(&topo.node_b, silent);
    for _ in 0..2 {
        let outcome = connect_and_abandon(
            &topo.pod_a,
            topo.pod_b_addr(silent),
            Duration::from_millis(1200),
        );
        assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    }

    // Closed ports on the foreign namespace's loopback and across its own veth.
    for i in 0..20 {
        for to in [Ipv4Addr::LOCALHOST, ForeignPair::B_IP] {
            let outcome = tcp_connect(&fa, SocketAddr::from((to, port)), STEP);
            assert!(
                matches!(outcome, ConnectOutcome::Refused),
                "foreign connect {i} to {to}:{port}: {outcome:?}"
            );
        }
    }

    let is_foreign = |f: &Value| {
        f["netns"]
            .as_u64()
            .is_some_and(|ns| foreign_inodes.contains(&ns))
            || involves(f, Ipv4Addr::LOCALHOST)
            || involves(f, ForeignPair::A_IP)
            || involves(f, ForeignPair::B_IP)
    };
    agent.expect_no_finding(is_foreign, Duration::from_secs(3));
    let served = agent.findings_endpoint();
    let leaked: Vec<&Value> = served.iter().filter(|f| is_foreign(f)).collect();
    assert!(
        leaked.is_empty(),
        "GET /findings has foreign findings: {leaked:#?}"
    );

    // The pod's own refused connect still is.
    let f = refused_connect(&topo, &agent, port, by_rst, "listener");
    assert_eq!(
        f["netns"].as_u64(),
        Some(netns_inode(&topo.pod_a)),
        "netns of pod A ({}): {f:#}",
        topo.pod_a
    );
    assert!(
        f["evidence"].get("syn_retransmits").is_none(),
        "a connect refused at once has no SYN retransmits: {f:#}"
    );
    agent.expect_no_finding(is_foreign, Duration::from_millis(200));
    drop(agent);
    drop(foreign);
}

/// Connects from `netns` to `addr` from local port `sport` (SO_REUSEADDR, so the port
/// of an earlier attempt is taken again), giving up after `after`.
fn connect_from_port(netns: &str, sport: u16, addr: SocketAddr, after: Duration) -> ConnectOutcome {
    in_netns(netns, || {
        let socket = match Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)) {
            Ok(s) => s,
            Err(e) => return ConnectOutcome::Other(e),
        };
        let local = SocketAddr::from((Ipv4Addr::UNSPECIFIED, sport));
        if let Err(e) = socket
            .set_reuse_address(true)
            .and_then(|()| socket.bind(&local.into()))
        {
            return ConnectOutcome::Other(e);
        }
        match socket.connect_timeout(&addr.into(), after) {
            Ok(()) => ConnectOutcome::Connected,
            Err(e) => ConnectOutcome::from_error(e),
        }
    })
}

/// Connects one socket from `netns` to each of `addrs` in turn (blocking, each attempt
/// given up after `after` by SO_SNDTIMEO): Linux lets a socket whose connect failed
/// connect again. The socket is closed after the last attempt.
fn connects_on_one_socket(
    netns: &str,
    addrs: &[SocketAddr],
    after: Duration,
) -> Vec<ConnectOutcome> {
    in_netns(netns, || {
        let socket = match Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
            .and_then(|s| s.set_write_timeout(Some(after)).map(|()| s))
        {
            Ok(s) => s,
            Err(e) => return vec![ConnectOutcome::Other(e)],
        };
        addrs
            .iter()
            .map(|addr| match socket.connect(&(*addr).into()) {
                Ok(()) => ConnectOutcome::Connected,
                // A blocking connect's SO_SNDTIMEO ran out with the SYN unanswered.
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => ConnectOutcome::TimedOut,
                Err(e) => ConnectOutcome::from_error(e),
            })
            .collect()
    })
}

/// A socket that connects again after a failed connect starts a new attempt: refused
/// twice (two closed ports), then dropped by this node's firewall, it makes two refusals
/// of the listener and a firewall timeout. Nothing of an earlier attempt (its verdict
/// already given, the reset it received) carries into the next one.
#[test]
fn one_socket_connecting_again_is_judged_per_attempt() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let (closed1, closed2, dropped) = (9112, 9113, 9114);
    topo.drop_forwarded_tcp(&topo.node_a, dropped);
    let refused_before = agent.counter(REFUSED);
    let timeout_before = agent.counter(TIMEOUT);

    let outcomes = connects_on_one_socket(
        &topo.pod_a,
        &[
            topo.pod_b_addr(closed1),
            topo.pod_b_addr(closed2),
            topo.pod_b_addr(dropped),
        ],
        Duration::from_secs(5),
    );
    assert!(
        matches!(
            outcomes.as_slice(),
            [
                ConnectOutcome::Refused,
                ConnectOutcome::Refused,
                ConnectOutcome::TimedOut
            ]
        ),
        "{outcomes:?}"
    );

    for port in [closed1, closed2] {
        let f = agent.wait_finding(kind_on_flow("tcp_refused", pods_flow(&topo, port)), STEP);
        assert_shape(&f);
        assert_layer(&f, "listener");
        assert_eq!(f["evidence"]["rst_received"], true, "{f:#}");
    }
    let timeout = agent.wait_finding(kind_on_flow("tcp_timeout", pods_flow(&topo, dropped)), STEP);
    assert_shape(&timeout);
    assert_layer(&timeout, "firewall");
    assert_eq!(
        timeout["evidence"]["drop_reason"], "NETFILTER_DROP",
        "{timeout:#}"
    );
    agent.wait_counter_at_least(REFUSED, refused_before + 2.0, STEP);
    agent.wait_counter_at_least(TIMEOUT, timeout_before + 1.0, STEP);
    agent.expect_no_finding(
        kind_on_flow("tcp_refused", pods_flow(&topo, dropped)),
        Duration::from_millis(500),
    );
    assert_eq!(
        agent.counter(REFUSED),
        refused_before + 2.0,
        "one refusal per refused attempt"
    );
}

/// Evidence belongs to its attempt: with the same source port (so the same flow key),
/// a SYN drop this node recorded for an earlier attempt, under a rule since removed,
/// must not explain a later attempt dropped beyond this node.
#[test]
fn evidence_from_an_earlier_attempt_does_not_explain_a_later_one() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9111;
    let sport = 40111;
    let flow = pods_flow(&topo, port);
    let is_timeout_on = |layer: &'static str| {
        move |f: &Value| kind_on_flow("tcp_timeout", flow)(f) && field(f, "layer") == layer
    };

    // First attempt: dropped by this node's firewall.
    topo.drop_forwarded_tcp(&topo.node_a, port);
    let outcome = connect_from_port(
        &topo.pod_a,
        sport,
        topo.pod_b_addr(port),
        Duration::from_secs(4),
    );
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let first = agent.wait_finding(is_timeout_on("firewall"), STEP);
    assert_eq!(
        first["evidence"]["drop_reason"], "NETFILTER_DROP",
        "{first:#}"
    );

    // Second attempt from the same port: the rule moved to the other node.
    topo.remove_forward_rules(&topo.node_a);
    topo.drop_forwarded_tcp(&topo.node_b, port);
    let start = Instant::now();
    let outcome = connect_from_port(
        &topo.pod_a,
        sport,
        topo.pod_b_addr(port),
        Duration::from_secs(4),
    );
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let second = agent.wait_finding(
        is_timeout_on("unknown"),
        left(start, Duration::from_secs(6)),
    );
    assert_shape(&second);
    assert_eq!(second["sport"], sport, "{second:#}");
    assert!(
        second["evidence"].get("drop_reason").is_none(),
        "the earlier attempt's drop leaked into this one: {second:#}"
    );
}

/// Connects from `netns` with a dual-stack IPv6 socket (`IPV6_V6ONLY` off, as Java and
/// many runtimes open them) to the IPv4 `addr` as `::ffff:a.b.c.d`.
fn connect_v4_mapped(netns: &str, addr: SocketAddrV4, timeout: Duration) -> ConnectOutcome {
    in_netns(netns, || {
        let socket = match Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)) {
            Ok(s) => s,
            Err(e) => return ConnectOutcome::Other(e),
        };
        if let Err(e) = socket.set_only_v6(false) {
            return ConnectOutcome::Other(e);
        }
        let mapped = std::net::SocketAddrV6::new(addr.ip().to_ipv6_mapped(), addr.port(), 0, 0);
        match socket.connect_timeout(&SocketAddr::V6(mapped).into(), timeout) {
            Ok(()) => ConnectOutcome::Connected,
            Err(e) => ConnectOutcome::from_error(e),
        }
    })
}

/// A dual-stack socket's flow is `::ffff:a.b.c.d` in the kernel while its packets, and
/// so the drop evidence, are IPv4: the two must meet, and findings show IPv4.
#[test]
fn v4_mapped_sockets_keep_their_evidence() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let (drop_port, reject_port) = (9112, 9113);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(reject_port), ServerMode::Echo);
    topo.drop_forwarded_tcp(&topo.node_a, drop_port);
    topo.reject_forwarded_tcp(&topo.node_a, reject_port, Reject::TcpReset);
    let target = |port| SocketAddrV4::new(topo.pod_b_ip, port);

    // A local drop: a firewall timeout with its evidence, not `unknown`.
    let start = Instant::now();
    let outcome = connect_v4_mapped(&topo.pod_a, target(drop_port), Duration::from_secs(4));
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(
        kind_on_flow("tcp_timeout", pods_flow(&topo, drop_port)),
        left(start, Duration::from_secs(6)),
    );
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");

    // A local reject with a reset: found at all, and this node's firewall.
    let outcome = connect_v4_mapped(&topo.pod_a, target(reject_port), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(
        kind_on_flow("tcp_refused", pods_flow(&topo, reject_port)),
        Duration::from_secs(1),
    );
    assert_layer(&f, "firewall");
    assert!(
        !f.to_string().contains("::ffff:"),
        "addresses are shown as IPv4: {f:#}"
    );
}

/// The SYN gets through but this node drops the SYN-ACK coming back: not "nothing came
/// back from beyond this node", but this node's firewall on the return path.
#[test]
fn syn_ack_dropped_on_the_return_path_is_this_nodes_firewall() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9114;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.drop_forwarded_syn_ack(&topo.node_a, port);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let client = connect_in_background(&topo.pod_a, topo.pod_b_addr(port), Duration::from_secs(6));
    let f = agent.wait_finding(
        kind_on_flow("tcp_timeout", pods_flow(&topo, port)),
        left(start, Duration::from_secs(5)),
    );
    let outcome = client.join().expect("client thread");
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_eq!(f["evidence"]["return_path"], true, "{f:#}");
    assert!(field(&f, "summary").contains("SYN-ACK"), "{f:#}");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
}

/// Pod B serving `port` behind node B's filter, which rejects pod A's connects to it
/// with ICMP host-prohibited.
fn server_behind_host_prohibited(topo: &Topology, port: u16) -> TcpServer {
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    topo.reject_forwarded_tcp(&topo.node_b, port, Reject::IcmpHostProhibited);
    server
}

/// Pod A connects to [`server_behind_host_prohibited`] once: the connect fails by ICMP.
fn connect_host_prohibited(topo: &Topology, port: u16) {
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), STEP);
    assert!(outcome.is_icmp_failure(), "{outcome:?}");
}

/// The finding of a [`connect_host_prohibited`]: unreachable because of a filter, with
/// the ICMP's type and code.
fn host_prohibited_finding(topo: &Topology, agent: &Agent, port: u16) -> Value {
    let f = agent.wait_finding(
        kind_on_flow("tcp_unreachable", pods_flow(topo, port)),
        Duration::from_secs(1),
    );
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["icmp_received_type"], 3, "{f:#}");
    assert_eq!(f["evidence"]["icmp_received_code"], 10, "{f:#}");
    f
}

/// Whether `from` is node B, whose filter rejects: its underlay or overlay address.
fn is_node_b(from: &str) -> bool {
    from == "10.200.0.2" || from == "192.168.77.2"
}

/// firewalld's default and kube-router's policies reject with ICMP host-prohibited: the
/// connect fails with EHOSTUNREACH, which alone would read as routing. The ICMP that
/// came back (seen by TC ingress, watched from the start here) names a filter.
#[test]
fn remote_icmp_host_prohibited_is_a_firewall_not_routing() {
    let topo = Topology::new();
    let agent = Agent::start_ready_watching_icmp(&topo);
    let port = 9115;
    let _server = server_behind_host_prohibited(&topo, port);

    connect_host_prohibited(&topo, port);
    let f = host_prohibited_finding(&topo, &agent, port);
    assert!(
        is_node_b(field(&f["evidence"], "icmp_received_from")),
        "{f:#}"
    );
}

const ICMP_WATCH: &str = "node_diag_icmp_watch";

/// Whether node A's underlay has the agent's classifier (a netlink filter, so `tc`
/// shows it).
fn classifier_on_underlay(topo: &Topology) -> bool {
    let out = cmd::try_run_in(
        &topo.node_a,
        &["tc", "filter", "show", "dev", UNDERLAY_IF, "ingress"],
    );
    String::from_utf8_lossy(&out.stdout).contains("nd_tc_ingress")
}

/// The same reject under the default `--icmp-watch on-trouble`: on a healthy node no TC
/// classifier runs, so the first failure's ICMP is not seen arriving. Its type and code
/// still reach the finding from the socket's own error queue (the kernel queues a
/// connect's ICMP error there), so the filter is named, though not which host it was.
/// That failure attaches the classifier; the retry's evidence then names the sender.
/// After the hold time without trouble the classifier is detached again, its clsact
/// with it.
#[test]
fn icmp_watched_on_trouble_names_the_sender_from_the_next_failure() {
    let topo = Topology::new();
    let mut agent =
        Agent::start_with_args(&topo, &["--tc-attach", "netlink", "--icmp-watch-hold", "4"]);
    agent.wait_ready(node_diag_tests::agent::READY);
    let port = 9122;
    let _server = server_behind_host_prohibited(&topo, port);
    assert_eq!(agent.wait_metric(ICMP_WATCH, STEP), 0.0);
    assert!(!classifier_on_underlay(&topo), "{}", agent.diagnostics());

    connect_host_prohibited(&topo, port);
    let f = host_prohibited_finding(&topo, &agent, port);
    assert!(f["evidence"].get("icmp_received_from").is_none(), "{f:#}");
    agent.wait_counter_at_least(ICMP_WATCH, 1.0, STEP);
    assert!(classifier_on_underlay(&topo), "{}", agent.diagnostics());

    // Past the kernel's one-second aggregation window, so that the retry's verdict is an
    // event of its own, with its evidence, not only a count.
    thread::sleep(Duration::from_millis(1200));
    connect_host_prohibited(&topo, port);
    // The same finding (kind, layer, flow), its evidence the latest attempt's.
    let deadline = Instant::now() + node_diag_tests::agent::scaled(STEP);
    let named = loop {
        let found = agent.findings_endpoint().into_iter().find(|f| {
            kind_on_flow("tcp_unreachable", pods_flow(&topo, port))(f)
                && f["evidence"].get("icmp_received_from").is_some()
        });
        match found {
            Some(f) => break f,
            None if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
            None => panic!(
                "no sender named after the watch began\n{}\n{}",
                agent.metrics_text(),
                agent.diagnostics()
            ),
        }
    };
    assert_layer(&named, "firewall");
    assert_eq!(named["count"], 2, "{named:#}");
    assert!(
        is_node_b(field(&named["evidence"], "icmp_received_from")),
        "{named:#}"
    );

    // Quiet for the hold time (4 s, checked every 0.5 s): detached, nothing left.
    let deadline = Instant::now() + node_diag_tests::agent::scaled(Duration::from_secs(10));
    while agent.counter(ICMP_WATCH) != 0.0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(agent.counter(ICMP_WATCH), 0.0, "{}", agent.diagnostics());
    assert!(!classifier_on_underlay(&topo), "{}", agent.diagnostics());
    let qdiscs = cmd::run_in(&topo.node_a, &["tc", "qdisc", "show", "dev", UNDERLAY_IF]);
    assert!(
        !qdiscs.contains("clsact"),
        "{qdiscs}\n{}",
        agent.diagnostics()
    );
}

/// Clients that abort (a RST) reset the server's accepted connections, each from a new
/// ephemeral port: one finding per listener, counting them, not one per client port.
#[test]
fn server_side_resets_aggregate_per_listener() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9116;
    let server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    let aborts = 5;
    for _ in 0..aborts {
        in_netns(&topo.pod_b, || {
            let mut stream = TcpStream::connect_timeout(&server.addr(), STEP).expect("connect");
            stream.write_all(b"x").expect("write");
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).expect("echo");
            // SO_LINGER 0: the close sends a RST.
            Socket::from(stream)
                .set_linger(Some(Duration::ZERO))
                .expect("linger");
        });
    }
    let listener = format!("{}:{port}", topo.pod_a_ip);
    let on_listener =
        |f: &Value| field(f, "kind") == "tcp_reset" && field(f, "listener") == listener;
    let f = agent.wait_finding(on_listener, STEP);
    assert_shape(&f);
    assert_layer(&f, "peer");
    // Every abort lands in the one finding.
    let deadline = Instant::now() + STEP;
    let resets: Vec<Value> = loop {
        let resets: Vec<Value> = agent
            .findings_endpoint()
            .into_iter()
            .filter(|f| field(f, "kind") == "tcp_reset")
            .collect();
        let counted = resets
            .iter()
            .filter(|f| on_listener(f))
            .map(|f| f["count"].as_u64().unwrap_or(0))
            .sum::<u64>();
        if counted >= aborts || Instant::now() > deadline {
            break resets;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(resets.len(), 1, "one finding per listener: {resets:#?}");
    assert_eq!(resets[0]["count"], aborts, "{resets:#?}");
    assert!(resets[0].get("dport").is_none(), "{resets:#?}");
}

/// A host-network client (node A's own namespace, as a hostNetwork pod or the kubelet)
/// whose SYNs node A's OUTPUT chain drops, and which waits until the kernel gives up
/// (`ETIMEDOUT` after its SYN retries): a timeout, this node's firewall, with the drop
/// as evidence, counted once. The drop happens before the packet leaves, so no "left
/// this node" may be said.
#[test]
fn host_network_connect_dropped_by_output_the_kernel_gives_up_on_is_a_firewall_timeout() {
    let topo = Topology::new();
    let port = 9131;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    // Two SYN retries: the kernel gives up after about 7 s, not two minutes.
    ok(topo.sysctl(&topo.node_a, "net.ipv4.tcp_syn_retries=2"));
    let dport = port.to_string();
    cmd::run_in(
        &topo.node_a,
        &[
            "iptables", "-w", "-A", "OUTPUT", "-p", "tcp", "--syn", "--dport", &dport, "-j", "DROP",
        ],
    );
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let outcome = tcp_connect(&topo.node_a, topo.pod_b_addr(port), Duration::from_secs(30));
    assert!(
        matches!(outcome, ConnectOutcome::TimedOut),
        "the kernel gives up: {outcome:?} after {:?}",
        start.elapsed()
    );
    let f = agent.wait_finding(
        |f| {
            field(f, "kind") == "tcp_timeout"
                && field(f, "dst") == topo.pod_b_ip.to_string()
                && f["dport"].as_u64() == Some(u64::from(port))
        },
        STEP,
    );
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_eq!(
        f["netns"].as_u64(),
        Some(netns_inode(&topo.node_a)),
        "{f:#}"
    );
    assert!(
        !field(&f, "summary").contains("left this node"),
        "this node dropped it: {f:#}"
    );
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
    thread::sleep(Duration::from_secs(1));
    assert_eq!(
        agent.counter(TIMEOUT),
        before + 1.0,
        "one attempt, one timeout\n{}",
        agent.metrics_text()
    );
}

/// The destination pod itself rejects with ICMP administratively prohibited (Cilium's
/// `policyDenyResponse: icmp`, firewalld on the server): a firewall at the destination,
/// and the evidence says the destination sent it, not a router or filter on the way.
#[test]
fn admin_prohibited_sent_by_the_destination_is_its_firewall() {
    let topo = Topology::new();
    let port = 9116;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    cmd::run_in(&topo.pod_b, &["nft", "add table inet ndpolicy"]);
    cmd::run_in(
        &topo.pod_b,
        &[
            "nft",
            "add chain inet ndpolicy input { type filter hook input priority 0; }",
        ],
    );
    cmd::run_in(
        &topo.pod_b,
        &[
            "nft",
            &format!(
                "add rule inet ndpolicy input tcp dport {port} reject with icmp type admin-prohibited"
            ),
        ],
    );
    let agent = Agent::start_ready_watching_icmp(&topo);
    let before = agent.counter(r#"node_diag_tcp_connect_failures_total{reason="unreachable"}"#);

    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), STEP);
    assert!(outcome.is_icmp_failure(), "{outcome:?}");
    let f = agent.wait_finding(
        kind_on_flow("tcp_unreachable", pods_flow(&topo, port)),
        Duration::from_secs(1),
    );
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["icmp_received_code"], 13, "{f:#}");
    assert_eq!(
        f["evidence"]["icmp_received_from"],
        topo.pod_b_ip.to_string(),
        "{f:#}"
    );
    assert_eq!(f["evidence"]["icmp_from_destination"], true, "{f:#}");
    assert!(field(&f, "summary").contains("the destination"), "{f:#}");
    agent.wait_counter_at_least(
        r#"node_diag_tcp_connect_failures_total{reason="unreachable"}"#,
        before + 1.0,
        STEP,
    );
}
