//! A kernel event's way to a finding: scoped, judged (`correlate`), accounted, and
//! carried out as the ledger decides (`findings::ledger`).

use super::*;

impl Agent {
    /// A kernel verdict: judged, its pods named, counted and recorded; a late success
    /// resolves the timeout it had been reported as, and a refusal or unreachable ending
    /// that attempt supersedes it.
    pub(super) async fn on_event(&mut self, kind: EventKind, ev: Event) {
        debug!(
            ?kind,
            sport = ev.flow.sport,
            dport = ev.flow.dport,
            count = ev.count,
            len = ev.len,
            mtu = ev.mtu,
            "kernel event"
        );
        if kind == EventKind::InboundSynDropped {
            self.on_inbound(&ev);
            return;
        }
        if kind.is_connect() && !self.scope_admits(&ev) {
            return;
        }
        if self.own.owns(&ev) {
            // A connection one of the agent's own listeners accepted (a scraper or
            // `node-diag findings` resetting it, say): node-diag's, not the workload's.
            debug!(
                ?kind,
                sport = ev.flow.sport,
                dport = ev.flow.dport,
                "event on the agent's own listener ignored"
            );
            return;
        }
        if kind == EventKind::MssShrunk {
            let by = blackholes::shrunk_by(&ev).await;
            if by != ShrunkBy::MtuProbing {
                // A route or link MTU shrank it (or nothing nameable did): no black hole
                // was shown, and the stall stands as it was judged.
                info!(
                    ?by,
                    dport = ev.flow.dport,
                    "segment sent smaller, not by MTU probing: no black hole"
                );
                return;
            }
            // Judged once the smaller segment shows it got through (`confirm_shrinks`).
            self.shrinks.push(ev, Instant::now());
            return;
        }
        self.judge(kind, ev).await;
    }

    /// Whether a connect verdict's namespace is this node's. The programs track the
    /// connects of namespaces the agent has not looked at yet (a pod connecting the moment
    /// its veth appeared, before the refresh that veth set off), so one may not be: the
    /// node is looked at again unless a look since the verdict was stamped already
    /// answered, and a namespace still not in the scope is marked out of it in the
    /// kernel (its next connects untracked) and its verdict accounted as nobody's.
    pub(super) fn scope_admits(&mut self, ev: &Event) -> bool {
        if self.maps.scope_has(ev.netns) != Some(false) {
            return true;
        }
        if self.scope_looked_ns < ev.ts_ns {
            self.on_scope();
        }
        if self.maps.scope_has(ev.netns) != Some(false) {
            return true;
        }
        debug!(
            netns = ev.netns,
            dport = ev.flow.dport,
            "connect verdict from a namespace not this node's; namespace marked out of scope"
        );
        self.maps.mark_out_of_scope(ev.netns);
        self.verdicts.event(ev, None);
        false
    }

    /// The segments sent smaller after a stall whose fate their sockets now show: those
    /// that got through judged as the black holes MTU probing masked, the others left
    /// the stalls they were.
    pub(super) async fn confirm_shrinks(&mut self) {
        for shrink in self.shrinks.check().await {
            match shrink {
                Shrink::Through(ev) => self.judge(EventKind::MssShrunk, ev).await,
                Shrink::NotShown(ev, why) => info!(
                    dport = ev.flow.dport,
                    mss_before = ev.len,
                    mss_after = ev.mtu,
                    why,
                    "segment sent smaller by MTU probing, not shown to get through: the stall stands, no black hole"
                ),
            }
        }
    }

    /// Judges the kernel verdict `ev` (see [`Self::on_event`]).
    pub(super) async fn judge(&mut self, kind: EventKind, ev: Event) {
        let translation = self.translator.translate(&ev, &self.maps).await;
        let drop_site = self.drop_site(kind, &ev, &translation).await;
        // Whether the evidence window was watched, before this event attaches anything.
        let icmp_watched = self.watch.covers(&ev);
        if self.watch.event(kind, &ev, Instant::now()) {
            self.start_icmp_watch("a verdict");
        }
        let ctx = Context {
            names: &self.names,
            now: SystemTime::now(),
            ephemeral_ports: self.ephemeral_ports.clone(),
            translation,
            conntrack: self.conntrack.window(&ev, &self.names),
            icmp_watched,
            drop_site,
        };
        let mut finding = correlate(kind, &ev, &ctx);
        if kind == EventKind::TcpStall && ev.mtu != 0 && ev.len >= ev.mtu {
            // A full-size segment: its MTU evidence may follow the retransmit the
            // programs judged it on (an agent started mid-stall sees none before).
            self.stalls.push(ev, Instant::now());
        }
        if let Some(f) = finding.as_mut() {
            f.name_pods(self.pods.current().name(&f.ends()));
        }
        // Before the verdict tracker keeps it as the template of later counts.
        let finding = finding.map(|f| self.path_probes.judge_cached(f));
        let made = finding.is_some();
        let finding = match self.verdicts.event(&ev, finding) {
            Some(mut finding) => {
                if let Some(cause) = finding.evidence.conntrack_cause() {
                    self.shared
                        .metrics()
                        .conntrack_drops(cause.as_str(), ev.drop.count);
                }
                let reason = self.names.drop_reason(ev.drop.reason);
                if finding.layer == Layer::Firewall
                    && let Some(program) = self.rules.program(&ev, &reason)
                {
                    finding.evidence.set_program(program);
                }
                self.rules.verdict(&finding, &ev, &reason);
                Some(finding)
            }
            None => None,
        };
        self.apply(ledger::verdict(kind, &ev, made, finding));
    }

    /// Carries out what the ledger decided for the findings held.
    pub(super) fn apply(&self, effects: impl IntoIterator<Item = Effect>) {
        for effect in effects {
            match effect {
                Effect::Record(finding) => self.record(finding),
                Effect::Keep(finding) => self.keep(finding),
                Effect::End(which, status) => {
                    let ended =
                        self.shared
                            .store()
                            .end_as(status, |f| which.covers(f), SystemTime::now());
                    for f in ended {
                        print_finding(&f, self.opts.format);
                    }
                }
            }
        }
    }

    /// Counts a finding in the metrics and the store, and prints it when the store says
    /// so. A finding with `count` 0 (an event whose verdicts a map read already
    /// accounted) only refreshes a finding the store holds.
    pub(super) fn record(&self, finding: Finding) {
        if finding.count == 0 && !self.shared.store().contains(&finding) {
            return;
        }
        self.shared.metrics().finding(&finding);
        self.keep(finding);
    }

    /// Stores and prints a finding without counting it in `node_diag_findings_total`
    /// (the verdict superseding a timeout: its attempt was counted as that timeout).
    pub(super) fn keep(&self, finding: Finding) {
        let printed = self.shared.store().record(finding, Instant::now());
        if let Some(f) = printed {
            print_finding(&f, self.opts.format);
        }
    }
}
