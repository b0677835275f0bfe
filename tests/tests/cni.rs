//! The MTU model against the device shapes real CNIs create, built by the testbed's
//! `cni` module in place of its `vx0` overlay, with the real agent in node A.
//! Each shape has a clean case (no `overlay_mtu_mismatch`, and where the shape carries
//! the pods' traffic, a bulk transfer through it is clean) and a broken one (one
//! mismatch whose arithmetic names what is wrong).
//!
//! - flannel: `flannel.1`, a VXLAN without a remote whose peers are FDB entries
//!   (`bridge fdb append 00:00:00:00:00:00 dev flannel.1 dst <peer>`), routes to the
//!   peers' pod subnets through it.
//! - Calico VXLAN: `vxlan.calico` with per-peer MAC FDB and neighbour entries. Calico
//!   IPIP: `tunl0` (the ipip module's fallback device: no remote, each packet sent to the
//!   gateway of its route); this machine's kernel has no ipip, so here those tests skip
//!   and the netlink fixtures of `node-diag/src/host_network/underlay.rs` cover it. The
//!   VM runner's kernels have ipip (`NODE_DIAG_REQUIRE_TUNNELS=1` makes it mandatory, as
//!   geneve and wireguard: see `node_diag_tests::tunnel`).
//! - Cilium in tunnel mode: `cilium_vxlan` in metadata (`external`) mode, veths at 1500
//!   on both ends and the pod's default route with `mtu 1450`. Cilium's eBPF datapath sets
//!   each packet's tunnel endpoint; here a route's `encap ip dst` does the same in the
//!   kernel. Also over an IPv6 underlay (VXLAN/IPv6: 70 bytes), and with `cilium_geneve`
//!   where the kernel has geneve.
//! - A multi-NIC node: a jumbo (9000) cluster network beside a 1500 network holding the
//!   default route; a VXLAN whose peers are on the jumbo network, and a WireGuard device
//!   whose peer is (where the kernel has wireguard).
//!
//! Every test is one `Scenario`: a shape, what the agent must judge of it, and what
//! `node-diag mtu` and the headroom gauge must say; one runner checks them all the same
//! way, so a new shape is a new row rather than another copy of the checks.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test cni -- --test-threads=1`.

/// One module, so that the name filter `cni` (as in `cargo xtask integration --filter
/// cni`) selects these tests and no other binary's.
mod cni {
    use std::time::Duration;

    use node_diag_testbed::cni::{
        self as shapes, CLUSTER_IF, CLUSTER_VXLAN_IF, NODE_B_CLUSTER, Tunnel, Underlay,
    };
    use node_diag_tests::finding::{field, mismatch_on};
    use node_diag_tests::topology::{POD_HOST_IF, POD_IF};
    use node_diag_tests::tunnel::or_skip;
    use node_diag_tests::{
        Agent, BULK, ServerMode, TcpServer, Topology, bulk_to_pod_b, cmd, node_diag_bin,
    };
    use serde_json::Value;

    /// The MTU findings are computed before the agent is ready; this only covers a slow
    /// VM.
    const FINDING_WITHIN: Duration = Duration::from_secs(5);
    /// How long a clean shape is watched for a finding.
    const QUIET: Duration = Duration::from_secs(3);

    // The scenario -----------------------------------------------------------------------

    /// The devices to build, with the testbed's builders.
    enum Shape {
        Flannel {
            bound: bool,
        },
        CalicoVxlan,
        CalicoIpip {
            mtu: u32,
        },
        Cilium(Tunnel, Underlay, u32),
        JumboClusterNetwork,
        /// The jumbo network, and a second peer of node A's `vxc` on the 1500 network.
        JumboWithAPeerOnTheDefaultNetwork,
        /// The jumbo network, with a route `mtu 1500` to node B's cluster address.
        JumboCappedByARoute,
        WireguardToTheClusterNetwork {
            mtu: u32,
        },
    }

    impl Shape {
        fn build(&self, topo: &Topology) -> node_diag_testbed::Result<()> {
            match *self {
                Shape::Flannel { bound } => shapes::flannel(topo, bound),
                Shape::CalicoVxlan => shapes::calico_vxlan(topo, 1450),
                Shape::CalicoIpip { mtu } => shapes::calico_ipip(topo, mtu),
                Shape::Cilium(tunnel, underlay, route_mtu) => {
                    shapes::cilium(topo, tunnel, underlay, route_mtu)
                }
                Shape::JumboClusterNetwork => shapes::jumbo_cluster_network(topo),
                Shape::JumboWithAPeerOnTheDefaultNetwork => {
                    shapes::jumbo_cluster_network(topo)?;
                    let stray = topo.node_b_underlay.to_string();
                    shapes::fdb_append(&topo.node_a, CLUSTER_VXLAN_IF, &stray)
                }
                Shape::JumboCappedByARoute => {
                    shapes::jumbo_cluster_network(topo)?;
                    let to = format!("{NODE_B_CLUSTER}/32");
                    node_diag_testbed::cmd::run(&[
                        "ip",
                        "-n",
                        &topo.node_a,
                        "route",
                        "add",
                        &to,
                        "dev",
                        CLUSTER_IF,
                        "mtu",
                        "1500",
                    ])
                    .map(drop)
                }
                Shape::WireguardToTheClusterNetwork { mtu } => {
                    shapes::wireguard_to_the_cluster_network(topo, mtu)
                }
            }
        }
    }

    /// Node A or pod A: where an interface is judged.
    #[derive(Clone, Copy)]
    enum Ns {
        NodeA,
        PodA,
    }

    impl Ns {
        fn name(self, topo: &Topology) -> &str {
            match self {
                Ns::NodeA => &topo.node_a,
                Ns::PodA => &topo.pod_a,
            }
        }
    }

    /// An interface: its namespace and name.
    type On<'a> = (Ns, &'a str);

    /// A value a finding's evidence or a report's verdict holds. Strings may name the
    /// topology's addresses, which differ per run or per build: `{pod_a}` (pod A's
    /// namespace), `{node_b}` (node B's underlay address), `{node_b_v6}` and `{gateway}`
    /// (the pods' gateway).
    #[derive(Clone, Copy)]
    enum Want<'a> {
        Str(&'a str),
        Int(i64),
        Bool(bool),
    }

    impl Want<'_> {
        fn value(self, topo: &Topology) -> Value {
            match self {
                Want::Str(s) => Value::from(fill(topo, s)),
                Want::Int(i) => Value::from(i),
                Want::Bool(b) => Value::from(b),
            }
        }
    }

    /// `text` with the topology's names and addresses in place of its placeholders (see
    /// [`Want`]).
    fn fill(topo: &Topology, text: &str) -> String {
        text.replace("{pod_a}", &topo.pod_a)
            .replace("{node_b_v6}", node_diag_testbed::tunnel::UNDERLAY_V6[1])
            .replace("{node_b}", &topo.node_b_underlay.to_string())
            .replace("{gateway}", &topo.pod_gateway.to_string())
    }

    /// How a finding's remediation must read.
    enum Remedy<'a> {
        StartsWith(&'a str),
        Contains(&'a str),
    }

    /// What the agent must judge of the shape.
    enum Judged<'a> {
        /// No `overlay_mtu_mismatch` within [`QUIET`] (about `watched` only, when given),
        /// and where the shape carries the pods' traffic (`transfer` names the port), a
        /// bulk transfer through it that comes back whole and clean.
        Clean {
            watched: Option<On<'a>>,
            transfer: Option<u16>,
        },
        Mismatch(Mismatch<'a>),
    }

    /// One active `overlay_mtu_mismatch`, whose summary has each of `summary` and whose
    /// evidence holds `evidence`.
    struct Mismatch<'a> {
        on: On<'a>,
        summary: &'a [&'a str],
        evidence: &'a [(&'a str, Want<'a>)],
        remediation: Option<Remedy<'a>>,
        /// A second mismatch that comes with it, and a part of its summary if it matters.
        also: Option<(On<'a>, Option<&'a str>)>,
        /// An interface the mismatch is not about, watched for a second.
        not_on: Option<On<'a>>,
    }

    const MISMATCH: Mismatch<'static> = Mismatch {
        on: (Ns::NodeA, ""),
        summary: &[],
        evidence: &[],
        remediation: None,
        also: None,
        not_on: None,
    };

    /// A shape, what the agent judges of it, and what `node-diag mtu` and the headroom
    /// gauge say.
    struct Scenario<'a> {
        shape: Shape,
        /// Every pod veth set to this MTU once the shape is built.
        pod_mtu: Option<u32>,
        judged: Judged<'a>,
        /// `node_diag_overlay_mtu_headroom_bytes` of interfaces.
        headroom: &'a [(On<'a>, f64)],
        /// Parts of `node-diag mtu`'s text.
        text: &'a [&'a str],
        /// Fields of `node-diag mtu -o json`'s verdicts on interfaces.
        verdicts: &'a [(On<'a>, &'a [(&'a str, Want<'a>)])],
        /// What only this scenario checks.
        more: Option<fn(&Topology)>,
    }

    const SCENARIO: Scenario<'static> = Scenario {
        shape: Shape::JumboClusterNetwork,
        pod_mtu: None,
        judged: Judged::Clean {
            watched: None,
            transfer: None,
        },
        headroom: &[],
        text: &[],
        verdicts: &[],
        more: None,
    };

    /// Builds the shape (or skips where the kernel lacks its kind), starts the agent and
    /// checks everything the scenario says.
    fn run(s: Scenario<'_>) {
        let topo = Topology::new();
        if !or_skip(s.shape.build(&topo)) {
            return;
        }
        if let Some(mtu) = s.pod_mtu {
            topo.set_pod_mtu(mtu);
        }
        let agent = Agent::start_ready(&topo);
        match &s.judged {
            Judged::Clean { watched, transfer } => {
                match watched {
                    None => agent.expect_no_finding(any_mismatch, QUIET),
                    Some((ns, dev)) => {
                        agent.expect_no_finding(mismatch_on(ns.name(&topo), dev), QUIET)
                    }
                }
                check_headroom(&topo, &agent, s.headroom);
                if let Some(port) = transfer {
                    bulk_transfer_is_clean(&topo, &agent, *port);
                }
            }
            Judged::Mismatch(m) => {
                check_mismatch(&topo, &agent, m);
                check_headroom(&topo, &agent, s.headroom);
                if let Some(((ns, dev), part)) = m.also {
                    let f = agent.wait_finding(mismatch_on(ns.name(&topo), dev), FINDING_WITHIN);
                    if let Some(part) = part {
                        summary_contains(&f, part);
                    }
                }
                if let Some((ns, dev)) = m.not_on {
                    agent.expect_no_finding(
                        mismatch_on(ns.name(&topo), dev),
                        Duration::from_secs(1),
                    );
                }
            }
        }
        if !s.text.is_empty() {
            let text = mtu_text(&topo);
            for part in s.text {
                let part = fill(&topo, part);
                assert!(text.contains(&part), "{part:?} not in:\n{text}");
            }
        }
        if !s.verdicts.is_empty() {
            let report = mtu_report(&topo);
            for ((ns, dev), fields) in s.verdicts {
                let v = verdict(&report, ns.name(&topo), dev);
                for (key, want) in *fields {
                    assert_eq!(v[key], want.value(&topo), "{key}: {v:#}");
                }
            }
        }
        if let Some(more) = s.more {
            more(&topo);
        }
    }

    fn check_mismatch(topo: &Topology, agent: &Agent, m: &Mismatch<'_>) {
        let (ns, dev) = m.on;
        let f = agent.wait_finding(mismatch_on(ns.name(topo), dev), FINDING_WITHIN);
        for part in m.summary {
            summary_contains(&f, &fill(topo, part));
        }
        for (key, want) in m.evidence {
            assert_eq!(f["evidence"][key], want.value(topo), "{key}: {f:#}");
        }
        let remediation = field(&f, "remediation");
        match m.remediation {
            Some(Remedy::StartsWith(start)) => {
                assert!(remediation.starts_with(start), "{start:?}: {f:#}")
            }
            Some(Remedy::Contains(part)) => {
                assert!(remediation.contains(part), "{part:?}: {f:#}")
            }
            None => {}
        }
    }

    fn check_headroom(topo: &Topology, agent: &Agent, headroom: &[(On<'_>, f64)]) {
        for &((ns, dev), bytes) in headroom {
            let series = format!(
                r#"node_diag_overlay_mtu_headroom_bytes{{interface="{dev}",netns="{}"}}"#,
                ns.name(topo)
            );
            assert_eq!(agent.metric(&series), Some(bytes), "{series}");
        }
    }

    fn any_mismatch(f: &Value) -> bool {
        field(f, "kind") == "overlay_mtu_mismatch"
    }

    /// Any finding a clean transfer must not cause.
    fn is_transfer_trouble(f: &Value) -> bool {
        matches!(
            field(f, "kind"),
            "overlay_mtu_mismatch" | "df_oversize_drop" | "pmtud_blackhole" | "tcp_stall"
        )
    }

    /// Sends `BULK` bytes from pod A to an echo server in pod B and checks they all come
    /// back, with nothing about MTUs, oversize drops or stalls from the agent.
    fn bulk_transfer_is_clean(topo: &Topology, agent: &Agent, port: u16) {
        let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
        let reply = bulk_to_pod_b(topo, port, 0x5a, Duration::from_secs(20))
            .expect("bulk transfer pod A -> pod B through the shape");
        assert_eq!(reply.len(), BULK);
        agent.expect_no_finding(is_transfer_trouble, QUIET);
    }

    /// `node-diag mtu` in node A, as text.
    fn mtu_text(topo: &Topology) -> String {
        let bin = node_diag_bin();
        cmd::run_in(&topo.node_a, &[bin.to_str().expect("utf-8 path"), "mtu"])
    }

    /// `node-diag mtu -o json` in node A.
    fn mtu_report(topo: &Topology) -> Value {
        let bin = node_diag_bin();
        let out = cmd::run_in(
            &topo.node_a,
            &[bin.to_str().expect("utf-8 path"), "mtu", "-o", "json"],
        );
        serde_json::from_str(&out).expect("node-diag mtu -o json")
    }

    /// The report's verdict on `interface` in namespace `netns`.
    fn verdict<'a>(report: &'a Value, netns: &str, interface: &str) -> &'a Value {
        report["interfaces"]
            .as_array()
            .expect("interfaces")
            .iter()
            .find(|v| v["netns_name"] == netns && v["interface"] == interface)
            .unwrap_or_else(|| panic!("no verdict on {netns} {interface}: {report:#}"))
    }

    fn summary_contains(f: &Value, part: &str) {
        assert!(field(f, "summary").contains(part), "{part:?} not in {f:#}");
    }

    // flannel ----------------------------------------------------------------------------

    #[test]
    fn flannel_vxlan_with_fdb_peers_is_clean() {
        run(Scenario {
            shape: Shape::Flannel { bound: true },
            judged: Judged::Clean {
                watched: None,
                transfer: Some(9101),
            },
            verdicts: &[(
                (Ns::NodeA, "flannel.1"),
                &[
                    ("verdict", Want::Str("ok")),
                    ("expected_mtu", Want::Int(1450)),
                    ("underlay", Want::Str("ul0")),
                    ("underlay_source", Want::Str("bound")),
                    // The FDB entry's peer.
                    ("underlay_endpoint", Want::Str("{node_b}")),
                ],
            )],
            ..SCENARIO
        });
    }

    /// Without its `dev`, the kernel leaves a VXLAN at 1500: flannel.1's only way to
    /// its peer is found through its FDB entry.
    #[test]
    fn flannel_vxlan_without_its_device_is_a_mismatch_through_its_fdb_peer() {
        run(Scenario {
            shape: Shape::Flannel { bound: false },
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::NodeA, "flannel.1"),
                summary: &[
                    "underlay ul0 1500 − VXLAN 50 = 1450, but vxlan flannel.1 is 1500",
                    "underlay ul0 is the route to {node_b}, an FDB destination",
                ],
                evidence: &[
                    ("underlay_source", Want::Str("route_to_fdb_destination")),
                    ("underlay_endpoint", Want::Str("{node_b}")),
                    ("headroom", Want::Int(-50)),
                ],
                remediation: Some(Remedy::StartsWith("Set flannel.1's MTU to 1450")),
                ..MISMATCH
            }),
            headroom: &[((Ns::NodeA, "flannel.1"), -50.0)],
            ..SCENARIO
        });
    }

    // Calico -----------------------------------------------------------------------------

    #[test]
    fn calico_vxlan_is_clean() {
        run(Scenario {
            shape: Shape::CalicoVxlan,
            judged: Judged::Clean {
                watched: None,
                transfer: Some(9102),
            },
            headroom: &[((Ns::NodeA, "vxlan.calico"), 0.0)],
            verdicts: &[(
                (Ns::NodeA, "vxlan.calico"),
                &[
                    ("verdict", Want::Str("ok")),
                    // The per-MAC FDB entry's peer.
                    ("underlay_endpoint", Want::Str("{node_b}")),
                ],
            )],
            ..SCENARIO
        });
    }

    /// Calico's `veth_mtu` left at the NIC's 1500 over its 1450 VXLAN (bound to the
    /// underlay, the kernel keeps vxlan.calico itself within 1450).
    #[test]
    fn calico_vxlan_with_veth_mtu_1500_is_a_mismatch() {
        run(Scenario {
            shape: Shape::CalicoVxlan,
            pod_mtu: Some(1500),
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::PodA, POD_IF),
                summary: &[
                    "underlay ul0 1500 − VXLAN 50 = 1450 (overlay vxlan.calico), but \
                            pod eth0 (netns {pod_a}) is 1500",
                ],
                evidence: &[
                    ("underlay_source", Want::Str("bound")),
                    ("underlay_endpoint", Want::Str("{node_b}")),
                ],
                remediation: Some(Remedy::StartsWith("Set the CNI MTU to 1450")),
                also: Some(((Ns::NodeA, POD_HOST_IF), None)),
                not_on: Some((Ns::NodeA, "vxlan.calico")),
            }),
            ..SCENARIO
        });
    }

    #[test]
    fn calico_ipip_tunl0_is_clean() {
        run(Scenario {
            shape: Shape::CalicoIpip { mtu: 1480 },
            pod_mtu: Some(1480),
            judged: Judged::Clean {
                watched: None,
                transfer: Some(9103),
            },
            verdicts: &[(
                (Ns::NodeA, "tunl0"),
                &[
                    ("verdict", Want::Str("ok")),
                    ("expected_mtu", Want::Int(1480)),
                    ("underlay_source", Want::Str("route_to_tunnel_gateway")),
                    ("underlay_endpoint", Want::Str("{node_b}")),
                ],
            )],
            ..SCENARIO
        });
    }

    #[test]
    fn calico_ipip_tunl0_at_the_nic_mtu_is_a_mismatch() {
        run(Scenario {
            shape: Shape::CalicoIpip { mtu: 1500 },
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::NodeA, "tunl0"),
                summary: &[
                    "underlay ul0 1500 − IPIP 20 = 1480, but ipip tunl0 is 1500",
                    "underlay ul0 is the route to {node_b}, the gateway of a route through it",
                ],
                ..MISMATCH
            }),
            ..SCENARIO
        });
    }

    // Cilium -----------------------------------------------------------------------------

    /// Veths at 1500 whose routes carry `mtu 1450`: healthy, and `node-diag mtu` says
    /// why. Cilium's host pair is neither a pod nor an underlay.
    fn cilium_clean(tunnel: Tunnel, label: &str, port: u16) {
        let dev = tunnel.device();
        let arithmetic = format!(
            "underlay ul0 1500 − {label} 50 = 1450 (overlay {dev}); pod eth0 (netns {{pod_a}}) \
             is 1450: route default via {{gateway}} mtu 1450 caps veth 1500"
        );
        run(Scenario {
            shape: Shape::Cilium(tunnel, Underlay::V4, 1450),
            judged: Judged::Clean {
                watched: None,
                transfer: Some(port),
            },
            headroom: &[((Ns::PodA, POD_IF), 0.0), ((Ns::NodeA, POD_HOST_IF), 0.0)],
            text: &[&arithmetic],
            verdicts: &[
                (
                    (Ns::PodA, POD_IF),
                    &[
                        ("mtu", Want::Int(1500)),
                        ("effective_mtu", Want::Int(1450)),
                        ("verdict", Want::Str("ok")),
                    ],
                ),
                (
                    (Ns::NodeA, dev),
                    &[
                        ("underlay", Want::Str("ul0")),
                        ("underlay_source", Want::Str("route_to_encap_destination")),
                        ("family_assumed", Want::Bool(false)),
                    ],
                ),
                (
                    (Ns::NodeA, "cilium_host"),
                    &[("verdict", Want::Str("not_applicable"))],
                ),
            ],
            ..SCENARIO
        });
    }

    #[test]
    fn cilium_vxlan_with_route_mtu_1450_on_1500_veths_is_clean() {
        cilium_clean(Tunnel::Vxlan, "VXLAN", 9104);
    }

    #[test]
    fn cilium_geneve_with_route_mtu_1450_on_1500_veths_is_clean() {
        cilium_clean(Tunnel::Geneve, "Geneve", 9105);
    }

    /// The routes' `mtu` left at 1500 over the 1450 tunnel: a mismatch naming the route.
    #[test]
    fn cilium_route_mtu_1500_over_the_tunnel_is_a_mismatch_naming_the_route() {
        run(Scenario {
            shape: Shape::Cilium(Tunnel::Vxlan, Underlay::V4, 1500),
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::PodA, POD_IF),
                summary: &[
                    "underlay ul0 1500 − VXLAN 50 = 1450 (overlay cilium_vxlan), but \
                            pod eth0 (netns {pod_a}) is 1500 (route default via {gateway} \
                            mtu 1500 does not cap it)",
                ],
                evidence: &[
                    ("route", Want::Str("default via {gateway}")),
                    ("route_mtu", Want::Int(1500)),
                    ("effective_mtu", Want::Int(1500)),
                ],
                remediation: Some(Remedy::StartsWith("Set the mtu of the pod's routes")),
                also: Some(((Ns::NodeA, POD_HOST_IF), Some("its pod's route"))),
                ..MISMATCH
            }),
            headroom: &[((Ns::PodA, POD_IF), -50.0)],
            ..SCENARIO
        });
    }

    /// Over an IPv6 underlay the tunnel carries 1500 − 70: routes at 1450 are 20 too big,
    /// and 1430 is clean end to end.
    #[test]
    fn cilium_over_an_ipv6_underlay_counts_70_bytes() {
        run(Scenario {
            shape: Shape::Cilium(Tunnel::Vxlan, Underlay::V6, 1450),
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::PodA, POD_IF),
                summary: &["underlay ul0 1500 − VXLAN/IPv6 70 = 1430"],
                evidence: &[
                    ("family", Want::Str("v6")),
                    ("overhead", Want::Int(70)),
                    ("headroom", Want::Int(-20)),
                    ("underlay_endpoint", Want::Str("{node_b_v6}")),
                ],
                ..MISMATCH
            }),
            ..SCENARIO
        });
    }

    #[test]
    fn cilium_over_an_ipv6_underlay_with_route_mtu_1430_is_clean() {
        run(Scenario {
            shape: Shape::Cilium(Tunnel::Vxlan, Underlay::V6, 1430),
            judged: Judged::Clean {
                watched: None,
                transfer: Some(9106),
            },
            headroom: &[((Ns::PodA, POD_IF), 0.0)],
            ..SCENARIO
        });
    }

    // A multi-NIC node ---------------------------------------------------------------------

    /// The default route is on the 1500 network; vxc's peer on the jumbo one: vxc at
    /// 8950 is right, and carries 8950-byte packets.
    #[test]
    fn multi_nic_vxlan_follows_the_route_to_its_peer_not_the_default_route() {
        run(Scenario {
            shape: Shape::JumboClusterNetwork,
            headroom: &[((Ns::NodeA, "vxc"), 0.0)],
            verdicts: &[(
                (Ns::NodeA, "vxc"),
                &[
                    ("underlay", Want::Str("cl0")),
                    ("underlay_mtu", Want::Int(9000)),
                    ("expected_mtu", Want::Int(8950)),
                    ("underlay_source", Want::Str("route_to_fdb_destination")),
                ],
            )],
            more: Some(full_size_df_ping_over_vxc),
            ..SCENARIO
        });
    }

    /// 8950 − 20 IPv4 − 8 ICMP: a full-size packet crosses with DF set.
    fn full_size_df_ping_over_vxc(topo: &Topology) {
        let ok = cmd::try_run_in(
            &topo.node_a,
            &[
                "ping",
                "-n",
                "-q",
                "-c",
                "2",
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                "8922",
                "10.99.0.2",
            ],
        );
        assert!(
            ok.status.success(),
            "8950-byte DF ping over vxc: {}",
            String::from_utf8_lossy(&ok.stdout)
        );
    }

    /// A peer on the 1500 network: its route is the smallest way out.
    #[test]
    fn multi_nic_peer_on_the_1500_network_is_a_mismatch() {
        run(Scenario {
            shape: Shape::JumboWithAPeerOnTheDefaultNetwork,
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::NodeA, "vxc"),
                summary: &[
                    "underlay ul0 1500 − VXLAN 50 = 1450, but vxlan vxc is 8950",
                    "underlay ul0 is the route to {node_b}, an FDB destination, the smallest \
                     path of its 2 endpoints",
                ],
                evidence: &[("underlay_endpoints", Want::Int(2))],
                ..MISMATCH
            }),
            ..SCENARIO
        });
    }

    /// A route `mtu` on the way to the peer caps the jumbo device.
    #[test]
    fn multi_nic_route_mtu_capping_the_cluster_network_is_a_mismatch() {
        const ARITHMETIC: &str = "underlay cl0 1500 (route 192.168.88.2/32 mtu 1500 caps \
                                  cl0 9000) − VXLAN 50 = 1450, but vxlan vxc is 8950";
        run(Scenario {
            shape: Shape::JumboCappedByARoute,
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::NodeA, "vxc"),
                summary: &[ARITHMETIC],
                evidence: &[
                    ("underlay_route_mtu", Want::Int(1500)),
                    ("underlay_device_mtu", Want::Int(9000)),
                ],
                remediation: Some(Remedy::Contains("raise the mtu of route 192.168.88.2/32")),
                ..MISMATCH
            }),
            text: &[ARITHMETIC],
            ..SCENARIO
        });
    }

    /// A WireGuard device whose peer is on the jumbo network, while the default route is
    /// on the 1500 one: its underlay is the route to the peer.
    #[test]
    fn multi_nic_wireguard_follows_the_route_to_its_peer() {
        run(Scenario {
            shape: Shape::WireguardToTheClusterNetwork { mtu: 8940 },
            judged: Judged::Clean {
                watched: Some((Ns::NodeA, "wgc")),
                transfer: None,
            },
            verdicts: &[(
                (Ns::NodeA, "wgc"),
                &[
                    ("verdict", Want::Str("ok")),
                    ("underlay", Want::Str("cl0")),
                    ("underlay_source", Want::Str("route_to_wireguard_peer")),
                    ("family_assumed", Want::Bool(false)),
                ],
            )],
            ..SCENARIO
        });
    }

    #[test]
    fn multi_nic_wireguard_above_the_route_to_its_peer_is_a_mismatch() {
        run(Scenario {
            shape: Shape::WireguardToTheClusterNetwork { mtu: 8960 },
            judged: Judged::Mismatch(Mismatch {
                on: (Ns::NodeA, "wgc"),
                summary: &[
                    "underlay cl0 9000 − WireGuard 60 = 8940, but wireguard wgc is 8960",
                    "underlay cl0 is the route to 192.168.88.2, a WireGuard peer's endpoint",
                ],
                ..MISMATCH
            }),
            ..SCENARIO
        });
    }
}
