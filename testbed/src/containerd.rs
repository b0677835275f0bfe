//! A real `containerd` (Debian's, with its CRI plugin, runc and the CNI bridge plugin)
//! as a guard, for the tests of pod naming.
//!
//! Everything is its own: root, state, socket, CNI configuration and IPAM data live
//! under a temporary directory; nothing is pulled from a registry. The sandbox ("pause")
//! image is built here as an OCI layout tarball holding the static busybox, sleeping,
//! and imported with `ctr` under the name the CRI plugin's `sandbox_image` expects.
//!
//! containerd runs in a given network namespace (node A), entered with `nsenter --net`
//! only, so that the CNI bridge and the pods' veths are in node A (which makes the pods
//! part of the agent's scope) while the pinned pod namespaces under `/run/netns` stay
//! visible to every process. Pods are created and removed through the CRI API
//! (`RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox`), as the kubelet would.
//!
//! Dropping the guard removes the pods left, stops containerd and its shims, unmounts
//! what it mounted under its directory and deletes the directory.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{
    Error, Result, cmd,
    process::{die_with_parent, send_signal, wait_timeout},
};

/// The image name `sandbox_image` is set to.
pub const SANDBOX_IMAGE: &str = "node-diag.test/pause:1";
/// The CNI bridge containerd's pods are attached to, in its network namespace.
pub const BRIDGE: &str = "ndcri0";
/// How long containerd gets to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Addresses the pods get from host-local IPAM: `subnet` (the bridge holds its first
/// address, the gateway) and the range `first..=last`. A one-address range makes a pod
/// re-created after a removal get the same address.
#[derive(Debug, Clone, Copy)]
pub struct PodPool {
    pub subnet: Ipv4Addr,
    pub prefix: u8,
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

impl PodPool {
    /// The bridge's address: the subnet's first host.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet) + 1)
    }
}

/// A pod sandbox created through CRI.
#[derive(Debug, Clone)]
pub struct Pod {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Ipv4Addr,
    /// The pinned network namespace's name under `/run/netns` (`cni-<uuid>`).
    pub netns: String,
    /// Its inode: what the agent's findings carry as `netns`.
    pub netns_inode: u64,
}

pub struct Containerd {
    dir: PathBuf,
    netns: String,
    pool: PodPool,
    socket: PathBuf,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Containerd {
    /// Starts containerd in network namespace `netns` with pods addressed from `pool`,
    /// waits for its socket and imports the sandbox image.
    pub fn start(netns: &str, pool: PodPool) -> Result<Self> {
        crate::require_root()?;
        let dir = std::env::temp_dir().join(format!("{}-containerd", crate::unique_name()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        // A tmpfs of its own: the overlayfs snapshotter's upper directories cannot be on
        // an overlay (the root of a VM guest, a container's /tmp).
        let dir_text = dir.display().to_string();
        cmd::run(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            "mode=0700",
            "node-diag-test",
            &dir_text,
        ])?;
        let spawned = Self::spawn(&dir, netns, pool);
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                unmount_under(&dir);
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let socket = dir.join("containerd.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("tokio runtime", e))?;
        let mut this = Self {
            client: rt.block_on(lazy_client(&socket)),
            dir,
            netns: netns.to_owned(),
            pool,
            socket,
            child: Some(child),
            rt,
        };
        this.wait_socket()?;
        this.import_sandbox_image()?;
        Ok(this)
    }

    /// Writes the configuration under `dir` and starts containerd in `netns`.
    fn spawn(dir: &Path, netns: &str, pool: PodPool) -> Result<Child> {
        for sub in ["cni", "ipam", "logs"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(|e| Error::io(format!("create {}", dir.join(sub).display()), e))?;
        }
        let socket = dir.join("containerd.sock");
        write(
            &dir.join("cni/10-node-diag-test.conflist"),
            &cni_config(dir, pool),
        )?;
        write(&dir.join("config.toml"), &containerd_config(dir, &socket))?;
        // Appended to: a restarted containerd keeps the log of its first run.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("containerd.log"))
            .map_err(|e| Error::io("create containerd.log", e))?;
        let log2 = log.try_clone().map_err(|e| Error::io("dup log", e))?;
        let mut command = Command::new("nsenter");
        command
            .arg(format!(
                "--net={}",
                crate::netns::netns_path(netns).display()
            ))
            .arg("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        die_with_parent(&mut command);
        command.spawn().map_err(|source| Error::Spawn {
            command: cmd::display(&command),
            source,
        })
    }

    /// Stops containerd (SIGTERM, then SIGKILL after 10 s), leaving its state and pods'
    /// shims: the runtime is down as after a crash or a `systemctl stop`, its socket
    /// refusing connections. [`Containerd::restart`] brings it back.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = send_signal(child.id(), libc::SIGTERM);
        if !matches!(
            wait_timeout(&mut child, Duration::from_secs(10)),
            Ok(Some(_))
        ) {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts containerd again on the same state and socket after [`Containerd::stop`],
    /// and waits for its socket.
    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        self.child = Some(Self::spawn(&self.dir, &self.netns, self.pool)?);
        self.wait_socket()
    }

    /// containerd's CRI socket (for `--cri-socket`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    fn wait_socket(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.socket.exists() && std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.error(format!("containerd exited at start ({status})")));
            }
            if Instant::now() > deadline {
                return Err(self.error(format!(
                    "containerd's socket not up within {START_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn error(&self, what: String) -> Error {
        Error::Agent {
            what,
            diagnostics: format!("containerd log:\n{}", self.log()),
        }
    }

    /// Builds the sandbox image (an OCI layout: the static busybox running `sleep`) and
    /// imports it into the CRI plugin's namespace.
    fn import_sandbox_image(&self) -> Result<()> {
        let tarball = build_sandbox_image(&self.dir.join("image"))?;
        let socket = self.socket.display().to_string();
        let tarball = tarball.display().to_string();
        cmd::run(&[
            "ctr", "-a", &socket, "-n", "k8s.io", "images", "import", &tarball,
        ])?;
        Ok(())
    }

    /// Creates pod `namespace/name` (uid `uid`) through `RunPodSandbox` and reads back
    /// its address and network namespace.
    pub fn run_pod(&mut self, namespace: &str, name: &str, uid: &str) -> Result<Pod> {
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.dir.join("logs").display().to_string(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod as i32,
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = self.client.clone();
        let id = self
            .rt
            .block_on(client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }))
            .map_err(|s| self.error(format!("RunPodSandbox {namespace}/{name}: {s}")))?
            .into_inner()
            .pod_sandbox_id;
        let status = self
            .rt
            .block_on(client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            }))
            .map_err(|s| self.error(format!("PodSandboxStatus {id}: {s}")))?
            .into_inner();
        let ip = status
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .and_then(|n| n.ip.parse().ok())
            .ok_or_else(|| self.error(format!("pod {name} has no IPv4 address: {status:?}")))?;
        let path = status
            .info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| {
                v["runtimeSpec"]["linux"]["namespaces"]
                    .as_array()?
                    .iter()
                    .find(|n| n["type"] == "network")?["path"]
                    .as_str()
                    .map(PathBuf::from)
            })
            .ok_or_else(|| self.error(format!("pod {name}: no network namespace path")))?;
        let netns = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let netns_inode = std::os::unix::fs::MetadataExt::ino(
            &fs::metadata(&path).map_err(|e| Error::io(format!("stat {}", path.display()), e))?,
        );
        Ok(Pod {
            id,
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            ip,
            netns,
            netns_inode,
        })
    }

    /// Stops and removes a pod sandbox (its address goes back to the pool).
    pub fn remove_pod(&mut self, id: &str) -> Result<()> {
        let mut client = self.client.clone();
        self.rt
            .block_on(client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .map_err(|s| self.error(format!("StopPodSandbox {id}: {s}")))?;
        self.rt
            .block_on(client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .map_err(|s| self.error(format!("RemovePodSandbox {id}: {s}")))?;
        Ok(())
    }

    fn remove_all_pods(&mut self) {
        let mut client = self.client.clone();
        let Ok(list) = self
            .rt
            .block_on(client.list_pod_sandbox(ListPodSandboxRequest { filter: None }))
        else {
            return;
        };
        for item in list.into_inner().items {
            let _ = self.remove_pod(&item.id);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.remove_all_pods();
        }
        if let Some(mut child) = self.child.take() {
            let _ = send_signal(child.id(), libc::SIGTERM);
            if !matches!(
                wait_timeout(&mut child, Duration::from_secs(10)),
                Ok(Some(_))
            ) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Shims outlive containerd by design: those of this instance name its socket.
        let needle = self.socket.display().to_string();
        for pid in processes_mentioning(&needle) {
            let _ = send_signal(pid, libc::SIGKILL);
        }
        unmount_under(&self.dir);
        if std::thread::panicking() {
            eprintln!("--- containerd log ---\n{}", self.log());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A client whose connections go to the unix socket `path` (connected on first use).
async fn lazy_client(path: &Path) -> RuntimeServiceClient<Channel> {
    let path = path.to_path_buf();
    let channel = Endpoint::from_static("http://containerd.invalid")
        .timeout(Duration::from_secs(60))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }));
    RuntimeServiceClient::new(channel)
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// A bridge network with host-local IPAM on `pool`, its data under `dir`.
fn cni_config(dir: &Path, pool: PodPool) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "node-diag-test",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{
                    "subnet": format!("{}/{}", pool.subnet, pool.prefix),
                    "gateway": pool.gateway().to_string(),
                    "rangeStart": pool.first.to_string(),
                    "rangeEnd": pool.last.to_string(),
                }]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dir.join("ipam"),
            },
        }],
    })
    .to_string()
}

/// containerd's configuration: everything under `dir`, the CRI plugin with the local
/// sandbox image, the overlayfs snapshotter, runc, and CNI from /usr/lib/cni.
fn containerd_config(dir: &Path, socket: &Path) -> String {
    let d = dir.display();
    let s = socket.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{s}"
[ttrpc]
  address = "{s}.ttrpc"
[debug]
  address = "{d}/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # The sandbox's oom_score_adj (-998) may not go below ours: lowering it needs
  # CAP_SYS_RESOURCE, which a test machine's root may not have.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
"#
    )
}

/// The sandbox image as an OCI layout tarball under `dir`: one uncompressed layer with
/// the static busybox, run as `busybox sleep` (forever, for a test).
fn build_sandbox_image(dir: &Path) -> Result<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    let rootfs = dir.join("rootfs/bin");
    for d in [&blobs, &rootfs] {
        fs::create_dir_all(d).map_err(|e| Error::io(format!("create {}", d.display()), e))?;
    }
    fs::copy(busybox, rootfs.join("busybox"))
        .map_err(|e| Error::io("copy /bin/busybox (package busybox-static)", e))?;
    let layer = dir.join("layer.tar");
    cmd::run(&[
        "tar",
        "--sort=name",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--mtime=@0",
        "-C",
        &dir.join("rootfs").display().to_string(),
        "-cf",
        &layer.display().to_string(),
        "bin",
    ])?;
    let layer_bytes = fs::read(&layer).map_err(|e| Error::io("read layer.tar", e))?;
    let layer = blob(&blobs, &layer_bytes)?;
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sleep", "2147483647"]},
        "rootfs": {"type": "layers", "diff_ids": [layer.0.clone()]},
    })
    .to_string();
    let config = blob(&blobs, config.as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.0, "size": config.1},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.0, "size": layer.1}],
    })
    .to_string();
    let manifest = blob(&blobs, manifest.as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest.0,
            "size": manifest.1,
            "platform": {"architecture": oci_arch(), "os": "linux"},
            "annotations": {"io.containerd.image.name": SANDBOX_IMAGE},
        }],
    })
    .to_string();
    write(&layout.join("index.json"), &index)?;
    write(
        &layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let tarball = dir.join("sandbox.tar");
    cmd::run(&[
        "tar",
        "-C",
        &layout.display().to_string(),
        "-cf",
        &tarball.display().to_string(),
        ".",
    ])?;
    Ok(tarball)
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

/// Stores `bytes` as a content-addressed blob; returns its digest and size.
fn blob(blobs: &Path, bytes: &[u8]) -> Result<(String, usize)> {
    let tmp = blobs.join("incoming");
    fs::write(&tmp, bytes).map_err(|e| Error::io("write blob", e))?;
    let sum = cmd::run(&["sha256sum", &tmp.display().to_string()])?;
    let hex = sum.split_whitespace().next().unwrap_or_default().to_owned();
    fs::rename(&tmp, blobs.join(&hex)).map_err(|e| Error::io("rename blob", e))?;
    Ok((format!("sha256:{hex}"), bytes.len()))
}

/// Pids whose command line contains `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Unmounts (lazily, deepest first) every mount point under `dir`.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        if let Ok(c) = std::ffi::CString::new(p) {
            // SAFETY: a valid C string; MNT_DETACH cannot leave anything half-done.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
