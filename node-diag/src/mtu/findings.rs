//! The findings of a judged model: `overlay_mtu_mismatch` for each interface above its
//! limit, `pmtud_disabled` for each namespace with PMTUD off, each with its remediation
//! and the arithmetic as evidence.

use std::{collections::HashMap, net::IpAddr, time::SystemTime};

use super::{
    model::{MtuVerdict, Role, Verdict},
    sysctls::{SysctlVerdict, no_pmtu_disc_meaning},
};
use crate::findings::{
    Finding, Kind, Layer, Severity,
    evidence::{Evidence, MtuEvidence, SysctlEvidence},
};

fn mismatch_finding(v: &MtuVerdict, now: SystemTime) -> Finding {
    let limit = v.expected_mtu.unwrap_or(0);
    let excess = -v.headroom.unwrap_or(0);
    // Where the underlay is a route's `mtu` below its device, raising that route is the
    // way to raise the underlay.
    let raise_underlay = match (&v.underlay_route, &v.underlay) {
        // A hop beyond this node is the narrow one: nothing here can raise it.
        _ if v.learned_pmtu.is_some() => format!(
            "raise the MTU of the hop towards {} that carries only {} bytes (beyond this \
             node: the route cache learned it from an ICMP frag-needed or packet-too-big) \
             by {excess} bytes",
            v.underlay_endpoint
                .map_or_else(|| "the tunnel's endpoint".into(), |a| a.to_string()),
            v.learned_pmtu.unwrap_or(0)
        ),
        (Some(route), Some(dev)) => {
            format!("raise the mtu of route {route} (it caps the underlay {dev}) by {excess} bytes")
        }
        (None, Some(dev)) => format!("raise the underlay {dev}'s MTU by {excess} bytes"),
        _ => format!("raise the underlay's MTU by {excess} bytes"),
    };
    let remediation = match v.role {
        Role::Overlay => match (&v.route, v.route_mtu) {
            (Some(route), Some(_)) => format!(
                "Set the mtu of route {route} through {} to {limit} (or {}'s MTU), or \
                 {raise_underlay}.",
                v.interface, v.interface
            ),
            _ => format!(
                "Set {}'s MTU to {limit} (the CNI's tunnel MTU setting), or {raise_underlay}.",
                v.interface
            ),
        },
        _ => {
            let by_arithmetic = v
                .underlay_mtu
                .zip(v.overhead)
                .map(|(u, o)| u.saturating_sub(o));
            let effective = v.effective_mtu.unwrap_or(v.mtu);
            // When the overlay device itself is set below what its underlay allows, it is
            // the one to raise; otherwise only the underlay can make room.
            let alternative = match (by_arithmetic, &v.overlay) {
                (Some(max), Some(ov)) if max > limit && max >= effective => {
                    format!("raise {ov}'s MTU to {effective}")
                }
                _ => raise_underlay,
            };
            // A route metric decides what the pod sends: the route is what to fix (the
            // CNI's route MTU, as Cilium sets it), the device may stay larger.
            let fix = match (&v.route, v.route_mtu) {
                (Some(route), Some(_)) => {
                    let whose = match v.role {
                        Role::NodeVeth => "its pod's routes".to_string(),
                        _ => format!("the pod's routes in netns {}", v.netns_name),
                    };
                    format!(
                        "Set the mtu of {whose} ({route}) to {limit} (the CNI's route MTU \
                         setting; running pods pick it up when recreated)"
                    )
                }
                (Some(route), None) => format!(
                    "Give route {route} mtu {limit} like the pod's other routes, or set the \
                     CNI MTU to {limit} (advmss only bounds TCP)"
                ),
                _ => format!(
                    "Set the CNI MTU to {limit} (pod interfaces and their node-side veths; \
                     running pods pick it up when recreated)"
                ),
            };
            format!(
                "{fix}, or {alternative}. Until then clamp TCP MSS to the path MTU (iptables \
                 -t mangle -A POSTROUTING -p tcp --tcp-flags SYN,RST SYN -j TCPMSS \
                 --clamp-mss-to-pmtu)."
            )
        }
    };
    let mut f = Finding::new(
        Kind::OverlayMtuMismatch,
        Layer::OverlayMtu,
        Severity::Warning,
        format!(
            "{}: packets above {limit} bytes do not fit the overlay and are dropped or \
             need PMTUD.",
            v.detail
        ),
        remediation,
        now,
    );
    f.interface = Some(v.interface.clone());
    f.netns = Some(v.netns);
    f.evidence = Evidence::Mtu(Box::new(MtuEvidence {
        underlay: v.underlay.clone(),
        underlay_mtu: v.underlay_mtu,
        underlay_device_mtu: v.underlay_device_mtu,
        underlay_route: v.underlay_route.clone(),
        underlay_route_mtu: v.underlay_route_mtu,
        underlay_endpoint: v.underlay_endpoint,
        underlay_endpoints: v.underlay_endpoints,
        underlay_source: v.underlay_source,
        underlay_found_by: v.underlay_found_by,
        learned_pmtu: v.learned_pmtu,
        learned_pmtu_expires_secs: v.learned_pmtu_expires_secs,
        frag_needed_from: None,
        encapsulation: v.encapsulation.clone(),
        overhead: v.overhead,
        overhead_breakdown: v.overhead_breakdown.clone(),
        expected_mtu: v.expected_mtu,
        actual_mtu: v.mtu,
        effective_mtu: v.effective_mtu,
        route: v.route.clone(),
        route_mtu: v.route_mtu,
        route_advmss: v.route_advmss,
        headroom: v.headroom,
        family: v.family,
        overlay: v.overlay.clone(),
        overlay_mtu: v.overlay_mtu,
        role: Some(v.role),
        netns_name: v.netns_name.clone(),
    }));
    f
}

fn sysctl_finding(s: &SysctlVerdict, now: SystemTime) -> Option<Finding> {
    let value = s.ip_no_pmtu_disc.filter(|v| *v != 0)?;
    // Mode 3 still honours frag-needed for TCP.
    let severity = if value == 3 {
        Severity::Info
    } else {
        Severity::Warning
    };
    let mut f = Finding::new(
        Kind::PmtudDisabled,
        Layer::HostSysctl,
        severity,
        format!(
            "net.ipv4.ip_no_pmtu_disc is {value} in netns {} ({}).",
            s.netns_name,
            no_pmtu_disc_meaning(value)
        ),
        "Set net.ipv4.ip_no_pmtu_disc=0 in this namespace; where frag-needed cannot get \
         through, also set net.ipv4.tcp_mtu_probing=1."
            .into(),
        now,
    );
    f.netns = Some(s.netns);
    f.evidence = Evidence::Sysctl(SysctlEvidence {
        sysctl: "net.ipv4.ip_no_pmtu_disc",
        value,
        tcp_mtu_probing: s.tcp_mtu_probing,
        netns_name: s.netns_name.clone(),
    });
    Some(f)
}

/// Names the hop in each mismatch judged on a learned path MTU: the sender of the
/// latest frag-needed (packet too big) this node saw for its endpoint (`senders`:
/// destination → sender, from the TC classifier's evidence). Without one, nothing is
/// named: the route cache does not keep who taught it.
pub(crate) fn name_frag_needed_senders(
    findings: &mut [Finding],
    senders: &HashMap<IpAddr, IpAddr>,
) {
    for f in findings {
        let Evidence::Mtu(e) = &mut f.evidence else {
            continue;
        };
        let from = e
            .learned_pmtu
            .and(e.underlay_endpoint)
            .and_then(|ep| senders.get(&ep).copied());
        if let Some(from) = from {
            e.frag_needed_from = Some(from);
            f.summary
                .push_str(&format!(" The frag-needed came from {from}."));
        }
    }
}

/// The findings of judged interfaces and sysctls.
pub(super) fn findings_of(
    verdicts: &[MtuVerdict],
    sysctls: &[SysctlVerdict],
    now: SystemTime,
) -> Vec<Finding> {
    verdicts
        .iter()
        .filter(|v| v.verdict == Verdict::Mismatch)
        .map(|v| mismatch_finding(v, now))
        .chain(sysctls.iter().filter_map(|s| sysctl_finding(s, now)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::{
        super::{fixtures::*, model::verdicts},
        *,
    };
    use crate::host_network::{LinkKind, Tunnel, UnderlaySource};

    #[test]
    fn pod_at_1500_over_a_1450_vxlan() {
        let snap = node(1500, 1450, 1500, 1500);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.verdict, Verdict::Ok);
        assert_eq!((vx.expected_mtu, vx.headroom), (Some(1450), Some(0)));
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.role, Role::PodInterface);
        assert_eq!(pod.verdict, Verdict::Mismatch);
        assert_eq!((pod.expected_mtu, pod.headroom), (Some(1450), Some(-50)));
        assert_eq!(verdict(&vs, NODE, "veth1").role, Role::NodeVeth);
        assert_eq!(verdict(&vs, NODE, "ul0").role, Role::Underlay);
        assert_eq!(verdict(&vs, NODE, "lo").verdict, Verdict::NotApplicable);

        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 2, "{fs:#?}");
        let f = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("eth0"))
            .unwrap();
        assert_eq!(f.kind, Kind::OverlayMtuMismatch);
        assert_eq!(f.layer, Layer::OverlayMtu);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.netns, Some(POD));
        assert!(
            f.summary
                .starts_with("underlay ul0 1500 − VXLAN 50 = 1450 (overlay vx0), but pod eth0"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("is 1500"), "{}", f.summary);
        assert!(
            f.remediation.starts_with("Set the CNI MTU to 1450"),
            "{}",
            f.remediation
        );
        let e = &f.evidence.to_map();
        assert_eq!(e["underlay"], "ul0");
        assert_eq!(e["underlay_mtu"], 1500);
        assert_eq!(e["encapsulation"], "VXLAN");
        assert_eq!(e["overhead"], 50);
        assert_eq!(e["expected_mtu"], 1450);
        assert_eq!(e["actual_mtu"], 1500);
        assert_eq!(e["headroom"], -50);
        assert_eq!(e["overlay"], "vx0");
        let node_side = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("veth1"))
            .unwrap();
        assert!(
            node_side
                .summary
                .contains("but node-side veth veth1 (peer of pod-a eth0) is 1500"),
            "{}",
            node_side.summary
        );
    }

    #[test]
    fn unbound_vxlan_forced_above_underlay_minus_50() {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces.push(tunnel(
            iface(NODE, "vxu", 5, LinkKind::Vxlan, 1500),
            Tunnel {
                remote: Some(IpAddr::from([10, 0, 0, 2])),
                ..Tunnel::default()
            },
            Some(("ul0", 2, 1500, UnderlaySource::RouteToRemote)),
        ));
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        let f = &fs[0];
        assert_eq!(f.interface.as_deref(), Some("vxu"));
        assert!(
            f.summary
                .starts_with("underlay ul0 1500 − VXLAN 50 = 1450, but vxlan vxu is 1500"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("the route to 10.0.0.2"), "{}", f.summary);
        assert!(f.remediation.starts_with("Set vxu's MTU to 1450"));
        assert_eq!(f.evidence.to_map()["underlay_source"], "route_to_remote");
        assert_eq!(f.evidence.to_map()["headroom"], -50);
    }

    #[test]
    fn overlay_set_below_its_underlay_limits_pods() {
        let snap = node(1500, 1400, 1450, 1400);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0].summary.starts_with(
                "overlay vx0 is 1400 (below underlay ul0 1500 − VXLAN 50 = 1450), but pod eth0"
            ),
            "{}",
            fs[0].summary
        );
        assert!(fs[0].remediation.contains("or raise vx0's MTU to 1450"));
    }

    /// Issue 37, case 2: the route cache learned 1400 towards node B, so the 1450 VXLAN
    /// carries 1350 at most, whatever its own devices say.
    #[test]
    fn a_learned_path_mtu_below_the_overlays_need_is_a_mismatch() {
        let peer = IpAddr::from([10, 0, 0, 2]);
        let snap = learned(node(1500, 1450, 1450, 1450), "vx0", peer, 1400);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.verdict, Verdict::Mismatch, "{vx:#?}");
        assert_eq!((vx.expected_mtu, vx.headroom), (Some(1350), Some(-100)));
        assert_eq!(vx.underlay_source, Some(UnderlaySource::LearnedPmtu));
        assert_eq!(vx.underlay_found_by, Some(UnderlaySource::Bound));
        assert!(
            vx.detail.starts_with(
                "underlay ul0 1400 (the route cache learned a path MTU of 1400 towards \
                 10.0.0.2, below ul0's 1500) − VXLAN 50 = 1350, but vxlan vx0 is 1450"
            ),
            "{}",
            vx.detail
        );
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        let on = |name: &str| {
            fs.iter()
                .find(|f| f.interface.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no finding on {name}: {fs:#?}"))
        };
        assert_eq!(fs.len(), 3, "vx0, the pod and its node-side veth: {fs:#?}");
        let f = on("vx0");
        assert_eq!(
            (f.kind, f.layer),
            (Kind::OverlayMtuMismatch, Layer::OverlayMtu)
        );
        let e = f.evidence.to_map();
        assert_eq!(e["underlay_source"], "learned_pmtu");
        assert_eq!(e["underlay_found_by"], "bound");
        assert_eq!(e["underlay_endpoint"], "10.0.0.2");
        assert_eq!(e["learned_pmtu"], 1400);
        assert_eq!(e["learned_pmtu_expires_secs"], 590);
        assert_eq!(e["underlay_mtu"], 1400);
        assert_eq!(e["underlay_device_mtu"], 1500);
        assert_eq!(e["expected_mtu"], 1350);
        assert!(
            f.remediation.starts_with(
                "Set vx0's MTU to 1350 (the CNI's tunnel MTU setting), or raise the MTU of \
                 the hop towards 10.0.0.2 that carries only 1400 bytes"
            ),
            "{}",
            f.remediation
        );
        // The pods inherit the overlay's limit and its arithmetic.
        let pod = on("eth0");
        assert!(
            pod.summary.starts_with(
                "underlay ul0 1400 (the route cache learned a path MTU of 1400 towards \
                 10.0.0.2, below ul0's 1500) − VXLAN 50 = 1350 (overlay vx0), but pod eth0"
            ),
            "{}",
            pod.summary
        );
        assert_eq!(pod.evidence.to_map()["learned_pmtu"], 1400);
    }

    #[test]
    fn the_hop_that_sent_the_frag_needed_is_named_when_seen() {
        let peer = IpAddr::from([10, 0, 0, 2]);
        let router = IpAddr::from([10, 0, 9, 254]);
        let snap = learned(node(1500, 1450, 1450, 1450), "vx0", peer, 1400);
        let mut fs = findings(&snap, SystemTime::UNIX_EPOCH);
        let unseen = fs.clone();
        super::name_frag_needed_senders(&mut fs, &HashMap::from([(router, peer)]));
        assert_eq!(fs, unseen, "a frag-needed for another destination");
        super::name_frag_needed_senders(&mut fs, &HashMap::from([(peer, router)]));
        let vx = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("vx0"))
            .expect("vx0");
        assert_eq!(vx.evidence.to_map()["frag_needed_from"], "10.0.9.254");
        assert!(
            vx.summary
                .ends_with("The frag-needed came from 10.0.9.254."),
            "{}",
            vx.summary
        );
        // A mismatch not judged on a learned path MTU names no hop.
        let snap = node(1500, 1500, 1500, 1500);
        let mut plain = findings(&snap, SystemTime::UNIX_EPOCH);
        super::name_frag_needed_senders(&mut plain, &HashMap::from([(peer, router)]));
        assert!(
            plain
                .iter()
                .all(|f| !f.evidence.to_map().contains_key("frag_needed_from")),
            "{plain:#?}"
        );
    }

    #[test]
    fn a_learned_path_mtu_that_does_not_narrow_the_path_changes_nothing() {
        let peer = IpAddr::from([10, 0, 0, 2]);
        // Learned on a jumbo underlay, above what the 1450 overlay needs: fine, and not
        // the underlay's limit either (9000 − 50 would be).
        let snap = learned(node(9000, 1450, 1450, 1450), "vx0", peer, 1500);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.verdict, Verdict::Ok, "{vx:#?}");
        assert_eq!(vx.underlay_source, Some(UnderlaySource::LearnedPmtu));
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
        // At the device's MTU: not below it, so not a limit, and no new keys.
        let snap = learned(node(1500, 1450, 1450, 1450), "vx0", peer, 1500);
        let vx = verdict(&verdicts(&snap), NODE, "vx0").clone();
        assert_eq!(vx.underlay_source, Some(UnderlaySource::Bound));
        assert_eq!(vx.learned_pmtu, None);
        // Expired: what the 1500 pod's finding says has no trace of it.
        let snap = node(1500, 1450, 1500, 1450);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        let e = fs[0].evidence.to_map();
        for key in [
            "learned_pmtu",
            "learned_pmtu_expires_secs",
            "underlay_found_by",
        ] {
            assert!(!e.contains_key(key), "{key} in {e:?}");
        }
        assert!(e.contains_key("underlay_route"), "existing keys stay, null");
    }

    #[test]
    fn a_learned_path_mtu_towards_an_ipv6_endpoint_counts_ipv6_headers() {
        // Packet-too-big from a 1280 hop towards node B's IPv6 address.
        let peer: IpAddr = "fd00:79::2".parse().unwrap();
        let mut snap = node(1500, 1430, 1430, 1430);
        let vx = snap
            .interfaces
            .iter_mut()
            .find(|i| i.name == "vx0")
            .unwrap();
        vx.remote_family = None;
        let snap = learned(snap, "vx0", peer, 1280);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(
            (vx.encapsulation.as_deref(), vx.expected_mtu, vx.verdict),
            (Some("VXLAN/IPv6"), Some(1210), Verdict::Mismatch)
        );
        assert!(
            vx.detail
                .contains("learned a path MTU of 1280 towards fd00:79::2"),
            "{}",
            vx.detail
        );
    }
}
