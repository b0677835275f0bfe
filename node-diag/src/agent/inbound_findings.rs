//! Inbound SYN drops (a client elsewhere's SYNs to a pod of this node, dropped here):
//! their findings, from the first drop's event and the counts read on each tick.

use super::*;

impl Agent {
    /// The first drop of an inbound key (a client elsewhere's SYN to a pod of this node,
    /// dropped here): its finding, unless a map read made it first; either way the
    /// rule behind it is followed from this SYN.
    pub(super) fn on_inbound(&mut self, ev: &Event) {
        let (key, agg) = inbound_verdict::entry_of(ev);
        let reason = self.names.drop_reason(ev.drop.reason);
        if self.inbound.seen(&key, agg.first_ns) {
            if let Some(template) = self.inbound.template(&key).cloned() {
                self.rules.verdict(&template, ev, &reason);
            }
            return;
        }
        // Read now: the counters around the first drop tell a full table from a rule.
        let window = self.conntrack.window(ev, &self.names);
        let finding = self.inbound_finding(&key, &agg, ev, window.as_ref());
        if let Some(cause) = finding.evidence.conntrack_cause() {
            self.shared
                .metrics()
                .conntrack_drops(cause.as_str(), u32::try_from(agg.count).unwrap_or(u32::MAX));
        }
        self.rules.verdict(&finding, ev, &reason);
        self.inbound.start(key, &agg, &finding);
        self.record(finding);
    }

    /// The finding of an inbound entry, its pods, Service and program named.
    pub(super) fn inbound_finding(
        &mut self,
        key: &node_diag_common::InboundKey,
        agg: &node_diag_common::InboundAgg,
        ev: &Event,
        window: Option<&crate::findings::conntrack::Window>,
    ) -> Finding {
        let mut f =
            inbound_verdict::finding(key, agg, agg.count, &self.names, SystemTime::now(), window);
        let (client, pod) = (inbound_verdict::client(key), inbound_verdict::pod_addr(key));
        let pods = self.pods.current();
        // The local side is the pod the SYN was going to. A client pod of this node is
        // rare here (its own SYN from its veth is left to its connect's verdict): one
        // whose SYN came back in from elsewhere, routed through another node unSNATed.
        f.pod = pods
            .by_netns
            .get(&key.netns)
            .or_else(|| pods.by_ip.get(&pod))
            .cloned();
        f.peer_pod = pods.by_ip.get(&client).cloned();
        f.service = self.translator.service_of_backend(pod, key.dport);
        let reason = self.names.drop_reason(key.reason);
        if let Some(program) = self.rules.program(ev, &reason) {
            f.evidence.set_program(program);
        }
        f
    }

    /// Every tick: what the inbound entries counted since the last read, the entries no
    /// event announced, and the idle ones deleted with their last counts.
    pub(super) fn read_inbound(&mut self, stamp: &str) {
        let (entries, now_ns) = self.maps.inbound_counts();
        let read = self.inbound.read(&entries, now_ns, stamp);
        for (key, agg, finding) in read.grown {
            // A later drop (a retransmit, or the client's next attempt from another
            // port): the rule read it may call for compares against the baseline.
            let mut ev = inbound_verdict::event_of(&key, &agg);
            ev.drop.last_ns = agg.last_ns;
            let reason = self.names.drop_reason(key.reason);
            self.rules.verdict(&finding, &ev, &reason);
            if let Some(cause) = finding.evidence.conntrack_cause() {
                self.shared.metrics().conntrack_drops(
                    cause.as_str(),
                    u32::try_from(finding.count).unwrap_or(u32::MAX),
                );
            }
            self.record(finding);
        }
        for (key, agg) in read.new {
            let ev = inbound_verdict::event_of(&key, &agg);
            let window = self.conntrack.window(&ev, &self.names);
            let finding = self.inbound_finding(&key, &agg, &ev, window.as_ref());
            if let Some(cause) = finding.evidence.conntrack_cause() {
                self.shared.metrics().conntrack_drops(
                    cause.as_str(),
                    u32::try_from(finding.count).unwrap_or(u32::MAX),
                );
            }
            let reason = self.names.drop_reason(key.reason);
            self.rules.verdict(&finding, &ev, &reason);
            self.inbound.start(key, &agg, &finding);
            self.record(finding);
        }
        for key in read.idle {
            let last = self.maps.take_inbound(&key);
            if let Some(finding) = self.inbound.taken(&key, last, stamp) {
                self.record(finding);
            }
        }
    }
}
