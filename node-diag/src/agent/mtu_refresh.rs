//! The MTU model's share of the agent: rebuilt from a netlink snapshot at start, on link
//! notifications and periodically (which is how a path MTU the route cache learns, or
//! forgets, is seen), it sets the MTU and path MTU gauges and syncs the condition
//! findings (`overlay_mtu_mismatch`, `pmtud_disabled`): new ones printed, gone ones
//! resolved.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Instant, SystemTime},
};

use tracing::warn;

use super::{failing::Failing, state::Shared};

static READ_INTERFACES: Failing = Failing::new(
    "read this node's interfaces for the MTU model",
    "the MTU model stays as it was",
);
use crate::{
    findings::{Kind, Status},
    host_network::{PodReads, SharedLinks},
    output::{OutputFormat, print_finding},
    pods::PodsHandle,
};

/// Rebuilds the MTU model from netlink: gauges, and the overlay_mtu_mismatch and
/// pmtud_disabled conditions (new ones printed, gone ones resolved).
/// `senders`: who sent the frag-needed seen for each destination, named in the
/// mismatches judged on a learned path MTU. `links`: the agent's namespace's links as
/// their notifications keep them, taken rather than dumped again (`None`: dumped).
/// `pod_reads`: whether the pods' namespaces are all read again or their recent reads
/// stand (a rebuild those links' notifications asked for).
pub(crate) async fn refresh_mtu(
    shared: &Shared,
    pods: &PodsHandle,
    senders: &HashMap<IpAddr, IpAddr>,
    format: OutputFormat,
    links: Option<SharedLinks>,
    pod_reads: PodReads,
) {
    // A blocking-pool thread: in the agent's namespace, as the table's dump must be.
    let read = move || match links {
        Some(links) => crate::host_network::current_links(&links)
            .and_then(|own| crate::host_network::snapshot_of(Some(own), pod_reads)),
        None => crate::host_network::snapshot_of(None, pod_reads),
    };
    let snapshot = match tokio::task::spawn_blocking(read).await {
        Ok(Ok(s)) => {
            READ_INTERFACES.worked();
            s
        }
        Ok(Err(e)) => {
            READ_INTERFACES.failed(&e);
            shared.metrics().mtu_refresh_failed();
            return;
        }
        Err(e) => {
            warn!(error = %e, "MTU snapshot task failed");
            shared.metrics().mtu_refresh_failed();
            return;
        }
    };
    let now = SystemTime::now();
    let model = crate::mtu::Model::from(&snapshot);
    {
        let metrics = shared.metrics();
        metrics.set_mtu_model(&model.gauges());
        metrics.set_path_mtus(model.path_mtus());
    }
    let mut findings = model.findings(now);
    crate::mtu::name_frag_needed_senders(&mut findings, senders);
    // An interface finding in a pod's namespace names the pod whose interface it is.
    let index = pods.current();
    for f in &mut findings {
        f.name_pods(index.name(&f.ends()));
    }
    let printed = shared.store().sync_conditions(
        &[Kind::OverlayMtuMismatch, Kind::PmtudDisabled],
        findings,
        now,
        Instant::now(),
    );
    let metrics = shared.metrics();
    for f in &printed {
        if f.status == Status::Active {
            metrics.finding(f);
        }
        print_finding(f, format);
    }
}
