//! Findings and kernel events for unit tests, built one way for every module's tests.

use std::time::SystemTime;

use node_diag_common::{AF_INET, Event, FlowKey};

use super::{Finding, Kind, Layer, Severity};

/// A bare `kind/layer` warning seen at the epoch, with no flow or evidence yet.
pub(crate) fn finding(kind: Kind, layer: Layer) -> Finding {
    Finding::new(
        kind,
        layer,
        Severity::Warning,
        "s".into(),
        "r".into(),
        SystemTime::UNIX_EPOCH,
    )
}

/// A `tcp_refused/listener` finding for 10.0.0.1:`sport` -> 10.0.0.2:80 in netns 1,
/// seen at the epoch.
pub(crate) fn refused(sport: u16) -> Finding {
    let mut f = Finding::new(
        Kind::TcpRefused,
        Layer::Listener,
        Severity::Warning,
        "no listener".into(),
        "start it".into(),
        SystemTime::UNIX_EPOCH,
    );
    f.src = Some([10, 0, 0, 1].into());
    f.dst = Some([10, 0, 0, 2].into());
    f.dport = Some(80);
    f.sport = Some(sport);
    f.netns = Some(1);
    f
}

/// An IPv4 event of `kind` and `error` for 10.244.1.7:40000 -> 10.244.2.9:8080 in netns
/// 4026532000.
pub(crate) fn event(kind: u32, error: u32) -> Event {
    let mut flow = FlowKey {
        sport: 40000,
        dport: 8080,
        family: AF_INET,
        ..Default::default()
    };
    flow.saddr[..4].copy_from_slice(&[10, 244, 1, 7]);
    flow.daddr[..4].copy_from_slice(&[10, 244, 2, 9]);
    Event {
        ts_ns: 1,
        kind,
        error,
        flow,
        netns: 4026532000,
        ..Default::default()
    }
}
