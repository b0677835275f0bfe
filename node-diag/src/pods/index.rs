//! The pods of this node, indexed by network namespace inode and by IP, built from what
//! the runtime says of each pod sandbox (pure but for the `stat` of a netns path).

use std::{
    collections::HashMap,
    net::IpAddr,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use k8s_cri::v1::{NamespaceMode, PodSandboxStatusResponse};
use serde::{Deserialize, Serialize};

/// A pod, as Kubernetes names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct PodRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// This node's pods by the inode of their network namespace (what findings carry as
/// `netns`) and by their addresses. Host-network pods are left out: their namespace and
/// addresses are the node's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodIndex {
    pub(crate) by_netns: HashMap<u32, PodRef>,
    pub(crate) by_ip: HashMap<IpAddr, PodRef>,
}

impl PodIndex {
    pub(crate) fn len(&self) -> usize {
        self.by_netns.len().max(self.by_ip.len())
    }

    /// The index of `sandboxes`, resolving each one's netns with `inode_of`.
    pub(crate) fn build(
        sandboxes: &[Sandbox],
        mut inode_of: impl FnMut(&Path) -> Option<u32>,
    ) -> Self {
        let mut idx = Self::default();
        for s in sandboxes.iter().filter(|s| !s.host_network && s.ready) {
            let inode = s.netns_path.as_deref().and_then(&mut inode_of).or_else(|| {
                s.pid
                    .and_then(|pid| inode_of(&PathBuf::from(format!("/proc/{pid}/ns/net"))))
            });
            if let Some(inode) = inode {
                idx.by_netns.insert(inode, s.pod.clone());
            }
            for ip in &s.ips {
                idx.by_ip.insert(*ip, s.pod.clone());
            }
        }
        idx
    }
}

/// The inode of the namespace file at `path` (a pinned netns or `/proc/<pid>/ns/net`);
/// `None` unless it is a namespace (nsfs): a pin whose bind mount this mount namespace
/// does not see is a plain empty file, whose inode names nothing.
pub(crate) fn netns_inode(path: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt as _;
    const NSFS_MAGIC: i64 = 0x6e73_6673;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs only writes the struct it is given; an all-zero statfs is valid.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a valid out-pointer.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 || fs.f_type as i64 != NSFS_MAGIC {
        return None;
    }
    std::fs::metadata(path).ok().map(|m| m.ino() as u32)
}

/// What the index needs of one ready pod sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub(crate) id: String,
    pub(crate) pod: PodRef,
    pub(crate) ips: Vec<IpAddr>,
    /// The pinned network namespace (containerd: the runtime spec's network namespace).
    pub(crate) netns_path: Option<PathBuf>,
    /// The sandbox's process, whose `/proc/<pid>/ns/net` is the namespace too.
    pub(crate) pid: Option<u32>,
    pub(crate) host_network: bool,
    /// Whether the sandbox is ready (running); only ready ones are indexed.
    pub(crate) ready: bool,
}

impl Sandbox {
    /// From a verbose `PodSandboxStatus` answer; `None` without metadata.
    pub(crate) fn from_status(resp: &PodSandboxStatusResponse) -> Option<Self> {
        let status = resp.status.as_ref()?;
        let meta = status.metadata.as_ref()?;
        let mut ips = Vec::new();
        if let Some(net) = &status.network {
            ips.extend(net.ip.parse::<IpAddr>().ok());
            ips.extend(
                net.additional_ips
                    .iter()
                    .filter_map(|i| i.ip.parse::<IpAddr>().ok()),
            );
        }
        let host_network = status
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .is_some_and(|o| o.network == NamespaceMode::Node as i32);
        let (netns_path, pid) = resp
            .info
            .get("info")
            .map(|json| verbose_info(json))
            .unwrap_or_default();
        Some(Self {
            ready: status.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32,
            id: status.id.clone(),
            pod: PodRef {
                namespace: meta.namespace.clone(),
                name: meta.name.clone(),
                uid: meta.uid.clone(),
            },
            ips,
            netns_path,
            pid,
            host_network,
        })
    }
}

/// The network namespace path and pid in a runtime's verbose sandbox info: containerd and
/// CRI-O both put the OCI runtime spec under `runtimeSpec` (its `linux.namespaces` entry
/// of type `network` has the pinned path) and the sandbox process under `pid`.
fn verbose_info(json: &str) -> (Option<PathBuf>, Option<u32>) {
    #[derive(Deserialize)]
    struct Info {
        pid: Option<u32>,
        #[serde(rename = "runtimeSpec")]
        runtime_spec: Option<Spec>,
    }
    #[derive(Deserialize)]
    struct Spec {
        linux: Option<Linux>,
    }
    #[derive(Deserialize)]
    struct Linux {
        #[serde(default)]
        namespaces: Vec<Ns>,
    }
    #[derive(Deserialize)]
    struct Ns {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        path: String,
    }
    let Ok(info) = serde_json::from_str::<Info>(json) else {
        return (None, None);
    };
    let path = info
        .runtime_spec
        .and_then(|s| s.linux)
        .and_then(|l| l.namespaces.into_iter().find(|n| n.kind == "network"))
        .filter(|n| !n.path.is_empty())
        .map(|n| PathBuf::from(n.path));
    (path, info.pid.filter(|p| *p > 0))
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1::{
        LinuxPodSandboxStatus, Namespace, NamespaceOption, PodIp, PodSandboxMetadata,
        PodSandboxNetworkStatus, PodSandboxStatus,
    };

    use super::*;

    /// Trimmed from containerd 1.6's verbose `PodSandboxStatus`.
    const CONTAINERD_INFO: &str = r#"{"pid":4242,"processStatus":"running","netNamespaceClosed":false,
        "image":"registry.k8s.io/pause:3.6","runtimeSpec":{"ociVersion":"1.0.2-dev",
        "linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},
        {"type":"network","path":"/var/run/netns/cni-1b2c"}]}}}"#;

    fn status(mode: NamespaceMode) -> PodSandboxStatusResponse {
        PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: "abc".into(),
                metadata: Some(PodSandboxMetadata {
                    name: "cart-7d9f".into(),
                    uid: "u-1".into(),
                    namespace: "shop".into(),
                    attempt: 0,
                }),
                network: Some(PodSandboxNetworkStatus {
                    ip: "10.244.1.7".into(),
                    additional_ips: vec![PodIp {
                        ip: "fd00::7".into(),
                    }],
                }),
                linux: Some(LinuxPodSandboxStatus {
                    namespaces: Some(Namespace {
                        options: Some(NamespaceOption {
                            network: mode as i32,
                            ..Default::default()
                        }),
                    }),
                }),
                ..Default::default()
            }),
            info: [("info".to_string(), CONTAINERD_INFO.to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn containerd_sandbox() {
        let s = Sandbox::from_status(&status(NamespaceMode::Pod)).unwrap();
        assert_eq!(s.pod.to_string(), "shop/cart-7d9f");
        assert_eq!(s.pod.uid, "u-1");
        assert_eq!(
            s.ips,
            vec![
                "10.244.1.7".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert_eq!(s.netns_path, Some(PathBuf::from("/var/run/netns/cni-1b2c")));
        assert_eq!(s.pid, Some(4242));
        assert!(!s.host_network);

        let idx = PodIndex::build(&[s], |p| {
            (p == Path::new("/var/run/netns/cni-1b2c")).then_some(4026532317)
        });
        assert_eq!(idx.by_netns[&4026532317].name, "cart-7d9f");
        assert_eq!(idx.by_ip.len(), 2);
    }

    #[test]
    fn pid_when_the_path_cannot_be_read() {
        let s = Sandbox::from_status(&status(NamespaceMode::Pod)).unwrap();
        let idx = PodIndex::build(&[s], |p| (p == Path::new("/proc/4242/ns/net")).then_some(7));
        assert_eq!(idx.by_netns[&7].name, "cart-7d9f");
    }

    #[test]
    fn host_network_pods_are_left_out() {
        let s = Sandbox::from_status(&status(NamespaceMode::Node)).unwrap();
        assert!(s.host_network);
        let idx = PodIndex::build(&[s], |_| Some(4026531840));
        assert_eq!(idx, PodIndex::default());
    }

    #[test]
    fn only_namespace_files_have_a_netns_inode() {
        assert!(netns_inode(Path::new("/proc/self/ns/net")).is_some());
        assert_eq!(netns_inode(Path::new("/proc/self/status")), None);
        assert_eq!(netns_inode(Path::new("/nonexistent/netns")), None);
    }

    #[test]
    fn info_without_spec_or_garbage() {
        assert_eq!(verbose_info("{}"), (None, None));
        assert_eq!(verbose_info("not json"), (None, None));
        assert_eq!(
            verbose_info(
                r#"{"pid":0,"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}"#
            ),
            (None, None)
        );
    }
}
