//! A finding's life, decided in one place: what a judged verdict, a stall that turned
//! out to be a black hole, or the tick's look at the open black holes does to the
//! findings held. Each decision is a pure function of what was judged, returning
//! [`Effect`]s; the agent carries them out (counts, stores, ends and prints) and decides
//! nothing about a finding's life itself.
//!
//! The lifecycle these decisions make:
//! - a verdict is **recorded** (counted once in `node_diag_findings_total`, stored,
//!   printed); repeats aggregate into it;
//! - the last word of an attempt reported as timing out (refused, unreachable) is
//!   **kept** without being counted again, and **supersedes** the timeout;
//! - a connect reported as timing out that got through after all **resolves** it (late
//!   success), as a restarted agent's first look does not: it has no timeout to end;
//! - a stall whose MTU evidence arrived late is **withdrawn** into the black hole it was
//!   (the stall resolved, the black hole recorded);
//! - a segment sent smaller by MTU probing **resolves** the stall, and a black hole the
//!   path probe found for it, in favour of the recovered black hole;
//! - a local black hole is **resolved** once its flow is no longer stuck, however far its
//!   retransmission timeout backed off (RTO backoff keeps it open).

use node_diag_common::{Event, FlowKey};

use super::{
    Finding, Kind, Layer, Status,
    correlate::{
        Withdrawal, addr,
        path::{PathVerdict, settled_here, withdrawn_meanwhile, withdraws},
        superseded, withdrawn,
    },
};
use crate::kernel::event::EventKind;

/// What the agent does to the findings it holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Count in `node_diag_findings_total`, store, and print when the store says so. A
    /// finding with `count` 0 (its verdicts already accounted by a map read) only
    /// refreshes one held.
    Record(Finding),
    /// Store and print without counting: its attempt was counted already.
    Keep(Finding),
    /// End the active findings `which` covers with `status`, and print them again.
    End(Ends, Status),
}

/// Which held findings an [`Effect::End`] ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ends {
    /// The timeouts a connect's attempt withdraws.
    Timeouts(Withdrawal),
    /// A flow's stall: its black hole is judged in its place.
    Stall(FlowKey),
    /// A flow's stall, and the black hole the path probe found for it: the flow moves.
    StallAndPathHole(FlowKey),
    /// Local black holes whose flow is none of these (the flows still stuck).
    BlackholesExcept(Vec<FlowKey>),
    /// The verdict a path probe's run replaces: the finding it asked about.
    Replaced(Box<Finding>),
}

impl Ends {
    pub(crate) fn covers(&self, f: &Finding) -> bool {
        match self {
            Ends::Timeouts(w) => w.covers(f),
            Ends::Stall(flow) => f.kind == Kind::TcpStall && on_flow(f, flow),
            Ends::StallAndPathHole(flow) => {
                (f.kind == Kind::TcpStall
                    || (f.kind == Kind::PmtudBlackhole && f.layer == Layer::Path))
                    && on_flow(f, flow)
            }
            Ends::BlackholesExcept(open) => {
                f.kind == Kind::PmtudBlackhole
                    && f.layer != Layer::Path
                    && !open.iter().any(|k| on_flow(f, k))
            }
            Ends::Replaced(original) => withdraws(original, f),
        }
    }
}

/// Whether a flow finding is about `key`.
pub(crate) fn on_flow(f: &Finding, key: &FlowKey) -> bool {
    let addr = |b: &[u8; 16]| addr(key, b);
    f.src == Some(addr(&key.saddr)) && f.dst == Some(addr(&key.daddr)) && f.dport == Some(key.dport)
}

/// A kernel verdict `ev` of `kind`, judged: `finding` is what it makes once its counts
/// are accounted (`None`: no finding, or only counts); `made` whether correlation made
/// one at all.
pub(crate) fn verdict(
    kind: EventKind,
    ev: &Event,
    made: bool,
    finding: Option<Finding>,
) -> Vec<Effect> {
    let mut effects = Vec::new();
    if kind == EventKind::MssShrunk {
        // The stall it ends was the path's, and the flow moves again: the stall, and a
        // black hole the path probe found for it first, give way to the recovered one.
        effects.push(Effect::End(
            Ends::StallAndPathHole(ev.flow),
            Status::Resolved,
        ));
    }
    match finding {
        Some(finding) => match superseded(kind, ev) {
            Some(w) => {
                // The attempt's last word: its timeout is withdrawn, and the attempt
                // stays counted once, as that timeout.
                effects.push(Effect::End(Ends::Timeouts(w), Status::Superseded));
                effects.push(Effect::Keep(finding));
            }
            None => effects.push(Effect::Record(finding)),
        },
        None if !made => {
            if let Some(w) = withdrawn(kind, ev) {
                // The connect that was timing out got through: a slow listener or a
                // transient drop, not a standing failure.
                effects.push(Effect::End(Ends::Timeouts(w), Status::Resolved));
            }
        }
        None => {}
    }
    effects
}

/// A stall reported without MTU evidence whose evidence arrived: it was the black hole
/// `blackhole` is judged as; the stall ends first.
pub(crate) fn stall_was_blackhole(flow: FlowKey) -> Effect {
    Effect::End(Ends::Stall(flow), Status::Resolved)
}

/// The tick's look at the local black holes: those whose flow is not in `stuck` (the
/// flows whose sockets are still stuck) are resolved.
pub(crate) fn blackholes_open(stuck: Vec<FlowKey>) -> Effect {
    Effect::End(Ends::BlackholesExcept(stuck), Status::Resolved)
}

/// A path probe's `verdict` on `original` (the finding it asked about), beside the
/// findings `held` and whether the entry `original` aggregates into is resolved: the
/// verdict recorded and what it replaces resolved, or why it is dropped.
///
/// # Errors
///
/// The reason the verdict is dropped: the kernel showed the black hole here itself, the
/// timeout it asked about was withdrawn meanwhile, or the finding resolved meanwhile
/// (the flow moved on; a healed path black hole is resolved on purpose, by its run).
pub(crate) fn path_verdict(
    original: &Finding,
    verdict: PathVerdict,
    held: &[Finding],
    original_resolved: bool,
) -> Result<Vec<Effect>, &'static str> {
    if held.iter().any(|s| settled_here(original, s)) {
        return Err("the kernel's black hole stands");
    }
    if held.iter().any(|s| withdrawn_meanwhile(original, s)) {
        return Err("the timeout was withdrawn meanwhile");
    }
    if !matches!(verdict, PathVerdict::Healed(_)) && original_resolved {
        return Err("its finding resolved meanwhile");
    }
    let replaced = || Effect::End(Ends::Replaced(Box::new(original.clone())), Status::Resolved);
    Ok(match verdict {
        PathVerdict::Replace(f) => vec![replaced(), Effect::Record(f)],
        PathVerdict::Annotate(f) => vec![Effect::Record(f)],
        // With the run that showed it healed in its evidence.
        PathVerdict::Healed(f) => vec![Effect::Record(f), replaced()],
    })
}

#[cfg(test)]
mod tests {
    use node_diag_common::{event_flag, event_kind};

    use super::*;
    use crate::findings::fixtures::{self, event};

    fn kind(ev: &Event) -> EventKind {
        EventKind::try_from(ev.kind).unwrap()
    }

    fn finding(kind: Kind, layer: Layer, ev: &Event) -> Finding {
        let mut f = fixtures::finding(kind, layer);
        f.src = Some(addr(&ev.flow, &ev.flow.saddr));
        f.dst = Some(addr(&ev.flow, &ev.flow.daddr));
        f.dport = Some(ev.flow.dport);
        f.netns = (ev.netns != 0).then_some(ev.netns);
        f
    }

    fn ended(effects: &[Effect]) -> Vec<(&Ends, Status)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::End(which, status) => Some((which, *status)),
                _ => None,
            })
            .collect()
    }

    /// The lifecycle paths the integration tests prove on real traffic, one row each:
    /// the event, what correlation made of it, and what becomes of the findings held.
    #[test]
    fn each_verdict_records_keeps_supersedes_or_resolves() {
        let timeout = event(event_kind::CONNECT_TIMEOUT, 0);
        let refused = event(event_kind::CONNECT_REFUSED, 111);
        let mut last_word = refused;
        last_word.flags |= event_flag::AFTER_TIMEOUT;
        let mut unreachable = event(event_kind::CONNECT_UNREACHABLE, 113);
        unreachable.flags |= event_flag::AFTER_TIMEOUT;
        let late = event(event_kind::CONNECT_LATE, 0);
        let mut gave_up = event(event_kind::CONNECT_GAVE_UP, 110);
        gave_up.flags |= event_flag::AFTER_TIMEOUT;

        // A verdict: recorded.
        let f = finding(Kind::TcpTimeout, Layer::Unknown, &timeout);
        assert_eq!(
            verdict(kind(&timeout), &timeout, true, Some(f.clone())),
            [Effect::Record(f)]
        );
        // A refusal on its own: recorded.
        let f = finding(Kind::TcpRefused, Layer::Listener, &refused);
        assert_eq!(
            verdict(kind(&refused), &refused, true, Some(f.clone())),
            [Effect::Record(f)]
        );
        // The last word after a timeout: the timeout superseded, the verdict kept (its
        // attempt counted once, as the timeout).
        for ev in [last_word, unreachable] {
            let f = finding(Kind::TcpRefused, Layer::Listener, &ev);
            let effects = verdict(kind(&ev), &ev, true, Some(f.clone()));
            assert_eq!(effects.len(), 2, "{effects:?}");
            assert_eq!(effects[1], Effect::Keep(f));
            let [(Ends::Timeouts(w), Status::Superseded)] = ended(&effects)[..] else {
                panic!("{effects:?}");
            };
            assert!(w.covers(&finding(Kind::TcpTimeout, Layer::Unknown, &ev)));
            assert!(!w.covers(&finding(Kind::TcpRefused, Layer::Listener, &ev)));
        }
        // Late success: the timeout resolved, nothing recorded.
        let effects = verdict(kind(&late), &late, false, None);
        let [(Ends::Timeouts(w), Status::Resolved)] = ended(&effects)[..] else {
            panic!("{effects:?}");
        };
        assert!(w.covers(&finding(Kind::TcpTimeout, Layer::Unknown, &late)));
        assert_eq!(effects.len(), 1);
        // The kernel giving up confirms the timeout: nothing ends.
        assert!(verdict(kind(&gave_up), &gave_up, false, None).is_empty());
        // Counts a map read already accounted (the tracker gave nothing): nothing.
        assert!(verdict(kind(&refused), &refused, true, None).is_empty());
    }

    #[test]
    fn a_segment_sent_smaller_resolves_the_stall_and_the_path_hole_for_the_recovery() {
        let shrunk = event(event_kind::MSS_SHRUNK, 0);
        let recovered = finding(Kind::PmtudBlackhole, Layer::OverlayMtu, &shrunk);
        let effects = verdict(kind(&shrunk), &shrunk, true, Some(recovered.clone()));
        assert_eq!(
            effects,
            [
                Effect::End(Ends::StallAndPathHole(shrunk.flow), Status::Resolved),
                Effect::Record(recovered)
            ]
        );
        let which = Ends::StallAndPathHole(shrunk.flow);
        assert!(which.covers(&finding(Kind::TcpStall, Layer::Unknown, &shrunk)));
        assert!(which.covers(&finding(Kind::PmtudBlackhole, Layer::Path, &shrunk)));
        // A local black hole is the tick's to resolve, not this.
        assert!(!which.covers(&finding(Kind::PmtudBlackhole, Layer::OverlayMtu, &shrunk)));
        let mut elsewhere = shrunk;
        elsewhere.flow.dport += 1;
        assert!(!which.covers(&finding(Kind::TcpStall, Layer::Unknown, &elsewhere)));
    }

    #[test]
    fn a_stall_with_late_evidence_is_withdrawn_into_its_black_hole() {
        let stall = event(event_kind::TCP_STALL, 0);
        let Effect::End(which, Status::Resolved) = stall_was_blackhole(stall.flow) else {
            panic!("the stall is resolved");
        };
        assert!(which.covers(&finding(Kind::TcpStall, Layer::Unknown, &stall)));
        assert!(!which.covers(&finding(Kind::PmtudBlackhole, Layer::OverlayMtu, &stall)));
    }

    #[test]
    fn a_path_probe_replaces_annotates_or_heals_unless_settled_meanwhile() {
        let timeout = event(event_kind::CONNECT_TIMEOUT, 0);
        let original = finding(Kind::TcpTimeout, Layer::Unknown, &timeout);
        let path = finding(Kind::TcpTimeout, Layer::Path, &timeout);
        let replaced = Effect::End(Ends::Replaced(Box::new(original.clone())), Status::Resolved);
        assert_eq!(
            path_verdict(&original, PathVerdict::Replace(path.clone()), &[], false),
            Ok(vec![replaced.clone(), Effect::Record(path.clone())])
        );
        assert_eq!(
            path_verdict(&original, PathVerdict::Annotate(path.clone()), &[], false),
            Ok(vec![Effect::Record(path.clone())])
        );
        assert_eq!(
            path_verdict(&original, PathVerdict::Healed(path.clone()), &[], true),
            Ok(vec![Effect::Record(path.clone()), replaced])
        );
        // The replaced verdict is the original's entry, not the path's.
        let Effect::End(which, _) =
            &path_verdict(&original, PathVerdict::Replace(path.clone()), &[], false).unwrap()[0]
        else {
            panic!()
        };
        assert!(which.covers(&original));
        assert!(!which.covers(&path));
        // The flow moved on meanwhile: nothing reopens.
        assert!(path_verdict(&original, PathVerdict::Replace(path.clone()), &[], true).is_err());
        // The timeout withdrawn while the probe ran.
        let mut withdrawn = original.clone();
        withdrawn.status = Status::Resolved;
        assert!(path_verdict(&original, PathVerdict::Replace(path), &[withdrawn], false).is_err());
    }

    /// RTO backoff: a black hole whose socket is still stuck stays open however long
    /// its retransmits pause; once its flow is not stuck it is resolved. A restarted
    /// agent's stuck flows are in `stuck` as well. Path black holes are the probe's.
    #[test]
    fn black_holes_stay_open_while_stuck_and_resolve_when_not() {
        let stuck = event(event_kind::PMTUD_STALL, 0);
        let mut freed = stuck;
        freed.flow.dport += 1;
        let Effect::End(which, Status::Resolved) = blackholes_open(vec![stuck.flow]) else {
            panic!("resolves");
        };
        assert!(!which.covers(&finding(Kind::PmtudBlackhole, Layer::OverlayMtu, &stuck)));
        assert!(which.covers(&finding(Kind::PmtudBlackhole, Layer::OverlayMtu, &freed)));
        assert!(!which.covers(&finding(Kind::PmtudBlackhole, Layer::Path, &freed)));
        assert!(!which.covers(&finding(Kind::TcpStall, Layer::Unknown, &freed)));
    }
}
