//! Which integration tests a guest runs: the whole suite, the kernel subset or the
//! arm64 subset, unless name filters were given. The lists are long and change with the
//! suite, apart from how the matrix boots its guests.

use super::arch::Arch;

/// The tests an aarch64 guest runs when no `--filter` is given: TCG emulating another
/// architecture is several times slower, so the subset that proves the eBPF object
/// passes the arm64 verifier and its BTF offsets resolve: doctor (always run), refused,
/// timeout, reset, the PMTUD black hole and a clean shutdown.
pub(super) const ARM64_SUBSET: &[&str] = &[
    "refused_connect_is_a_listener_problem",
    "forward_drop_timeout_is_a_firewall_problem",
    "reset_by_peer_is_reported_as_reset_not_refused",
    "sigterm_exits_cleanly_and_detaches",
    "filtered_frag_needed_is_a_pmtud_black_hole",
];

/// The tests `cargo xtask test` runs in its x86_64 guest when no `--filter` is given
/// (`integration --subset` runs them too). The whole suite under TCG takes 45-50 minutes,
/// which CI's 90 cannot hold beside everything else on a slow day, and most of it tests
/// user space the host run already proved. These are the tests where the kernel differs:
/// every program through this kernel's verifier and read paths (probe reads before 6.2),
/// each verdict's kernel evidence (resets sent and received, ICMP errors through the TC
/// classifier, drop reasons by this kernel's numbering, retransmits and stalls), TC
/// attachment through netlink and its cleanup after SIGTERM and `kill -9` (no TCX before
/// 6.6), conntrack drops, IPv6 and IPv4-mapped sockets, the PMTUD black hole and the
/// path probes that find one beyond the node, Services
/// rejected by netfilter, and the real tunnels (Geneve, WireGuard, IPIP, GRE), which this
/// machine's kernel does not have. Each name matches one test, except the `tunnels::`
/// ones, which each match the tests of one tunnel kind in that module. Where an IPv6 or behind-the-router test repeats an
/// IPv4 or on-the-tunnel one through the same kernel paths (the held black hole, the
/// agent started mid-stall, the dead peer, the clean path under MTU probing), only one
/// runs here, so that CI's 90 minutes hold this subset and the 5.10 one; the whole
/// suite (`integration --kernel 6.1`) runs both.
pub(super) const KERNEL_SUBSET: &[&str] = &[
    // scenarios
    "refused_connect_is_a_listener_problem",
    "reset_sent_for_a_closed_port_counts_on_the_node_that_sent_it",
    "forward_drop_timeout_is_a_firewall_problem",
    "reset_by_peer_is_reported_as_reset_not_refused",
    "missing_pod_route_is_a_cni_routing_problem",
    "sigterm_exits_cleanly_and_detaches",
    "drop_beyond_this_node_is_a_timeout_of_unknown_layer",
    "pods_refused_half_a_second_after_their_veth_appears_are_each_reported",
    "doctor_has_every_program_accepted_and_reads_as_this_kernel_allows",
    // verdicts
    "dead_peer_bulk_transfer_is_a_stall_not_a_black_hole",
    "dead_peer_with_mtu_probing_on_is_a_stall_not_a_masked_black_hole",
    "local_reject_with_tcp_reset_is_this_nodes_firewall",
    "remote_icmp_port_unreachable_is_a_firewall_not_the_listener",
    "abandoned_connect_with_local_drop_is_a_timeout",
    "connect_that_succeeds_late_resolves_its_timeout",
    "connect_completed_by_a_simultaneous_open_resolves_its_timeout",
    "one_socket_connecting_again_is_judged_per_attempt",
    "v4_mapped_sockets_keep_their_evidence",
    "syn_ack_dropped_on_the_return_path_is_this_nodes_firewall",
    "server_side_resets_aggregate_per_listener",
    "icmp_watched_on_trouble_names_the_sender_from_the_next_failure",
    "host_network_connect_dropped_by_output_the_kernel_gives_up_on_is_a_firewall_timeout",
    "admin_prohibited_sent_by_the_destination_is_its_firewall",
    // local_drops
    "blackhole_route_for_a_pod_block_is_cni_routing",
    "unreachable_route_for_a_pod_block_is_cni_routing",
    "prohibit_route_for_a_pod_block_is_cni_routing_not_a_firewall",
    "vxlan_without_the_peers_fdb_entry_is_cni_routing",
    // storm
    "refused_storm_is_aggregated_in_the_kernel_and_accounted_exactly",
    "resets_whose_error_the_client_takes_at_once_are_each_the_listeners_refusal",
    "refusals_to_twenty_thousand_distinct_ports_are_accounted_exactly",
    // tc_fallback
    "netlink_mode_sigterm_leaves_no_filter_and_no_clsact",
    "killed_agents_filters_are_replaced_and_their_clsact_removed_on_exit",
    "foreign_clsact_and_filter_survive_start_and_sigterm",
    "netlink_filter_sees_frag_needed_from_beyond_this_node",
    // drops, conntrack
    "drops_are_counted_by_reason_in_this_nodes_namespaces_only",
    "syn_dropped_by_a_full_conntrack_table_is_conntrack",
    "syn_ack_dropped_as_invalid_is_conntrack",
    // ipv6
    "ipv6_port_unreachable_reject_is_a_firewall_not_the_listener",
    "ipv6_admin_prohibited_is_a_firewall",
    "ipv6_closed_port_is_the_listener",
    "ipv6_oversize_drop_with_pmtud_working_is_info",
    "ipv6_kube_proxy_reject_without_endpoints_is_the_service_ip6tables_nft",
    "ipv6_kube_proxy_reject_without_endpoints_is_the_service_ip6tables_legacy",
    "ipv6_kube_proxy_reject_without_endpoints_is_the_service_nftables",
    "ipv6_admin_prohibited_from_the_destination_is_its_firewall",
    "ipv6_packet_too_big_dropped_in_output_names_the_output_hook",
    "ipv6_refusal_delayed_by_neighbour_discovery_is_one_listener_verdict",
    "ipv6_failed_neighbour_connect_is_one_unreachable_verdict",
    "ipv6_failed_neighbour_connect_whose_error_the_client_takes_first_is_one_unreachable_verdict",
    // mtu
    "filtered_frag_needed_is_a_pmtud_black_hole",
    "oversized_pod_mtu_with_icmp_allowed_is_an_oversize_drop_that_recovers",
    "unbound_vxlan_above_its_underlay_is_an_overlay_mismatch",
    "frag_needed_from_beyond_this_node_is_counted_as_received",
    "masqueraded_flow_with_frag_needed_filtered_is_a_black_hole",
    "a_black_hole_stays_open_while_its_flow_is_stuck",
    "an_agent_started_during_a_black_hole_reports_it_at_the_next_retransmit",
    "a_stall_after_pmtud_worked_is_no_black_hole",
    // path_mtu
    "learned_path_mtu_below_the_overlays_need_is_an_overlay_mismatch",
    "learned_ipv6_path_mtu_below_the_overlays_need_is_an_overlay_mismatch",
    // path_probe: the agent's own echo probes through this kernel's raw ICMP sockets
    "black_hole_beyond_the_node_is_found_by_probing_the_path",
    "black_hole_behind_the_router_is_found_by_probing_the_path",
    "dead_peer_behind_the_tunnel_stays_a_stall",
    "tunnel_dropped_on_the_path_is_the_overlay",
    "tunnel_dropped_under_a_learned_neighbour_is_the_overlay",
    // pmtud_ipv6
    "ipv6_stall_after_pmtud_worked_is_no_black_hole",
    "ipv6_black_hole_beyond_the_node_is_found_by_probing",
    "a_black_hole_masked_by_mtu_probing_is_reported_recovered",
    "mtu_probing_on_a_clean_path_reports_nothing",
    "a_route_mtu_lowered_mid_stall_is_not_mtu_probing",
    "ipv6_black_hole_masked_by_mtu_probing_is_reported_recovered",
    "a_path_black_hole_resolves_once_the_hop_heals",
    // nat
    "service_rejected_on_this_node_is_the_firewall_not_the_listener",
    "service_rejected_by_icmp_beyond_this_node_is_a_firewall_not_the_service",
    "no_endpoints_is_the_service_with_nftables",
    // rules and programs named: counters and TC/cgroup queries on this kernel
    "iptables_nft_reject_rule_is_named",
    "iptables_legacy_reject_rule_is_named",
    "nftables_reject_rule_is_named",
    "dropping_rule_of_a_timing_out_connect_is_named",
    "tc_program_that_dropped_the_syn_is_named",
    "cgroup_egress_program_that_dropped_the_syn_is_named",
    // inbound: a forwarded SYN's route and devices read at its drop, on this kernel
    "syn_dropped_by_an_ingress_policy_is_an_inbound_firewall_finding",
    "syn_rejected_by_an_ingress_policy_is_an_inbound_reject",
    "syn_reset_by_an_ingress_policy_is_named_a_reject_by_its_rule",
    "a_connect_from_this_node_is_its_own_verdict_not_an_inbound_one",
    "a_connect_from_a_pod_of_this_node_is_its_own_verdict_not_an_inbound_one",
    "an_ipv6_ingress_policy_drop_is_the_same_inbound_finding",
    // every real tunnel kind, each its own name so that guests splitting the subset
    // share them (together they take about 7 minutes under TCG)
    "tunnels::geneve",
    "tunnels::gre",
    "tunnels::ipip",
    "tunnels::wireguard",
    "tunnels::ipv6_vxlan",
    "tunnels::unbound_ipv6_vxlan",
];

/// The kernel subset on the kernel where the agent runs its fallbacks (Debian 11's 5.10:
/// fentry on `sock_def_error_report` and `__icmp_send`, `kfree_skb` by drop site with
/// fexit on the functions that run tc and cgroup programs), within
/// CI's 90 minutes beside the 6.1 subset: every program through this kernel's verifier
/// (`doctor`), and each verdict whose evidence those fallbacks give: refused, reset,
/// unreachable and the ICMP errors sent, the firewall and routing layers from the drop
/// sites, drop counts, the MTU black hole and oversize drops (IPv4 and IPv6), the inbound
/// firewall drop, drops by other eBPF programs, and the clean shutdown. The rest of the kernel subset reads the same
/// tracepoints as 6.1 (retransmits, resets, TC through netlink) and stays there;
/// `integration --kernel 5.10` runs everything.
pub(super) const FALLBACK_SUBSET: &[&str] = &[
    "doctor_has_every_program_accepted_and_reads_as_this_kernel_allows",
    "refused_connect_is_a_listener_problem",
    "forward_drop_timeout_is_a_firewall_problem",
    "reset_by_peer_is_reported_as_reset_not_refused",
    "missing_pod_route_is_a_cni_routing_problem",
    "connect_is_unreachable_without_the_pod_route",
    "sigterm_exits_cleanly_and_detaches",
    "remote_icmp_port_unreachable_is_a_firewall_not_the_listener",
    "local_reject_with_tcp_reset_is_this_nodes_firewall",
    "blackhole_route_for_a_pod_block_is_cni_routing",
    "unreachable_route_for_a_pod_block_is_cni_routing",
    "prohibit_route_for_a_pod_block_is_cni_routing_not_a_firewall",
    "drops_are_counted_by_reason_in_this_nodes_namespaces_only",
    "ipv6_port_unreachable_reject_is_a_firewall_not_the_listener",
    "ipv6_oversize_drop_with_pmtud_working_is_info",
    "ipv6_failed_neighbour_connect_whose_error_the_client_takes_first_is_one_unreachable_verdict",
    "filtered_frag_needed_is_a_pmtud_black_hole",
    "oversized_pod_mtu_with_icmp_allowed_is_an_oversize_drop_that_recovers",
    "refused_storm_is_aggregated_in_the_kernel_and_accounted_exactly",
    "syn_dropped_by_an_ingress_policy_is_an_inbound_firewall_finding",
    "tc_program_that_dropped_the_syn_is_named",
    "cgroup_egress_program_that_dropped_the_syn_is_named",
];

pub(super) fn suite_name(
    filters: &[String],
    subset: bool,
    arch: Arch,
    kernel_subset: &[&str],
) -> String {
    match (filters.is_empty(), arch) {
        (true, Arch::X86_64) if subset && kernel_subset == FALLBACK_SUBSET => {
            "fallback subset".into()
        }
        (true, Arch::X86_64) if subset => "kernel subset".into(),
        (true, Arch::X86_64) => "whole suite".into(),
        (true, Arch::Aarch64) => "arm64 subset".into(),
        (false, _) => format!("filter: {}", filters.join(" ")),
    }
}

/// The name filters a guest of `arch` runs with; `kernel_subset` is its kernel's
/// (`Series::subset`).
pub(super) fn guest_filters(
    filters: &[String],
    subset: bool,
    arch: Arch,
    kernel_subset: &'static [&'static str],
) -> Vec<String> {
    if !filters.is_empty() {
        return filters.to_vec();
    }
    let named: &[&str] = match arch {
        Arch::Aarch64 => ARM64_SUBSET,
        Arch::X86_64 if subset => kernel_subset,
        Arch::X86_64 => &[],
    };
    named.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;

    /// A renamed test would silently leave the subset, and a name that is part of another
    /// would bring that one in: every name (a libtest substring filter) must select one
    /// test function of the integration suite, or, for `module::prefix`, the tests of
    /// that module starting with the prefix; those together select every test of their
    /// module.
    #[test]
    fn every_subset_name_selects_one_integration_test() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir).unwrap() {
            files.push(fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        let test_fns = |source: &str| -> Vec<String> {
            source
                .split("#[test]")
                .skip(1)
                .filter_map(|after| Some(after.split("fn ").nth(1)?.split('(').next()?.to_owned()))
                .collect()
        };
        let tests: Vec<String> = files.iter().flat_map(|f| test_fns(f)).collect();
        assert!(tests.len() > 100, "found only {} tests", tests.len());
        let mut by_module: std::collections::HashMap<&str, Vec<String>> = Default::default();
        for name in KERNEL_SUBSET
            .iter()
            .chain(ARM64_SUBSET)
            .chain(FALLBACK_SUBSET)
        {
            if let Some((module, prefix)) = name.split_once("::") {
                let file = files
                    .iter()
                    .find(|f| f.contains(&format!("mod {module} {{")))
                    .unwrap_or_else(|| panic!("{name}: no module {module}"));
                let selected: Vec<String> = test_fns(file)
                    .into_iter()
                    .filter(|t| t.starts_with(prefix))
                    .collect();
                assert!(!selected.is_empty(), "{name} selects no test of {module}");
                let outside = tests.iter().filter(|t| t.contains(name)).count();
                assert_eq!(outside, 0, "{name} also matches a test name");
                by_module.entry(module).or_default().extend(selected);
                continue;
            }
            let selected = tests.iter().filter(|t| t.contains(name)).count();
            assert_eq!(selected, 1, "{name} selects {selected} test functions");
        }
        for (module, mut selected) in by_module {
            let file = files
                .iter()
                .find(|f| f.contains(&format!("mod {module} {{")))
                .unwrap();
            let mut all = test_fns(file);
            all.sort();
            selected.sort();
            selected.dedup();
            assert_eq!(selected, all, "the {module}:: names leave tests out");
        }
    }

    #[test]
    fn filters_win_then_the_arch_subset_then_the_kernel_subset() {
        let given = vec!["mtu".to_owned()];
        assert_eq!(
            guest_filters(&given, true, Arch::X86_64, KERNEL_SUBSET),
            given
        );
        assert_eq!(
            guest_filters(&[], true, Arch::Aarch64, KERNEL_SUBSET).len(),
            ARM64_SUBSET.len()
        );
        assert_eq!(
            guest_filters(&[], true, Arch::X86_64, KERNEL_SUBSET).len(),
            KERNEL_SUBSET.len()
        );
        assert!(guest_filters(&[], false, Arch::X86_64, KERNEL_SUBSET).is_empty());
        assert_eq!(
            guest_filters(&[], true, Arch::X86_64, FALLBACK_SUBSET).len(),
            FALLBACK_SUBSET.len()
        );
        assert_eq!(
            suite_name(&[], true, Arch::X86_64, KERNEL_SUBSET),
            "kernel subset"
        );
        assert_eq!(
            suite_name(&[], true, Arch::X86_64, FALLBACK_SUBSET),
            "fallback subset"
        );
        assert_eq!(
            suite_name(&[], false, Arch::X86_64, FALLBACK_SUBSET),
            "whole suite"
        );
    }
}
