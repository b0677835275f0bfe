//! The agent's own HTTP listeners (`--listen`, `--findings-listen`): the connections they
//! accept are node-diag's, not the workload it diagnoses, and what befalls them (a
//! scraper or `node-diag findings` resetting its connection, a stall) is never reported.
//!
//! The match is on the socket's local end: the agent's network namespace and a
//! listener's bound address and port (a wildcard bind, `0.0.0.0` or `[::]`, matches any
//! local address of its family, and `[::]` the IPv4-mapped ones too). An accepted
//! socket's local end is its listener's address, so this is exact for accepted
//! connections; nothing else in that namespace can hold that local port while the agent
//! listens on it (the kernel refuses the bind: the listeners set no `SO_REUSEPORT`). The agent's own outgoing connections to its
//! port are deliberately not matched: their local end is an ephemeral port, and a probe
//! that cannot reach the agent's port (refused, timed out, dropped) is a real fault
//! worth reporting.

use std::net::{IpAddr, SocketAddr};

use node_diag_common::{Event, FlowKey};

use crate::findings::correlate::addr;

/// The agent's listening sockets, as bound, and the namespace they live in.
#[derive(Clone, Debug, Default)]
pub(crate) struct OwnEndpoints {
    /// Network namespace inode of the agent (0 when unknown: nothing matches then).
    netns: u32,
    listeners: Vec<SocketAddr>,
}

impl OwnEndpoints {
    pub(crate) fn new(netns: u32, listeners: Vec<SocketAddr>) -> Self {
        Self { netns, listeners }
    }

    /// Whether `ev`'s local socket is one the agent's listeners accepted.
    pub(crate) fn owns(&self, ev: &Event) -> bool {
        self.netns != 0 && ev.netns == self.netns && self.is_listener_end(&ev.flow)
    }

    fn is_listener_end(&self, flow: &FlowKey) -> bool {
        let local = addr(flow, &flow.saddr);
        self.listeners
            .iter()
            .any(|l| l.port() == flow.sport && bound_covers(l.ip(), local))
    }
}

/// Whether a listener bound to `bound` accepts connections on local address `local`
/// (already canonical: an IPv4-mapped address is IPv4).
fn bound_covers(bound: IpAddr, local: IpAddr) -> bool {
    match bound {
        IpAddr::V4(b) if b.is_unspecified() => local.is_ipv4(),
        // A dual-stack `[::]` bind accepts both families (the default bindv6only=0).
        IpAddr::V6(b) if b.is_unspecified() => true,
        b => b.to_canonical() == local,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use node_diag_common::{AF_INET, AF_INET6};

    use super::*;

    fn ev(netns: u32, local: IpAddr, sport: u16, dport: u16) -> Event {
        let mut flow = FlowKey {
            sport,
            dport,
            ..Default::default()
        };
        match local {
            IpAddr::V4(a) => {
                flow.family = AF_INET;
                flow.saddr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                flow.family = AF_INET6;
                flow.saddr = a.octets();
            }
        }
        Event {
            flow,
            netns,
            ..Default::default()
        }
    }

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn accepted_sockets_of_a_wildcard_listener_are_the_agents() {
        let own = OwnEndpoints::new(7, vec!["0.0.0.0:9464".parse().unwrap()]);
        assert!(own.owns(&ev(7, v4("10.77.0.1"), 9464, 51000)));
        assert!(own.owns(&ev(7, v4("127.0.0.1"), 9464, 51000)));
        // Another namespace's workload on the same port is not the agent's.
        assert!(!own.owns(&ev(8, v4("10.77.0.1"), 9464, 51000)));
        // Another port of this namespace neither.
        assert!(!own.owns(&ev(7, v4("10.77.0.1"), 8080, 51000)));
        // The agent's own client end towards its port (e.g. a probe) is not the listener.
        assert!(!own.owns(&ev(7, v4("10.77.0.1"), 51000, 9464)));
        // An IPv6 socket is not accepted by an IPv4 wildcard.
        assert!(!own.owns(&ev(7, IpAddr::V6(Ipv6Addr::LOCALHOST), 9464, 51000)));
    }

    #[test]
    fn a_specific_bind_matches_its_address_only() {
        let own = OwnEndpoints::new(
            7,
            vec![
                "10.77.0.1:9465".parse().unwrap(),
                "[::]:9464".parse().unwrap(),
            ],
        );
        assert!(own.owns(&ev(7, v4("10.77.0.1"), 9465, 51000)));
        assert!(!own.owns(&ev(7, v4("10.77.0.2"), 9465, 51000)));
        // Dual-stack wildcard: both families.
        assert!(own.owns(&ev(7, v4("10.77.0.2"), 9464, 51000)));
        assert!(own.owns(&ev(7, IpAddr::V6(Ipv6Addr::LOCALHOST), 9464, 51000)));
        // An IPv4-mapped local address is its IPv4 one.
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 77, 0, 1).to_ipv6_mapped());
        assert!(own.owns(&ev(7, mapped, 9465, 51000)));
    }

    #[test]
    fn an_unknown_namespace_matches_nothing() {
        let own = OwnEndpoints::new(0, vec!["0.0.0.0:9464".parse().unwrap()]);
        assert!(!own.owns(&ev(0, v4("10.77.0.1"), 9464, 51000)));
        let own = OwnEndpoints::new(7, vec!["0.0.0.0:9464".parse().unwrap()]);
        assert!(!own.owns(&ev(0, v4("10.77.0.1"), 9464, 51000)));
    }
}
