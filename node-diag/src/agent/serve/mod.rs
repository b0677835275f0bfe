//! The agent's HTTP listeners, served with bounds: an accept loop of our own over hyper's
//! HTTP/1 connection, so that nothing a client does can hold the agent's sockets for
//! long or make it queue work.
//!
//! - A cap on concurrent connections per listener: a connection over it is accepted and
//!   closed at once (counted in `node_diag_http_connections_rejected_total`), never left
//!   in the kernel's backlog.
//! - hyper's header-read timer: a request head must arrive within the header timeout of
//!   the connection's start or of the previous response (hyper starts it whenever it
//!   waits for a head, so it also closes idle keep-alive connections and ones that never
//!   send a byte); the TLS handshake has the same bound.
//! - An idle timeout on the bytes themselves: a connection that neither reads nor writes
//!   for that long (a client that stopped reading its answer) is closed.
//! - No request body is ever read: every route is a `GET` without one.
//!
//! Each listener has its own web config ([`web_config`]; the scrape listener's from
//! `--web-config-file`, the findings listener's from `--findings-web-config-file`, plain
//! HTTP without one), read at every connection: TLS, client certificates and basic auth,
//! and a reloaded config applies to the next connection. `/findings` is served on the
//! scrape listener only over a connection whose client certificate was verified
//! (`RequireAndVerifyClientCert`).

mod basic_auth;
pub(crate) mod web_config;

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    path::PathBuf,
    pin::{Pin, pin},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    http::{HeaderValue, Request, Response, StatusCode, header},
};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::gauge::Gauge;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::{JoinHandle, JoinSet},
};
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

use self::web_config::{Active, Watch};
use super::metrics::{HttpMetrics, ListenerLabel};

/// How often the web config's files are checked for changes.
const WEB_CONFIG_POLL: Duration = Duration::from_secs(2);
/// The largest request head read (Prometheus' is a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;
/// At most one warning per listener this often about the connection cap.
const CAP_WARN_EVERY: Duration = Duration::from_secs(60);

/// The bounds of every connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// What one listener serves.
#[derive(Clone)]
pub(crate) enum Routes {
    /// The scrape listener: `plain` on every connection, `with_findings` on one whose
    /// client certificate was verified.
    Scrape {
        plain: Router,
        with_findings: Router,
    },
    Findings(Router),
}

/// A bound listener and what it serves.
pub(crate) struct Listener {
    /// `scrape` or `findings`: the metric's label and the logs' name.
    pub(crate) name: &'static str,
    pub(crate) tcp: TcpListener,
    pub(crate) routes: Routes,
    /// Its web config in force (plain HTTP, no auth, when none was given).
    pub(crate) web: WebConfig,
}

/// A listener's web config in force, swapped on reload.
pub(crate) type WebConfig = watch::Receiver<Arc<Active>>;

/// Serves `listeners` until the returned task is aborted (which closes every
/// connection with it).
pub(crate) fn spawn(
    listeners: Vec<Listener>,
    limits: Limits,
    metrics: HttpMetrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut loops = JoinSet::new();
        for listener in listeners {
            loops.spawn(accept_loop(listener, limits, metrics.clone()));
        }
        while loops.join_next().await.is_some() {}
    })
}

/// Polls the web config at `path` and puts each good new version in force; a bad one is
/// logged and the one in force kept. Runs until aborted.
pub(crate) fn spawn_reload(
    path: PathBuf,
    mut watch: Watch,
    tx: watch::Sender<Arc<Active>>,
    ok: Gauge,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(WEB_CONFIG_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A few stat calls; a read and a parse when something changed.
            match watch.poll() {
                None => {}
                Some(Ok(loaded)) => {
                    for w in &loaded.warnings {
                        warn!(file = %path.display(), "web config: {w}");
                    }
                    info!(file = %path.display(), "web config reloaded");
                    ok.set(1);
                    tx.send_replace(Arc::new(loaded.active));
                }
                Some(Err(e)) => {
                    warn!(error = %e, "web config not reloaded: the previous one stays in force");
                    ok.set(0);
                }
            }
        }
    })
}

async fn accept_loop(listener: Listener, limits: Limits, metrics: HttpMetrics) {
    let label = ListenerLabel {
        listener: listener.name.to_owned(),
    };
    let rejected = metrics.rejected.get_or_create(&label).clone();
    let open = metrics.open.get_or_create(&label).clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut last_cap_warning: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.tcp.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors most likely: back off rather than spin; the
                // connections being served go on.
                warn!(listener = listener.name, error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Counted before the close, so that a client seeing it can read the count.
            rejected.inc();
            // Closed at once: a refusal the client sees now, not a queue.
            drop(stream);
            if last_cap_warning.is_none_or(|t| t.elapsed() >= CAP_WARN_EVERY) {
                last_cap_warning = Some(Instant::now());
                warn!(
                    listener = listener.name,
                    max = limits.max_connections,
                    "connection cap reached: new connections are closed at once (see --http-max-connections)"
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let open = open.clone();
        open.inc();
        let routes = listener.routes.clone();
        let active = listener.web.borrow().clone();
        connections.spawn(async move {
            connection(stream, peer, routes, active, limits).await;
            open.dec();
            drop(slot);
        });
    }
}

/// One connection: the TLS handshake when configured, then HTTP/1.1 until the client
/// closes or a bound is hit.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    routes: Routes,
    web: Arc<Active>,
    limits: Limits,
) {
    let Some(tls) = &web.tls else {
        let router = match routes {
            Routes::Scrape { plain, .. } => plain,
            Routes::Findings(router) => router,
        };
        serve(stream, router, &web, limits).await;
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.config));
    let stream = match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let router = match routes {
        Routes::Scrape {
            with_findings,
            plain,
        } => {
            if web.verifies_clients() {
                with_findings
            } else {
                plain
            }
        }
        Routes::Findings(router) => router,
    };
    let stream = PeerCloseAware {
        inner: stream,
        peer_closed: false,
    };
    serve(stream, router, &web, limits).await;
}

/// A served TLS stream whose close skips the TLS `close_notify` once the client has
/// closed its end. A client that closes its socket without a `close_notify` of its own
/// (ureq does, so `node-diag findings` does) no longer reads: a `close_notify` written
/// then only makes its kernel answer with a reset. The TCP end is shut down all the same.
struct PeerCloseAware {
    inner: tokio_rustls::server::TlsStream<TcpStream>,
    /// The client's end closed: the read side met its end, cleanly or not.
    peer_closed: bool,
}

impl AsyncRead for PeerCloseAware {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let ended = match &polled {
            Poll::Ready(Ok(())) => buf.filled().len() == before && buf.remaining() > 0,
            Poll::Ready(Err(e)) => e.kind() == io::ErrorKind::UnexpectedEof,
            Poll::Pending => false,
        };
        if ended {
            self.peer_closed = true;
        }
        polled
    }
}

impl AsyncWrite for PeerCloseAware {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.peer_closed {
            // Whatever TLS records are still buffered are for a reader that is gone.
            let (tcp, _) = self.inner.get_mut();
            return Pin::new(tcp).poll_shutdown(cx);
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// HTTP/1.1 on `io` until it ends, its header timer fires or it goes idle.
async fn serve<I>(io: I, router: Router, web: &Arc<Active>, limits: Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: io,
        activity: Arc::clone(&activity),
    });
    let web = Arc::clone(web);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let router = router.clone();
        let web = Arc::clone(&web);
        async move { Ok::<_, Infallible>(respond(request, router, &web).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD);
    let mut conn = pin!(builder.serve_connection(io, service));
    loop {
        let idle = activity.idle_for();
        if idle >= limits.idle_timeout {
            debug!("connection idle for {idle:?}: closed");
            return;
        }
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    debug!(error = %e, "connection ended");
                }
                return;
            }
            () = tokio::time::sleep(limits.idle_timeout - idle) => {}
        }
    }
}

/// Paths that say nothing but whether the agent runs: served without basic auth, so
/// that the kubelet's probes need no credentials.
const OPEN_PATHS: &[&str] = &["/healthz", "/readyz"];

async fn respond(request: Request<Incoming>, router: Router, web: &Active) -> Response<Body> {
    if let Some(auth) = &web.auth
        && !OPEN_PATHS.contains(&request.uri().path())
        && !auth.allows(request.headers()).await
    {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"node-diag\""),
            )
            .body(Body::from("Unauthorized\n"))
            .unwrap_or_default();
    }
    let mut response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    for (name, value) in &web.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

/// When a connection last moved a byte.
struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// A stream that records its activity.
struct Tracked<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;
    use crate::agent::{http, metrics::Metrics, state::Shared};
    use crate::findings::Store;

    /// A scrape listener on a free loopback port, served with `limits` and no web
    /// config; its address and metrics.
    async fn scrape(limits: Limits) -> (SocketAddr, HttpMetrics, JoinHandle<()>) {
        let mut metrics = Metrics::new();
        let http_metrics = metrics.register_http(&["scrape"]);
        let shared = Arc::new(Shared::new(metrics, Store::new(Duration::from_secs(1), 16)));
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = Listener {
            name: "scrape",
            tcp,
            routes: Routes::Scrape {
                plain: http::scrape_router(shared.clone(), false),
                with_findings: http::scrape_router(shared, true),
            },
            web: watch::channel(Arc::new(Active::default())).1,
        };
        let task = spawn(vec![listener], limits, http_metrics.clone());
        (addr, http_metrics, task)
    }

    /// `GET path` on a fresh connection: the whole answer.
    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Whether the peer closed `s` within `within` (EOF or reset).
    fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_the_cap_a_connection_is_closed_at_once_and_counted() {
        let limits = Limits {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: 2,
        };
        let (addr, metrics, task) = scrape(limits).await;
        let rejected = tokio::task::spawn_blocking(move || {
            let held: Vec<_> = (0..2)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            // Let the loop take both before the third arrives.
            std::thread::sleep(Duration::from_millis(200));
            let mut third = std::net::TcpStream::connect(addr).unwrap();
            let closed = closed_within(&mut third, Duration::from_secs(2));
            drop(held);
            closed
        })
        .await
        .unwrap();
        assert!(rejected, "the connection over the cap was not closed");
        let label = ListenerLabel {
            listener: "scrape".into(),
        };
        assert_eq!(metrics.rejected.get_or_create(&label).get(), 1);
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_and_idle_connections_are_closed_after_the_header_timeout() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(30),
            max_connections: 8,
        };
        let (addr, _, task) = scrape(limits).await;
        tokio::task::spawn_blocking(move || {
            let mut silent = std::net::TcpStream::connect(addr).unwrap();
            assert!(!closed_within(&mut silent, Duration::from_millis(100)));
            assert!(closed_within(&mut silent, Duration::from_secs(2)));
            let mut kept = std::net::TcpStream::connect(addr).unwrap();
            kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            let mut buf = [0u8; 512];
            let n = kept.read(&mut buf).unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
            let start = Instant::now();
            assert!(closed_within(&mut kept, Duration::from_secs(2)));
            assert!(start.elapsed() >= Duration::from_millis(200));
        })
        .await
        .unwrap();
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_moving_no_byte_is_closed_after_the_idle_timeout() {
        let limits = Limits {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_millis(300),
            max_connections: 8,
        };
        let (addr, _, task) = scrape(limits).await;
        tokio::task::spawn_blocking(move || {
            let mut slow = std::net::TcpStream::connect(addr).unwrap();
            slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            assert!(!closed_within(&mut slow, Duration::from_millis(150)));
            // A byte now and then keeps it open past the idle timeout...
            for _ in 0..3 {
                slow.write_all(b"X-A: b\r\n").unwrap();
                assert!(!closed_within(&mut slow, Duration::from_millis(150)));
            }
            // ...silence closes it.
            assert!(closed_within(&mut slow, Duration::from_secs(2)));
        })
        .await
        .unwrap();
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scrape_listener_says_where_the_findings_are() {
        let limits = Limits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_connections: 8,
        };
        let (addr, _, task) = scrape(limits).await;
        let (findings, metrics) =
            tokio::task::spawn_blocking(move || (get(addr, "/findings"), get(addr, "/metrics")))
                .await
                .unwrap();
        assert!(findings.starts_with("HTTP/1.1 404"), "{findings}");
        assert!(findings.contains("--findings-listen"), "{findings}");
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("node_diag_http_connections_rejected_total{listener=\"scrape\"} 0"),
            "{metrics}"
        );
        task.abort();
    }
}
