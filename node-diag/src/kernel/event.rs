//! The kernel's verdict numbers (`node_diag_common::event_kind`), decoded once where a
//! ring-buffer record enters user space: past this edge a verdict is an enum.

use node_diag_common::event_kind;

/// What a kernel [`node_diag_common::Event`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventKind {
    /// A RST (or an ICMP port-unreachable) answered the SYN.
    ConnectRefused,
    /// The SYN was retransmitted the threshold's number of times unanswered.
    ConnectTimeout,
    /// The connect failed on an ICMP unreachable.
    ConnectUnreachable,
    /// An established connection was reset.
    EstablishedReset,
    /// The kernel itself gave up on a connect after its full SYN backoff.
    ConnectGaveUp,
    /// DF packets dropped for exceeding the egress MTU.
    DfOversize,
    /// Full-size segments retransmitted with MTU evidence: a PMTUD black hole.
    PmtudStall,
    /// A segment retransmitted without MTU evidence: the peer went silent.
    TcpStall,
    /// The application closed a connecting socket before any answer.
    ConnectAbandoned,
    /// A connect already reported as timing out was established after all.
    ConnectLate,
    /// A stall without MTU evidence ended with its segment sent again smaller.
    MssShrunk,
    /// A SYN from elsewhere towards a pod of this node, dropped here by a filter: the
    /// first of its client, pod and port.
    InboundSynDropped,
}

impl EventKind {
    /// Verdicts on a connect, from the programs' tracking of connecting sockets (which
    /// includes namespaces the agent has not looked at yet).
    pub(crate) fn is_connect(self) -> bool {
        matches!(
            self,
            Self::ConnectRefused
                | Self::ConnectTimeout
                | Self::ConnectUnreachable
                | Self::ConnectGaveUp
                | Self::ConnectAbandoned
                | Self::ConnectLate
        )
    }
}

/// A record whose kind this agent does not know: a mismatched build of the programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown event kind {0}")]
pub(crate) struct UnknownKind(pub(crate) u32);

impl TryFrom<u32> for EventKind {
    type Error = UnknownKind;

    fn try_from(kind: u32) -> Result<Self, UnknownKind> {
        Ok(match kind {
            event_kind::CONNECT_REFUSED => Self::ConnectRefused,
            event_kind::CONNECT_TIMEOUT => Self::ConnectTimeout,
            event_kind::CONNECT_UNREACHABLE => Self::ConnectUnreachable,
            event_kind::ESTABLISHED_RESET => Self::EstablishedReset,
            event_kind::CONNECT_GAVE_UP => Self::ConnectGaveUp,
            event_kind::DF_OVERSIZE => Self::DfOversize,
            event_kind::PMTUD_STALL => Self::PmtudStall,
            event_kind::TCP_STALL => Self::TcpStall,
            event_kind::CONNECT_ABANDONED => Self::ConnectAbandoned,
            event_kind::CONNECT_LATE => Self::ConnectLate,
            event_kind::MSS_SHRUNK => Self::MssShrunk,
            event_kind::INBOUND_SYN_DROPPED => Self::InboundSynDropped,
            other => return Err(UnknownKind(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_kind_decodes_and_others_do_not() {
        for n in 1..=12 {
            assert!(EventKind::try_from(n).is_ok(), "{n}");
        }
        assert_eq!(EventKind::try_from(0), Err(UnknownKind(0)));
        assert_eq!(EventKind::try_from(13), Err(UnknownKind(13)));
    }
}
