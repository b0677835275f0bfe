//! The MTU model against real tunnel devices: Geneve, WireGuard, IPIP, GRE and VXLAN
//! over an IPv6 underlay, each created in node A on top of the testbed's underlay veth
//! `ul0` (1500), the agent started, and its `overlay_mtu_mismatch` findings and headroom
//! gauge checked against the kernel's own arithmetic.
//!
//! - Mismatch: the tunnel's MTU forced above `underlay − overhead` is one active finding
//!   with that arithmetic ("underlay ul0 1500 − GRE 24 = 1476, but gre gre9 is 1500"),
//!   the evidence's numbers, and a negative headroom.
//! - Clean: a tunnel at exactly `underlay − overhead` (where the kernel derives the MTU
//!   itself, its default is checked to be that) has headroom 0 and no finding.
//!
//! This repository's build machines have no geneve, wireguard, ipip or gre modules: there
//! those tests print `SKIPPED: kernel <release> has no <kind> support` and pass, unless
//! `NODE_DIAG_REQUIRE_TUNNELS=1` (the VM runner's Debian kernels have every kind), which
//! makes a missing kind a failure. VXLAN over IPv6 runs everywhere.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test tunnels -- --test-threads=1`.

/// One module, so that the name filter `tunnels` (as in `cargo xtask integration
/// --filter tunnels`) selects these tests and no other binary's.
mod tunnels {
    use std::time::Duration;

    use node_diag_testbed::tunnel::{self, UNDERLAY_V6, peer_key};

    use node_diag_tests::finding::{assert_shape_mtu, field, is_mismatch_on, mismatch_on};
    use node_diag_tests::topology::{UNDERLAY_IF, UNDERLAY_MTU};
    use node_diag_tests::tunnel::add_tunnel_or_skip;
    use node_diag_tests::{Agent, Topology, cmd, ok};
    use serde_json::Value;

    /// Node A's and node B's IPv6 underlay addresses (on `ul0`).
    const NODE_A_V6: &str = UNDERLAY_V6[0];
    const NODE_B_V6: &str = UNDERLAY_V6[1];
    /// The MTU findings are computed before the agent is ready; this only covers a slow VM.
    const FINDING_WITHIN: Duration = Duration::from_secs(5);
    /// How long a clean tunnel is watched for a finding.
    const QUIET: Duration = Duration::from_secs(2);

    /// A tunnel as the model should judge it.
    struct Tunnel<'a> {
        /// Interface name in node A.
        name: &'a str,
        /// Kernel kind, as the summary names the device ("gre gre9").
        kind: &'a str,
        /// The encapsulation's label in summaries and evidence ("GRE", "VXLAN/IPv6").
        label: &'a str,
        /// `v4` or `v6`, the evidence's `family`.
        family: &'a str,
        overhead: u32,
        /// How the underlay is found: the evidence's `underlay_source`.
        source: &'a str,
        /// How the summary says the underlay was found ("the route to 192.168.77.2").
        how: String,
    }

    impl Tunnel<'_> {
        fn expected_mtu(&self) -> u32 {
            UNDERLAY_MTU - self.overhead
        }
    }

    fn ip_a(topo: &Topology, args: &[&str]) {
        let mut argv = vec!["ip", "-n", &topo.node_a];
        argv.extend_from_slice(args);
        cmd::run(&argv);
    }

    /// Sets `name` in node A to `mtu` (when given) and up.
    fn set_up(topo: &Topology, name: &str, mtu: Option<u32>) {
        let mtu = mtu.map(|m| m.to_string());
        let mut args = vec!["link", "set", name];
        if let Some(mtu) = &mtu {
            args.extend(["mtu", mtu.as_str()]);
        }
        args.push("up");
        ip_a(topo, &args);
    }

    /// The MTU the kernel gave `name` in node A.
    fn kernel_mtu(topo: &Topology, name: &str) -> u32 {
        let out = cmd::run(&["ip", "-n", &topo.node_a, "-j", "link", "show", "dev", name]);
        let links: Value = serde_json::from_str(&out).expect("ip -j link show");
        let mtu = links[0]["mtu"].as_u64().expect("an mtu");
        u32::try_from(mtu).expect("a u32 MTU")
    }

    fn headroom_series(topo: &Topology, name: &str) -> String {
        format!(
            r#"node_diag_overlay_mtu_headroom_bytes{{interface="{name}",netns="{}"}}"#,
            topo.node_a
        )
    }

    /// Any `overlay_mtu_mismatch` about node A's `name`, active or resolved.
    fn any_mismatch_on<'a>(topo: &'a Topology, name: &'a str) -> impl Fn(&Value) -> bool + 'a {
        move |f| {
            field(f, "kind") == "overlay_mtu_mismatch"
                && f["interface"] == name
                && f["evidence"]["netns_name"] == topo.node_a.as_str()
        }
    }

    /// The tunnel at `actual` MTU is one active mismatch with the model's arithmetic, its
    /// evidence and a negative headroom gauge.
    fn assert_mismatch(agent: &Agent, topo: &Topology, t: &Tunnel, actual: u32) {
        let expected = t.expected_mtu();
        assert!(
            actual > expected,
            "the test must force the MTU above the limit"
        );
        let f = agent.wait_finding(mismatch_on(&topo.node_a, t.name), FINDING_WITHIN);
        assert_shape_mtu(&f);
        let summary = field(&f, "summary");
        let arithmetic = format!(
            "underlay {UNDERLAY_IF} {UNDERLAY_MTU} − {} {} = {expected}",
            t.label, t.overhead
        );
        assert!(summary.starts_with(&arithmetic), "{arithmetic:?}: {f:#}");
        let subject = format!(", but {} {} is {actual}", t.kind, t.name);
        assert!(summary.contains(&subject), "{subject:?}: {f:#}");
        let how = format!("underlay {UNDERLAY_IF} is {}", t.how);
        assert!(summary.contains(&how), "{how:?}: {f:#}");
        let e = &f["evidence"];
        assert_eq!(e["underlay"], UNDERLAY_IF, "{f:#}");
        assert_eq!(e["underlay_mtu"], UNDERLAY_MTU, "{f:#}");
        assert_eq!(e["underlay_source"], t.source, "{f:#}");
        assert_eq!(e["encapsulation"], t.label, "{f:#}");
        assert_eq!(e["family"], t.family, "{f:#}");
        assert_eq!(e["overhead"], t.overhead, "{f:#}");
        assert_eq!(e["expected_mtu"], expected, "{f:#}");
        assert_eq!(e["actual_mtu"], actual, "{f:#}");
        let headroom = i64::from(expected) - i64::from(actual);
        assert_eq!(e["headroom"], headroom, "{f:#}");
        assert_eq!(e["role"], "overlay", "{f:#}");
        let remediation = format!("Set {}'s MTU to {expected}", t.name);
        assert!(
            field(&f, "remediation").starts_with(&remediation),
            "{remediation:?}: {f:#}"
        );

        let active: Vec<Value> = agent
            .findings_endpoint()
            .into_iter()
            .filter(|f| is_mismatch_on(f, &topo.node_a, t.name))
            .collect();
        assert_eq!(active.len(), 1, "one active mismatch: {active:#?}");
        assert_eq!(
            agent.metric(&headroom_series(topo, t.name)),
            Some(headroom as f64),
            "{}",
            agent.metrics_text()
        );
    }

    /// The tunnel sits exactly at its limit: headroom 0 and no finding about it.
    fn assert_clean(agent: &Agent, topo: &Topology, name: &str) {
        let series = headroom_series(topo, name);
        assert_eq!(
            agent.wait_metric(&series, FINDING_WITHIN),
            0.0,
            "{}",
            agent.metrics_text()
        );
        agent.expect_no_finding(any_mismatch_on(topo, name), QUIET);
    }

    /// Checks that the kernel itself gave `name` the MTU the model expects of it.
    fn assert_kernel_default(topo: &Topology, t: &Tunnel) {
        assert_eq!(
            kernel_mtu(topo, t.name),
            t.expected_mtu(),
            "the kernel's own {} MTU on a {UNDERLAY_MTU} underlay",
            t.kind
        );
    }

    /// `local`/`remote` options on the underlay's IPv4 addresses.
    fn v4_endpoints(topo: &Topology) -> [String; 4] {
        [
            "local".into(),
            topo.node_a_underlay.to_string(),
            "remote".into(),
            topo.node_b_underlay.to_string(),
        ]
    }

    fn route_to_node_b(topo: &Topology) -> String {
        format!("the route to {}", topo.node_b_underlay)
    }

    // Geneve ------------------------------------------------------------------------------

    fn geneve<'a>(topo: &Topology, name: &'a str) -> Tunnel<'a> {
        Tunnel {
            name,
            kind: "geneve",
            label: "Geneve",
            family: "v4",
            overhead: 50,
            source: "route_to_remote",
            how: route_to_node_b(topo),
        }
    }

    /// Geneve has no `local`: its remote's route is its underlay.
    fn add_geneve(topo: &Topology, name: &str) -> bool {
        let remote = topo.node_b_underlay.to_string();
        add_tunnel_or_skip(
            &topo.node_a,
            name,
            "geneve",
            &["id", "9", "remote", &remote],
        )
    }

    #[test]
    fn geneve_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        if !add_geneve(&topo, "gnv9") {
            return;
        }
        set_up(&topo, "gnv9", Some(1500));
        let agent = Agent::start_ready(&topo);
        assert_mismatch(&agent, &topo, &geneve(&topo, "gnv9"), 1500);
    }

    #[test]
    fn geneve_at_its_kernel_default_is_clean() {
        let topo = Topology::new();
        if !add_geneve(&topo, "gnv9") {
            return;
        }
        set_up(&topo, "gnv9", None);
        assert_kernel_default(&topo, &geneve(&topo, "gnv9"));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "gnv9");
    }

    // WireGuard ---------------------------------------------------------------------------

    /// WireGuard whose peer has an endpoint on node B's underlay address (IPv4 or IPv6):
    /// the model reads it over generic netlink, and the route to it is the underlay
    /// (`route_to_wireguard_peer`: one of its peers' endpoints).
    fn wireguard<'a>(name: &'a str, endpoint_ip: &str) -> Tunnel<'a> {
        let v6 = endpoint_ip.contains(':');
        Tunnel {
            name,
            kind: "wireguard",
            label: if v6 { "WireGuard/IPv6" } else { "WireGuard" },
            family: if v6 { "v6" } else { "v4" },
            overhead: if v6 { 80 } else { 60 },
            source: "route_to_wireguard_peer",
            how: format!("the route to {endpoint_ip}, a WireGuard peer's endpoint"),
        }
    }

    /// A WireGuard device with one peer, at `endpoint` (`ip:port`, `[ip6]:port`) or none.
    /// Nothing is sent: the device has no private key.
    fn add_wireguard(topo: &Topology, name: &str, endpoint: Option<&str>) -> bool {
        if !add_tunnel_or_skip(&topo.node_a, name, "wireguard", &[]) {
            return false;
        }
        let peer_key = ok(peer_key());
        let mut args = vec!["wg", "set", name, "peer", &peer_key];
        if let Some(endpoint) = endpoint {
            args.extend(["endpoint", endpoint]);
        }
        args.extend(["allowed-ips", "10.99.0.2/32"]);
        cmd::run_in(&topo.node_a, &args);
        true
    }

    /// WireGuard's default MTU: room for an IPv6 underlay on 1500.
    const WG_DEFAULT_MTU: u32 = 1420;

    #[test]
    fn wireguard_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        let endpoint = format!("{}:51820", topo.node_b_underlay);
        if !add_wireguard(&topo, "wg9", Some(&endpoint)) {
            return;
        }
        set_up(&topo, "wg9", Some(1500));
        let agent = Agent::start_ready(&topo);
        let t = wireguard("wg9", &topo.node_b_underlay.to_string());
        assert_mismatch(&agent, &topo, &t, 1500);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "wg9"), FINDING_WITHIN);
        assert!(
            !field(&f, "summary").contains("assumed"),
            "the peer's endpoint tells the family: {f:#}"
        );
    }

    #[test]
    fn wireguard_at_underlay_minus_60_is_clean() {
        let topo = Topology::new();
        let endpoint = format!("{}:51820", topo.node_b_underlay);
        if !add_wireguard(&topo, "wg9", Some(&endpoint)) {
            return;
        }
        assert_eq!(kernel_mtu(&topo, "wg9"), WG_DEFAULT_MTU);
        let t = wireguard("wg9", &topo.node_b_underlay.to_string());
        set_up(&topo, "wg9", Some(t.expected_mtu()));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "wg9");
    }

    /// 1440 fits an IPv4 underlay, not the IPv6 one this peer is reached over.
    #[test]
    fn wireguard_over_ipv6_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        add_ipv6_underlay(&topo);
        let endpoint = format!("[{NODE_B_V6}]:51820");
        if !add_wireguard(&topo, "wg9", Some(&endpoint)) {
            return;
        }
        set_up(&topo, "wg9", Some(1440));
        let agent = Agent::start_ready(&topo);
        assert_mismatch(&agent, &topo, &wireguard("wg9", NODE_B_V6), 1440);
    }

    #[test]
    fn wireguard_over_ipv6_at_its_kernel_default_is_clean() {
        let topo = Topology::new();
        add_ipv6_underlay(&topo);
        let endpoint = format!("[{NODE_B_V6}]:51820");
        if !add_wireguard(&topo, "wg9", Some(&endpoint)) {
            return;
        }
        set_up(&topo, "wg9", None);
        assert_kernel_default(&topo, &wireguard("wg9", NODE_B_V6));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "wg9");
    }

    /// A peer without an endpoint (it has not been heard from) tells nothing: the default
    /// route's device is the underlay, IPv4 assumed, and the summary says so.
    #[test]
    fn wireguard_without_endpoints_is_judged_by_the_default_route() {
        let topo = Topology::new();
        if !add_wireguard(&topo, "wg9", None) {
            return;
        }
        let via = topo.node_b_underlay.to_string();
        ip_a(
            &topo,
            &["route", "add", "default", "via", &via, "dev", UNDERLAY_IF],
        );
        set_up(&topo, "wg9", Some(1500));
        let agent = Agent::start_ready(&topo);
        let t = Tunnel {
            source: "default_route",
            how: "the default route".into(),
            ..wireguard("wg9", &via)
        };
        assert_mismatch(&agent, &topo, &t, 1500);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "wg9"), FINDING_WITHIN);
        assert!(
            field(&f, "summary").contains("= 1440 (IPv4 underlay assumed)"),
            "{f:#}"
        );
    }

    // IPIP --------------------------------------------------------------------------------

    fn ipip<'a>(topo: &Topology, name: &'a str) -> Tunnel<'a> {
        Tunnel {
            name,
            kind: "ipip",
            label: "IPIP",
            family: "v4",
            overhead: 20,
            source: "route_to_remote",
            how: route_to_node_b(topo),
        }
    }

    fn add_ipip(topo: &Topology, name: &str) -> bool {
        let ends = v4_endpoints(topo);
        let ends: Vec<&str> = ends.iter().map(String::as_str).collect();
        add_tunnel_or_skip(&topo.node_a, name, "ipip", &ends)
    }

    #[test]
    fn ipip_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        if !add_ipip(&topo, "ipip9") {
            return;
        }
        set_up(&topo, "ipip9", Some(1500));
        let agent = Agent::start_ready(&topo);
        assert_mismatch(&agent, &topo, &ipip(&topo, "ipip9"), 1500);
    }

    #[test]
    fn ipip_at_its_kernel_default_is_clean() {
        let topo = Topology::new();
        if !add_ipip(&topo, "ipip9") {
            return;
        }
        set_up(&topo, "ipip9", None);
        assert_kernel_default(&topo, &ipip(&topo, "ipip9"));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "ipip9");
    }

    // GRE ---------------------------------------------------------------------------------

    /// GRE with `optional_fields` of key, checksum and sequence: 4 bytes more each.
    fn gre<'a>(topo: &Topology, name: &'a str, optional_fields: u32) -> Tunnel<'a> {
        Tunnel {
            name,
            kind: "gre",
            label: "GRE",
            family: "v4",
            overhead: 24 + 4 * optional_fields,
            source: "route_to_remote",
            how: route_to_node_b(topo),
        }
    }

    fn add_gre(topo: &Topology, name: &str, extra: &[&str]) -> bool {
        let ends = v4_endpoints(topo);
        let mut options: Vec<&str> = ends.iter().map(String::as_str).collect();
        options.extend_from_slice(extra);
        add_tunnel_or_skip(&topo.node_a, name, "gre", &options)
    }

    /// Key, checksum and sequence number: GRE's three optional fields.
    const KEY_CSUM_SEQ: &[&str] = &["key", "7", "csum", "seq"];

    #[test]
    fn gre_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        if !add_gre(&topo, "gre9", &[]) {
            return;
        }
        set_up(&topo, "gre9", Some(1500));
        let agent = Agent::start_ready(&topo);
        assert_mismatch(&agent, &topo, &gre(&topo, "gre9", 0), 1500);
    }

    #[test]
    fn gre_at_its_kernel_default_is_clean() {
        let topo = Topology::new();
        if !add_gre(&topo, "gre9", &[]) {
            return;
        }
        set_up(&topo, "gre9", None);
        assert_kernel_default(&topo, &gre(&topo, "gre9", 0));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "gre9");
    }

    #[test]
    fn gre_key_checksum_and_sequence_count_in_the_overhead() {
        let topo = Topology::new();
        if !add_gre(&topo, "gre9", KEY_CSUM_SEQ) {
            return;
        }
        let t = gre(&topo, "gre9", 3);
        // 1476 fits plain GRE, not GRE with its three optional fields.
        set_up(&topo, "gre9", Some(1476));
        let agent = Agent::start_ready(&topo);
        assert_mismatch(&agent, &topo, &t, 1476);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "gre9"), FINDING_WITHIN);
        assert_eq!(
            f["evidence"]["overhead_breakdown"],
            "20 IPv4 + 4 GRE + 4 GRE checksum + 4 GRE key + 4 GRE sequence",
            "{f:#}"
        );
    }

    #[test]
    fn gre_with_key_checksum_and_sequence_at_its_kernel_default_is_clean() {
        let topo = Topology::new();
        if !add_gre(&topo, "gre9", KEY_CSUM_SEQ) {
            return;
        }
        set_up(&topo, "gre9", None);
        assert_kernel_default(&topo, &gre(&topo, "gre9", 3));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "gre9");
    }

    // VXLAN over IPv6 ---------------------------------------------------------------------

    fn add_ipv6_underlay(topo: &Topology) {
        ok(tunnel::add_ipv6_underlay(topo));
    }

    fn vxlan6<'a>(name: &'a str, source: &'a str, how: &str) -> Tunnel<'a> {
        Tunnel {
            name,
            kind: "vxlan",
            label: "VXLAN/IPv6",
            family: "v6",
            overhead: 70,
            source,
            how: how.into(),
        }
    }

    /// A VXLAN from node A's to node B's IPv6 underlay address, on `port`, bound to the
    /// underlay device or not.
    fn add_vxlan6(topo: &Topology, name: &str, vni: &str, port: &str, bound: bool) {
        let mut options = vec![
            "id", vni, "local", NODE_A_V6, "remote", NODE_B_V6, "dstport", port,
        ];
        if bound {
            options.extend(["dev", UNDERLAY_IF]);
        }
        assert!(add_tunnel_or_skip(&topo.node_a, name, "vxlan", &options));
    }

    #[test]
    fn unbound_ipv6_vxlan_above_its_underlay_is_an_overlay_mismatch() {
        let topo = Topology::new();
        add_ipv6_underlay(&topo);
        // Unbound, so the kernel leaves it at 1500.
        add_vxlan6(&topo, "vx96", "96", "4796", false);
        assert_eq!(kernel_mtu(&topo, "vx96"), 1500);
        set_up(&topo, "vx96", None);
        let agent = Agent::start_ready(&topo);
        let how = format!("the route to {NODE_B_V6}");
        assert_mismatch(
            &agent,
            &topo,
            &vxlan6("vx96", "route_to_remote", &how),
            1500,
        );
        // The testbed's IPv4 overlay is fine.
        agent.expect_no_finding(any_mismatch_on(&topo, "vx0"), QUIET);
    }

    #[test]
    fn ipv6_vxlan_at_underlay_minus_70_is_clean() {
        let topo = Topology::new();
        add_ipv6_underlay(&topo);
        // Bound to the underlay, the kernel derives 1430 itself; unbound, set to 1430.
        add_vxlan6(&topo, "vx96", "96", "4796", true);
        let t = vxlan6("vx96", "bound", "");
        assert_kernel_default(&topo, &t);
        set_up(&topo, "vx96", None);
        add_vxlan6(&topo, "vx97", "97", "4797", false);
        set_up(&topo, "vx97", Some(t.expected_mtu()));
        let agent = Agent::start_ready(&topo);
        assert_clean(&agent, &topo, "vx96");
        assert_clean(&agent, &topo, "vx97");
    }
}
