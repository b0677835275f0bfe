//! Findings name pods: a real containerd (Debian's, CRI plugin, runc, CNI bridge) runs in
//! node A with its own socket and state, pods are created through its CRI API, and the
//! agent started with `--cri-socket` names them in the findings of their connects.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time, containerd,
//! runc, containernetworking-plugins and busybox-static installed
//! (`cargo xtask prereqs --test-tools`):
//! `cargo test -p node-diag-tests --test pods -- --test-threads=1`.

use std::{
    net::{Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use node_diag_testbed::containerd::{Containerd, Pod, PodPool};
use node_diag_tests::finding::{assert_shape, field};
use node_diag_tests::{Agent, ConnectOutcome, Topology, ok, tcp_connect};
use serde_json::Value;

const STEP: Duration = Duration::from_secs(3);

/// One address only: a pod re-created after a removal gets the same one.
const POOL: PodPool = PodPool {
    subnet: Ipv4Addr::new(10, 88, 7, 0),
    prefix: 24,
    first: Ipv4Addr::new(10, 88, 7, 10),
    last: Ipv4Addr::new(10, 88, 7, 10),
};

/// A closed port on node A, reached from the pods through their bridge.
fn closed_port_on_node(port: u16) -> SocketAddr {
    SocketAddr::new(POOL.gateway().into(), port)
}

fn start_containerd(topo: &Topology) -> Containerd {
    ok(Containerd::start(&topo.node_a, POOL))
}

fn names_pod(f: &Value, pod: &Pod) -> bool {
    f["pod"]["namespace"] == pod.namespace.as_str()
        && f["pod"]["name"] == pod.name.as_str()
        && f["pod"]["uid"] == pod.uid.as_str()
}

/// Findings of `kind` from `pod`'s namespace.
fn from_pod<'a>(kind: &'a str, pod: &'a Pod) -> impl Fn(&Value) -> bool + 'a {
    move |f| field(f, "kind") == kind && f["netns"].as_u64() == Some(pod.netns_inode)
}

fn start_agent<'t>(topo: &'t Topology, containerd: &Containerd) -> Agent<'t> {
    let socket = containerd.socket().display().to_string();
    let mut agent = Agent::start_with_args(topo, &["--cri-socket", &socket]);
    agent.wait_ready(Duration::from_secs(60));
    agent
}

#[test]
fn refused_connect_from_a_cri_pod_names_the_pod() {
    let topo = Topology::new();
    let mut containerd = start_containerd(&topo);
    let pod = ok(containerd.run_pod("shop", "cart-7d9f", "4f1c-cart-uid"));
    let agent = start_agent(&topo, &containerd);

    let outcome = tcp_connect(&pod.netns, closed_port_on_node(8081), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(from_pod("tcp_refused", &pod), Duration::from_secs(5));
    assert_shape(&f);
    assert!(names_pod(&f, &pod), "the finding names {pod:?}:\n{f:#}");
    assert_eq!(f["src"], pod.ip.to_string(), "{f:#}");
    assert!(f.get("peer_pod").is_none(), "node A is no pod: {f:#}");
    agent.wait_counter_at_least(
        r#"node_diag_findings_total{kind="tcp_refused",layer="listener",severity="warning",namespace="shop"}"#,
        1.0,
        STEP,
    );
}

#[test]
fn pod_created_while_the_agent_runs_is_named_within_2s() {
    let topo = Topology::new();
    let mut containerd = start_containerd(&topo);
    let agent = start_agent(&topo, &containerd);

    // The pod's first connect comes at once, before the runtime could have been read
    // (events, or the list every second where the runtime has no events).
    let pod = ok(containerd.run_pod("shop", "late-4b2", "uid-late"));
    let created = Instant::now();
    let outcome = tcp_connect(&pod.netns, closed_port_on_node(8085), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let deadline = created + Duration::from_secs(2);
    let named = loop {
        let found = agent
            .findings_endpoint()
            .into_iter()
            .find(|f| from_pod("tcp_refused", &pod)(f) && names_pod(f, &pod));
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "no finding names {pod:?} within 2 s of its creation:\n{:#?}\n{}",
            agent.findings_endpoint(),
            agent.stderr()
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert_shape(&named);
    assert_eq!(field(&named, "layer"), "listener", "{named:#}");
    assert_eq!(named["src"], pod.ip.to_string(), "{named:#}");
    assert_eq!(named["dport"], 8085, "{named:#}");
}

#[test]
fn timed_out_connect_from_a_cri_pod_names_the_pod() {
    let topo = Topology::new();
    let mut containerd = start_containerd(&topo);
    let pod = ok(containerd.run_pod("shop", "checkout-5b2a", "77aa-checkout-uid"));
    let agent = start_agent(&topo, &containerd);
    topo.drop_forwarded_tcp(&topo.node_a, 8082);

    let outcome = tcp_connect(&pod.netns, topo.pod_b_addr(8082), Duration::from_secs(8));
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(from_pod("tcp_timeout", &pod), Duration::from_secs(5));
    assert_shape(&f);
    assert!(names_pod(&f, &pod), "the finding names {pod:?}:\n{f:#}");
}

#[test]
fn pod_recreated_with_the_same_address_is_named_anew() {
    let topo = Topology::new();
    let mut containerd = start_containerd(&topo);
    let old = ok(containerd.run_pod("shop", "cart-old", "uid-old"));
    let agent = start_agent(&topo, &containerd);
    let outcome = tcp_connect(&old.netns, closed_port_on_node(8083), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(from_pod("tcp_refused", &old), Duration::from_secs(5));
    assert!(names_pod(&f, &old), "{f:#}");

    ok(containerd.remove_pod(&old.id));
    let new = ok(containerd.run_pod("shop", "cart-new", "uid-new"));
    assert_eq!(
        new.ip, old.ip,
        "host-local hands out its only address again"
    );
    // The kernel may even give the new namespace the old one's inode number: only the
    // runtime tells the two pods apart. It is re-read every 5 s; connect until a
    // finding names the new pod (within that window one may still name the old).
    let named_new = |f: &Value| from_pod("tcp_refused", &new)(f) && names_pod(f, &new);
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let outcome = tcp_connect(&new.netns, closed_port_on_node(8083), STEP);
        assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
        if let Some(f) = agent.try_wait_finding(named_new, Duration::from_secs(1)) {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "no finding names the re-created pod {new:?}:\n{:#?}\n{}",
            agent.findings(),
            agent.stderr()
        );
        thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(found["src"], new.ip.to_string());
    // The old pod's finding keeps its name: a new pod makes a finding of its own.
    let old_finding = agent
        .findings_endpoint()
        .into_iter()
        .find(|f| field(f, "kind") == "tcp_refused" && names_pod(f, &old))
        .unwrap_or_else(|| panic!("the old pod's finding is gone: {:#?}", agent.findings()));
    assert_eq!(old_finding["src"], old.ip.to_string(), "{old_finding:#}");
    // From now on the new pod is named at once.
    let outcome = tcp_connect(&new.netns, closed_port_on_node(8083), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    thread::sleep(Duration::from_secs(1));
    let latest = agent
        .findings_endpoint()
        .into_iter()
        .filter(|f| field(f, "kind") == "tcp_refused" && f["dport"] == 8083)
        .max_by_key(|f| f["last_seen"].as_str().unwrap_or_default().to_owned())
        .expect("findings on port 8083");
    assert!(names_pod(&latest, &new), "{latest:#}");
}

#[test]
fn mtu_mismatch_on_a_cri_pod_interface_names_the_pod() {
    let topo = Topology::new();
    let mut containerd = start_containerd(&topo);
    // The bridge plugin leaves the pod's eth0 at 1500, above node A's 1450 overlay.
    let pod = ok(containerd.run_pod("shop", "cache-0", "uid-cache-0"));
    let agent = start_agent(&topo, &containerd);
    let f = agent.wait_finding(
        |f| {
            field(f, "kind") == "overlay_mtu_mismatch"
                && f["netns"].as_u64() == Some(pod.netns_inode)
                && names_pod(f, &pod)
        },
        Duration::from_secs(20),
    );
    assert_eq!(f["interface"], "eth0", "{f:#}");
}

#[test]
fn without_a_runtime_findings_carry_no_pod_and_one_line_says_why() {
    let topo = Topology::new();
    let missing =
        std::env::temp_dir().join(format!("{}-no-cri.sock", node_diag_tests::unique_name()));
    let missing = missing.display().to_string();
    let mut agent = Agent::start_with_args(&topo, &["--cri-socket", &missing]);
    agent.wait_ready(Duration::from_secs(60));

    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(8084), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(
        |f| field(f, "kind") == "tcp_refused" && f["dport"] == 8084,
        Duration::from_secs(5),
    );
    assert!(
        f.get("pod").is_none() && f.get("peer_pod").is_none(),
        "{f:#}"
    );
    // Past two refreshes: still said once.
    thread::sleep(Duration::from_secs(11));
    let stderr = agent.stderr();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("findings will not name pods"))
        .collect();
    assert_eq!(lines.len(), 1, "one line about the runtime:\n{stderr}");
    assert!(
        lines[0].contains(&missing),
        "it names the socket: {}",
        lines[0]
    );
    agent.wait_counter_at_least(
        r#"node_diag_findings_total{kind="tcp_refused",layer="listener",severity="warning",namespace=""}"#,
        1.0,
        STEP,
    );
}

#[test]
fn doctor_names_the_runtime_or_says_it_is_missing() {
    let topo = Topology::new();
    let containerd = start_containerd(&topo);
    let doctor = |socket: &str| -> Value {
        let out = std::process::Command::new(node_diag_tests::node_diag_bin())
            .args(["doctor", "-o", "json", "--cri-socket", socket])
            .output()
            .expect("node-diag doctor runs");
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor JSON: {e}: {out:?}"));
        report["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "container runtime").cloned())
            .unwrap_or_else(|| panic!("no container runtime check: {report:#}"))
    };
    let socket = containerd.socket().display().to_string();
    let check = doctor(&socket);
    assert_eq!(check["status"], "ok", "{check:#}");
    let detail = check["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("containerd ") && detail.contains(&socket),
        "{check:#}"
    );

    let check = doctor("/nonexistent/cri.sock");
    assert_eq!(check["status"], "warn", "{check:#}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("will not name pods"),
        "{check:#}"
    );
}
