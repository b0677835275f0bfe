//! The Service and NAT family: what the agent found behind a flow's destination
//! (kube-proxy's name for it, the backend NAT chose or its candidates), set on the
//! finding and said in its summary.

use std::net::SocketAddr;

use super::Finding;

/// What the agent knows of the Service and NAT behind a flow's destination: the
/// kernel's NAT map or conntrack for the backend, kube-proxy's rules for the name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Translation {
    /// Where this node's NAT sent the flow, when it changed the destination.
    pub(crate) backend: Option<SocketAddr>,
    /// kube-proxy's name for the Service: `<namespace>/<name>:<port>`.
    pub(crate) service: Option<String>,
    /// kube-proxy's rules reject this Service's connects: it has no endpoints.
    pub(crate) no_endpoints: bool,
    /// The Service's endpoints, when NAT's choice among them is not known.
    pub(crate) candidates: Vec<SocketAddr>,
}

impl Translation {
    /// The Service whose own REJECT (no endpoints) answers its connects.
    pub(super) fn without_endpoints(&self) -> Option<&str> {
        self.service.as_deref().filter(|_| self.no_endpoints)
    }

    /// A sentence for a summary: where the connection went.
    fn describe(&self) -> Option<String> {
        match (&self.service, self.backend) {
            (Some(s), Some(b)) => Some(format!(
                " It is Service {s}, NATed on this node to backend {b}."
            )),
            (Some(s), None) => Some(format!(" It is Service {s}.")),
            (None, Some(b)) => Some(format!(" This node's NAT sent it to {b}.")),
            (None, None) => None,
        }
    }

    /// Sets the finding's Service fields and says where the connection went.
    pub(super) fn apply(&self, f: &mut Finding) {
        if f.dst.is_none() || f.listener.is_some() {
            return;
        }
        f.service.clone_from(&self.service);
        f.backend = self.backend.map(|b| b.ip());
        f.backend_port = self.backend.map(|b| b.port());
        if let Some(more) = self.describe() {
            f.summary.push_str(&more);
        }
        if self.backend.is_none() && !self.candidates.is_empty() {
            f.evidence.set_candidates(&self.candidates);
            let candidates: Vec<String> = self.candidates.iter().map(ToString::to_string).collect();
            f.summary.push_str(&format!(
                " Its backend is one of {} (conntrack keeps no record of a connection refused at once).",
                candidates.join(", ")
            ));
        }
    }
}

/// What to check for a Service without endpoints.
pub(super) fn service_remediation(svc: &str) -> String {
    let (ns, name) = svc
        .split_once('/')
        .map(|(ns, rest)| (ns, rest.split(':').next().unwrap_or(rest)))
        .unwrap_or(("default", svc));
    format!(
        "Check the Service's selector and its pods' readiness: `kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={name}`, `kubectl -n {ns} describe service {name}`, and whether the selected pods are Ready (failing readiness probes take them out)."
    )
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::super::testkit::*;
    use super::*;
    use crate::findings::{Kind, Layer};

    #[test]
    fn kube_proxys_no_endpoints_reject_is_the_service() {
        let f = run_translated(
            &rejected_here(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: true,
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Service));
        assert_eq!(f.service.as_deref(), Some("shop/cart:http"));
        assert!(
            f.summary
                .contains("Service shop/cart:http has no ready endpoints"),
            "{}",
            f.summary
        );
        assert!(f.remediation.contains("selector"), "{}", f.remediation);
        assert!(
            f.remediation.contains("-n shop") && f.remediation.contains("service-name=cart"),
            "{}",
            f.remediation
        );
    }

    #[test]
    fn kube_proxys_ipv6_no_endpoints_reject_is_the_service() {
        // ip6tables' REJECT (icmp6-port-unreachable) drops the SYN and answers with an
        // ICMPv6 error this node's tracepoints do not see being sent.
        let mut ev = event(node_diag_common::event_kind::CONNECT_REFUSED, 111);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00:96::30"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets();
        ev.drop = dropped(12, 1, 4026532000, 0);
        let no_endpoints = Translation {
            service: Some("shop/cart:http".into()),
            no_endpoints: true,
            ..Translation::default()
        };
        let f = run_translated(&ev, no_endpoints.clone()).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Service));
        assert!(
            f.summary.contains("ICMPv6 port unreachable"),
            "{}",
            f.summary
        );
        // An ICMPv6 administratively prohibited is a filter's, Service or not.
        ev.icmp_rcvd = icmp_received(1, [0; 4]);
        ev.icmp_rcvd.from = [0; 16];
        let f = run_translated(&ev, no_endpoints).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
    }

    #[test]
    fn a_reject_for_a_service_with_endpoints_stays_the_firewall() {
        // A NetworkPolicy or host firewall rejecting a Service that has endpoints.
        let f = run_translated(
            &rejected_here(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: false,
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.service.as_deref(), Some("shop/cart:http"));
    }

    #[test]
    fn a_backend_refusing_is_its_listener_with_service_and_backend() {
        let backend: SocketAddr = "10.244.2.9:8080".parse().unwrap();
        let f = run_translated(
            &refused_with_rst(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: false,
                backend: Some(backend),
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!(f.layer, Layer::Listener);
        assert_eq!(
            (f.backend, f.backend_port),
            (Some(backend.ip()), Some(8080))
        );
        assert!(
            f.summary.contains("backend 10.244.2.9:8080"),
            "{}",
            f.summary
        );
        let plain = run(&refused_with_rst()).unwrap();
        assert_eq!((plain.service, plain.backend), (None, None));
    }
}
