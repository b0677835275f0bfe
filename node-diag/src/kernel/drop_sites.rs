//! Drop reasons on kernels whose `skb:kfree_skb` carries none (before 5.17, e.g. Debian
//! 11's 5.10): the drop's location, the return address into the function that freed the
//! packet, stands for the reason. The functions that drop for one known cause are looked
//! up once, at load time, in `/proc/kallsyms` (their start, and the next symbol's as their
//! end), numbered in the agent's own reason table ([`reasons`]) and written to the
//! programs' `DROP_SITES` map. The names are those newer kernels give the same drops, so
//! the families ([`super::drop_family`]) and everything after them are unchanged; the
//! reason is coarser (`ip_forward`'s too-big and hop-limit drops share a function: the
//! program tells them apart by the packet's length against its route's MTU). A drop by
//! another eBPF program is freed in functions that drop for other causes too; those sites
//! stand for `TC_INGRESS`/`TC_EGRESS`/`BPF_CGROUP_EGRESS` only for a packet the
//! companion fexit programs saw condemned ([`site_needs`], the programs' `shot` module).

use std::collections::BTreeMap;

use node_diag_common::{DROP_SITE_ENTRIES, DROP_SITE_UNKNOWN, DropSite, site_needs};

use super::tracefs::DropReasons;

/// Each dropping function, the reason its drops stand for, and what a drop there needs
/// besides to stand for it ([`site_needs`] bits, 0 for nothing).
const SITES: &[(&str, &str, u32)] = &[
    // Every netfilter verdict NF_DROP (iptables, nftables, ip6tables) frees here.
    ("nf_hook_slow", "NETFILTER_DROP", 0),
    // Forwarding: a DF packet over the route's MTU (checked by the program).
    ("ip_forward", "PKT_TOO_BIG", 0),
    ("ip6_forward", "PKT_TOO_BIG", 0),
    // An `unreachable` or `prohibit` route.
    ("ip_error", "IP_INADDRERRORS", 0),
    ("ip6_pkt_drop", "IP_INADDRERRORS", 0),
    // No route out of this host for a locally generated packet.
    ("ip_route_output_flow", "IP_OUTNOROUTES", 0),
    // The next hop's address could not be resolved.
    ("neigh_invalidate", "NEIGH_FAILED", 0),
    ("__neigh_event_send", "NEIGH_QUEUEFULL", 0),
    ("ip_finish_output2", "NEIGH_CREATEFAIL", 0),
    // Other eBPF programs' drops: the packet a tc classifier shot is freed where clsact
    // ran it (inlined into the receive and transmit paths, or not), the one a cgroup
    // egress program denied right after it; all of these drop for other causes too.
    ("sch_handle_ingress", "TC_INGRESS", site_needs::TC_SHOT),
    (
        "__netif_receive_skb_core",
        "TC_INGRESS",
        site_needs::TC_SHOT,
    ),
    ("sch_handle_egress", "TC_EGRESS", site_needs::TC_SHOT),
    ("__dev_queue_xmit", "TC_EGRESS", site_needs::TC_SHOT),
    (
        "ip_finish_output",
        "BPF_CGROUP_EGRESS",
        site_needs::CGROUP_EGRESS_DENIED,
    ),
    (
        "ip6_finish_output",
        "BPF_CGROUP_EGRESS",
        site_needs::CGROUP_EGRESS_DENIED,
    ),
];
const _: () = assert!(SITES.len() <= DROP_SITE_ENTRIES as usize);

/// The agent's reason table on such kernels: `NOT_SPECIFIED` (a drop at no known site)
/// at [`DROP_SITE_UNKNOWN`], then each reason of [`SITES`] once.
pub(crate) fn reasons() -> DropReasons {
    let mut table = BTreeMap::new();
    table.insert(DROP_SITE_UNKNOWN, "NOT_SPECIFIED".to_owned());
    for (_, name, _) in SITES {
        if !table.values().any(|n| n == name) {
            let next = DROP_SITE_UNKNOWN + table.len() as u32;
            table.insert(next, (*name).to_owned());
        }
    }
    DropReasons::from_table(table)
}

/// The [`SITES`] found in `kallsyms` (the text of `/proc/kallsyms`, read as root: the
/// addresses are real), each with its reason's value in `reasons`. A function missing
/// (inlined, or in a module not loaded) is left out; at most [`DROP_SITE_ENTRIES`].
pub(crate) fn resolve(kallsyms: &str, reasons: &DropReasons) -> Vec<DropSite> {
    // Every text symbol's start, sorted: a function ends where the next one starts.
    let mut starts: Vec<(u64, &str)> = kallsyms
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let name = fields.next()?;
            (addr != 0 && matches!(kind, "t" | "T")).then_some((addr, name))
        })
        .collect();
    starts.sort_unstable();
    let mut sites = Vec::new();
    for (function, reason, needs) in SITES {
        let Some(reason) = reasons.value(reason) else {
            continue;
        };
        // The compiler's out-of-line copies (`sch_handle_ingress.constprop.0`,
        // `.isra.0`, `.part.0`) drop as the function does.
        let copies = starts.iter().enumerate().filter(|(_, (_, name))| {
            name.strip_prefix(function)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        });
        for (i, &(start, _)) in copies {
            let Some(&(end, _)) = starts[i + 1..].iter().find(|(addr, _)| *addr > start) else {
                continue;
            };
            sites.push(DropSite {
                start,
                end,
                reason,
                needs: *needs,
            });
        }
    }
    sites.truncate(DROP_SITE_ENTRIES as usize);
    sites
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81a00000 T nf_hook_slow
ffffffff81a00100 T nf_hook_slow_list
ffffffff81b00000 t ip_forward_finish
ffffffff81b00080 T ip_forward
ffffffff81b00400 T ip_forward_finish_gso
ffffffff81c00000 t ip_error
ffffffff81c00200 d some_data
ffffffff81c00300 t ip_rt_bug
ffffffffc0000000 t vxlan_xmit\t[vxlan]
0000000000000000 A fixed_percpu_data
";

    #[test]
    fn the_reason_table_names_each_reason_once() {
        let r = reasons();
        assert_eq!(r.name(DROP_SITE_UNKNOWN), "NOT_SPECIFIED");
        let too_big = r.value("PKT_TOO_BIG").unwrap();
        assert_ne!(too_big, DROP_SITE_UNKNOWN);
        assert!(r.value("NETFILTER_DROP").is_some());
        // Two functions stand for PKT_TOO_BIG, one value.
        assert_eq!(r.len(), 1 + 10);
    }

    #[test]
    fn functions_resolve_to_their_text_and_reason() {
        let r = reasons();
        let sites = resolve(KALLSYMS, &r);
        let nf = r.value("NETFILTER_DROP").unwrap();
        let too_big = r.value("PKT_TOO_BIG").unwrap();
        let route = r.value("IP_INADDRERRORS").unwrap();
        assert_eq!(
            sites,
            [
                DropSite {
                    start: 0xffff_ffff_81a0_0000,
                    end: 0xffff_ffff_81a0_0100,
                    reason: nf,
                    needs: 0
                },
                DropSite {
                    start: 0xffff_ffff_81b0_0080,
                    end: 0xffff_ffff_81b0_0400,
                    reason: too_big,
                    needs: 0
                },
                // Data symbols are not text: ip_error ends at the next function.
                DropSite {
                    start: 0xffff_ffff_81c0_0000,
                    end: 0xffff_ffff_81c0_0300,
                    reason: route,
                    needs: 0
                },
            ]
        );
    }

    #[test]
    fn other_programs_drop_sites_need_the_packet_condemned() {
        let r = reasons();
        let kallsyms = "\
ffffffff81d00000 T __netif_receive_skb_core
ffffffff81d01000 t __netif_receive_skb_one_core
ffffffff81e00000 t ip_finish_output
ffffffff81e00200 t ip_finish_output2
ffffffff81e00800 T ip_output
ffffffff81f00000 t sch_handle_egress.constprop.0
ffffffff81f00100 t sch_handle_egress_other
";
        let sites = resolve(kallsyms, &r);
        let site = |start: u64| sites.iter().find(|s| s.start == start).copied();
        let ingress = site(0xffff_ffff_81d0_0000).expect("the receive path's site");
        assert_eq!(r.name(ingress.reason), "TC_INGRESS");
        assert_eq!(ingress.needs, site_needs::TC_SHOT);
        assert_eq!(ingress.end, 0xffff_ffff_81d0_1000);
        let egress = site(0xffff_ffff_81e0_0000).expect("ip_finish_output's site");
        assert_eq!(r.name(egress.reason), "BPF_CGROUP_EGRESS");
        assert_eq!(egress.needs, site_needs::CGROUP_EGRESS_DENIED);
        // The neighbour's drop needs nothing more.
        assert_eq!(site(0xffff_ffff_81e0_0200).map(|s| s.needs), Some(0));
        // An out-of-line copy is the function; another name sharing its start is not.
        let copy = site(0xffff_ffff_81f0_0000).expect("the copy's site");
        assert_eq!(r.name(copy.reason), "TC_EGRESS");
        assert_eq!(copy.end, 0xffff_ffff_81f0_0100);
        assert!(site(0xffff_ffff_81f0_0100).is_none());
    }

    #[test]
    fn hidden_addresses_resolve_nothing() {
        // Read without privilege, kallsyms shows every address as 0.
        let hidden = "0000000000000000 T nf_hook_slow\n0000000000000000 T nf_hook_slow_list\n";
        assert!(resolve(hidden, &reasons()).is_empty());
    }
}
