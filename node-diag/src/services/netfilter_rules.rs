//! The netfilter rules that drop or reject, with their packet counters, in the calling
//! thread's network namespace: what names the rule behind a `firewall` (or `service`)
//! verdict. Two snapshots around a flow's drop tell which rule counted it ([`rose`]).
//!
//! Three rule sets, each read with the tool that shows its comments:
//!
//! - iptables-nft: `iptables-nft-save -c` / `ip6tables-nft-save -c` give each rule's
//!   comment (an xtables match that `nft` cannot print) and counters; the rule handle
//!   is the nft handle of the rule at the same position of the same chain.
//! - iptables-legacy: `iptables-legacy-save -c` / `ip6tables-legacy-save -c`, only when
//!   the kernel lists legacy tables here. Legacy rules have no handle: the rule number
//!   (`iptables -L --line-numbers`) stands in.
//! - native nftables: `nft -j list table`, for every table iptables-nft does not own
//!   (the table list dumped over netlink), kube-proxy's own left out.
//!   Only rules with a `counter` count: a drop by a rule without one is never named.
//!
//! A rule counts here when its verdict is to drop or reject (`-j DROP`, `-j REJECT`,
//! `drop`, `reject`): the rules that jump there, or accept, never end a packet.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::Duration,
};

use serde::Serialize;

use super::{
    iptables::tokenize,
    nft_netlink, nftables,
    sources::{find_tool, run},
};

/// A dump of a namespace's rules is small next to kube-proxy's; past this the tool is
/// stuck (the xtables lock) and the rule stays unnamed.
const DEADLINE: Duration = Duration::from_secs(3);

/// Which rule set a rule is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) enum Backend {
    #[serde(rename = "iptables-nft")]
    IptablesNft,
    #[serde(rename = "iptables-legacy")]
    IptablesLegacy,
    #[serde(rename = "nftables")]
    Nftables,
}

/// One dropping or rejecting rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Rule {
    pub(crate) backend: Backend,
    /// `ip`, `ip6`, `inet`...: the nftables family (iptables' are `ip` and `ip6`).
    pub(crate) family: String,
    pub(crate) table: String,
    pub(crate) chain: String,
    /// The nftables rule handle (iptables-nft and nftables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) handle: Option<u64>,
    /// The rule's number in its chain, from 1 (iptables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) position: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) comment: Option<String>,
    /// `drop` or `reject`.
    pub(crate) verdict: &'static str,
    #[serde(skip)]
    pub(crate) packets: u64,
    /// The rule as printed, without counters: it identifies the rule across snapshots.
    #[serde(skip)]
    text: String,
}

impl Rule {
    fn id(&self) -> (Backend, &str, &str, &str, &str) {
        (
            self.backend,
            &self.family,
            &self.table,
            &self.chain,
            &self.text,
        )
    }
}

/// The dropping and rejecting rules of one namespace at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) rules: Vec<Rule>,
}

/// Reads every rule set in the calling thread's namespace. Missing tools and tables
/// leave their rules out: never an error, only fewer rules to name.
pub(crate) fn snapshot() -> Snapshot {
    let mut rules = Vec::new();
    let mut iptables_nft_tables = HashSet::new();
    for (tool, family) in [("iptables-nft-save", "ip"), ("ip6tables-nft-save", "ip6")] {
        let Some(text) = dump(tool, &["-c"]) else {
            continue;
        };
        iptables_nft_tables.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix('*'))
                .map(|t| (family.to_owned(), t.trim().to_owned())),
        );
        rules.extend(parse_iptables_save(&text, Backend::IptablesNft, family));
    }
    for (tool, family, names) in [
        ("iptables-legacy-save", "ip", "ip_tables_names"),
        ("ip6tables-legacy-save", "ip6", "ip6_tables_names"),
    ] {
        // Not running the tool without legacy tables keeps it from loading modules.
        let listed = std::fs::read_to_string(Path::new("/proc/thread-self/net").join(names))
            .is_ok_and(|s| !s.trim().is_empty());
        if listed && let Some(text) = dump(tool, &["-c"]) {
            rules.extend(parse_iptables_save(&text, Backend::IptablesLegacy, family));
        }
    }
    if let Some(nft) = nft_tables() {
        // iptables-nft's rules are nft rules too: they take their handles from here.
        for rule in rules
            .iter_mut()
            .filter(|r| r.backend == Backend::IptablesNft)
        {
            let key = (
                rule.family.clone(),
                rule.table.clone(),
                rule.chain.clone(),
                rule.position.unwrap_or(0),
            );
            rule.handle = nft.positions.get(&key).copied();
        }
        rules.extend(
            nft.rules
                .into_iter()
                .filter(|r| !iptables_nft_tables.contains(&(r.family.clone(), r.table.clone()))),
        );
    }
    Snapshot { rules }
}

/// The rules of every nftables table but kube-proxy's own (`ip`/`ip6 kube-proxy`), each
/// read with `nft -j list table`. Not `nft -j list ruleset`: beside kube-proxy's
/// nftables mode at scale it takes seconds (see [`super::nft_netlink`]), and
/// kube-proxy's table has no counted dropping rule to name. `None` when no table could
/// be listed.
fn nft_tables() -> Option<NftRules> {
    let tables = nft_netlink::tables(DEADLINE).ok()?;
    let mut all = NftRules::default();
    for t in tables
        .iter()
        .filter(|t| !(matches!(t.family, "ip" | "ip6") && t.name == nftables::TABLE))
    {
        if let Some(json) = dump("nft", &["-j", "list", "table", t.family, &t.name]) {
            let part = parse_nft_json(&json);
            all.rules.extend(part.rules);
            all.positions.extend(part.positions);
        }
    }
    Some(all)
}

fn dump(tool: &str, args: &[&str]) -> Option<String> {
    let path = find_tool(tool)?;
    run(&path, args, DEADLINE)
        .ok()
        .filter(|o| o.status.success())
        .map(|o| o.stdout)
}

/// The dropping and rejecting rules of an `iptables-save -c` dump.
fn parse_iptables_save(text: &str, backend: Backend, family: &str) -> Vec<Rule> {
    let mut out = Vec::new();
    let mut table = String::new();
    let mut positions: HashMap<String, u32> = HashMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_owned();
            positions.clear();
            continue;
        }
        let Some((packets, rest)) = counters(line) else {
            continue;
        };
        let Some(words) = tokenize(rest) else {
            continue;
        };
        let Some(["-A", chain]) = words.get(..2).map(|w| [w[0].as_str(), w[1].as_str()]) else {
            continue;
        };
        let position = positions.entry(chain.to_owned()).or_insert(0);
        *position += 1;
        let after = |flag: &str| {
            words
                .windows(2)
                .find(|w| w[0] == flag)
                .map(|w| w[1].clone())
        };
        let verdict = match after("-j").as_deref() {
            Some("DROP") => "drop",
            Some("REJECT") => "reject",
            _ => continue,
        };
        out.push(Rule {
            backend,
            family: family.to_owned(),
            table: table.clone(),
            chain: chain.to_owned(),
            handle: None,
            position: Some(*position),
            comment: after("--comment"),
            verdict,
            packets,
            text: rest.to_owned(),
        });
    }
    out
}

/// `[12:720] -A ...`: the packet count and the rule.
fn counters(line: &str) -> Option<(u64, &str)> {
    let rest = line.strip_prefix('[')?;
    let (counts, rule) = rest.split_once(']')?;
    let (packets, _bytes) = counts.split_once(':')?;
    Some((packets.parse().ok()?, rule.trim()))
}

/// What `nft -j list table` holds for naming: its counted dropping rules, and every
/// rule's handle by position (for iptables-nft's rules).
#[derive(Default)]
struct NftRules {
    rules: Vec<Rule>,
    positions: HashMap<(String, String, String, u32), u64>,
}

fn parse_nft_json(json: &str) -> NftRules {
    let mut out = NftRules::default();
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return out;
    };
    let items = value["nftables"].as_array().cloned().unwrap_or_default();
    let mut counts: HashMap<(String, String, String), u32> = HashMap::new();
    for item in items {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let text = |k: &str| rule[k].as_str().unwrap_or_default().to_owned();
        let (family, table, chain) = (text("family"), text("table"), text("chain"));
        let Some(handle) = rule["handle"].as_u64() else {
            continue;
        };
        let position = counts
            .entry((family.clone(), table.clone(), chain.clone()))
            .or_insert(0);
        *position += 1;
        out.positions.insert(
            (family.clone(), table.clone(), chain.clone(), *position),
            handle,
        );
        let exprs = rule["expr"].as_array().cloned().unwrap_or_default();
        let verdict = exprs.iter().find_map(|e| {
            if e.get("drop").is_some() {
                Some("drop")
            } else if e.get("reject").is_some() {
                Some("reject")
            } else {
                None
            }
        });
        let packets = exprs
            .iter()
            .find_map(|e| e.get("counter")?.get("packets")?.as_u64());
        let (Some(verdict), Some(packets)) = (verdict, packets) else {
            continue;
        };
        out.rules.push(Rule {
            backend: Backend::Nftables,
            family,
            table,
            chain,
            handle: Some(handle),
            position: None,
            comment: rule["comment"].as_str().map(str::to_owned),
            verdict,
            packets,
            text: handle.to_string(),
        });
    }
    out
}

/// The one rule whose counter rose from `before` to `after`, and by how much; `None`
/// when none or several did (then the drop is not attributable to one rule). A rule
/// new in `after` rose by its whole count.
pub(crate) fn rose(before: &Snapshot, after: &Snapshot) -> Option<(Rule, u64)> {
    let old: HashMap<_, u64> = before.rules.iter().map(|r| (r.id(), r.packets)).collect();
    let mut risen = after.rules.iter().filter_map(|r| {
        let delta = r
            .packets
            .saturating_sub(old.get(&r.id()).copied().unwrap_or(0));
        (delta > 0).then(|| (r.clone(), delta))
    });
    let one = risen.next()?;
    risen.next().is_none().then_some(one)
}

/// The NetworkPolicy a rule's comment names: `np <namespace>/<name>`, or the
/// `policy`/`networkpolicy` forms some controllers write.
pub(crate) fn policy_of(comment: &str) -> Option<String> {
    let mut words = comment.split_whitespace();
    let first = words.next()?.trim_end_matches(':').to_ascii_lowercase();
    if !matches!(first.as_str(), "np" | "policy" | "networkpolicy") {
        return None;
    }
    let name = words.next()?;
    let (ns, policy) = name.split_once('/')?;
    (!ns.is_empty() && !policy.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = r#"# Generated by iptables-nft-save v1.8.9 (nf_tables) on Sat Dec  5 03:00:00 2026
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [4:240]
[0:0] -A OUTPUT -d 10.0.0.9/32 -j ACCEPT
[3:180] -A OUTPUT -p tcp -m tcp --dport 5432 -m comment --comment "np default/deny-db" -j REJECT --reject-with icmp-port-unreachable
[1:60] -A OUTPUT -p udp -j DROP
COMMIT
"#;

    #[test]
    fn iptables_save_keeps_dropping_rules_with_position_and_comment() {
        let rules = parse_iptables_save(SAVE, Backend::IptablesNft, "ip");
        assert_eq!(rules.len(), 2);
        let r = &rules[0];
        assert_eq!(
            (
                r.table.as_str(),
                r.chain.as_str(),
                r.position,
                r.verdict,
                r.packets
            ),
            ("filter", "OUTPUT", Some(2), "reject", 3)
        );
        assert_eq!(r.comment.as_deref(), Some("np default/deny-db"));
        assert_eq!(rules[1].comment, None);
    }

    #[test]
    fn nft_json_keeps_counted_dropping_rules_and_every_position() {
        let json = r#"{"nftables": [{"rule": {"family": "inet", "table": "f", "chain": "out", "handle": 4, "expr": [{"counter": {"packets": 2, "bytes": 120}}, {"accept": null}]}},
            {"rule": {"family": "inet", "table": "f", "chain": "out", "handle": 7, "comment": "np default/deny-db", "expr": [{"counter": {"packets": 5, "bytes": 300}}, {"reject": {"type": "tcp reset"}}]}},
            {"rule": {"family": "inet", "table": "f", "chain": "out", "handle": 9, "expr": [{"drop": null}]}}]}"#;
        let nft = parse_nft_json(json);
        assert_eq!(nft.rules.len(), 1, "the uncounted drop cannot be named");
        assert_eq!(nft.rules[0].handle, Some(7));
        assert_eq!(nft.rules[0].comment.as_deref(), Some("np default/deny-db"));
        let key = ("inet".into(), "f".into(), "out".into(), 3);
        assert_eq!(nft.positions.get(&key), Some(&9));
    }

    fn with_counts(counts: &[u64]) -> Snapshot {
        let mut rules = parse_iptables_save(SAVE, Backend::IptablesNft, "ip");
        for (r, &c) in rules.iter_mut().zip(counts) {
            r.packets = c;
        }
        Snapshot { rules }
    }

    #[test]
    fn only_a_single_risen_rule_is_named() {
        let before = with_counts(&[3, 1]);
        let (rule, delta) = rose(&before, &with_counts(&[4, 1])).unwrap();
        assert_eq!((rule.position, delta), (Some(2), 1));
        assert_eq!(rose(&before, &before), None);
        assert_eq!(rose(&before, &with_counts(&[4, 2])), None, "ambiguous");
    }

    #[test]
    fn policy_names_from_comments() {
        assert_eq!(
            policy_of("np default/deny-db").as_deref(),
            Some("default/deny-db")
        );
        assert_eq!(
            policy_of("NetworkPolicy: prod/web").as_deref(),
            Some("prod/web")
        );
        assert_eq!(policy_of("default/web:http has no endpoints"), None);
        assert_eq!(policy_of("cali:Xy12"), None);
    }
}
