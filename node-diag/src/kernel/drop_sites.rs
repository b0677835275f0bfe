//! Drop reasons on kernels whose `skb:kfree_skb` carries none (before 5.17, e.g. Debian
//! 11's 5.10): the drop's location, the return address into the function that freed the
//! packet, stands for the reason. The functions that drop for one known cause are looked
//! up once, at load time, in `/proc/kallsyms` (their start, and the next symbol's as their
//! end), numbered in the agent's own reason table ([`reasons`]) and written to the
//! programs' `DROP_SITES` map. The names are those newer kernels give the same drops, so
//! the families ([`super::drop_family`]) and everything after them are unchanged; the
//! reason is coarser (`ip_forward`'s too-big and hop-limit drops share a function: the
//! program tells them apart by the packet's length against its route's MTU).

use std::collections::BTreeMap;

use node_diag_common::{DROP_SITE_ENTRIES, DROP_SITE_UNKNOWN, DropSite};

use super::tracefs::DropReasons;

/// Each dropping function and the reason its drops stand for.
const SITES: &[(&str, &str)] = &[
    // Every netfilter verdict NF_DROP (iptables, nftables, ip6tables) frees here.
    ("nf_hook_slow", "NETFILTER_DROP"),
    // Forwarding: a DF packet over the route's MTU (checked by the program).
    ("ip_forward", "PKT_TOO_BIG"),
    ("ip6_forward", "PKT_TOO_BIG"),
    // An `unreachable` or `prohibit` route.
    ("ip_error", "IP_INADDRERRORS"),
    ("ip6_pkt_drop", "IP_INADDRERRORS"),
    // No route out of this host for a locally generated packet.
    ("ip_route_output_flow", "IP_OUTNOROUTES"),
    // The next hop's address could not be resolved.
    ("neigh_invalidate", "NEIGH_FAILED"),
    ("__neigh_event_send", "NEIGH_QUEUEFULL"),
    ("ip_finish_output2", "NEIGH_CREATEFAIL"),
];

/// The agent's reason table on such kernels: `NOT_SPECIFIED` (a drop at no known site)
/// at [`DROP_SITE_UNKNOWN`], then each reason of [`SITES`] once.
pub(crate) fn reasons() -> DropReasons {
    let mut table = BTreeMap::new();
    table.insert(DROP_SITE_UNKNOWN, "NOT_SPECIFIED".to_owned());
    for (_, name) in SITES {
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
    for (function, reason) in SITES {
        let Some(reason) = reasons.value(reason) else {
            continue;
        };
        let Some(i) = starts.iter().position(|(_, name)| name == function) else {
            continue;
        };
        let start = starts[i].0;
        let Some(&(end, _)) = starts[i + 1..].iter().find(|(addr, _)| *addr > start) else {
            continue;
        };
        sites.push(DropSite {
            start,
            end,
            reason,
            _pad: 0,
        });
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
        assert_eq!(r.len(), 1 + 7);
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
                    _pad: 0
                },
                DropSite {
                    start: 0xffff_ffff_81b0_0080,
                    end: 0xffff_ffff_81b0_0400,
                    reason: too_big,
                    _pad: 0
                },
                // Data symbols are not text: ip_error ends at the next function.
                DropSite {
                    start: 0xffff_ffff_81c0_0000,
                    end: 0xffff_ffff_81c0_0300,
                    reason: route,
                    _pad: 0
                },
            ]
        );
    }

    #[test]
    fn hidden_addresses_resolve_nothing() {
        // Read without privilege, kallsyms shows every address as 0.
        let hidden = "0000000000000000 T nf_hook_slow\n0000000000000000 T nf_hook_slow_list\n";
        assert!(resolve(hidden, &reasons()).is_empty());
    }
}
