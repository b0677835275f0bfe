//! `node-diag findings --cluster NAME`: every agent behind a headless Service.
//!
//! NAME's A and AAAA records are the agents (a headless Service's name resolves to every
//! ready endpoint's address: with the DaemonSet's `hostNetwork`, each node's). Their port
//! is `--port`, else the SRV record `_findings._tcp.NAME`: what Kubernetes' DNS serves
//! for a Service port named `findings` (`_<port-name>._<proto>.<service>.<namespace>.svc.
//! <zone>`). Names are resolved by hickory-resolver as the system does
//! (`/etc/resolv.conf`: its name servers, search domains and `ndots`, so `node-diag.node-
//! diag` works inside a cluster), or by one `--dns-server`.
//!
//! The agents are asked at most [`PARALLEL`] at a time, each on its own thread (the
//! client is blocking ureq), over the client's TLS and credentials, and each answer or failure is kept with its agent.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    sync::Mutex,
};

use hickory_resolver::{
    ResolveError, Resolver, TokioResolver,
    config::{LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts},
    name_server::TokioConnectionProvider,
    proto::xfer::Protocol,
};

use super::{Answer, ClientError};

/// How many agents are asked at once.
pub(crate) const PARALLEL: usize = 16;
/// The Service port name whose SRV record gives the agents' port.
pub(crate) const PORT_NAME: &str = "findings";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    #[error("cannot read the system's DNS configuration (/etc/resolv.conf)")]
    Config(#[source] ResolveError),
    #[error("cannot start the DNS resolver")]
    Runtime(#[source] std::io::Error),
    #[error("cannot resolve the agents of {name}")]
    Addresses {
        name: String,
        #[source]
        cause: ResolveError,
    },
    #[error("{name} has no address records: is it the agents' headless Service (clusterIP: None)?")]
    NoAddresses { name: String },
    #[error("no port for the agents of {name}: no SRV record {srv}; give --port")]
    NoPort {
        name: String,
        srv: String,
        #[source]
        cause: ResolveError,
    },
}

/// Where the agents of a cluster are.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    /// The headless Service's name.
    pub(crate) name: String,
    /// `--port`: the agents' findings port, instead of the SRV record's.
    pub(crate) port: Option<u16>,
    /// `--dns-server`: ask only this server (UDP, then TCP), not the system's.
    pub(crate) dns_server: Option<SocketAddr>,
}

/// One agent of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Member {
    pub(crate) addr: SocketAddr,
}

/// The SRV name of `name`'s findings port.
pub(crate) fn srv_name(name: &str) -> String {
    format!("_{PORT_NAME}._tcp.{name}")
}

impl Cluster {
    fn resolver(&self) -> Result<TokioResolver, ClusterError> {
        let mut builder = match self.dns_server {
            Some(server) => {
                let mut config = ResolverConfig::new();
                config.add_name_server(NameServerConfig::new(server, Protocol::Udp));
                config.add_name_server(NameServerConfig::new(server, Protocol::Tcp));
                let mut b =
                    Resolver::builder_with_config(config, TokioConnectionProvider::default());
                // Only the server named: not /etc/hosts either.
                b.options_mut().use_hosts_file = ResolveHosts::Never;
                b
            }
            None => Resolver::builder_tokio().map_err(ClusterError::Config)?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // A Service's every A and AAAA record: dual-stack clusters have agents on both.
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // Each poll sees the agents of now (a DaemonSet rolls; a node joins).
        opts.cache_size = 0;
        Ok(builder.build())
    }

    /// The agents behind the name, sorted by address.
    pub(crate) fn members(&self) -> Result<Vec<Member>, ClusterError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClusterError::Runtime)?;
        rt.block_on(async {
            let resolver = self.resolver()?;
            let name = self.name.trim_end_matches('.').to_string();
            let port = match self.port {
                Some(p) => p,
                None => {
                    let srv = srv_name(&name);
                    let records = resolver.srv_lookup(srv.as_str()).await.map_err(|cause| {
                        ClusterError::NoPort {
                            name: name.clone(),
                            srv: srv.clone(),
                            cause,
                        }
                    })?;
                    // Kubernetes serves one record per endpoint, all with the Service
                    // port's target port; the lowest priority first by RFC 2782.
                    let mut ports: Vec<(u16, u16)> =
                        records.iter().map(|r| (r.priority(), r.port())).collect();
                    ports.sort();
                    match ports.first() {
                        Some((_, port)) => *port,
                        None => return Err(ClusterError::NoAddresses { name }),
                    }
                }
            };
            let ips = resolver.lookup_ip(name.as_str()).await.map_err(|cause| {
                ClusterError::Addresses {
                    name: name.clone(),
                    cause,
                }
            })?;
            let addrs: BTreeSet<IpAddr> = ips.iter().collect();
            if addrs.is_empty() {
                return Err(ClusterError::NoAddresses { name });
            }
            Ok(addrs
                .into_iter()
                .map(|ip| Member {
                    addr: SocketAddr::new(ip, port),
                })
                .collect())
        })
    }
}

/// `GET path` on every member, at most [`PARALLEL`] at once: each member's answer or
/// failure, in the members' order.
pub(crate) fn fetch_all(
    members: &[Member],
    path: &str,
    get: &(dyn Fn(&str, &str) -> Result<Answer, ClientError> + Sync),
) -> Vec<Result<Answer, ClientError>> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Result<Answer, ClientError>>>> =
        Mutex::new((0..members.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL.min(members.len()) {
            scope.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(member) = members.get(i) else { break };
                    // `HOST:PORT`: the client's TLS flags choose the scheme.
                    let answer = get(&member.addr.to_string(), path);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(answer);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(ClientError::Status {
                    url: String::new(),
                    status: 0,
                })
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    #[test]
    fn the_srv_name_is_kubernetes_for_a_port_named_findings() {
        assert_eq!(
            srv_name("node-diag.node-diag.svc.cluster.local"),
            "_findings._tcp.node-diag.node-diag.svc.cluster.local"
        );
    }

    #[test]
    fn members_are_asked_concurrently_but_bounded_and_answers_keep_their_order() {
        let members: Vec<Member> = (0..40)
            .map(|i| Member {
                addr: SocketAddr::from(([10, 0, 0, i as u8], 9465)),
            })
            .collect();
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let get = |url: &str, _path: &str| -> Result<Answer, ClientError> {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            now.fetch_sub(1, Ordering::SeqCst);
            if url.ends_with(".3:9465") {
                return Err(ClientError::Status {
                    url: url.into(),
                    status: 500,
                });
            }
            Ok(Answer {
                body: url.to_string(),
                total: None,
                truncated: false,
            })
        };
        let answers = fetch_all(&members, "/findings", &get);
        assert_eq!(answers.len(), 40);
        for (m, a) in members.iter().zip(&answers) {
            match a {
                Ok(a) => assert_eq!(a.body, m.addr.to_string()),
                Err(_) => assert_eq!(m.addr.ip(), IpAddr::from([10, 0, 0, 3])),
            }
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= PARALLEL, "{most} at once");
    }
}
