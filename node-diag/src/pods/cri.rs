//! The CRI v1 client over the runtime's unix socket (gRPC, k8s-cri's generated API on
//! tonic). Only read-only calls: `Version`, `ListPodSandbox`, `PodSandboxStatus`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest, VersionRequest, runtime_service_client::RuntimeServiceClient,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::debug;

use super::index::Sandbox;

/// Bound on connecting and on each call: a wedged runtime must not stall the refresh.
const TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub(crate) enum CriError {
    #[error("no CRI socket at {0}")]
    Missing(PathBuf),
    #[error(
        "permission denied on {0}: run as root (the DaemonSet in deploy/ does) or give the agent access to the runtime's socket"
    )]
    Permission(PathBuf),
    #[error("cannot connect to {path}: {source}")]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("CRI {call} on {path}: {status}")]
    Call {
        call: &'static str,
        path: PathBuf,
        status: Box<tonic::Status>,
    },
}

/// The runtime's own name and version, from `Version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuntimeVersion {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) api_version: String,
}

/// A connected CRI client.
pub(crate) struct Cri {
    path: PathBuf,
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to the runtime at `path`; fails at once when the socket is missing or
    /// not accessible, so the caller can say which.
    pub(crate) async fn connect(path: &Path) -> Result<Self, CriError> {
        // Probe the socket first: tonic's transport error hides the errno.
        if let Err(e) = UnixStream::connect(path).await {
            return Err(match e.kind() {
                std::io::ErrorKind::NotFound => CriError::Missing(path.to_path_buf()),
                std::io::ErrorKind::PermissionDenied => CriError::Permission(path.to_path_buf()),
                _ => CriError::Unreachable {
                    path: path.to_path_buf(),
                    source: e,
                },
            });
        }
        let socket = path.to_path_buf();
        // The URI is required by tonic but unused: every connection goes to the socket.
        let channel =
            Endpoint::from_static("http://cri.invalid")
                .connect_timeout(TIMEOUT)
                .timeout(TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .map_err(|source| CriError::Connect {
                    path: path.to_path_buf(),
                    source,
                })?;
        debug!(socket = %path.display(), "connected to the container runtime");
        Ok(Self {
            path: path.to_path_buf(),
            client: RuntimeServiceClient::new(channel),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) async fn version(&mut self) -> Result<RuntimeVersion, CriError> {
        let v = self
            .client
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .map_err(|s| self.call_error("Version", s))?
            .into_inner();
        Ok(RuntimeVersion {
            name: v.runtime_name,
            version: v.runtime_version,
            api_version: v.runtime_api_version,
        })
    }

    /// Every ready pod sandbox, with its verbose status. A sandbox that went away between
    /// the list and its status is skipped.
    pub(crate) async fn sandboxes(&mut self) -> Result<Vec<Sandbox>, CriError> {
        let list = self
            .client
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    state: Some(PodSandboxStateValue {
                        state: PodSandboxState::SandboxReady as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| self.call_error("ListPodSandbox", s))?
            .into_inner();
        let mut out = Vec::with_capacity(list.items.len());
        for item in list.items {
            let status = self
                .client
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: item.id.clone(),
                    verbose: true,
                })
                .await;
            match status {
                Ok(resp) => out.extend(Sandbox::from_status(resp.get_ref())),
                Err(s) if s.code() == tonic::Code::NotFound => {
                    debug!(sandbox = %item.id, "sandbox gone before its status was read");
                }
                Err(s) => return Err(self.call_error("PodSandboxStatus", s)),
            }
        }
        Ok(out)
    }

    fn call_error(&self, call: &'static str, status: tonic::Status) -> CriError {
        CriError::Call {
            call,
            path: self.path.clone(),
            status: Box::new(status),
        }
    }
}
