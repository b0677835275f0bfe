//! A small parser for the OpenMetrics / Prometheus text exposition: enough to
//! find one series (`name{label="value",...}`) and read its value. Labels are
//! compared as a set, so their order does not matter.

use std::collections::BTreeMap;

use crate::Error;

/// Label names to values.
pub type Labels = BTreeMap<String, String>;

/// One sample line of an exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Series name as printed (with any `_total`, `_bucket`... suffix).
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Its value.
    pub value: f64,
}

/// Parses `name` or `name{a="x",b="y"}`.
pub fn parse_series(series: &str) -> Result<(String, Labels), String> {
    let (name, labels, rest) = split_series(series.trim())?;
    if !rest.trim().is_empty() {
        return Err(format!("trailing text after series in {series:?}"));
    }
    Ok((name, labels))
}

/// Splits the series off the start of a sample line: (name, labels, rest).
fn split_series(line: &str) -> Result<(String, Labels, &str), String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return Err(format!("no metric name in {line:?}"));
    }
    let rest = &line[name_end..];
    let Some(body) = rest.strip_prefix('{') else {
        return Ok((name.to_owned(), Labels::new(), rest));
    };
    let mut labels = Labels::new();
    let mut chars = body.char_indices().peekable();
    loop {
        // Skip separators and spaces before a label name (or the closing brace).
        while let Some(&(_, c)) = chars.peek() {
            if c == ',' || c.is_whitespace() {
                chars.next();
            } else {
                break;
            }
        }
        let Some((start, c)) = chars.next() else {
            return Err(format!("unterminated label set in {line:?}"));
        };
        if c == '}' {
            return Ok((name.to_owned(), labels, &body[start + 1..]));
        }
        let mut label = String::from(c);
        loop {
            match chars.next() {
                Some((_, '=')) => break,
                Some((_, c)) => label.push(c),
                None => return Err(format!("label without value in {line:?}")),
            }
        }
        if !matches!(chars.next(), Some((_, '"'))) {
            return Err(format!("unquoted value for label {label:?} in {line:?}"));
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                Some((_, '"')) => break,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("dangling escape in {line:?}")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label value in {line:?}")),
            }
        }
        labels.insert(label.trim().to_owned(), value);
    }
}

/// Parses every sample line of an exposition (comments and blank lines are
/// skipped; `# EOF` ends it).
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line == "# EOF" {
            break;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = split_series(line)?;
        let value_text = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| format!("no value in {line:?}"))?;
        let value = value_text
            .parse::<f64>()
            .map_err(|_| format!("bad value {value_text:?} in {line:?}"))?;
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(samples)
}

/// The value of the series `series` (e.g.
/// `node_diag_tcp_resets_total{direction="sent"}`) in `text`, if present. Fails when
/// `series` or `text` cannot be parsed.
pub fn find_value(text: &str, series: &str) -> Result<Option<f64>, Error> {
    let (name, labels) = parse_series(series)
        .map_err(|e| Error::Exposition(format!("bad series {series:?}: {e}")))?;
    let samples = parse_exposition(text).map_err(|e| Error::Exposition(format!("{e}\n{text}")))?;
    Ok(samples
        .into_iter()
        .find(|s| s.name == name && s.labels == labels)
        .map(|s| s.value))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP node_diag_tcp_connect_failures TCP connects that failed.
# TYPE node_diag_tcp_connect_failures counter
node_diag_tcp_connect_failures_total{reason="refused"} 3
node_diag_tcp_connect_failures_total{reason="timeout"} 1.5e1
# TYPE node_diag_findings counter
node_diag_findings_total{kind="tcp_refused",layer="listener",severity="warning"} 2
node_diag_events_lost_total 0
node_diag_odd{msg="a \"quoted\", {brace} \\ x",k="v"} +Inf 1700000000
# EOF
ignored 1
"#;

    #[test]
    fn finds_labelled_series() {
        assert_eq!(
            find_value(
                TEXT,
                r#"node_diag_tcp_connect_failures_total{reason="refused"}"#
            )
            .unwrap(),
            Some(3.0)
        );
        assert_eq!(
            find_value(
                TEXT,
                r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#
            )
            .unwrap(),
            Some(15.0)
        );
    }

    #[test]
    fn labels_are_a_set() {
        let series =
            r#"node_diag_findings_total{severity="warning",kind="tcp_refused",layer="listener"}"#;
        assert_eq!(find_value(TEXT, series).unwrap(), Some(2.0));
        // A subset of the labels is a different series.
        assert_eq!(
            find_value(TEXT, r#"node_diag_findings_total{kind="tcp_refused"}"#).unwrap(),
            None
        );
    }

    #[test]
    fn unlabelled_escaped_and_missing() {
        assert_eq!(
            find_value(TEXT, "node_diag_events_lost_total").unwrap(),
            Some(0.0)
        );
        assert_eq!(
            find_value(
                TEXT,
                r#"node_diag_odd{k="v",msg="a \"quoted\", {brace} \\ x"}"#
            )
            .unwrap(),
            Some(f64::INFINITY)
        );
        assert_eq!(
            find_value(
                TEXT,
                r#"node_diag_tcp_connect_failures_total{reason="unreachable"}"#
            )
            .unwrap(),
            None
        );
        assert_eq!(
            find_value(TEXT, "ignored").unwrap(),
            None,
            "nothing after # EOF"
        );
    }

    #[test]
    fn rejects_malformed() {
        assert!(parse_series("x{a=1}").is_err());
        assert!(parse_series(r#"x{a="1""#).is_err());
        assert!(parse_exposition("x{a=\"1\"}").is_err());
        assert!(parse_exposition("x notanumber").is_err());
    }
}
