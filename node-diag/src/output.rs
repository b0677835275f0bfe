//! How findings are printed. The agent logs each finding as it makes it on stdout
//! ([`print_finding`]: one full line, or one JSON object). `node-diag findings` prints
//! what it fetched from an agent for a person at a terminal: a compact line of about
//! [`LINE_WIDTH`] columns ([`compact_line`]), with summary, evidence and fix under it
//! in `-o wide` ([`wide_lines`]), coloured by severity on a terminal ([`use_color`]).

use std::io::Write as _;

use crate::findings::{Finding, Severity, Status};

/// How findings and reports are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputFormat {
    /// One readable line per finding.
    Text,
    /// One JSON object per line.
    Json,
}

/// How `node-diag findings` prints findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FindingsFormat {
    /// One compact line per finding (about 120 columns).
    Text,
    /// The compact line, then the full summary, the evidence, the fix, the node and the
    /// status on indented lines.
    Wide,
    /// One JSON object per line, each finding as the agent sent it.
    Json,
}

/// `--color`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColorChoice {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset or empty.
    Auto,
    Always,
    Never,
}

/// Whether to colour: `always` and `never` as said (a flag overrides `NO_COLOR`, as
/// <https://no-color.org> asks); `auto` on a terminal without a non-empty `NO_COLOR`.
pub(crate) fn use_color(choice: ColorChoice, is_terminal: bool, no_color: Option<&str>) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal && no_color.is_none_or(str::is_empty),
    }
}

/// The width the compact line is cut to.
pub(crate) const LINE_WIDTH: usize = 120;
/// Column widths of the compact line (a longer value pushes the rest right).
const WHAT_WIDTH: usize = 26;
const WHERE_WIDTH: usize = 30;
const COUNT_WIDTH: usize = 5;
/// The summary keeps at least this much when the columns before it overflow.
const MIN_SUMMARY: usize = 20;

const RESET: &str = "\x1b[0m";

fn paint(text: &str, color: Option<&str>) -> String {
    match color {
        Some(c) => format!("{c}{text}{RESET}"),
        None => text.to_string(),
    }
}

fn severity_tag(s: Severity) -> (&'static str, &'static str) {
    match s {
        Severity::Critical => ("CRIT", "\x1b[1;31m"),
        Severity::Warning => ("WARN", "\x1b[33m"),
        Severity::Info => ("INFO", "\x1b[36m"),
    }
}

fn status_tag(s: Status) -> Option<(&'static str, &'static str)> {
    match s {
        Status::Active => None,
        Status::Resolved => Some(("RESOLVED", "\x1b[32m")),
        Status::Superseded => Some(("SUPERSEDED", "\x1b[2m")),
    }
}

/// `HH:MM:SS` of an RFC 3339 time (UTC, as the agent writes it).
fn clock(t: &str) -> &str {
    t.split_once('T')
        .and_then(|(_, rest)| rest.get(..8))
        .unwrap_or("--:--:--")
}

/// Who the finding is about: each end's pod where this node knows it, else its address
/// (`shop/cart → 10.0.0.2:80`, `10.0.0.1 → 10.0.0.2:80`), then its interface or listener.
pub(crate) fn ends(f: &Finding) -> String {
    let port = f.dport.map(|p| format!(":{p}")).unwrap_or_default();
    let local = f
        .pod
        .as_ref()
        .map(|p| p.to_string())
        .or_else(|| f.src.map(|a| a.to_string()));
    let peer = f
        .peer_pod
        .as_ref()
        .map(|p| format!("{p}{port}"))
        .or_else(|| f.service.as_ref().map(|s| format!("svc {s}")))
        .or_else(|| {
            f.dst.map(|a| match a {
                std::net::IpAddr::V6(_) if !port.is_empty() => format!("[{a}]{port}"),
                _ => format!("{a}{port}"),
            })
        });
    let mut out = match (local, peer) {
        (Some(l), Some(p)) => format!("{l} → {p}"),
        (Some(l), None) => l,
        (None, Some(p)) => format!("→ {p}"),
        (None, None) => String::new(),
    };
    let mut add = |s: String| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&s);
    };
    if let Some(i) = &f.interface {
        add(format!("dev {i}"));
    }
    if let Some(l) = f.listener {
        add(format!("listener {l}"));
    }
    out
}

/// The summary without the flow it opens with: `Connection to 10.0.0.2:80 was refused:
/// the packet arrived...` becomes `the packet arrived...`, since the line names the flow
/// already.
pub(crate) fn short_summary(f: &Finding) -> &str {
    let s = f.summary.as_str();
    if let Some((head, rest)) = s.split_once(": ")
        && head.starts_with("Connection ")
        && f.dst.is_some_and(|d| head.contains(&d.to_string()))
        && !rest.is_empty()
    {
        return rest;
    }
    s
}

/// `text` cut to `width` characters, an ellipsis marking the cut.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn pad(text: &str, width: usize) -> String {
    let n = text.chars().count();
    format!("{text}{}", " ".repeat(width.saturating_sub(n)))
}

/// The compact line of `node-diag findings`: `HH:MM:SS SEV kind/layer ends ×count
/// summary`, at most [`LINE_WIDTH`] columns (the summary is cut to fit). An ended
/// finding shows when it ended and `RESOLVED`/`SUPERSEDED` before its summary.
#[cfg(test)]
pub(crate) fn compact_line(f: &Finding, color: bool) -> String {
    compact_line_on(f, None, color)
}

/// Width of the node column of `node-diag findings --cluster` (longer names are cut).
pub(crate) const NODE_WIDTH: usize = 14;

/// [`compact_line`] with a node column after the time (`--cluster`): `HH:MM:SS node SEV
/// ...`, the summary shortened so the line keeps its width.
pub(crate) fn compact_line_on(f: &Finding, node: Option<&str>, color: bool) -> String {
    let node = node.map(|n| pad(&fit(n, NODE_WIDTH), NODE_WIDTH) + " ");
    let node = node.as_deref().unwrap_or("");
    let time = match f.status {
        Status::Active => clock(&f.last_seen),
        _ => clock(f.resolved_at.as_deref().unwrap_or(&f.last_seen)),
    };
    let (sev, sev_color) = severity_tag(f.severity);
    let what = format!("{}/{}", f.kind, f.layer);
    // A long kind/layer borrows from the padding of the next column, so the count and
    // summary stay aligned when it can.
    let borrowed = what.chars().count().saturating_sub(WHAT_WIDTH);
    let what = pad(&what, WHAT_WIDTH);
    let place = pad(&ends(f), WHERE_WIDTH.saturating_sub(borrowed));
    let count = format!("{:>COUNT_WIDTH$}", format!("×{}", f.count));
    let head_len = [time, sev, &what, &place, &count]
        .iter()
        .map(|s| s.chars().count() + 1)
        .sum::<usize>()
        + node.chars().count();
    let room = LINE_WIDTH.saturating_sub(head_len).max(MIN_SUMMARY);
    let (status, summary) = match status_tag(f.status) {
        Some((word, c)) => {
            let text = fit(&format!("{word}: {}", short_summary(f)), room);
            // The marker keeps its colour even where the summary is cut into it.
            let split = text.len().min(word.len() + 1);
            let (marker, rest) = text.split_at(split);
            (paint(marker, color.then_some(c)), rest.to_string())
        }
        None => (String::new(), fit(short_summary(f), room)),
    };
    format!(
        "{time} {node}{} {what} {place} {count} {status}{summary}",
        paint(sev, color.then_some(sev_color))
    )
}

/// `-o wide`: the compact line, then the whole summary, the evidence, the fix, the node
/// and the status, indented and wrapped.
#[cfg(test)]
pub(crate) fn wide_lines(f: &Finding, node: Option<&str>, color: bool) -> String {
    wide_lines_on(f, node, false, color)
}

/// [`wide_lines`], with the node column on the first line when `node_column`
/// (`--cluster`).
pub(crate) fn wide_lines_on(
    f: &Finding,
    node: Option<&str>,
    node_column: bool,
    color: bool,
) -> String {
    const INDENT: usize = 14;
    let mut out = compact_line_on(f, node.filter(|_| node_column), color);
    let mut field = |name: &str, value: &str| {
        if value.is_empty() {
            return;
        }
        let label = format!("    {name}: ");
        out.push('\n');
        out.push_str(&pad(&label, INDENT));
        out.push_str(&wrap(value, LINE_WIDTH - INDENT, INDENT));
    };
    field("summary", &f.summary);
    let evidence = match serde_json::to_value(&f.evidence) {
        Ok(serde_json::Value::Object(map)) => map
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    field("evidence", &evidence);
    field("fix", &f.remediation);
    let mut about = vec![format!("node {}", node.unwrap_or("-"))];
    if let Some(ns) = f.netns {
        about.push(format!("netns {ns}"));
    }
    if let Some(s) = &f.service {
        about.push(format!("service {s}"));
    }
    if let Some(b) = f.backend {
        let port = f.backend_port.map(|p| format!(":{p}")).unwrap_or_default();
        about.push(format!("backend {b}{port}"));
    }
    if let (Some(s), Some(p)) = (f.src, f.sport) {
        about.push(format!("last source {s}:{p}"));
    }
    field("where", &about.join(", "));
    let status = match &f.resolved_at {
        Some(at) => format!("{} at {at}", f.status),
        None => f.status.to_string(),
    };
    let seen = if f.count == 1 && f.first_seen == f.last_seen {
        format!("seen once at {}", f.last_seen)
    } else {
        format!(
            "seen {} times from {} to {}",
            f.count, f.first_seen, f.last_seen
        )
    };
    field("status", &format!("{status}, {seen}"));
    out
}

/// Wraps `text` at spaces to `width` columns, continuation lines indented by `indent`.
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut col = 0;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let n = word.chars().count();
        if col > 0 && col + 1 + n > width {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = 0;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += n;
    }
    out
}

/// Prints one finding on stdout in `format` and flushes, so a pipe sees it at once. A
/// closed stdout must not stop the agent (findings stay on `/findings`), so write errors
/// are ignored.
pub(crate) fn print_finding(f: &Finding, format: OutputFormat) {
    let line = match format {
        OutputFormat::Json => serde_json::to_string(f).unwrap_or_default(),
        OutputFormat::Text => text_line(f),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The readable one-liner of the text output.
pub(crate) fn text_line(f: &Finding) -> String {
    let flow = match (&f.src, &f.dst, f.dport) {
        (Some(s), Some(d), Some(p)) => {
            let sport = f.sport.map(|p| format!(":{p}")).unwrap_or_default();
            format!(" {s}{sport} -> {d}:{p}")
        }
        _ => f
            .listener
            .map(|l| format!(" listener {l}"))
            .unwrap_or_default(),
    };
    let repeat = if f.count > 1 {
        format!(" (x{})", f.count)
    } else {
        String::new()
    };
    let iface = f
        .interface
        .as_ref()
        .map(|i| format!(" interface={i}"))
        .unwrap_or_default();
    let pods = match (&f.pod, &f.peer_pod) {
        (None, None) => String::new(),
        (Some(p), None) => format!(" pod={p}"),
        (None, Some(q)) => format!(" peer_pod={q}"),
        (Some(p), Some(q)) => format!(" pod={p} peer_pod={q}"),
    };
    let iface = format!("{iface}{pods}");
    if f.status != Status::Active {
        return format!(
            "{} {} {} layer={}{}{}: {}",
            f.resolved_at.as_deref().unwrap_or(&f.last_seen),
            f.status.as_str().to_uppercase(),
            f.kind,
            f.layer,
            iface,
            flow,
            f.summary
        );
    }
    format!(
        "{} {:<8} {} layer={}{}{}{}: {} Fix: {}",
        f.last_seen,
        f.severity.as_str().to_uppercase(),
        f.kind,
        f.layer,
        iface,
        flow,
        repeat,
        f.summary,
        f.remediation
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::fixtures::refused;

    fn pod(ns: &str, name: &str) -> crate::pods::PodRef {
        crate::pods::PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("u-{name}"),
        }
    }

    /// A refused finding as the agent words it, seen at 07:35:57.
    fn worded() -> Finding {
        let mut f = refused(4000);
        f.summary = "Connection to 10.0.0.2:80 was refused: the packet arrived and the peer answered the SYN with a RST, so nothing listens on that port.".into();
        f.last_seen = "2026-12-05T07:35:57.123Z".into();
        f.count = 3;
        f
    }

    #[test]
    fn compact_line_names_the_flow_once_and_fits() {
        let line = compact_line(&worded(), false);
        assert_eq!(
            line,
            "07:35:57 WARN tcp_refused/listener       10.0.0.1 → 10.0.0.2:80            ×3 \
             the packet arrived and the peer answered …"
        );
        assert_eq!(line.chars().count(), LINE_WIDTH);
        // A short summary is not padded.
        let mut short = worded();
        short.summary = "no listener".into();
        assert!(compact_line(&short, false).ends_with("×3 no listener"));
    }

    #[test]
    fn compact_line_prefers_pods_and_shows_interfaces_and_listeners() {
        let mut f = worded();
        f.pod = Some(pod("shop", "cart-7d9f"));
        f.peer_pod = Some(pod("shop", "db-0"));
        assert!(
            compact_line(&f, false).contains(" shop/cart-7d9f → shop/db-0:80 "),
            "{}",
            compact_line(&f, false)
        );
        f.peer_pod = None;
        assert!(compact_line(&f, false).contains(" shop/cart-7d9f → 10.0.0.2:80 "));

        let mut mtu = worded();
        (mtu.src, mtu.dst, mtu.dport) = (None, None, None);
        mtu.pod = Some(pod("shop", "cart"));
        mtu.interface = Some("eth0".into());
        mtu.summary = "eth0 MTU 1500 is above the overlay's 1450".into();
        (mtu.kind, mtu.layer) = (
            crate::findings::Kind::OverlayMtuMismatch,
            crate::findings::Layer::OverlayMtu,
        );
        let line = compact_line(&mtu, false);
        assert!(line.contains(" shop/cart dev eth0 "), "{line}");
        // The long kind/layer takes from the next column's padding: counts stay aligned.
        let column = |l: &str| l.chars().position(|c| c == '×');
        assert_eq!(
            column(&line),
            column(&compact_line(&worded(), false)),
            "{line}"
        );
        assert!(
            line.ends_with("eth0 MTU 1500 is above the overlay's 1450"),
            "{line}"
        );

        let mut reset = worded();
        (reset.src, reset.dst, reset.dport) = (None, None, None);
        reset.listener = Some("10.0.0.2:443".parse().unwrap());
        assert!(compact_line(&reset, false).contains(" listener 10.0.0.2:443 "));

        let mut v6 = worded();
        v6.dst = Some("fd00::2".parse().unwrap());
        v6.summary = "Connection to [fd00::2]:80 was refused: nothing listens.".into();
        let line = compact_line(&v6, false);
        assert!(line.contains(" 10.0.0.1 → [fd00::2]:80 "), "{line}");
        assert!(line.ends_with(" nothing listens."), "{line}");
    }

    #[test]
    fn ended_findings_are_marked() {
        let mut f = worded();
        f.status = Status::Resolved;
        f.resolved_at = Some("2026-12-05T07:41:02.000Z".into());
        let line = compact_line(&f, false);
        assert!(line.starts_with("07:41:02 WARN"), "{line}");
        assert!(line.contains(" ×3 RESOLVED: the packet arrived"), "{line}");
        assert_eq!(line.chars().count(), LINE_WIDTH);
        f.status = Status::Superseded;
        assert!(compact_line(&f, false).contains(" SUPERSEDED: the packet"));
    }

    #[test]
    fn colour_only_where_asked() {
        let mut f = worded();
        assert!(!compact_line(&f, false).contains('\x1b'));
        let coloured = compact_line(&f, true);
        assert!(coloured.contains("\x1b[33mWARN\x1b[0m"), "{coloured:?}");
        f.severity = Severity::Critical;
        assert!(compact_line(&f, true).contains("\x1b[1;31mCRIT\x1b[0m"));
        f.status = Status::Resolved;
        assert!(compact_line(&f, true).contains("\x1b[32mRESOLVED:\x1b[0m"));

        use ColorChoice::*;
        assert!(use_color(Auto, true, None));
        assert!(
            use_color(Auto, true, Some("")),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_color(Auto, true, Some("1")), "NO_COLOR");
        assert!(!use_color(Auto, false, None), "not a terminal");
        assert!(use_color(Always, false, Some("1")), "the flag wins");
        assert!(!use_color(Never, true, None));
    }

    #[test]
    fn the_cluster_view_puts_the_node_after_the_time_and_keeps_the_width() {
        let f = worded();
        let plain = compact_line(&f, false);
        let line = compact_line_on(&f, Some("node-a"), false);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[1], "node-a", "{line}");
        assert_eq!(cols[2], plain.split_whitespace().nth(1).unwrap());
        assert!(line.chars().count() <= LINE_WIDTH, "{line}");
        // Long names are cut so the columns stay aligned.
        let long = compact_line_on(&f, Some("ip-10-0-12-34.eu-west-1.compute.internal"), false);
        let column = |l: &str| l.find(" WARN ").map(|i| l[..i].chars().count());
        assert_eq!(column(&long), column(&line), "{long}\n{line}");
        let wide = wide_lines_on(&f, Some("node-a"), true, false);
        assert_eq!(wide.lines().next().unwrap(), line);
        assert!(wide.contains("node node-a"), "{wide}");
    }

    #[test]
    fn wide_adds_summary_evidence_fix_node_and_status() {
        let mut f = worded();
        f.remediation = "Check the destination's listener (`ss -tlnp` in the pod).".into();
        f.evidence = crate::findings::Evidence::Received(
            serde_json::from_str(r#"{"errno":"ECONNREFUSED","rst_received":true,"rule":null}"#)
                .unwrap(),
        );
        let text = wide_lines(&f, Some("node-a"), false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], compact_line(&f, false));
        assert!(
            lines[1].starts_with("    summary:  Connection to 10.0.0.2:80 was refused: the packet")
        );
        // Wrapped under itself, every word kept.
        assert!(lines[2].starts_with(&" ".repeat(14)), "{text}");
        assert!(!lines[2].starts_with(&" ".repeat(15)), "{text}");
        assert_eq!(
            format!("{} {}", &lines[1][14..], lines[2].trim_start()),
            f.summary
        );
        assert_eq!(
            lines[3],
            "    evidence: errno=ECONNREFUSED rst_received=true"
        );
        assert!(
            lines[4].starts_with("    fix:      Check the destination's listener"),
            "{text}"
        );
        assert!(
            lines[5].contains("node node-a, netns 1, last source 10.0.0.1:4000"),
            "{text}"
        );
        assert!(lines[6].contains("active, seen 3 times from "), "{text}");
        assert!(
            lines.iter().all(|l| l.chars().count() <= LINE_WIDTH),
            "{text}"
        );
        assert!(wide_lines(&f, None, false).contains("node -,"));
    }

    #[test]
    fn active_line_has_severity_flow_and_fix() {
        let mut f = refused(4000);
        f.count = 3;
        let line = text_line(&f);
        assert_eq!(
            line,
            "1970-01-01T00:00:00.000Z WARNING  tcp_refused layer=listener 10.0.0.1:4000 -> 10.0.0.2:80 (x3): no listener Fix: start it"
        );
    }

    #[test]
    fn pods_are_named_namespace_slash_name() {
        let mut f = refused(4000);
        f.pod = Some(crate::pods::PodRef {
            namespace: "shop".into(),
            name: "cart-7d9f".into(),
            uid: "u-1".into(),
        });
        assert_eq!(
            text_line(&f),
            "1970-01-01T00:00:00.000Z WARNING  tcp_refused layer=listener pod=shop/cart-7d9f 10.0.0.1:4000 -> 10.0.0.2:80: no listener Fix: start it"
        );
    }

    #[test]
    fn an_ended_line_says_how_it_ended() {
        for (status, word) in [
            (Status::Resolved, "RESOLVED"),
            (Status::Superseded, "SUPERSEDED"),
        ] {
            let mut f = refused(4000);
            f.status = status;
            f.resolved_at = Some("later".into());
            let line = text_line(&f);
            assert!(
                line.starts_with(&format!("later {word} tcp_refused")),
                "{line}"
            );
        }
    }
}
