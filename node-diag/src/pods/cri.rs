//! The CRI v1 client over the runtime's unix socket (gRPC, k8s-cri's generated API on
//! tonic). Only read-only calls: `Version`, `ListPodSandbox`, `PodSandboxStatus` and the
//! `GetContainerEvents` stream.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    ContainerEventResponse, GetEventsRequest, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue, PodSandboxStatusRequest, VersionRequest,
    runtime_service_client::RuntimeServiceClient,
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

impl CriError {
    /// Whether the runtime does not have the call (a CRI older than the call).
    pub(crate) fn unimplemented(&self) -> bool {
        matches!(self, Self::Call { status, .. } if status.code() == tonic::Code::Unimplemented)
    }
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

/// The runtime's event stream (`GetContainerEvents`).
pub(crate) type Events = tonic::codec::Streaming<ContainerEventResponse>;

/// A channel to the socket at `path`; `timeout` bounds each call when given.
async fn channel(path: &Path, timeout: Option<Duration>) -> Result<Channel, CriError> {
    let socket = path.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    let mut endpoint = Endpoint::from_static("http://cri.invalid").connect_timeout(TIMEOUT);
    if let Some(t) = timeout {
        endpoint = endpoint.timeout(t);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|source| CriError::Connect {
            path: path.to_path_buf(),
            source,
        })
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
        let channel = channel(path, Some(TIMEOUT)).await?;
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

    /// The ids of the ready pod sandboxes: one cheap call, no per-sandbox status.
    pub(crate) async fn ready_ids(&mut self) -> Result<Vec<String>, CriError> {
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
        Ok(list.items.into_iter().map(|i| i.id).collect())
    }

    /// One sandbox's verbose status; `None` once it is gone (or lacks metadata).
    pub(crate) async fn status(&mut self, id: &str) -> Result<Option<Sandbox>, CriError> {
        let status = self
            .client
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await;
        match status {
            Ok(resp) => Ok(Sandbox::from_status(resp.get_ref())),
            Err(s) if s.code() == tonic::Code::NotFound => {
                debug!(sandbox = %id, "sandbox gone before its status was read");
                Ok(None)
            }
            Err(s) => Err(self.call_error("PodSandboxStatus", s)),
        }
    }

    /// Opens the runtime's event stream, on a connection of its own without the calls'
    /// time bound (the stream is quiet for as long as no container changes). A runtime
    /// without it (containerd before 1.7) answers `Unimplemented`.
    pub(crate) async fn events(&self) -> Result<Events, CriError> {
        let mut client = RuntimeServiceClient::new(channel(&self.path, None).await?);
        client
            .get_container_events(GetEventsRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| self.call_error("GetContainerEvents", s))
    }

    fn call_error(&self, call: &'static str, status: tonic::Status) -> CriError {
        CriError::Call {
            call,
            path: self.path.clone(),
            status: Box::new(status),
        }
    }
}
