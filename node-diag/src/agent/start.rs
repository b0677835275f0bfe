//! The agent's start: the programs loaded and attached, the maps taken, the first look
//! at the node, the listeners served.

use super::*;

const MAX_FINDINGS: usize = 4096;

impl Agent {
    /// Loads and attaches the programs, binds the listener, starts the HTTP server and
    /// the ring buffer's drain, and writes the ready file: from its return on, the
    /// agent is ready and its events arrive on the receiver.
    pub(super) async fn start(
        opts: RunOptions,
    ) -> Result<(Self, mpsc::Receiver<(EventKind, Event)>), AgentError> {
        // Before anything is loaded: a bad web config is the operator's to fix first.
        let web = WebConfigs {
            scrape: load_web_config(opts.web_config_file.as_deref())?,
            findings: load_web_config(opts.findings_web_config_file.as_deref())?,
        };
        // The programs' maps are empty before this: evidence begins here.
        let loaded_ns = monotonic_ns();
        let mut loaded = loader::load(&loader::Options {
            syn_retrans_threshold: opts.syn_retries,
            scoped: !opts.all_netns,
            ebpf_log: opts.ebpf_log,
        })?;
        info!(
            attached = ?loaded.attached,
            degraded = loaded.degraded.len(),
            btf = loaded.btf_ok,
            tracefs = %loaded.tracefs.display(),
            mounted_tracefs = loaded.mounted_tracefs,
            drop_reasons = loaded.drop_reasons.len(),
            "eBPF programs attached"
        );
        let (ring, maps) = KernelMaps::take(&mut loaded.ebpf, loaded.drop_reasons.slots())?;
        // Bound before TC is attached: a second agent in this namespace (the listen
        // address taken) fails here, before it could mistake the first one's filters
        // for leftovers.
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|source| AgentError::Listen {
                flag: "--listen",
                addr: opts.listen,
                source,
            })?;
        let local = listener.local_addr()?;
        let findings_listener =
            match opts.findings_listen.0 {
                Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(
                    |source| AgentError::Listen {
                        flag: "--findings-listen",
                        addr,
                        source,
                    },
                )?),
                None => None,
            };
        let findings_local = match &findings_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let tc = match TcIngress::load(&mut loaded.ebpf, opts.tc_attach) {
            Ok(tc) => Some(tc),
            Err(e) => {
                warn!(error = %e, "TC ingress unavailable: frag-needed received is not seen");
                None
            }
        };
        let watch = IcmpWatch::new(
            opts.icmp_watch,
            Duration::from_secs(opts.icmp_watch_hold),
            loaded_ns,
        );
        let shared = Arc::new(Shared::new(
            Metrics::new(),
            Store::new(Duration::from_secs(opts.repeat_interval), MAX_FINDINGS)
                .on_node(node_name(opts.node_name.as_deref())),
        ));
        let names = Names::for_this_node(loaded.drop_reasons.clone());
        let service_failures = shared.metrics().service_rules_failures();
        let service_count = shared.metrics().services();
        let mut agent = Self {
            loaded,
            maps,
            conntrack: ConntrackWatch::default(),
            tc,
            watch,
            shared,
            pods: crate::pods::watch(opts.cri_socket.clone()).await,
            pods_named: 0,
            translator: Translator::start(service_failures, service_count),
            drop_sites: drop_sites::DropSites::default(),
            names,
            ephemeral_ports: crate::host_network::local_port_range(),
            own: own_endpoints::OwnEndpoints::new(
                crate::host_network::conntrack_stats::own_netns(),
                std::iter::once(local).chain(findings_local).collect(),
            ),
            verdicts: verdicts::VerdictTracker::default(),
            scope_looked_ns: 0,
            inbound: inbound::InboundTracker::default(),
            blackholes: BlackholeWatch::default(),
            stalls: blackholes::StallRecheck::default(),
            shrinks: blackholes::ShrinkConfirm::default(),
            path_probes: path_probe::PathProbes::new(path_probe::Limits {
                window: Duration::from_secs(opts.path_probe_window),
                ..Default::default()
            }),
            rules: rule_watch::RuleWatch::start(),
            bad_records: Arc::new(AtomicU64::new(0)),
            tasks: Vec::new(),
            links: None,
            opts,
        };
        let node = agent.refresh_namespaces();
        agent.start_tc(node.as_ref(), loaded_ns);
        // The first conntrack readings, and the first look at the agent's health.
        agent.on_refresh();
        // Stale from here on: the loop takes a fresh look every refresh.
        drop(node);

        agent.serve(listener, findings_listener, web);
        let (tx, rx) = mpsc::channel(crate::kernel::ring::QUEUE);
        let drain = crate::kernel::ring::drain(ring, tx, agent.bad_records.clone());
        agent.tasks.push(tokio::spawn(async move {
            if let Err(e) = drain.await {
                warn!(error = %e, "ring buffer drain stopped");
            }
        }));
        if let Some(logs) = agent.loaded.ebpf_log.take() {
            agent.tasks.push(tokio::spawn(async {
                if let Err(e) = crate::kernel::ebpf_log::drain(logs).await {
                    warn!(error = %e, "eBPF log stream stopped");
                }
            }));
        }
        agent.refresh_mtu(PodReads::Fresh).await;
        // Start-up's scratch (the kernel's BTF parsed, the programs' objects relocated
        // and verified) is freed by now; the pages it leaves free go back.
        allocator::release_free();
        if let Some(path) = &agent.opts.ready_file
            && let Err(source) = std::fs::write(
                path,
                match findings_local {
                    Some(findings) => format!("{local}\n{findings}\n"),
                    None => format!("{local}\n"),
                },
            )
        {
            let path = path.clone();
            agent.shutdown();
            return Err(AgentError::ReadyFile { path, source });
        }
        agent.shared.set_ready(true);
        match findings_local {
            Some(findings) => info!(listen = %local, findings_listen = %findings, "ready"),
            None => info!(listen = %local, "ready"),
        }
        Ok((agent, rx))
    }

    /// Serves the HTTP endpoints on the listeners (and keeps the web config, when there
    /// is one, in step with its files).
    pub(super) fn serve(
        &mut self,
        scrape: tokio::net::TcpListener,
        findings: Option<tokio::net::TcpListener>,
        web: WebConfigs,
    ) {
        let shared = self.shared.clone();
        let names: &[&str] = if findings.is_some() {
            &["scrape", "findings"]
        } else {
            &["scrape"]
        };
        let metrics = shared.metrics().register_http(names);
        let mut listeners = vec![serve::Listener {
            name: "scrape",
            tcp: scrape,
            routes: serve::Routes::Scrape {
                plain: http::scrape_router(shared.clone(), false),
                with_findings: http::scrape_router(shared.clone(), true),
            },
            web: self.web_config("scrape", web.scrape, &metrics),
        }];
        if let Some(tcp) = findings {
            listeners.push(serve::Listener {
                name: "findings",
                tcp,
                routes: serve::Routes::Findings(http::findings_router(shared.clone())),
                web: self.web_config("findings", web.findings, &metrics),
            });
        }
        let max_connections = connection_cap(
            self.opts.http_max_connections,
            fds::connection_budget(),
            listeners.len(),
        );
        if max_connections < self.opts.http_max_connections as usize {
            warn!(
                flag = self.opts.http_max_connections,
                budget = fds::connection_budget(),
                listeners = listeners.len(),
                cap = max_connections,
                "HTTP connection cap lowered to the listeners' share of the open-files budget"
            );
        } else {
            info!(
                cap = max_connections,
                budget = fds::connection_budget(),
                "HTTP connection cap per listener"
            );
        }
        let limits = serve::Limits {
            header_timeout: self.opts.http_header_timeout,
            idle_timeout: self.opts.http_idle_timeout,
            max_connections,
        };
        self.tasks.push(serve::spawn(listeners, limits, metrics));
    }

    /// One listener's web config, kept in step with its files when it has one.
    pub(super) fn web_config(
        &mut self,
        listener: &'static str,
        loaded: Option<(PathBuf, serve::web_config::Loaded)>,
        metrics: &HttpMetrics,
    ) -> serve::WebConfig {
        let Some((path, loaded)) = loaded else {
            return tokio::sync::watch::channel(Arc::new(serve::web_config::Active::default())).1;
        };
        let watch = serve::web_config::Watch::new(&path, &loaded);
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(loaded.active));
        let ok = metrics
            .web_config_ok
            .get_or_create(&ListenerLabel {
                listener: listener.to_owned(),
            })
            .clone();
        self.tasks.push(serve::spawn_reload(path, watch, tx, ok));
        rx
    }
}
