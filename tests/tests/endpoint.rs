//! The agent's HTTP listeners as an attacker, a busy cluster and real clients see them:
//! thousands of held connections cut by the header timeout, connections over the cap
//! closed at once, `/findings` kept off the node's address, TLS with client
//! certificates scraped by a real Prometheus, basic auth with curl, and the web config
//! reloaded.
//!
//! Certificates are made by `openssl`, requests by `curl`, both run inside node A. Root,
//! `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test endpoint -- --test-threads=1`.

use std::fs;
use std::io::{ErrorKind, Read as _, Write as _};
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_testbed::pki::{TempDir, make_pki};
use node_diag_testbed::process::die_with_parent;
use node_diag_tests::{
    Agent, ConnectOutcome, Topology, agent::READY, cmd, in_netns, node_diag_bin, ok,
    process::run_with_timeout, tcp_connect,
};
use serde_json::Value;

/// The longest `/healthz` may take while the listeners are under siege.
const HEALTHZ_BOUND: Duration = Duration::from_millis(100);

/// Raises this process's soft open-file limit to its hard limit (the agent, started
/// from here, inherits it): the tests hold thousands of sockets.
fn raise_nofile() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, raised).expect("cannot raise RLIMIT_NOFILE");
    limit.maximum.unwrap_or(u64::MAX)
}

/// `curl args...` inside `netns`: its output, whatever its exit.
fn curl(netns: &str, args: &[&str]) -> Output {
    let mut argv = vec!["curl", "-sS", "--max-time", "5"];
    argv.extend_from_slice(args);
    cmd::try_run_in(netns, &argv)
}

/// `curl -w '%{http_code}' args...` inside `netns`: (status, body); status 0 when no
/// HTTP answer came.
fn curl_status(netns: &str, args: &[&str]) -> (u16, String, Output) {
    let mut all = vec!["-o", "/dev/stdout", "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(netns, &all);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned(), out)
}

/// Writes `text` to `path` the way a Kubernetes Secret update lands: a new file renamed
/// over the old one.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    fs::write(&tmp, text).expect("write the new file");
    fs::rename(&tmp, path).expect("rename it into place");
}

/// One `GET /healthz` on a fresh connection: (status line, time taken).
fn healthz(addr: SocketAddr) -> (String, Duration) {
    let start = Instant::now();
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connect to {addr} for /healthz: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .expect("send /healthz");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let elapsed = start.elapsed();
    (answer.lines().next().unwrap_or("").to_owned(), elapsed)
}

/// A connection the test holds open, and when the agent closed it.
struct Held {
    stream: TcpStream,
    connected: Instant,
    closed: Option<Instant>,
}

impl Held {
    /// Reads what is there without blocking; records the close (EOF or reset).
    fn check(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => break,
            }
        }
        self.closed = Some(Instant::now());
    }
}

/// Opens a connection to `addr` (from the calling thread's namespace); an odd `i`
/// sends an unfinished request head, an even one nothing.
fn open_held(addr: SocketAddr, i: usize) -> Held {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connection {i} to {addr}: {e}"));
    let connected = Instant::now();
    if i % 2 == 1 {
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
            .expect("send a partial head");
    }
    stream.set_nonblocking(true).expect("nonblocking");
    Held {
        stream,
        connected,
        closed: None,
    }
}

/// Opens `n` connections to `addr` on a thread of its own (in the calling thread's
/// namespace), after those `already` held, while this one checks, every 20 ms, which of
/// them the agent closed and probes `/healthz` on `probe`; until every one is closed or
/// `after_last` has passed since the last one opened (however long opening them took
/// on a loaded machine), at most a minute. A connect the kernel makes wait (a SYN
/// retransmitted) delays only itself.
fn hold_and_watch(
    already: Vec<Held>,
    addr: SocketAddr,
    n: usize,
    probe: SocketAddr,
    after_last: Duration,
) -> (Vec<Held>, Vec<(String, Duration)>) {
    let total = already.len() + n;
    let held = std::sync::Mutex::new(already);
    let mut probes = Vec::new();
    let start = Instant::now();
    thread::scope(|scope| {
        let opener = scope.spawn(|| {
            for i in 0..n {
                let h = open_held(addr, i);
                held.lock().expect("lock").push(h);
            }
        });
        loop {
            let (all_closed, watched_long_enough) = {
                let mut held = held.lock().expect("lock");
                for h in held.iter_mut() {
                    h.check();
                }
                let all_opened = held.len() == total;
                let last = held.iter().map(|h| h.connected).max();
                (
                    all_opened && held.iter().all(|h| h.closed.is_some()),
                    all_opened && last.is_some_and(|t| t.elapsed() > after_last),
                )
            };
            if all_closed || watched_long_enough || start.elapsed() > Duration::from_secs(60) {
                break;
            }
            probes.push(healthz(probe));
            thread::sleep(Duration::from_millis(20));
        }
        opener.join().expect("the opener panicked");
    });
    (held.into_inner().expect("lock"), probes)
}

/// 2,000 connections (half silent, half stopped in the middle of their request head)
/// and a kept-alive one gone idle are all closed by the agent within its header timeout
/// (not before: they were served, not refused), while `/healthz` answers within
/// [`HEALTHZ_BOUND`] on the findings listener, where the DaemonSet's probes go (on the
/// scrape listener itself a probe can wait a SYN retransmit, a second, whenever the
/// flood fills its accept queue faster than a loaded machine drains it).
#[test]
fn held_connections_are_closed_within_the_header_timeout() {
    assert!(raise_nofile() > 4_500, "the hard RLIMIT_NOFILE is too low");
    let topo = Topology::new();
    let timeout = Duration::from_secs(2);
    let mut agent = Agent::start_with_args(
        &topo,
        &[
            "--http-header-timeout",
            "2s",
            "--http-max-connections",
            "4096",
        ],
    );
    agent.wait_ready(READY);
    let addr: SocketAddr = agent.listen_addr().parse().expect("listen address");
    let probe: SocketAddr = agent
        .findings_addr()
        .expect("a findings listener")
        .parse()
        .expect("findings address");
    let slack = Duration::from_millis(1500);
    let report = in_netns(&topo.node_a, || {
        // A kept-alive connection that got its answer and went quiet.
        let mut kept = TcpStream::connect(addr).expect("connect");
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
            .expect("send");
        let mut buf = [0u8; 1024];
        let n = kept
            .read(&mut buf)
            .expect("answer on the kept-alive connection");
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        kept.set_nonblocking(true).expect("nonblocking");
        let kept = Held {
            stream: kept,
            connected: Instant::now(),
            closed: None,
        };
        let opening = Instant::now();
        let watched = hold_and_watch(
            vec![kept],
            addr,
            2_000,
            probe,
            timeout + slack + Duration::from_secs(1),
        );
        let last = watched.0.iter().map(|h| h.connected).max().expect("held");
        eprintln!("2,000 connections opened in {:?}", last - opening);
        watched
    });
    let (held, probes) = report;
    let open: Vec<usize> = (0..held.len())
        .filter(|&i| held[i].closed.is_none())
        .collect();
    assert!(
        open.is_empty(),
        "{} of {} connections still open {:?} after the header timeout ({timeout:?}), e.g. #{:?}",
        open.len(),
        held.len(),
        slack,
        &open[..open.len().min(5)]
    );
    let lived: Vec<Duration> = held
        .iter()
        .map(|h| h.closed.expect("closed").duration_since(h.connected))
        .collect();
    let shortest = *lived.iter().min().expect("connections");
    let longest = *lived.iter().max().expect("connections");
    assert!(
        shortest >= timeout - Duration::from_millis(300),
        "a connection was closed after {shortest:?}, before the header timeout {timeout:?}: refused rather than timed out?"
    );
    let late: Vec<(usize, Duration)> = lived
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, l)| *l > timeout + slack)
        .collect();
    assert!(
        late.is_empty(),
        "{} connections lived more than the header timeout {timeout:?} + {slack:?} (index, time): {:?}",
        late.len(),
        &late[..late.len().min(20)]
    );
    assert!(probes.len() >= 5, "only {} /healthz probes", probes.len());
    for (status, took) in &probes {
        assert!(status.starts_with("HTTP/1.1 200"), "/healthz: {status:?}");
        assert!(
            *took < HEALTHZ_BOUND,
            "/healthz took {took:?} with {} connections held: {probes:?}",
            held.len()
        );
    }
    eprintln!(
        "{} connections closed {shortest:?}..{longest:?} after they opened; {} /healthz answered in at most {:?}",
        held.len(),
        probes.len(),
        probes.iter().map(|p| p.1).max().unwrap_or_default()
    );
    assert_eq!(
        agent.counter(r#"node_diag_http_connections_rejected_total{listener="scrape"}"#),
        0.0
    );
}

/// Over `--http-max-connections` the agent closes a new connection as soon as it
/// accepts it and counts it; the findings listener on loopback (where the probes go)
/// keeps answering `/healthz` meanwhile.
#[test]
fn connections_over_the_cap_are_closed_at_once() {
    raise_nofile();
    let topo = Topology::new();
    let cap = 100;
    let mut agent = Agent::start_with_args(
        &topo,
        &[
            "--http-header-timeout",
            "5s",
            "--http-max-connections",
            "100",
        ],
    );
    agent.wait_ready(READY);
    let addr: SocketAddr = agent.listen_addr().parse().expect("listen address");
    let findings: SocketAddr = agent
        .findings_addr()
        .expect("a findings listener")
        .parse()
        .expect("findings address");
    let (mut held, over, probes) = in_netns(&topo.node_a, || {
        let held: Vec<Held> = (0..cap).map(|i| open_held(addr, i)).collect();
        // Let the agent take them all before the ones over the cap come.
        thread::sleep(Duration::from_millis(300));
        let mut probes = Vec::new();
        // Each one over the cap: how long from its connect to its close (EOF or reset).
        let over: Vec<Option<Duration>> = (0..2 * cap)
            .map(|i| {
                if i % 20 == 0 {
                    probes.push(healthz(findings));
                }
                let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("connection {i} over the cap: {e}"));
                let connected = Instant::now();
                stream
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .expect("timeout");
                let mut buf = [0u8; 256];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => return Some(connected.elapsed()),
                        Ok(_) => continue,
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                        {
                            return None;
                        }
                        Err(_) => return Some(connected.elapsed()),
                    }
                }
            })
            .collect();
        (held, over, probes)
    });
    let still_open = over.iter().filter(|o| o.is_none()).count();
    assert_eq!(
        still_open,
        0,
        "{still_open} of {} connections over a cap of {cap} were not closed within 2 s",
        over.len()
    );
    let slowest = over.iter().flatten().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(200),
        "a connection over the cap was closed only after {slowest:?}"
    );
    for h in &mut held {
        h.check();
    }
    let closed = held.iter().filter(|h| h.closed.is_some()).count();
    assert_eq!(
        closed, 0,
        "{closed} of the {cap} connections within the cap were closed"
    );
    assert!(probes.len() >= 10, "{probes:?}");
    for (status, took) in &probes {
        assert!(status.starts_with("HTTP/1.1 200"), "/healthz: {status:?}");
        assert!(*took < HEALTHZ_BOUND, "/healthz on loopback took {took:?}");
    }
    drop(held);
    // The held ones gone, the scrape listener serves again.
    thread::sleep(Duration::from_secs(1));
    let rejected = agent.counter(r#"node_diag_http_connections_rejected_total{listener="scrape"}"#);
    assert_eq!(rejected, (2 * cap) as f64, "rejections counted");
}

/// Polls `f` until it gives a value; panics after `timeout`.
fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// By default `/findings` is served on loopback only: the node's address refuses the
/// findings port (from the node itself and from its peer) and the scrape listener, bound
/// to every address as the DaemonSet binds it, answers 404 saying where it is.
#[test]
fn findings_are_unreachable_on_the_node_address_by_default() {
    let help = cmd::run(&[&node_diag_bin().display().to_string(), "run", "--help"]);
    assert!(
        help.contains("127.0.0.1:9465") && help.contains("--findings-listen"),
        "`node-diag run --help` does not give the findings listener's loopback default:\n{help}"
    );
    let topo = Topology::new();
    let port = ok(node_diag_testbed::agent::free_port(&topo.node_a));
    let listen = format!("0.0.0.0:{port}");
    let mut agent = ok(node_diag_testbed::Agent::start(
        &topo,
        &node_diag_bin(),
        Some(&listen),
        &[],
    ));
    ok(agent.wait_ready(READY));
    let findings_addr: SocketAddr = agent
        .findings_addr()
        .expect("findings listener")
        .parse()
        .expect("address");
    assert!(findings_addr.ip().is_loopback(), "{findings_addr}");
    let node = topo.node_a_underlay;
    let on_node = SocketAddr::from((node, findings_addr.port()));
    for from in [&topo.node_a, &topo.node_b] {
        let outcome = tcp_connect(from, on_node, Duration::from_secs(2));
        assert!(
            matches!(outcome, ConnectOutcome::Refused),
            "{on_node} (the findings port on the node's address) from {from}: {outcome:?}"
        );
    }
    let scrape_on_node = format!("{node}:{port}");
    let (status, body, _) = curl_status(
        &topo.node_b,
        &[&format!("http://{scrape_on_node}/findings")],
    );
    assert_eq!(status, 404, "/findings on the scrape listener: {body}");
    assert!(body.contains("--findings-listen"), "{body}");
    let (status, _, _) = curl_status(&topo.node_b, &[&format!("http://{scrape_on_node}/metrics")]);
    assert_eq!(status, 200, "/metrics on the node's address");
    // On loopback it is there.
    let served = ok(agent.findings_endpoint());
    assert!(served.iter().all(Value::is_object), "{served:?}");
}

/// A Prometheus server inside node A with its own config, as a guard.
struct Prometheus<'t> {
    child: Child,
    netns: String,
    addr: String,
    dir: TempDir,
    _topo: PhantomData<&'t Topology>,
}

impl<'t> Prometheus<'t> {
    fn start(topo: &'t Topology, scrape_configs: &str) -> Prometheus<'t> {
        let dir = TempDir::new("prometheus");
        fs::create_dir_all(dir.path("data")).expect("data dir");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{scrape_configs}"
        );
        fs::write(dir.path("prometheus.yml"), config).expect("write config");
        let port = ok(node_diag_testbed::agent::free_port(&topo.node_a));
        let addr = format!("127.0.0.1:{port}");
        let log = fs::File::create(dir.path("prometheus.log")).expect("log");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &topo.node_a, "/usr/bin/prometheus"])
            .arg(format!("--config.file={}", dir.arg("prometheus.yml")))
            .arg(format!("--storage.tsdb.path={}", dir.arg("data")))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().unwrap_or_else(|e| {
            panic!("cannot start prometheus: {e} (apt-get install prometheus)")
        });
        let prometheus = Prometheus {
            child,
            netns: topo.node_a.clone(),
            addr,
            dir,
            _topo: PhantomData,
        };
        wait_for(Duration::from_secs(30), || {
            let r =
                node_diag_testbed::http::get(&prometheus.netns, &prometheus.addr, "/-/ready", None);
            matches!(r, Ok(ref r) if r.status == 200).then_some(())
        });
        prometheus
    }

    /// The active target of `job`, once it has been scraped (health not `unknown`).
    fn target(&self, job: &str) -> Option<Value> {
        let r =
            node_diag_testbed::http::get(&self.netns, &self.addr, "/api/v1/targets", None).ok()?;
        let v: Value = serde_json::from_str(&r.body).ok()?;
        v["data"]["activeTargets"]
            .as_array()?
            .iter()
            .find(|t| t["labels"]["job"] == job && t["health"] != "unknown")
            .cloned()
    }

    /// `up` of `job` as the query API gives it.
    fn up(&self, job: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query=up%7Bjob%3D%22{job}%22%7D");
        let r = node_diag_testbed::http::get(&self.netns, &self.addr, &path, None).ok()?;
        let v: Value = serde_json::from_str(&r.body).ok()?;
        v["data"]["result"].as_array()?.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log());
        }
    }
}

/// With TLS and `RequireAndVerifyClientCert`, a real Prometheus scrapes `/metrics` with
/// its client certificate (up = 1) and fails without one or with one from another CA
/// (up = 0); curl agrees; `/findings` is served on the scrape listener to a verified
/// client.
#[test]
fn prometheus_scrapes_over_tls_with_a_client_certificate() {
    let topo = Topology::new();
    let pki = TempDir::new("pki");
    make_pki(&pki, "client", Some(&["127.0.0.1"]));
    make_pki(&pki, "stranger", None);
    // Relative file names: resolved against the config's directory.
    fs::write(
        pki.path("web.yml"),
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.crt\n  min_version: TLS12\n",
    )
    .expect("write web.yml");
    let web = pki.arg("web.yml");
    let mut agent = Agent::start_with_args(&topo, &["--web-config-file", &web]);
    agent.wait_ready(READY);
    let url = format!("https://{}", agent.listen_addr());
    let ca = pki.arg("client-ca.crt");
    let with_cert = |path: &str, cert: &str| {
        curl_status(
            &topo.node_a,
            &[
                "--cacert",
                &ca,
                "--cert",
                &pki.arg(&format!("{cert}.crt")),
                "--key",
                &pki.arg(&format!("{cert}.key")),
                &format!("{url}{path}"),
            ],
        )
    };
    let (status, body, out) = with_cert("/metrics", "client");
    assert_eq!(status, 200, "{body} {out:?}");
    assert!(
        body.contains("node_diag_http_connections_rejected_total"),
        "{body}"
    );
    let (status, body, _) = with_cert("/findings", "client");
    assert_eq!(
        status, 200,
        "/findings to a verified client on the scrape listener: {body}"
    );
    assert!(serde_json::from_str::<Vec<Value>>(&body).is_ok(), "{body}");
    let (status, _, out) = curl_status(&topo.node_a, &["--cacert", &ca, &format!("{url}/metrics")]);
    assert_eq!(status, 0, "answered without a client certificate: {out:?}");
    let (status, _, out) = with_cert("/metrics", "stranger");
    assert_eq!(status, 0, "answered a certificate of another CA: {out:?}");
    let (status, _, out) = curl_status(
        &topo.node_a,
        &[&format!("http://{}/metrics", agent.listen_addr())],
    );
    assert_ne!(status, 200, "answered plain HTTP: {out:?}");
    // The kubelet's probes, which present no certificate, go to the findings listener:
    // plain HTTP on loopback, untouched by the scrape listener's config.
    let findings = agent.findings_addr().expect("findings listener").to_owned();
    for (path, want) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let (status, body, out) = curl_status(&topo.node_a, &[&format!("http://{findings}{path}")]);
        assert_eq!(status, 200, "probe {path} on {findings}: {body} {out:?}");
        assert_eq!(body.trim(), want, "probe {path}");
    }

    let target = agent.listen_addr().to_owned();
    let tls = |cert: &str| {
        format!(
            "    tls_config:\n      ca_file: {ca}\n      cert_file: {}\n      key_file: {}\n",
            pki.arg(&format!("{cert}.crt")),
            pki.arg(&format!("{cert}.key"))
        )
    };
    let job = |name: &str, tls: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n{tls}    static_configs:\n      - targets: ['{target}']\n"
        )
    };
    let configs = format!(
        "{}{}{}",
        job("with-cert", &tls("client")),
        job(
            "without-cert",
            &format!("    tls_config:\n      ca_file: {ca}\n")
        ),
        job("stranger", &tls("stranger")),
    );
    let prometheus = Prometheus::start(&topo, &configs);
    let up = |job: &str| {
        wait_for(Duration::from_secs(20), || {
            prometheus.target(job)?;
            prometheus.up(job)
        })
    };
    assert_eq!(
        up("with-cert"),
        1.0,
        "{:#?}",
        prometheus.target("with-cert")
    );
    assert_eq!(up("without-cert"), 0.0);
    assert_eq!(up("stranger"), 0.0);
    let refused = prometheus.target("without-cert").expect("target");
    eprintln!(
        "with a client certificate: up; without: {}",
        refused["lastError"]
    );
}

/// Basic auth: curl (and `node-diag findings --basic-auth-user`) with the right password
/// is served, a wrong one or none gets 401
/// with `WWW-Authenticate: Basic` (the probes' `/healthz` needs none), on the scrape
/// listener and, given the same file as `--findings-web-config-file`, on the findings
/// listener; the password changed in the file, the old one is refused within seconds; a
/// broken file then leaves the config in force and says so in a metric.
#[test]
fn basic_auth_and_its_reload() {
    let topo = Topology::new();
    let dir = TempDir::new("web");
    let config = |password: &str| {
        let hash = bcrypt::hash(password, 6).expect("bcrypt");
        format!("basic_auth_users:\n  alice: '{hash}'\n")
    };
    let web = dir.path("web.yml");
    fs::write(&web, config("first")).expect("write web.yml");
    let web_arg = dir.arg("web.yml");
    let mut agent = Agent::start_with_args(
        &topo,
        &[
            "--web-config-file",
            &web_arg,
            "--findings-web-config-file",
            &web_arg,
        ],
    );
    agent.wait_ready(READY);
    let url = format!("http://{}/metrics", agent.listen_addr());
    let status = |user: Option<&str>| {
        let mut args = vec!["-D", "/dev/stderr"];
        if let Some(user) = user {
            args.extend(["-u", user]);
        }
        args.push(&url);
        let (status, _, out) = curl_status(&topo.node_a, &args);
        (status, String::from_utf8_lossy(&out.stderr).to_lowercase())
    };
    assert_eq!(status(Some("alice:first")).0, 200);
    let (code, headers) = status(Some("alice:wrong"));
    assert_eq!(code, 401);
    assert!(headers.contains("www-authenticate: basic"), "{headers}");
    assert_eq!(status(None).0, 401);
    assert_eq!(status(Some("mallory:first")).0, 401);
    let healthz = format!("http://{}/healthz", agent.listen_addr());
    assert_eq!(curl_status(&topo.node_a, &[&healthz]).0, 200);
    let findings = format!(
        "http://{}/findings",
        agent.findings_addr().expect("findings")
    );
    assert_eq!(curl_status(&topo.node_a, &[&findings]).0, 401);
    assert_eq!(
        curl_status(&topo.node_a, &["-u", "alice:first", &findings]).0,
        200
    );
    // The client's own flags: the password from a file (its newline ignored).
    let findings_client = |password: &str| {
        let file = dir.path("password");
        fs::write(&file, format!("{password}\n")).expect("write the password file");
        let bin = node_diag_bin();
        let server = agent.findings_addr().expect("findings").to_owned();
        cmd::try_run_in(
            &topo.node_a,
            &[
                bin.to_str().unwrap(),
                "findings",
                "--server",
                &server,
                "--basic-auth-user",
                "alice",
                "--basic-auth-password-file",
                file.to_str().unwrap(),
            ],
        )
    };
    let out = findings_client("first");
    assert!(out.status.success(), "{out:?}");
    let out = findings_client("wrong");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("answered 401"),
        "{out:?}"
    );

    replace_file(&web, &config("second"));
    let changed = Instant::now();
    wait_for(Duration::from_secs(5), || {
        (status(Some("alice:first")).0 == 401).then_some(())
    });
    eprintln!(
        "old password refused {:?} after the change",
        changed.elapsed()
    );
    assert_eq!(status(Some("alice:second")).0, 200);

    replace_file(&web, "basic_auth_users:\n  alice: not-a-hash\n");
    thread::sleep(Duration::from_secs(5));
    assert_eq!(
        status(Some("alice:second")).0,
        200,
        "a broken file replaced the config"
    );
    let text = curl(&topo.node_a, &["-u", "alice:second", &url]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    for listener in ["scrape", "findings"] {
        let ok_gauge = node_diag_testbed::metrics::find_value(
            &text,
            &format!("node_diag_web_config_last_reload_successful{{listener=\"{listener}\"}}"),
        )
        .expect("exposition");
        assert_eq!(ok_gauge, Some(0.0), "{listener}: {text}");
    }
    let stderr = agent.stderr();
    assert!(
        stderr.contains("not reloaded") && stderr.contains("not a bcrypt hash"),
        "no warning about the broken file:\n{stderr}"
    );
}

/// A bad web config at start-up is an error naming the file and the problem.
#[test]
fn a_bad_web_config_stops_the_start_up() {
    let topo = Topology::new();
    let dir = TempDir::new("web");
    fs::write(
        dir.path("web.yml"),
        "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
    )
    .expect("write");
    let run = run_with_timeout(
        Command::new("ip")
            .args(["netns", "exec", &topo.node_a])
            .arg(node_diag_bin())
            .args(["run", "--web-config-file", &dir.arg("web.yml")]),
        Duration::from_secs(30),
    );
    assert!(
        run.status.is_some_and(|s| !s.success()),
        "did not stop at once with a bad web config: {:?}\n{}",
        run.status,
        run.stderr
    );
    assert!(
        run.stderr.contains(&dir.arg("web.yml")) && run.stderr.contains("missing.crt"),
        "the error does not name the file and the problem:\n{}",
        run.stderr
    );
}
