//! Self-tests of the harness, no agent needed: the topology carries pod
//! traffic, the TCP helpers classify failures correctly, and everything is
//! gone after drop (even after a panic).
//!
//! `cargo test -p node-diag-tests --test topology -- --test-threads=1` (root).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use node_diag_tests::netns::netns_exists;
use node_diag_tests::topology::{POD_HOST_IF, POD_IF, UNDERLAY_IF, VXLAN_IF};
use node_diag_tests::{
    ConnectOutcome, ServerMode, TcpServer, Topology, cmd, http_get, spawn_in_netns, tcp_connect,
    tcp_request,
};

const STEP: Duration = Duration::from_secs(3);

fn mtu(netns: &str, dev: &str) -> u32 {
    let out = cmd::run(&["ip", "-n", netns, "-o", "link", "show", "dev", dev]);
    let mut words = out.split_whitespace();
    words
        .find(|w| *w == "mtu")
        .and_then(|_| words.next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no mtu in {out:?}"))
}

#[test]
fn pods_talk_over_the_overlay() {
    let topo = Topology::new();
    assert_eq!(mtu(&topo.node_a, UNDERLAY_IF), 1500);
    assert_eq!(
        mtu(&topo.node_a, VXLAN_IF),
        1450,
        "kernel-derived vxlan MTU"
    );
    assert_eq!(mtu(&topo.node_b, VXLAN_IF), 1450);
    assert_eq!(mtu(&topo.node_a, POD_HOST_IF), 1450);
    assert_eq!(mtu(&topo.pod_a, POD_IF), 1450);

    assert!(
        topo.ping_until(&topo.pod_b, topo.pod_a_ip, STEP),
        "pod B -> pod A ping"
    );

    let server_b = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9000), ServerMode::Echo);
    for i in 0..5 {
        let msg = format!("hello {i}");
        let reply = tcp_request(&topo.pod_a, server_b.addr(), msg.as_bytes(), STEP)
            .unwrap_or_else(|e| panic!("request {i} pod A -> pod B failed: {e}"));
        assert_eq!(reply, msg.as_bytes());
    }
    assert_eq!(server_b.accepted(), 5);

    // A payload bigger than one segment, both directions of the overlay.
    let server_a = TcpServer::start(&topo.pod_a, topo.pod_a_addr(9000), ServerMode::Echo);
    let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    let reply = tcp_request(&topo.pod_b, server_a.addr(), &big, STEP).expect("pod B -> pod A");
    assert_eq!(reply, big);
}

#[test]
fn connect_classifies_refused_and_reset() {
    let topo = Topology::new();
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(9001), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");

    let server = TcpServer::start(
        &topo.pod_b,
        topo.pod_b_addr(9002),
        ServerMode::ResetAfterFirstByte,
    );
    let outcome = tcp_connect(&topo.pod_a, server.addr(), STEP);
    assert!(matches!(outcome, ConnectOutcome::Connected), "{outcome:?}");
    let err = tcp_request(&topo.pod_a, server.addr(), b"x", STEP)
        .expect_err("the server aborts the connection");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
}

#[test]
fn connect_times_out_through_a_forward_drop() {
    let topo = Topology::new();
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9003), ServerMode::Echo);
    topo.drop_forwarded_tcp(&topo.node_a, 9003);

    let timeout = Duration::from_millis(1500);
    let start = Instant::now();
    let outcome = tcp_connect(&topo.pod_a, server.addr(), timeout);
    let elapsed = start.elapsed();
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    assert!(elapsed >= timeout, "timed out early: {elapsed:?}");
    assert_eq!(server.accepted(), 0);

    // A background connect (as the scenarios use) sees the same.
    let addr = server.addr();
    let bg = spawn_in_netns(&topo.pod_a, move || {
        std::net::TcpStream::connect_timeout(&addr, timeout).map(drop)
    });
    let err = bg.join().expect("connect thread").expect_err("dropped");
    assert!(
        matches!(ConnectOutcome::from_error(err), ConnectOutcome::TimedOut),
        "background connect"
    );
}

#[test]
fn connect_is_unreachable_without_the_pod_route() {
    let topo = Topology::new();
    topo.delete_pod_route(&topo.node_b, topo.pod_b_ip);
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(9004), Duration::from_secs(6));
    assert!(outcome.is_icmp_failure(), "{outcome:?}");
}

#[test]
fn http_get_reads_a_response_in_the_namespace() {
    let topo = Topology::new();
    let (listener_tx, listener_rx) = std::sync::mpsc::channel();
    let server = spawn_in_netns(&topo.node_a, move || {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener_tx
            .send(listener.local_addr().expect("addr"))
            .expect("send addr");
        let (mut conn, _) = listener.accept().expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = conn.read(&mut buf).expect("read request");
            assert!(n > 0, "client closed early");
            request.extend_from_slice(&buf[..n]);
        }
        conn.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nup 1\r\n0\r\n\r\n",
        )
        .expect("write response");
        String::from_utf8(request).expect("utf-8 request")
    });
    let addr = listener_rx.recv().expect("server address").to_string();
    let (status, body) = http_get(&topo.node_a, &addr, "/metrics");
    let request = server.join().expect("server thread");
    assert_eq!((status, body.as_str()), (200, "up 1"));
    assert!(
        request.starts_with("GET /metrics HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains("Connection: close\r\n"), "{request}");
}

#[test]
fn namespaces_are_gone_after_drop_even_on_panic() {
    let topo = Topology::new();
    let names = topo.netns_names();
    assert_eq!(names.len(), 4);
    assert_eq!(
        names,
        [&topo.node_a, &topo.node_b, &topo.pod_a, &topo.pod_b].map(String::clone)
    );
    for name in &names {
        assert!(netns_exists(name), "{name} missing while alive");
        assert!(name.len() <= 15, "{name} longer than an interface name");
    }
    drop(topo);
    for name in &names {
        assert!(!netns_exists(name), "{name} left behind after drop");
    }

    let mut names = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topo = Topology::new();
        names = topo.netns_names();
        let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9005), ServerMode::Echo);
        panic!("deliberate failure inside a test");
    }));
    assert!(result.is_err());
    assert_eq!(names.len(), 4);
    for name in &names {
        assert!(!netns_exists(name), "{name} left behind after a panic");
    }
}
