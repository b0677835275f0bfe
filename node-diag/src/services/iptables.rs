//! kube-proxy's iptables mode, read back from `iptables-save` / `ip6tables-save` text
//! (nft-backed or legacy: both print the same format).
//!
//! What is taken, by rule shape (options in any order, since `iptables-save` reorders
//! what kube-proxy wrote and normalises `-d 10.96.0.10` to `-d 10.96.0.10/32`):
//!
//! - nat `KUBE-SERVICES`, comment `"<svc> cluster IP"`, `"<svc> external IP"` or
//!   `"<svc> loadbalancer IP"`, with `-d`, `-p`, `--dport` and a jump to the Service's
//!   `KUBE-SVC-`, `KUBE-EXT-`, `KUBE-FW-` (or pre-1.24 `KUBE-XLB-`) chain: a frontend.
//!   The masquerade rules with the same comment jump to `KUBE-MARK-MASQ` and are skipped.
//! - `KUBE-SEP-*`, `-j DNAT --to-destination <ip:port>`, comment `"<svc>"`: a backend.
//!   When a DNAT rule has no comment, its Service comes from the `KUBE-SVC-*` chain that
//!   jumps to it.
//! - any chain (filter `KUBE-SERVICES` for ClusterIPs, `KUBE-EXTERNAL-SERVICES` for
//!   external IPs and NodePorts), comment `"<svc> has no endpoints"`: the Service has no
//!   endpoints; with `-d` and `--dport`, also one of its frontends. `"has no local
//!   endpoints"` (externalTrafficPolicy Local) is not the same thing and is skipped.
//!
//! Every other line (masquerade marks, `KUBE-NODEPORTS`, statistic and `recent`
//! matches, firewall chains, other software's rules) is skipped, and so is a line that
//! does not tokenise or whose addresses do not parse: one odd rule never costs the rest.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use tracing::debug;

use super::{
    catalog::{ServiceCatalog, is_service_port_name},
    proto_number,
};

/// The options of one `-A` rule that matter here.
#[derive(Debug, Default)]
struct Rule {
    chain: String,
    /// `-d` when it names one address (`/32`, `/128` or none) and is not negated.
    dst: Option<IpAddr>,
    proto: Option<u8>,
    dport: Option<u16>,
    comment: Option<String>,
    jump: Option<String>,
    to_destination: Option<String>,
}

/// Parses `iptables-save` (or `ip6tables-save`) output into a catalog.
pub(crate) fn parse(text: &str) -> ServiceCatalog {
    let mut catalog = ServiceCatalog::new();
    let mut table = String::new();
    // For DNAT rules without a comment: which Service each KUBE-SVC chain is, which
    // KUBE-SEP chains it jumps to, and where each KUBE-SEP chain sends.
    let mut svc_chain_names: HashMap<String, (String, u8)> = HashMap::new();
    let mut svc_chain_seps: Vec<(String, String)> = Vec::new();
    let mut anonymous_seps: HashMap<String, (u8, SocketAddr)> = HashMap::new();

    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(t) = line.strip_prefix('*') {
            t.clone_into(&mut table);
            continue;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let Some(rule) = parse_rule(rest) else {
            debug!(
                line = n + 1,
                "iptables-save: skipped a rule that does not tokenise"
            );
            continue;
        };
        let jump = rule.jump.as_deref().unwrap_or("");
        let comment = rule.comment.as_deref().unwrap_or("");

        if let Some(name) = comment.strip_suffix(" has no endpoints") {
            if let (true, Some(proto)) = (is_service_port_name(name), rule.proto) {
                let addr = rule.dst.zip(rule.dport).map(SocketAddr::from);
                catalog.mark_no_endpoints(name, proto, addr);
            }
            continue;
        }
        if table != "nat" {
            continue;
        }
        if rule.chain == "KUBE-SERVICES" {
            let name = [" cluster IP", " external IP", " loadbalancer IP"]
                .iter()
                .find_map(|suffix| comment.strip_suffix(suffix));
            let to_service = ["KUBE-SVC-", "KUBE-EXT-", "KUBE-FW-", "KUBE-XLB-"]
                .iter()
                .any(|p| jump.starts_with(p));
            if let (Some(name), true, Some(ip), Some(proto), Some(port)) =
                (name, to_service, rule.dst, rule.proto, rule.dport)
                && is_service_port_name(name)
            {
                catalog.add_frontend(name, proto, SocketAddr::new(ip, port));
                if jump.starts_with("KUBE-SVC-") {
                    svc_chain_names.insert(jump.to_owned(), (name.to_owned(), proto));
                }
            }
        } else if rule.chain.starts_with("KUBE-SVC-") && jump.starts_with("KUBE-SEP-") {
            svc_chain_seps.push((rule.chain.clone(), jump.to_owned()));
        } else if rule.chain.starts_with("KUBE-SEP-") && jump == "DNAT" {
            let Some(dest) = rule.to_destination.as_deref().and_then(parse_dnat_dest) else {
                debug!(
                    line = n + 1,
                    "iptables-save: skipped a DNAT without a usable --to-destination"
                );
                continue;
            };
            let Some(proto) = rule.proto else { continue };
            if is_service_port_name(comment) {
                catalog.add_backend(comment, proto, dest);
            } else {
                anonymous_seps.insert(rule.chain.clone(), (proto, dest));
            }
        }
    }

    for (svc_chain, sep_chain) in svc_chain_seps {
        if let (Some((name, proto)), Some((sep_proto, dest))) = (
            svc_chain_names.get(&svc_chain),
            anonymous_seps.get(&sep_chain),
        ) && proto == sep_proto
        {
            catalog.add_backend(name, *proto, *dest);
        }
    }
    catalog
}

/// The options of one rule (after `-A `), or `None` when the quoting is broken.
fn parse_rule(rest: &str) -> Option<Rule> {
    let tokens = tokenize(rest)?;
    let mut it = tokens.into_iter().peekable();
    let mut rule = Rule {
        chain: it.next()?,
        ..Rule::default()
    };
    let mut negate = false;
    while let Some(tok) = it.next() {
        let negated = std::mem::take(&mut negate);
        match tok.as_str() {
            "!" => negate = true,
            "-d" | "--destination" => {
                let value = it.next()?;
                if !negated {
                    rule.dst = single_address(&value);
                }
            }
            "-p" | "--protocol" => {
                let value = it.next()?;
                if !negated {
                    rule.proto = proto_number(&value);
                }
            }
            "--dport" | "--destination-port" => {
                let value = it.next()?;
                if !negated {
                    rule.dport = value.parse().ok();
                }
            }
            "--comment" => rule.comment = Some(it.next()?),
            "-j" | "--jump" => rule.jump = Some(it.next()?),
            "--to-destination" => rule.to_destination = Some(it.next()?),
            // Options and values this parser does not know are skipped one token at a
            // time: none of their values is spelled like an option above.
            _ => {}
        }
    }
    Some(rule)
}

/// Splits an `iptables-save` rule into words: blanks separate, double quotes group (a
/// comment with spaces), a backslash escapes the next character inside quotes.
/// `None` for an unterminated quote.
pub(super) fn tokenize(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else {
            return Some(out);
        };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => word.push(chars.next()?),
                    c => word.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
        }
        out.push(word);
    }
}

/// `10.96.0.10`, `10.96.0.10/32` or `fd00::1/128`: one address. A wider prefix is not a
/// Service address.
fn single_address(value: &str) -> Option<IpAddr> {
    let (ip, prefix) = match value.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (value, None),
    };
    let ip: IpAddr = ip.parse().ok()?;
    let full = if ip.is_ipv4() { "32" } else { "128" };
    match prefix {
        None => Some(ip),
        Some(p) if p == full => Some(ip),
        Some(_) => None,
    }
}

/// `10.244.1.5:8080` or `[fd00::5]:8080`. A DNAT to an address alone (no port) keeps
/// the Service port, which kube-proxy never writes; such a rule is skipped.
fn parse_dnat_dest(value: &str) -> Option<SocketAddr> {
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::fixtures::{
        IP6TABLES_LEGACY_SAVE, IP6TABLES_NFT_SAVE, IPTABLES_LEGACY_SAVE_V4, IPTABLES_NFT_SAVE_V4,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn check_v4(c: &ServiceCatalog) {
        let web = c
            .by_frontend(ip("10.96.0.20"), 6, 80)
            .expect("web by ClusterIP");
        assert_eq!(web.name, "default/web:http");
        assert!(!web.no_endpoints);
        assert_eq!(
            web.backends,
            vec![sa("10.244.1.5:8080"), sa("10.244.2.6:8080")]
        );
        assert_eq!(
            web.frontends,
            vec![sa("10.96.0.20:80"), sa("192.168.99.20:80")],
            "ClusterIP and external IP, not the NodePort"
        );
        assert_eq!(
            c.by_backend(ip("10.244.2.6"), 6, 8080).map(|s| &s.name[..]),
            Some("default/web:http")
        );
        assert!(
            c.by_frontend(ip("10.96.0.20"), 17, 80).is_none(),
            "wrong protocol"
        );

        let empty = c
            .by_frontend(ip("10.96.0.30"), 6, 80)
            .expect("no-endpoint Service");
        assert_eq!(empty.name, "default/empty:http");
        assert!(empty.no_endpoints);
        assert!(empty.backends.is_empty());

        let dns = c
            .by_frontend(ip("10.96.0.10"), 17, 53)
            .expect("kube-dns over UDP");
        assert_eq!(dns.name, "kube-system/kube-dns:dns");
        assert_eq!(
            dns.backends,
            vec![sa("10.244.1.3:53")],
            "affinity rules skipped"
        );

        let unnamed = c
            .by_frontend(ip("10.96.0.40"), 6, 8080)
            .expect("unnamed port");
        assert_eq!(unnamed.name, "default/unnamed");
        assert_eq!(unnamed.backends, vec![sa("10.244.2.7:80")]);

        let lb = c
            .by_frontend(ip("203.0.113.10"), 6, 443)
            .expect("load-balancer IP");
        assert_eq!(lb.name, "default/lb:https");
        assert_eq!(lb.backends, vec![sa("10.244.2.8:8443")]);

        assert_eq!(c.len(), 5);
        assert_eq!(c.no_endpoints_count(), 1);
    }

    fn check_v6(c: &ServiceCatalog) {
        let web = c.by_frontend(ip("fd00:96::20"), 6, 80).expect("web6");
        assert_eq!(web.name, "default/web6:http");
        assert_eq!(
            web.backends,
            vec![sa("[fd00:244::5]:8080"), sa("[fd00:244::6]:8080")]
        );
        let empty = c.by_frontend(ip("fd00:96::30"), 6, 80).expect("empty6");
        assert!(empty.no_endpoints);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn iptables_nft_save_v4() {
        check_v4(&parse(IPTABLES_NFT_SAVE_V4));
    }

    #[test]
    fn iptables_legacy_save_v4() {
        check_v4(&parse(IPTABLES_LEGACY_SAVE_V4));
    }

    #[test]
    fn ip6tables_save_nft_and_legacy() {
        check_v6(&parse(IP6TABLES_NFT_SAVE));
        check_v6(&parse(IP6TABLES_LEGACY_SAVE));
    }

    #[test]
    fn junk_lines_cost_nothing_else() {
        let junk = [
            "-A KUBE-SERVICES -d 10.96.0.99/32 -p tcp -m comment --comment \"unterminated",
            "-A KUBE-SEP-XXXXXXXXXXXXXXXX -p tcp -m comment --comment \"default/x:y\" -j DNAT --to-destination notanaddress",
            "-A KUBE-SEP-YYYYYYYYYYYYYYYY -p tcp -m comment --comment \"default/x:y\" -j DNAT",
            "-A KUBE-SERVICES -d 10.96.0.0/16 -p tcp -m comment --comment \"default/wide:p cluster IP\" -m tcp --dport 80 -j KUBE-SVC-ZZZZZZZZZZZZZZZZ",
            "-A KUBE-SERVICES ! -d 10.96.0.98/32 -p tcp -m comment --comment \"default/neg:p cluster IP\" -m tcp --dport 80 -j KUBE-SVC-ZZZZZZZZZZZZZZZZ",
            "-A KUBE-SERVICES -d 10.96.0.97/32 -p tcp -m comment --comment \"not a service cluster IP\" -m tcp --dport 80 -j KUBE-SVC-ZZZZZZZZZZZZZZZZ",
            "-A",
            "-A KUBE-SERVICES -p",
            "garbage line",
            "*",
            ":KUBE-SVC-ZZZZZZZZZZZZZZZZ - [0:0]",
        ]
        .join("\n");
        // Junk before, inside the nat table and after.
        let text = format!(
            "{junk}\n{}\n{junk}\n",
            IPTABLES_NFT_SAVE_V4.replace("COMMIT", &format!("{junk}\nCOMMIT"))
        );
        check_v4(&parse(&text));
    }

    #[test]
    fn dnat_without_comment_is_named_through_its_svc_chain() {
        let text = "*nat\n\
            -A KUBE-SERVICES -d 10.96.0.60/32 -p tcp -m comment --comment \"ns/old:web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
            -A KUBE-SVC-AAAAAAAAAAAAAAAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-BBBBBBBBBBBBBBBB\n\
            -A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.244.3.3:8080\n\
            COMMIT\n";
        let c = parse(text);
        let svc = c
            .by_backend(ip("10.244.3.3"), 6, 8080)
            .expect("named via KUBE-SVC");
        assert_eq!(svc.name, "ns/old:web");
    }

    #[test]
    fn tokenizer() {
        assert_eq!(
            tokenize(r#"X -m comment --comment "a \"b\" c" -j Y"#).unwrap(),
            vec!["X", "-m", "comment", "--comment", "a \"b\" c", "-j", "Y"]
        );
        assert!(tokenize(r#"X --comment "open"#).is_none());
    }
}
