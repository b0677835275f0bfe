//! The classic Prometheus text format (0.0.4) of an OpenMetrics exposition: what the
//! agent serves to a scraper that does not accept OpenMetrics, and what the tests compare
//! against. Only metadata changes; samples pass through untouched.

use alloc::{collections::BTreeMap, format, string::String};

/// Rewrites OpenMetrics metadata into the 0.0.4 text format: metadata names the samples
/// (`_total` counters, `_info` gauges), no `# UNIT`, no `# EOF`.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut renamed: BTreeMap<String, (String, &str)> = BTreeMap::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            let entry = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                other => (String::from(name), other),
            };
            renamed.insert(String::from(name), entry);
        }
    }
    let mut out = String::new();
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, _)) = rest.split_once(' ')
            && let Some((new, kind)) = renamed.get(name)
        {
            out.push_str(&format!("# TYPE {new} {kind}\n"));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ")
            && let Some((name, help)) = rest.split_once(' ')
            && let Some((new, _)) = renamed.get(name)
        {
            out.push_str(&format!("# HELP {new} {help}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
