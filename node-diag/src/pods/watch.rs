//! Keeps the [`PodIndex`] current by change: the sandboxes are listed once at start and
//! each one's detailed status read once; then the runtime's event stream
//! (`GetContainerEvents`, containerd 1.7+) says which sandbox appeared, changed or went,
//! and only that one's status is read again. The list is taken again every
//! [`SAFETY_NET`] (events can be lost) and whenever the stream breaks, and, where the
//! runtime has no event stream (containerd 1.6, CRI-O without it) or it fails, every
//! [`LIST`]: one call naming the ready sandboxes, the status read only of new ones.
//! A failed read keeps the last good index. The runtime being absent or refusing the
//! agent is said once (and again only after it had recovered).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use k8s_cri::v1::{ContainerEventResponse, ContainerEventType, PodSandboxState};
use tracing::{debug, info, warn};

use super::{
    DEFAULT_SOCKETS, PodIndex,
    cri::{Cri, CriError, Events},
    index::{Sandbox, netns_inode},
    socket_path,
};

/// How often the sandboxes are listed without an event stream: a new pod is named within
/// this (its status read once), the list itself is one small call.
pub(crate) const LIST: Duration = Duration::from_secs(1);
/// How often the sandboxes are listed while the event stream runs, for events lost.
pub(crate) const SAFETY_NET: Duration = Duration::from_secs(60);
/// How long a runtime that cannot be reached is left before it is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(5);

/// The current index, shared with the agent's loop, and the runtime's state.
#[derive(Clone, Default)]
pub(crate) struct PodsHandle(
    Arc<RwLock<Arc<PodIndex>>>,
    Arc<RwLock<Option<Runtime>>>,
    /// Bumped at each new index, so the agent can name what it saw before.
    Arc<std::sync::atomic::AtomicU64>,
);

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

    /// How many indexes were set: a change means findings may be named anew.
    pub(crate) fn generation(&self) -> u64 {
        self.2.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, index: PodIndex) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(index);
        self.2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Reads the pods once (so findings from the start can name them), then keeps them
/// current from a task of the current runtime. `configured` is `--cri-socket`.
pub(crate) async fn watch(configured: Option<PathBuf>) -> PodsHandle {
    let handle = PodsHandle::default();
    let mut follower = Follower {
        configured,
        cri: None,
        socket: None,
        healthy: None,
        sandboxes: Sandboxes::default(),
        events: None,
    };
    let synced = follower.sync(&handle).await;
    follower.report(synced, &handle);
    tokio::spawn({
        let handle = handle.clone();
        async move { follower.run(&handle).await }
    });
    handle
}

/// What a runtime event asks of the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Read this sandbox's status (it appeared or changed).
    Status(String),
    /// This sandbox is no longer ready: out of the index.
    Remove(String),
    /// Nothing: a container of a sandbox the index already has.
    Nothing,
}

/// What `ev` asks of the index, `known` saying which sandboxes it holds. The runtime
/// reports a sandbox's own changes as events of a container whose id is the sandbox's
/// (containerd); a container's events carry its sandbox's status, which brings in a
/// sandbox whose own event was missed.
pub(crate) fn action(ev: &ContainerEventResponse, known: impl Fn(&str) -> bool) -> Action {
    let sandbox = ev.pod_sandbox_status.as_ref();
    let sandbox_id = sandbox.map_or(ev.container_id.as_str(), |s| s.id.as_str());
    if sandbox_id.is_empty() {
        return Action::Nothing;
    }
    let own = sandbox.is_none_or(|s| s.id == ev.container_id);
    let kind = ContainerEventType::try_from(ev.container_event_type).ok();
    if own {
        return match kind {
            Some(
                ContainerEventType::ContainerStoppedEvent
                | ContainerEventType::ContainerDeletedEvent,
            ) => Action::Remove(sandbox_id.to_owned()),
            // Created, started, or a kind this build does not know: read it.
            _ if sandbox.is_none() && known(sandbox_id) => Action::Nothing,
            _ => Action::Status(sandbox_id.to_owned()),
        };
    }
    let ready = sandbox.is_some_and(|s| s.state == PodSandboxState::SandboxReady as i32);
    if ready && !known(sandbox_id) {
        Action::Status(sandbox_id.to_owned())
    } else {
        Action::Nothing
    }
}

/// The ready sandboxes the index is built from, by id.
#[derive(Debug, Default)]
pub(crate) struct Sandboxes(HashMap<String, Sandbox>);

impl Sandboxes {
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.0.contains_key(id)
    }

    /// Of the ready sandboxes `listed`, those not held yet (their status to read); the
    /// held ones not listed are dropped. Returns (new, whether any was dropped).
    pub(crate) fn diff(&mut self, listed: &[String]) -> (Vec<String>, bool) {
        let before = self.0.len();
        self.0.retain(|id, _| listed.contains(id));
        let new = listed
            .iter()
            .filter(|id| !self.0.contains_key(*id))
            .cloned()
            .collect();
        (new, self.0.len() != before)
    }

    /// A status read: held if ready, dropped otherwise. Whether the index changes.
    pub(crate) fn apply(&mut self, id: &str, status: Option<Sandbox>) -> bool {
        match status.filter(|s| s.ready) {
            Some(s) => self.0.insert(id.to_owned(), s.clone()).as_ref() != Some(&s),
            None => self.remove(id),
        }
    }

    pub(crate) fn remove(&mut self, id: &str) -> bool {
        self.0.remove(id).is_some()
    }

    fn index(&self) -> PodIndex {
        let all: Vec<Sandbox> = self.0.values().cloned().collect();
        PodIndex::build(&all, netns_inode)
    }
}

struct Follower {
    configured: Option<PathBuf>,
    cri: Option<Cri>,
    /// The socket last read from or tried: a runtime that goes away (its socket
    /// removed) is down, not unknown.
    socket: Option<PathBuf>,
    /// Whether the last read worked; `None` before the first.
    healthy: Option<bool>,
    sandboxes: Sandboxes,
    /// Whether the runtime has an event stream; `None` until asked.
    events: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("no container runtime socket found (tried {})", DEFAULT_SOCKETS.join(", "))]
    NoSocket,
    #[error(transparent)]
    Cri(#[from] CriError),
}

impl Follower {
    /// Follows the runtime for good: its events where it has them, else its list.
    async fn run(&mut self, handle: &PodsHandle) {
        loop {
            if self.healthy != Some(true) {
                tokio::time::sleep(RETRY).await;
                let synced = self.sync(handle).await;
                self.report(synced, handle);
                continue;
            }
            if self.events != Some(false)
                && let Some(stream) = self.open_events().await
            {
                let followed = self.follow(stream, handle).await;
                // Events may have been lost in between: list again.
                let synced = match followed {
                    Ok(()) => self.sync(handle).await,
                    Err(e) => Err(e),
                };
                self.report(synced, handle);
                if self.events != Some(false) {
                    tokio::time::sleep(LIST).await;
                }
                continue;
            }
            tokio::time::sleep(LIST).await;
            let synced = self.sync(handle).await;
            self.report(synced, handle);
        }
    }

    /// The event stream, or `None` (said once) where the runtime has none.
    async fn open_events(&mut self) -> Option<Events> {
        let cri = self.cri.as_ref()?;
        match cri.events().await {
            Ok(stream) => {
                if self.events != Some(true) {
                    info!(
                        "pods followed by the runtime's events; sandboxes listed again every {}s",
                        SAFETY_NET.as_secs()
                    );
                }
                self.events = Some(true);
                Some(stream)
            }
            Err(e) if e.unimplemented() => {
                info!(
                    "the runtime has no event stream (GetContainerEvents: containerd 1.7+); sandboxes listed every {}s",
                    LIST.as_secs()
                );
                self.events = Some(false);
                None
            }
            Err(e) => {
                debug!(error = %e, "no event stream now; listing sandboxes meanwhile");
                None
            }
        }
    }

    /// Applies events until the stream ends (`Ok`) or a status read fails; lists the
    /// sandboxes every [`SAFETY_NET`] meanwhile.
    async fn follow(&mut self, mut stream: Events, handle: &PodsHandle) -> Result<(), ReadError> {
        let mut net = tokio::time::interval(SAFETY_NET);
        net.tick().await;
        loop {
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(ev)) => self.on_event(&ev, handle).await?,
                    Ok(None) => {
                        debug!("the runtime's event stream ended");
                        return Ok(());
                    }
                    Err(status) => {
                        debug!(%status, "the runtime's event stream failed");
                        return Ok(());
                    }
                },
                _ = net.tick() => self.sync(handle).await?,
            }
        }
    }

    async fn on_event(
        &mut self,
        ev: &ContainerEventResponse,
        handle: &PodsHandle,
    ) -> Result<(), ReadError> {
        let changed = match action(ev, |id| self.sandboxes.contains(id)) {
            Action::Nothing => false,
            Action::Remove(id) => self.sandboxes.remove(&id),
            Action::Status(id) => {
                let cri = self.cri.as_mut().ok_or(ReadError::NoSocket)?;
                let status = cri.status(&id).await?;
                self.sandboxes.apply(&id, status)
            }
        };
        if changed {
            let index = self.sandboxes.index();
            debug!(pods = index.len(), "pods changed");
            handle.set(index);
        }
        Ok(())
    }

    /// Lists the ready sandboxes (connecting first if needed) and reads the status of
    /// those not held yet.
    async fn sync(&mut self, handle: &PodsHandle) -> Result<(), ReadError> {
        if self.cri.is_none() {
            let path = socket_path(self.configured.as_deref()).ok_or(ReadError::NoSocket)?;
            self.socket = Some(path.clone());
            self.cri = Some(Cri::connect(&path).await?);
            // A runtime reached anew (perhaps another one) is listed from scratch.
            self.sandboxes = Sandboxes::default();
            self.events = None;
        }
        let cri = self.cri.as_mut().ok_or(ReadError::NoSocket)?;
        let listed = cri.ready_ids().await?;
        let (new, mut changed) = self.sandboxes.diff(&listed);
        for id in new {
            let status = cri.status(&id).await?;
            changed |= self.sandboxes.apply(&id, status);
        }
        if changed || self.healthy != Some(true) {
            handle.set(self.sandboxes.index());
        }
        Ok(())
    }

    fn report(&mut self, result: Result<(), ReadError>, handle: &PodsHandle) {
        match result {
            Ok(()) => {
                if self.healthy != Some(true) {
                    let socket = self.cri.as_ref().map(|c| c.path().display().to_string());
                    info!(
                        socket = socket.as_deref().unwrap_or(""),
                        pods = handle.current().len(),
                        "pod names from the container runtime"
                    );
                }
                self.healthy = Some(true);
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
                        RETRY.as_secs()
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
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use k8s_cri::v1::PodSandboxStatus;

    use super::*;
    use crate::pods::PodRef;

    fn event(
        kind: ContainerEventType,
        container: &str,
        sandbox: Option<(&str, PodSandboxState)>,
    ) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: container.into(),
            container_event_type: kind as i32,
            pod_sandbox_status: sandbox.map(|(id, state)| PodSandboxStatus {
                id: id.into(),
                state: state as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const READY: PodSandboxState = PodSandboxState::SandboxReady;
    const NOT_READY: PodSandboxState = PodSandboxState::SandboxNotready;

    #[test]
    fn a_sandbox_started_is_read_stopped_or_deleted_removed() {
        let none = |_: &str| false;
        for kind in [
            ContainerEventType::ContainerCreatedEvent,
            ContainerEventType::ContainerStartedEvent,
        ] {
            assert_eq!(
                action(&event(kind, "sb1", Some(("sb1", READY))), none),
                Action::Status("sb1".into())
            );
        }
        for kind in [
            ContainerEventType::ContainerStoppedEvent,
            ContainerEventType::ContainerDeletedEvent,
        ] {
            assert_eq!(
                action(&event(kind, "sb1", Some(("sb1", NOT_READY))), |_| true),
                Action::Remove("sb1".into())
            );
        }
    }

    #[test]
    fn a_container_brings_in_only_an_unknown_ready_sandbox() {
        let ev = event(
            ContainerEventType::ContainerStartedEvent,
            "c1",
            Some(("sb1", READY)),
        );
        assert_eq!(action(&ev, |_| false), Action::Status("sb1".into()));
        assert_eq!(action(&ev, |id| id == "sb1"), Action::Nothing);
        // A container stopping does not take its sandbox out.
        let stop = event(
            ContainerEventType::ContainerStoppedEvent,
            "c1",
            Some(("sb1", READY)),
        );
        assert_eq!(action(&stop, |id| id == "sb1"), Action::Nothing);
        let not_ready = event(
            ContainerEventType::ContainerStartedEvent,
            "c1",
            Some(("sb1", NOT_READY)),
        );
        assert_eq!(action(&not_ready, |_| false), Action::Nothing);
    }

    #[test]
    fn an_event_without_sandbox_status_is_its_container_ids() {
        let ev = event(ContainerEventType::ContainerStartedEvent, "sb1", None);
        assert_eq!(action(&ev, |_| false), Action::Status("sb1".into()));
        assert_eq!(action(&ev, |_| true), Action::Nothing);
        let gone = event(ContainerEventType::ContainerDeletedEvent, "sb1", None);
        assert_eq!(action(&gone, |_| true), Action::Remove("sb1".into()));
        assert_eq!(
            action(
                &event(ContainerEventType::ContainerStartedEvent, "", None),
                |_| false
            ),
            Action::Nothing
        );
    }

    fn sandbox(id: &str, name: &str, ready: bool) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod: PodRef {
                namespace: "shop".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            ips: vec![format!("10.0.0.{}", name.len()).parse().unwrap()],
            netns_path: Some(PathBuf::from("/nonexistent")),
            pid: None,
            host_network: false,
            ready,
        }
    }

    #[test]
    fn sandboxes_follow_status_reads_and_lists() {
        let mut held = Sandboxes::default();
        assert!(held.apply("sb1", Some(sandbox("sb1", "cart", true))));
        assert!(
            !held.apply("sb1", Some(sandbox("sb1", "cart", true))),
            "same status: no change"
        );
        assert!(held.apply("sb2", Some(sandbox("sb2", "db", true))));
        assert_eq!(held.index().by_ip.len(), 2);
        // A status no longer ready, or gone, takes it out.
        assert!(held.apply("sb2", Some(sandbox("sb2", "db", false))));
        assert!(!held.apply("sb2", None));
        assert_eq!(held.index().by_ip.len(), 1);
        // The list: sb1 went, sb3 is new (its status to read).
        let (new, dropped) = held.diff(&["sb3".to_string()]);
        assert_eq!(new, vec!["sb3".to_string()]);
        assert!(dropped);
        assert_eq!(held.index(), PodIndex::default());
        let (new, dropped) = held.diff(&[]);
        assert!(new.is_empty() && !dropped);
    }
}
