//! `node-diag probe`: the path MTU found by a real DF binary search through the test
//! topology (1450 across the vxlan overlay, 1500 on the underlay), a TCP check, and a
//! PMTUD black hole made by dropping ICMP frag-needed on node A.
//!
//! No agent runs here: `probe` needs no eBPF, only a raw ICMP socket, and is run with
//! `ip netns exec` in the namespace it probes from. Every run's exit status is checked
//! against its report (0 ok, 2 refused, 3 no answer, 4 black hole, 5 unreachable), and
//! `-v` progress goes to stderr, never into the JSON on stdout.
//!
//! `NODE_DIAG_BIN=target/debug/node-diag cargo test -p node-diag-tests --test probe -- --test-threads=1` (root).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use node_diag_tests::netns::Netns;
use node_diag_tests::topology::{POD_HOST_IF, POD_IF};
use node_diag_tests::{ServerMode, TcpServer, Topology, cmd, node_diag_bin, unique_name};
use serde_json::Value;

/// Bounds each echo wait before the first answer (and the TCP connect); later waits
/// adapt to the round trip, so a black hole costs well under this per vanished size.
const TIMEOUT_MS: &str = "1000";

/// What a probe run gave: its report, exit status and stderr.
struct Run {
    report: Value,
    code: Option<i32>,
    stderr: String,
}

/// Runs `node-diag probe DST ARGS -o json` inside `netns`.
fn probe_run(netns: &str, dst: impl ToString, args: &[&str]) -> Run {
    let bin = node_diag_bin();
    let bin = bin.to_str().expect("NODE_DIAG_BIN is not UTF-8");
    let dst = dst.to_string();
    let mut argv = vec![bin, "probe", &dst, "--timeout-ms", TIMEOUT_MS, "-o", "json"];
    argv.extend_from_slice(args);
    let out = cmd::try_run_in(netns, &argv);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("probe output is not JSON ({e}):\n{stdout}\nstderr: {stderr}"));
    Run {
        report,
        code: out.status.code(),
        stderr,
    }
}

/// The exit status the documented mapping gives `report`: a failed TCP check first,
/// then the path's verdict.
fn expected_exit(report: &Value) -> i32 {
    match (report["tcp"]["result"].as_str(), report["verdict"].as_str()) {
        (Some("refused"), _) => 2,
        (Some("timed_out"), _) => 3,
        (Some("unreachable"), _) => 5,
        (Some("error"), _) => 6,
        (_, Some("ok" | "pmtu_below_local")) => 0,
        (_, Some("blackhole")) => 4,
        (_, Some("no_reply"))
            if report["summary"]
                .as_str()
                .is_some_and(|s| s.contains("unreachable")) =>
        {
            5
        }
        (_, Some("no_reply")) => 3,
        other => panic!("unexpected report {other:?}: {report:#}"),
    }
}

/// Runs `node-diag probe DST ARGS -o json` inside `netns` and returns its report, after
/// checking that its exit status is the report's.
fn probe(netns: &str, dst: impl ToString, args: &[&str]) -> Value {
    let run = probe_run(netns, dst, args);
    assert_eq!(
        run.code,
        Some(expected_exit(&run.report)),
        "exit status of {:#}\nstderr: {}",
        run.report,
        run.stderr
    );
    run.report
}

/// Runs `node-diag probe ARGS` inside `netns`, expecting it to fail; returns stderr.
fn probe_error(netns: &str, args: &[&str]) -> String {
    let bin = node_diag_bin();
    let mut argv = vec![bin.to_str().expect("NODE_DIAG_BIN is not UTF-8"), "probe"];
    argv.extend_from_slice(args);
    let out = cmd::try_run_in(netns, &argv);
    assert!(
        !out.status.success(),
        "probe {args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn set_mtu(netns: &str, dev: &str, mtu: u32) {
    cmd::run(&[
        "ip",
        "-n",
        netns,
        "link",
        "set",
        dev,
        "mtu",
        &mtu.to_string(),
    ]);
}

#[test]
fn overlay_path_mtu_is_1450() {
    let topo = Topology::new();
    for (from, to, what) in [
        (&topo.pod_a, topo.pod_b_ip, "pod A -> pod B"),
        (&topo.pod_b, topo.pod_a_ip, "pod B -> pod A"),
    ] {
        let r = probe(from, to, &[]);
        assert_eq!(r["path_mtu"], 1450, "{what}: {r:#}");
        assert_eq!(r["max_icmp_payload"], 1422, "1450 − 20 − 8: {r:#}");
        assert_eq!(r["local_mtu"], 1450, "{what}: {r:#}");
        assert_eq!(r["verdict"], "ok", "{what}: {r:#}");
        assert_eq!(r["vanished_sizes"], serde_json::json!([]), "{r:#}");
    }
}

#[test]
fn underlay_path_mtu_is_1500() {
    let topo = Topology::new();
    let r = probe(&topo.node_a, topo.node_b_underlay, &[]);
    assert_eq!(r["path_mtu"], 1500, "{r:#}");
    assert_eq!(r["max_icmp_payload"], 1472, "1500 − 20 − 8: {r:#}");
    assert_eq!(r["interface"], "ul0", "{r:#}");
    assert_eq!(r["verdict"], "ok", "{r:#}");
}

#[test]
fn tcp_check_tells_refused_from_ok() {
    let topo = Topology::new();
    let r = probe(&topo.pod_a, topo.pod_b_ip, &["--port", "9"]);
    assert_eq!(r["tcp"]["port"], 9, "{r:#}");
    assert_eq!(r["tcp"]["result"], "refused", "{r:#}");
    assert_eq!(r["tcp"]["errno"], libc::ECONNREFUSED, "{r:#}");
    assert_eq!(r["path_mtu"], 1450, "{r:#}");

    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(8080), ServerMode::Echo);
    let r = probe(&topo.pod_a, topo.pod_b_ip, &["--port", "8080"]);
    assert_eq!(r["tcp"]["result"], "ok", "{r:#}");
    assert!(r["tcp"]["errno"].is_null(), "{r:#}");
    // The kernel completes the handshake before the server thread's accept returns.
    assert_eq!(server.wait_accepted(1, Duration::from_secs(5)), 1);
}

/// The seed's fault: pod A (and its node-side veth) at 1500 over the 1450 vxlan, so a
/// 1472-byte DF echo from pod A must be forwarded by node A into vx0 and is refused there.
/// With ICMP allowed node A says so (frag-needed, next-hop MTU 1450); with frag-needed
/// dropped on node A's output hook the oversized probes just vanish.
#[test]
fn frag_needed_dropped_is_a_black_hole() {
    let topo = Topology::new();
    set_mtu(&topo.pod_a, POD_IF, 1500);
    set_mtu(&topo.node_a, POD_HOST_IF, 1500);

    let r = probe(&topo.pod_a, topo.pod_b_ip, &[]);
    assert_eq!(r["local_mtu"], 1500, "{r:#}");
    assert_eq!(r["path_mtu"], 1450, "{r:#}");
    assert_eq!(r["verdict"], "pmtu_below_local", "{r:#}");
    assert!(r["frag_needed"]["count"].as_u64() >= Some(1), "{r:#}");
    assert_eq!(r["frag_needed"]["next_hop_mtu"], 1450, "{r:#}");
    let router: IpAddr = r["frag_needed"]["from"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("frag_needed.from is not an address: {r:#}"));
    assert_eq!(
        router,
        IpAddr::V4(topo.pod_gateway),
        "node A sent it: {r:#}"
    );
    assert_eq!(r["vanished_sizes"], serde_json::json!([]), "{r:#}");

    // Pod A has now learnt (and cached) PMTU 1450 towards pod B; the probe must not
    // trust that cache, or the black hole below would hide behind it.
    // The table goes with node A's namespace.
    topo.drop_frag_needed(&topo.node_a);
    let r = probe(&topo.pod_a, topo.pod_b_ip, &[]);
    assert_eq!(r["verdict"], "blackhole", "{r:#}");
    assert_eq!(r["path_mtu"], 1450, "{r:#}");
    assert_eq!(r["frag_needed"]["count"], 0, "{r:#}");
    let vanished: Vec<u64> = r["vanished_sizes"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    assert_eq!(vanished.first(), Some(&1451), "{r:#}");
    assert_eq!(vanished.last(), Some(&1500), "{r:#}");

    // The same path in text: the verdict in words and the 1450 − 20 − 8 arithmetic.
    let bin = node_diag_bin();
    let dst = topo.pod_b_ip.to_string();
    let out = cmd::try_run_in(
        &topo.pod_a,
        &[
            bin.to_str().unwrap(),
            "probe",
            &dst,
            "--timeout-ms",
            TIMEOUT_MS,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert_eq!(out.status.code(), Some(4), "a black hole exits 4: {text}");
    assert!(
        text.contains("black hole: oversized probes vanished without ICMP frag-needed"),
        "{text}"
    );
    assert!(
        text.contains("1450 − 20 (IPv4) − 8 (ICMP) = 1422"),
        "{text}"
    );
    assert!(text.contains("1500 − 20 − 8 = 1472"), "{text}");
}

/// The statuses a script tests, each from a real path: 0 for a working path and open
/// port, 2 refused, 3 timed out, 4 black hole; and `-v` shows the search on stderr.
#[test]
fn exit_status_tells_ok_refused_timeout_and_black_hole() {
    let topo = Topology::new();
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(8080), ServerMode::Echo);
    let dst = topo.pod_b_ip;

    let ok = probe_run(&topo.pod_a, dst, &["--port", "8080", "-v"]);
    assert_eq!(ok.report["tcp"]["result"], "ok", "{:#}", ok.report);
    assert_eq!(ok.code, Some(0), "{:#}", ok.report);
    // Progress on stderr, one line per probe: the smallest size first, then the MTU.
    assert!(
        ok.stderr
            .contains(&format!("probing {dst}: 68 ok\nprobing {dst}: 1450 ok\n")),
        "{}",
        ok.stderr
    );
    assert!(
        ok.stderr.contains(&format!("connecting to {dst}:8080")),
        "{}",
        ok.stderr
    );
    let quiet = probe_run(&topo.pod_a, dst, &[]);
    assert_eq!(quiet.code, Some(0));
    assert!(
        !quiet.stderr.contains("probing"),
        "no -v, no terminal: {}",
        quiet.stderr
    );

    let refused = probe_run(&topo.pod_a, dst, &["--port", "9"]);
    assert_eq!(
        refused.report["tcp"]["result"], "refused",
        "{:#}",
        refused.report
    );
    assert_eq!(refused.code, Some(2), "{:#}", refused.report);

    // Node B's firewall drops the SYNs: the connect times out, while echo still works.
    topo.drop_forwarded_tcp(&topo.node_b, 8081);
    let timed_out = probe_run(&topo.pod_a, dst, &["--port", "8081"]);
    assert_eq!(
        timed_out.report["tcp"]["result"], "timed_out",
        "{:#}",
        timed_out.report
    );
    assert_eq!(timed_out.report["verdict"], "ok", "{:#}", timed_out.report);
    assert_eq!(timed_out.code, Some(3), "{:#}", timed_out.report);

    // The seed's black hole: pod A at 1500 over the 1450 overlay, frag-needed dropped.
    set_mtu(&topo.pod_a, POD_IF, 1500);
    set_mtu(&topo.node_a, POD_HOST_IF, 1500);
    topo.drop_frag_needed(&topo.node_a);
    let hole = probe_run(&topo.pod_a, dst, &["-v"]);
    assert_eq!(hole.report["verdict"], "blackhole", "{:#}", hole.report);
    assert_eq!(hole.code, Some(4), "{:#}", hole.report);
    assert!(
        hole.stderr.contains(&format!(
            "probing {dst}: 1500 lost\nprobing {dst}: 1500 lost\n"
        )),
        "each silence is shown, and its retry: {}",
        hole.stderr
    );

    // A usage error is 1 (bad input), never 2, which means refused.
    let bad = cmd::try_run_in(
        &topo.pod_a,
        &[
            node_diag_bin().to_str().unwrap(),
            "probe",
            &dst.to_string(),
            "--bogus",
        ],
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
}

#[test]
fn clear_errors_and_loopback() {
    let ns = Netns::create(&unique_name()).expect("create a namespace");
    let stderr = probe_error(ns.name(), &["10.9.9.9"]);
    assert!(stderr.contains("no route to 10.9.9.9"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let stderr = probe_error(ns.name(), &["10.0.0.300"]);
    assert!(stderr.contains("invalid destination"), "{stderr}");

    // Loopback: 65536-byte MTU, capped at the 65535-byte IP packet; IPv6 too.
    let r = probe(ns.name(), Ipv4Addr::LOCALHOST, &["--port", "1"]);
    assert_eq!(
        (&r["path_mtu"], &r["verdict"]),
        (&Value::from(65535), &Value::from("ok")),
        "{r:#}"
    );
    assert_eq!(r["tcp"]["result"], "refused", "{r:#}");
    let r = probe(ns.name(), "::1", &["--max-mtu", "9000"]);
    assert_eq!(r["family"], "ipv6", "{r:#}");
    assert_eq!(r["path_mtu"], 9000, "{r:#}");
    assert_eq!(r["max_icmp_payload"], 9000 - 48, "{r:#}");
}
