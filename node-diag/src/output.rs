//! How findings are printed: one line per finding, readable text or one JSON object.
//! The agent prints findings as it makes them and `node-diag findings` prints what it
//! fetched from an agent, both through [`print_finding`].

use std::io::Write as _;

use crate::findings::{Finding, Status};

/// How findings and reports are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputFormat {
    /// One readable line per finding.
    Text,
    /// One JSON object per line.
    Json,
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
