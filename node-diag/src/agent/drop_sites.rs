//! The site of a connect's SYN drop whose reason alone does not name a layer
//! (`NOT_SPECIFIED`, a tunnel's or a route's reason): the route and tunnel towards the
//! destination in the namespace that dropped it, looked up off the event loop. A storm
//! of failures to one destination asks once per [`DropSites::TTL`].

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    time::{Duration, Instant},
};

use node_diag_common::Event;
use tracing::debug;

use crate::{
    findings::{
        correlate::{Translation, addr},
        names::Names,
    },
    host_network::{
        conntrack_stats::{own_netns, scope_files},
        drop_site::{DropSite, drop_site},
        in_netns,
    },
    kernel::{
        drop_family::{DropFamily, family},
        event::EventKind,
    },
};

#[derive(Default)]
pub(super) struct DropSites(HashMap<(u32, IpAddr), (Instant, Option<DropSite>)>);

impl DropSites {
    const TTL: Duration = Duration::from_secs(2);
    /// Bounds the memory a scan of many destinations can take.
    const MAX: usize = 1024;

    /// The site of `ev`'s SYN drop, when its reason needs one, towards the address the
    /// packet was routed to: the Service's backend once this node's NAT chose it.
    pub(super) async fn of(
        &mut self,
        kind: EventKind,
        ev: &Event,
        names: &Names,
        translation: &Translation,
    ) -> Option<DropSite> {
        let judged = matches!(
            kind,
            EventKind::ConnectTimeout | EventKind::ConnectAbandoned | EventKind::ConnectUnreachable
        );
        if !judged || ev.drop.count == 0 {
            return None;
        }
        let reason = names.drop_reason(ev.drop.reason);
        let wanted = matches!(
            family(&reason),
            Some(DropFamily::Unspecified | DropFamily::Tunnel | DropFamily::Routing)
        );
        if !wanted {
            return None;
        }
        let dst = translation
            .backend
            .map_or_else(|| addr(&ev.flow, &ev.flow.daddr), |b| b.ip());
        let key = (ev.drop.netns, dst);
        if let Some((at, site)) = self.0.get(&key)
            && at.elapsed() < Self::TTL
        {
            return site.clone();
        }
        let netns = ev.drop.netns;
        let lookup = tokio::task::spawn_blocking(move || look(netns, dst)).await;
        let site = lookup.unwrap_or_else(|e| {
            debug!(error = %e, "drop site lookup task failed");
            None
        });
        if self.0.len() >= Self::MAX {
            self.0.retain(|_, (at, _)| at.elapsed() < Self::TTL);
        }
        if self.0.len() < Self::MAX {
            self.0.insert(key, (Instant::now(), site.clone()));
        }
        site
    }
}

impl super::Agent {
    /// The site of `ev`'s SYN drop (see [`DropSites::of`]).
    pub(super) async fn drop_site(
        &mut self,
        kind: EventKind,
        ev: &Event,
        translation: &Translation,
    ) -> Option<DropSite> {
        self.drop_sites.of(kind, ev, &self.names, translation).await
    }
}

/// [`drop_site`] in namespace `netns` (the agent's own when 0).
fn look(netns: u32, dst: IpAddr) -> Option<DropSite> {
    let found = if netns == 0 || netns == own_netns() {
        drop_site(dst)
    } else {
        let file = scope_files(Some(&BTreeSet::from([netns])))
            .into_iter()
            .find(|f| f.inode == netns)?;
        match in_netns(&file, || drop_site(dst)) {
            Ok(found) => found,
            Err(e) => {
                debug!(error = %e, netns, "cannot enter namespace for the drop site");
                return None;
            }
        }
    };
    found
        .inspect_err(|e| debug!(error = %e, netns, %dst, "drop site lookup failed"))
        .ok()
}
