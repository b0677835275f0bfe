//! Pods of this node, from its container runtime over the CRI socket: which pod a network
//! namespace or an IP belongs to, so that findings name `namespace/name` instead of a
//! netns inode and an address.
//!
//! - [`cri`]: the gRPC client (k8s-cri's generated CRI v1 API on tonic) over the
//!   runtime's unix socket: containerd's or CRI-O's, or the one `--cri-socket` names.
//! - [`index`]: turns the runtime's sandboxes into a [`PodIndex`] (pure): by netns inode
//!   (from the sandbox's network namespace path, else its pid) and by IP.
//! - [`watch`]: keeps the index current by change: the runtime's events (or, without
//!   them, a one-call list every second) say which sandbox to read, keeping the last
//!   good index through runtime hiccups.
//!
//! Only the runtime's socket is needed, no Kubernetes API credentials. Without a runtime
//! (or without permission to its socket) the index stays empty: findings carry the
//! netns and addresses only, as they always did.

pub(crate) mod cri;
pub(crate) mod index;
pub(crate) mod watch;

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

pub(crate) use index::{PodIndex, PodRef};
pub(crate) use watch::{PodsHandle, watch};

/// Where the runtimes listen by default, tried in this order.
pub(crate) const DEFAULT_SOCKETS: [&str; 2] =
    ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// The CRI socket to use: `configured` if given, else the first default that is a
/// socket. (A hostPath mount of a socket the node lacks shows up as an empty directory:
/// the runtime creates a missing mount source as one.)
pub(crate) fn socket_path(configured: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt as _;
    if let Some(p) = configured {
        return Some(p.to_path_buf());
    }
    DEFAULT_SOCKETS
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()))
}

/// Where a flow or listener runs, as a finding knows it: what its pods are named from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ends {
    /// The local side's network namespace.
    pub(crate) netns: Option<u32>,
    /// The local side's address.
    pub(crate) src: Option<IpAddr>,
    /// A server-side finding's listener.
    pub(crate) listener: Option<SocketAddr>,
    /// The other end: the backend NAT sent the connection to, else the destination.
    pub(crate) peer: Option<IpAddr>,
}

/// The pods at a finding's two ends, where they run on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) pod: Option<PodRef>,
    pub(crate) peer_pod: Option<PodRef>,
}

impl PodIndex {
    /// The pods at `ends`: the local one by its netns, else its source address (or
    /// listener's); the peer by its address.
    pub(crate) fn name(&self, ends: &Ends) -> Named {
        Named {
            pod: ends
                .netns
                .and_then(|n| self.by_netns.get(&n))
                .or_else(|| ends.src.and_then(|ip| self.by_ip.get(&ip)))
                .or_else(|| ends.listener.and_then(|l| self.by_ip.get(&l.ip())))
                .cloned(),
            peer_pod: ends.peer.and_then(|ip| self.by_ip.get(&ip)).cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn index() -> PodIndex {
        let mut idx = PodIndex::default();
        idx.by_netns.insert(4026532317, pod("cart"));
        idx.by_ip.insert("10.0.0.1".parse().unwrap(), pod("cart"));
        idx.by_ip.insert("10.0.0.2".parse().unwrap(), pod("db"));
        idx.by_ip
            .insert("10.0.0.9".parse().unwrap(), pod("db-backend"));
        idx
    }

    /// A flow from 10.0.0.1 (`src`) in netns 1 to `peer`.
    fn ends(peer: &str) -> Ends {
        Ends {
            netns: Some(1),
            src: Some("10.0.0.1".parse().unwrap()),
            listener: None,
            peer: Some(peer.parse().unwrap()),
        }
    }

    fn name_of(p: &Option<PodRef>) -> Option<&str> {
        p.as_ref().map(|p| p.name.as_str())
    }

    #[test]
    fn local_pod_from_netns_then_src() {
        let idx = index();
        let by_netns = Ends {
            netns: Some(4026532317),
            src: Some("10.9.9.9".parse().unwrap()),
            ..ends("10.0.0.2")
        };
        assert_eq!(name_of(&idx.name(&by_netns).pod), Some("cart"));
        assert_eq!(name_of(&idx.name(&ends("10.0.0.2")).pod), Some("cart"));
    }

    #[test]
    fn peer_pod_is_the_peer_address() {
        let idx = index();
        assert_eq!(name_of(&idx.name(&ends("10.0.0.2")).peer_pod), Some("db"));
        assert_eq!(
            name_of(&idx.name(&ends("10.0.0.9")).peer_pod),
            Some("db-backend")
        );
    }

    #[test]
    fn host_network_flow_names_nobody() {
        let host = Ends {
            netns: Some(4026531840),
            src: Some("192.168.1.1".parse().unwrap()),
            ..ends("192.168.1.2")
        };
        assert_eq!(index().name(&host), Named::default());
    }

    #[test]
    fn configured_socket_wins() {
        assert_eq!(
            socket_path(Some(Path::new("/tmp/x.sock"))),
            Some(PathBuf::from("/tmp/x.sock"))
        );
    }
}
