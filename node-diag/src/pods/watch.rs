//! Keeps the [`PodIndex`] current: read once at start, then every [`REFRESH`] from a
//! background task. A failed read keeps the last good index. The runtime being absent
//! or refusing the agent is said once (and again only after it had recovered).

use std::{
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use tracing::{debug, info, warn};

use super::{
    DEFAULT_SOCKETS, PodIndex,
    cri::{Cri, CriError},
    index::netns_inode,
    socket_path,
};

/// How often the runtime is asked for its pods. A pod started since is named from the
/// next read; its first findings may carry its netns only.
pub(crate) const REFRESH: Duration = Duration::from_secs(5);

/// The current index, shared with the agent's loop, and the runtime's state.
#[derive(Clone, Default)]
pub(crate) struct PodsHandle(Arc<RwLock<Arc<PodIndex>>>, Arc<RwLock<Option<Runtime>>>);

/// The runtime the pods are read from: its socket, and whether its last read worked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Runtime {
    pub(crate) socket: PathBuf,
    pub(crate) up: bool,
}

impl PodsHandle {
    /// The runtime's state, once a socket is known (configured, or found once at a
    /// default path); `None` on a host where no runtime was ever found, where the agent
    /// runs without pod names by design.
    pub(crate) fn runtime(&self) -> Option<Runtime> {
        self.1
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_runtime(&self, runtime: Option<Runtime>) {
        *self.1.write().unwrap_or_else(PoisonError::into_inner) = runtime;
    }

    pub(crate) fn current(&self) -> Arc<PodIndex> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, index: PodIndex) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(index);
    }
}

/// Reads the pods once (so findings from the start can name them), then keeps them
/// current from a task of the current runtime. `configured` is `--cri-socket`.
pub(crate) async fn watch(configured: Option<PathBuf>) -> PodsHandle {
    let handle = PodsHandle::default();
    let mut poller = Poller {
        configured,
        cri: None,
        socket: None,
        healthy: None,
    };
    poller.refresh(&handle).await;
    tokio::spawn({
        let handle = handle.clone();
        async move {
            let mut tick = tokio::time::interval(REFRESH);
            tick.tick().await;
            loop {
                tick.tick().await;
                poller.refresh(&handle).await;
            }
        }
    });
    handle
}

struct Poller {
    configured: Option<PathBuf>,
    cri: Option<Cri>,
    /// The socket last read from or tried: a runtime that goes away (its socket
    /// removed) is down, not unknown.
    socket: Option<PathBuf>,
    /// Whether the last read worked; `None` before the first.
    healthy: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("no container runtime socket found (tried {})", DEFAULT_SOCKETS.join(", "))]
    NoSocket,
    #[error(transparent)]
    Cri(#[from] CriError),
}

impl Poller {
    async fn refresh(&mut self, handle: &PodsHandle) {
        match self.read().await {
            Ok(index) => {
                if self.healthy != Some(true) {
                    let socket = self.cri.as_ref().map(|c| c.path().display().to_string());
                    info!(
                        socket = socket.as_deref().unwrap_or(""),
                        pods = index.len(),
                        "pod names from the container runtime"
                    );
                }
                debug!(pods = index.len(), "pods refreshed");
                self.healthy = Some(true);
                handle.set(index);
                handle.set_runtime(
                    self.socket
                        .clone()
                        .map(|socket| Runtime { socket, up: true }),
                );
            }
            Err(e) => {
                // A broken connection is retried from scratch next time.
                self.cri = None;
                if self.healthy != Some(false) {
                    warn!(
                        error = %e,
                        "findings will not name pods (netns and addresses only): mount the runtime's CRI socket or pass --cri-socket PATH; retrying every {}s",
                        REFRESH.as_secs()
                    );
                } else {
                    debug!(error = %e, "container runtime still unavailable");
                }
                self.healthy = Some(false);
                handle.set_runtime(
                    self.socket
                        .clone()
                        .map(|socket| Runtime { socket, up: false }),
                );
            }
        }
    }

    async fn read(&mut self) -> Result<PodIndex, ReadError> {
        if self.cri.is_none() {
            let path = socket_path(self.configured.as_deref()).ok_or(ReadError::NoSocket)?;
            self.socket = Some(path.clone());
            self.cri = Some(Cri::connect(&path).await?);
        }
        let cri = self.cri.as_mut().ok_or(ReadError::NoSocket)?;
        let sandboxes = cri.sandboxes().await?;
        Ok(PodIndex::build(&sandboxes, netns_inode))
    }
}
