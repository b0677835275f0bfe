//! The client against a real HTTP server on loopback (axum, in process) serving fixture
//! JSON the way an agent does, old (no `id`, no query parameters) or new.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::IntoResponse,
    routing::get as route,
};

use super::*;
use crate::{
    findings::{Kind, Layer, Severity, Status, fixtures::refused},
    pods::PodRef,
};

/// What the fixture answers, and the query strings it was asked.
#[derive(Default)]
struct Fixture {
    status: u16,
    body: String,
    headers: Vec<(&'static str, String)>,
    queries: Vec<String>,
}

type Shared = Arc<Mutex<Fixture>>;

async fn findings(State(s): State<Shared>, RawQuery(q): RawQuery) -> impl IntoResponse {
    let mut s = s.lock().unwrap();
    s.queries.push(q.unwrap_or_default());
    let mut headers = HeaderMap::new();
    for (k, v) in &s.headers {
        headers.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    (
        StatusCode::from_u16(s.status).unwrap(),
        headers,
        s.body.clone(),
    )
}

/// Serves `/findings` from a fixture on 127.0.0.1, on a runtime of its own that lives
/// as long as the test process.
fn serve(body: String) -> (String, Shared) {
    let shared: Shared = Arc::new(Mutex::new(Fixture {
        status: 200,
        body,
        ..Default::default()
    }));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let state = shared.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new()
                .route("/findings", route(findings))
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{addr}"), shared)
}

fn options(url: &str, format: FindingsFormat) -> Options {
    Options {
        server: Some(url.to_string()),
        follow: false,
        last: None,
        filters: Filters::default(),
        format,
        color: false,
        poll: Duration::from_millis(10),
        cluster: None,
        client: Client::plain(),
    }
}

/// One poll's stdout and stderr.
fn poll(session: &mut Session) -> (Vec<String>, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    session.poll(&mut out, &mut err).unwrap();
    let out = String::from_utf8(out).unwrap();
    (
        out.lines().map(str::to_string).collect(),
        String::from_utf8(err).unwrap(),
    )
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn json(findings: &[Finding]) -> String {
    serde_json::to_string(findings).unwrap()
}

/// Findings that differ only in listener, interface, pod or status: the fields the old
/// client's key left out.
fn look_alikes() -> Vec<Finding> {
    let mut reset = refused(4000);
    reset.kind = Kind::TcpReset;
    (reset.src, reset.dst, reset.dport, reset.sport) = (None, None, None, None);
    reset.listener = Some("10.0.0.2:80".parse().unwrap());
    let mut https = reset.clone();
    https.listener = Some("10.0.0.2:443".parse().unwrap());

    let mut mtu = refused(4000);
    (mtu.kind, mtu.layer) = (Kind::OverlayMtuMismatch, Layer::OverlayMtu);
    (mtu.src, mtu.dst, mtu.dport, mtu.sport) = (None, None, None, None);
    mtu.interface = Some("veth1".into());
    mtu.summary = "veth1 MTU 1500 is above the overlay's 1450".into();
    let mut other_veth = mtu.clone();
    other_veth.interface = Some("veth2".into());
    other_veth.summary = "veth2 MTU 1500 is above the overlay's 1450".into();

    let mut cart = refused(4000);
    cart.pod = Some(pod("cart"));
    let mut db = cart.clone();
    db.pod = Some(pod("db"));

    let mut resolved = mtu.clone();
    resolved.status = Status::Resolved;
    resolved.resolved_at = Some("1970-01-01T00:00:05.000Z".into());
    vec![reset, https, mtu, other_veth, cart, db, resolved]
}

#[test]
fn findings_differing_in_listener_interface_pod_or_status_are_all_shown() {
    let all = look_alikes();
    let (url, _) = serve(json(&all));
    let mut text = Session::new(options(&url, FindingsFormat::Text));
    let (lines, err) = poll(&mut text);
    assert_eq!(lines.len(), all.len(), "{lines:#?}");
    assert!(err.is_empty(), "{err}");
    for (needle, times) in [
        ("listener 10.0.0.2:80 ", 1),
        ("listener 10.0.0.2:443 ", 1),
        ("dev veth1 ", 2),
        ("dev veth2 ", 1),
        ("shop/cart → 10.0.0.2:80", 1),
        ("shop/db → 10.0.0.2:80", 1),
        ("RESOLVED: veth1 MTU 1500", 1),
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(needle)).count(),
            times,
            "{needle}: {lines:#?}"
        );
    }
    let mut as_json = Session::new(options(&url, FindingsFormat::Json));
    let (lines, _) = poll(&mut as_json);
    let back: Vec<Finding> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, all, "every finding, fields unchanged");
}

#[test]
fn json_lines_keep_fields_this_client_does_not_know() {
    let mut v = serde_json::to_value(refused(4000)).unwrap();
    v["id"] = "42".into();
    v["node"] = "node-a".into();
    v["from_a_newer_agent"] = serde_json::json!({"x": 1});
    let (url, _) = serve(serde_json::Value::Array(vec![v.clone()]).to_string());
    let (lines, _) = poll(&mut Session::new(options(&url, FindingsFormat::Json)));
    assert_eq!(lines.len(), 1);
    let back: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(back, v);
    let (wide, _) = poll(&mut Session::new(options(&url, FindingsFormat::Wide)));
    assert!(wide.iter().any(|l| l.contains("node node-a")), "{wide:#?}");
}

#[test]
fn follow_prints_a_condition_turning_resolved() {
    let mut mtu = look_alikes()[2].clone();
    mtu.last_seen = "1970-01-01T00:00:01.000Z".into();
    let mut refused = refused(4000);
    refused.last_seen = "1970-01-01T00:00:02.000Z".into();
    let (url, fixture) = serve(json(&[mtu.clone(), refused.clone()]));
    let mut opts = options(&url, FindingsFormat::Text);
    opts.follow = true;
    let mut session = Session::new(opts);
    let (first, _) = poll(&mut session);
    assert_eq!(first.len(), 2, "{first:#?}");
    let (quiet, _) = poll(&mut session);
    assert!(quiet.is_empty(), "nothing changed: {quiet:#?}");

    mtu.status = Status::Resolved;
    mtu.resolved_at = Some("1970-01-01T00:00:09.000Z".into());
    fixture.lock().unwrap().body = json(&[mtu.clone(), refused.clone()]);
    let (lines, _) = poll(&mut session);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].starts_with("00:00:09 WARN overlay_mtu_mismatch/overlay_mtu"));
    assert!(
        lines[0].contains("RESOLVED: veth1 MTU 1500"),
        "{}",
        lines[0]
    );

    // Growth is printed too, and a reopened condition.
    refused.count = 5;
    refused.last_seen = "1970-01-01T00:00:10.000Z".into();
    mtu.status = Status::Active;
    mtu.resolved_at = None;
    mtu.last_seen = "1970-01-01T00:00:11.000Z".into();
    fixture.lock().unwrap().body = json(&[mtu, refused]);
    let (lines, _) = poll(&mut session);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].contains("×5"), "{lines:#?}");
    assert!(
        lines[1].starts_with("00:00:11 WARN overlay_mtu_mismatch"),
        "{lines:#?}"
    );
    assert!(!lines[1].contains("RESOLVED"), "{lines:#?}");
}

#[test]
fn follow_outlives_an_agent_restart() {
    let (url, fixture) = serve(json(&[refused(4000)]));
    let mut opts = options(&url, FindingsFormat::Text);
    opts.follow = true;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run_with(opts, &mut out, &mut err, |polls| {
        let mut f = fixture.lock().unwrap();
        match polls {
            // Down for two polls: said once.
            1 => f.status = 503,
            3 => {
                f.status = 200;
                let mut new = refused(4000);
                new.dport = Some(81);
                f.body = json(&[refused(4000), new]);
            }
            _ => {}
        }
        polls < 4
    })
    .unwrap();
    let err = String::from_utf8(err).unwrap();
    assert_eq!(
        err,
        format!(
            "node-diag: the agent at {url} answered 503; polling on\n\
             node-diag: the agent answers again\n"
        )
    );
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "the first, then the new one: {out}");
    assert!(lines[1].contains("10.0.0.2:81 "), "{out}");

    // An agent never reached is an error at once.
    let mut opts = options("http://127.0.0.1:1", FindingsFormat::Text);
    opts.follow = true;
    let e = run_with(opts, &mut Vec::new(), &mut Vec::new(), |_| true).unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
}

#[test]
fn follow_starts_with_the_last_n() {
    let many: Vec<Finding> = (0..30)
        .map(|i| {
            let mut f = refused(4000);
            f.dport = Some(1000 + i);
            f.last_seen = format!("1970-01-01T00:00:{i:02}.000Z");
            f
        })
        .collect();
    let (url, fixture) = serve(json(&many));
    let follow = |last| {
        let mut opts = options(&url, FindingsFormat::Text);
        opts.follow = true;
        opts.last = last;
        Session::new(opts)
    };
    let (lines, _) = poll(&mut follow(None));
    assert_eq!(lines.len(), DEFAULT_FOLLOW_LAST);
    assert!(
        lines[0].contains(":1020 "),
        "the most recent ten: {lines:#?}"
    );
    assert!(lines[9].contains(":1029 "), "oldest first: {lines:#?}");
    let (lines, _) = poll(&mut follow(Some(3)));
    assert_eq!(lines.len(), 3);

    let mut only_new = follow(Some(0));
    assert!(poll(&mut only_new).0.is_empty());
    let mut more = many.clone();
    let mut new = refused(4000);
    new.dport = Some(7);
    new.last_seen = "1970-01-01T00:01:00.000Z".into();
    more.push(new);
    fixture.lock().unwrap().body = json(&more);
    let (lines, _) = poll(&mut only_new);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("10.0.0.2:7 "), "{lines:#?}");
    // Following always asks for the most the agent gives.
    assert!(
        fixture
            .lock()
            .unwrap()
            .queries
            .iter()
            .all(|q| q == "limit=10000")
    );
}

#[test]
fn every_filter_is_sent_and_applied_again() {
    let mut keep = refused(4000);
    keep.pod = Some(pod("cart"));
    keep.severity = Severity::Critical;
    keep.last_seen = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let mut other_kind = keep.clone();
    other_kind.kind = Kind::TcpTimeout;
    let mut info = keep.clone();
    info.severity = Severity::Info;
    info.dport = Some(1);
    let mut elsewhere = keep.clone();
    elsewhere.pod = Some(PodRef {
        namespace: "kube-system".into(),
        ..pod("cart")
    });
    let mut old = keep.clone();
    old.last_seen = "1970-01-01T00:00:00.000Z".into();
    let mut resolved = keep.clone();
    resolved.status = Status::Resolved;
    resolved.dport = Some(2);
    // An agent from before the parameters: everything, whatever was asked.
    let (url, fixture) = serve(json(&[
        other_kind,
        info,
        elsewhere,
        old,
        keep.clone(),
        resolved,
    ]));
    let mut opts = options(&url, FindingsFormat::Json);
    opts.filters = Filters {
        kinds: vec![Kind::TcpRefused, Kind::PmtudBlackhole],
        severity: Some(Severity::Warning),
        namespace: Some("shop".into()),
        pod: Some("shop/cart".into()),
        since: Some(query::parse_since("10m").unwrap()),
        statuses: vec![Status::Active],
    };
    let (lines, _) = poll(&mut Session::new(opts));
    let shown: Vec<Finding> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(shown, [keep]);
    assert_eq!(
        fixture.lock().unwrap().queries,
        [
            "kind=tcp_refused,pmtud_blackhole&severity=warning&namespace=shop&pod=shop/cart&since=10m&status=active&limit=10000"
        ]
    );
}

#[test]
fn a_cut_answer_is_said_on_stderr() {
    let (url, fixture) = serve(json(&[refused(1), refused(2)]));
    fixture.lock().unwrap().headers = vec![
        ("x-node-diag-total", "12000".into()),
        ("x-node-diag-truncated", "true".into()),
    ];
    let (lines, err) = poll(&mut Session::new(options(&url, FindingsFormat::Text)));
    assert_eq!(lines.len(), 2);
    assert!(
        err.contains("showing the 2 most recent of 12000 matching findings"),
        "{err}"
    );
    // `--last` asked for the cut, and gets it quietly.
    let mut opts = options(&url, FindingsFormat::Text);
    opts.last = Some(1);
    let (lines, err) = poll(&mut Session::new(opts));
    assert_eq!(lines.len(), 1, "an agent that ignored the limit: cut here");
    assert!(err.is_empty(), "{err}");
    assert!(fixture.lock().unwrap().queries[1].ends_with("limit=1"));
}

#[test]
fn a_refused_query_prints_the_agents_message() {
    let (url, fixture) = serve("unknown kind \"tcp_refsued\"\n".into());
    fixture.lock().unwrap().status = 400;
    let mut session = Session::new(options(&url, FindingsFormat::Text));
    let err = session
        .poll(&mut Vec::new(), &mut Vec::new())
        .expect_err("a 400");
    assert_eq!(
        err.to_string(),
        format!("the agent at {url} refused the query: unknown kind \"tcp_refsued\"")
    );
}

#[test]
fn a_dead_agent_is_named_with_its_cause_once() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let err = Session::new(options(&url, FindingsFormat::Text))
        .poll(&mut Vec::new(), &mut Vec::new())
        .expect_err("nothing listens");
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(chain.matches("Connection refused").count(), 1, "{chain}");
    assert!(
        chain.starts_with(&format!("cannot reach the agent at {url}")),
        "{chain}"
    );
}

/// Serves `response` (raw bytes) to one connection on 127.0.0.1; returns the URL.
fn serve_once(response: &'static [u8]) -> String {
    use std::io::Read as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buf[..n]);
        }
        conn.write_all(response).unwrap();
    });
    url
}

#[test]
fn chunk_boundary_inside_a_utf8_character() {
    // "é" is C3 A9: the first chunk ends after C3, the second starts with A9.
    let url = serve_once(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          3\r\n[\"\xc3\r\n3\r\n\xa9\"]\r\n0\r\n\r\n",
    );
    assert_eq!(
        get(&Client::plain(), &url, "/findings").unwrap().body,
        "[\"\u{e9}\"]"
    );
}

#[test]
fn status_is_checked_as_a_number() {
    let url = serve_once(b"HTTP/1.1 404 Not 200 Found\r\nContent-Length: 0\r\n\r\n");
    match get(&Client::plain(), &url, "/findings") {
        Err(ClientError::Status { status, .. }) => assert_eq!(status, 404),
        other => panic!("expected a status error, got {:?}", other.err()),
    }
}
