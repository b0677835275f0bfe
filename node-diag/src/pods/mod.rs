//! Pods of this node, from its container runtime over the CRI socket: which pod a network
//! namespace or an IP belongs to, so that findings name `namespace/name` instead of a
//! netns inode and an address.
//!
//! - [`cri`]: the gRPC client (k8s-cri's generated CRI v1 API on tonic) over the
//!   runtime's unix socket: containerd's or CRI-O's, or the one `--cri-socket` names.
//! - [`index`]: turns the runtime's sandboxes into a [`PodIndex`] (pure): by netns inode
//!   (from the sandbox's network namespace path, else its pid) and by IP.
//! - [`watch`]: keeps the index current from a background task polling every few seconds,
//!   keeping the last good index through runtime hiccups.
//!
//! Only the runtime's socket is needed, no Kubernetes API credentials. Without a runtime
//! (or without permission to its socket) the index stays empty: findings carry the
//! netns and addresses only, as they always did.

pub mod cri;
pub mod index;
pub mod watch;

use std::path::{Path, PathBuf};

pub use index::{PodIndex, PodRef};
pub use watch::{PodsHandle, watch};

use crate::findings::Finding;

/// Where the runtimes listen by default, tried in this order.
pub const DEFAULT_SOCKETS: [&str; 2] =
    ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// The CRI socket to use: `configured` if given, else the first default that is a
/// socket. (A hostPath mount of a socket the node lacks shows up as an empty directory:
/// the runtime creates a missing mount source as one.)
pub fn socket_path(configured: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt as _;
    if let Some(p) = configured {
        return Some(p.to_path_buf());
    }
    DEFAULT_SOCKETS
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()))
}

/// Names the pods of a finding: `pod` is the local side (its netns, else its source
/// address), `peer_pod` the other end when it is a pod of this node (the backend NAT
/// sent the connection to, else the destination). Fields already set are kept.
pub fn name_pods(f: &mut Finding, pods: &PodIndex) {
    if f.pod.is_none() {
        f.pod = f
            .netns
            .and_then(|n| pods.by_netns.get(&n))
            .or_else(|| f.src.and_then(|ip| pods.by_ip.get(&ip)))
            .or_else(|| f.listener.and_then(|l| pods.by_ip.get(&l.ip())))
            .cloned();
    }
    if f.peer_pod.is_none() {
        f.peer_pod = f
            .backend
            .or(f.dst)
            .and_then(|ip| pods.by_ip.get(&ip))
            .cloned();
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::findings::fixtures::refused;

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

    #[test]
    fn local_pod_from_netns_then_src() {
        let idx = index();
        let mut f = refused(4000);
        f.netns = Some(4026532317);
        f.src = Some("10.9.9.9".parse().unwrap());
        name_pods(&mut f, &idx);
        assert_eq!(f.pod.as_ref().map(|p| p.name.as_str()), Some("cart"));

        let mut f = refused(4000);
        f.netns = Some(1);
        name_pods(&mut f, &idx);
        assert_eq!(f.pod.as_ref().map(|p| p.name.as_str()), Some("cart"));
    }

    #[test]
    fn peer_pod_prefers_backend() {
        let idx = index();
        let mut f = refused(4000);
        name_pods(&mut f, &idx);
        assert_eq!(f.peer_pod.as_ref().map(|p| p.name.as_str()), Some("db"));
        let mut f = refused(4000);
        f.backend = Some("10.0.0.9".parse::<IpAddr>().unwrap());
        name_pods(&mut f, &idx);
        assert_eq!(
            f.peer_pod.as_ref().map(|p| p.name.as_str()),
            Some("db-backend")
        );
    }

    #[test]
    fn host_network_flow_names_nobody() {
        let mut f = refused(4000);
        f.src = Some("192.168.1.1".parse().unwrap());
        f.dst = Some("192.168.1.2".parse().unwrap());
        f.netns = Some(4026531840);
        name_pods(&mut f, &index());
        assert_eq!(f.pod, None);
        assert_eq!(f.peer_pod, None);
    }

    #[test]
    fn configured_socket_wins() {
        assert_eq!(
            socket_path(Some(Path::new("/tmp/x.sock"))),
            Some(PathBuf::from("/tmp/x.sock"))
        );
    }
}
