//! Traffic-control objects over rtnetlink: the filters under a `clsact` qdisc and the
//! qdisc itself. `kernel::tc` uses them on kernels without TCX, where its classifier is a
//! netlink (`cls_bpf`) filter that outlives a killed agent: to find and remove the
//! filters a previous agent left, and to remove a `clsact` only once nothing is left in it.

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
};

use super::rtnetlink::{NetlinkError, request, socket};

/// Which side of a `clsact` qdisc a filter sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClsactSide {
    Ingress,
    Egress,
}

impl ClsactSide {
    pub(crate) const BOTH: [ClsactSide; 2] = [ClsactSide::Ingress, ClsactSide::Egress];

    fn parent(self) -> TcHandle {
        TcHandle {
            major: TcHandle::CLSACT.major,
            minor: match self {
                ClsactSide::Ingress => TcHandle::MIN_INGRESS,
                ClsactSide::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

/// One filter as the kernel dumps it. The kernel also dumps every (priority, protocol)
/// slot once with handle 0 before its filters: such an entry still means "not empty".
#[derive(Debug, Clone)]
pub(crate) struct TcFilter {
    header: TcHeader,
    /// The classifier (`bpf`, `u32`, `flower`...).
    pub(crate) kind: String,
    /// For a `bpf` filter, the name it was given (`TCA_BPF_NAME`).
    pub(crate) bpf_name: Option<String>,
    /// For a `bpf` filter, its program's id (`TCA_BPF_ID`).
    pub(crate) bpf_id: Option<u32>,
}

impl TcFilter {
    pub(crate) fn priority(&self) -> u16 {
        (self.header.info >> 16) as u16
    }

    pub(crate) fn handle(&self) -> u32 {
        self.header.handle.into()
    }
}

#[cfg(test)]
impl TcFilter {
    /// A filter as a dump would give it, for tests of who owns what.
    pub(crate) fn fixture(kind: &str, priority: u16, handle: u32, bpf_name: Option<&str>) -> Self {
        let header = TcHeader {
            handle: handle.into(),
            parent: ClsactSide::Ingress.parent(),
            info: u32::from(priority) << 16,
            ..TcHeader::default()
        };
        TcFilter {
            header,
            kind: kind.into(),
            bpf_name: bpf_name.map(Into::into),
            bpf_id: None,
        }
    }
}

/// Every filter on `side` of interface `index`'s `clsact` (none when it has no clsact).
pub(crate) fn clsact_filters(index: u32, side: ClsactSide) -> Result<Vec<TcFilter>, NetlinkError> {
    let sock = socket()?;
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.parent = side.parent();
    let msgs = request(
        &sock,
        RouteNetlinkMessage::GetTrafficFilter(msg),
        NLM_F_DUMP,
    )?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewTrafficFilter(m) => Some(filter_from(m)),
            _ => None,
        })
        .collect())
}

fn filter_from(msg: TcMessage) -> TcFilter {
    let (header, attributes) = msg.into_parts();
    let mut kind = String::new();
    let mut bpf_name = None;
    let mut bpf_id = None;
    for attr in attributes {
        match attr {
            TcAttribute::Kind(k) => kind = k,
            TcAttribute::Options(options) => {
                for option in options {
                    match option {
                        TcOption::Bpf(TcFilterBpfOption::ProgName(name)) => bpf_name = Some(name),
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => bpf_id = Some(id),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    TcFilter {
        header,
        kind,
        bpf_name,
        bpf_id,
    }
}

/// Deletes one filter from a dump (by interface, parent, priority, protocol and handle).
pub(crate) fn delete_filter(filter: &TcFilter) -> Result<(), NetlinkError> {
    let sock = socket()?;
    let msg = TcMessage::from_parts(filter.header.clone(), Vec::new());
    request(&sock, RouteNetlinkMessage::DelTrafficFilter(msg), NLM_F_ACK)?;
    Ok(())
}

/// Whether interface `index` has a `clsact` qdisc (a plain `ingress` qdisc sits at the
/// same place and is not one).
pub(crate) fn has_clsact(index: u32) -> Result<bool, NetlinkError> {
    let sock = socket()?;
    let msgs = request(
        &sock,
        RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()),
        NLM_F_DUMP,
    )?;
    Ok(msgs.into_iter().any(|m| match m {
        RouteNetlinkMessage::NewQueueDiscipline(q) => {
            q.header.index == index as i32
                && q.header.parent == TcHandle::CLSACT
                && q.attributes
                    .iter()
                    .any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"))
        }
        _ => false,
    }))
}

/// Deletes interface `index`'s `clsact` qdisc, and with it every filter it holds: callers
/// check it is empty first.
pub(crate) fn delete_clsact(index: u32) -> Result<(), NetlinkError> {
    let sock = socket()?;
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.parent = TcHandle::CLSACT;
    msg.attributes.push(TcAttribute::Kind("clsact".into()));
    request(
        &sock,
        RouteNetlinkMessage::DelQueueDiscipline(msg),
        NLM_F_ACK,
    )?;
    Ok(())
}
