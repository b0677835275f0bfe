//! Network-policy rules as a policy controller writes them, for the tests that drop or
//! reject a flow by one and expect the agent to name it: a rule commented
//! `np default/deny-db` (Calico's and kube-router's comment style), in a chain of its own
//! for a pod's ingress (Calico's `cali-tw-<interface>`) or straight in `FORWARD`.
//! The rules live in the test's namespaces and go with them.

use crate::cmd;

/// The comment a policy controller gives its rules: the policy's namespace and name.
pub const COMMENT: &str = "np default/deny-db";
/// Calico names a workload's ingress policy chain after its interface (the pods' veth
/// on the node side is `vpod0` in every topology).
pub const INGRESS_CHAIN: &str = "cali-tw-vpod0";

/// Appends to `chain` of `netns`, through `tool` (`iptables-nft`, `ip6tables-nft`,
/// `iptables-legacy`...), a rule that ends TCP to `port` with `target` (`DROP`, or
/// `REJECT` and its options), commented as the policy's.
pub fn rule(netns: &str, tool: &str, chain: &str, port: u16, target: &[&str]) {
    let port = port.to_string();
    let mut argv = vec![
        tool,
        "-A",
        chain,
        "-p",
        "tcp",
        "--dport",
        &port,
        "-m",
        "comment",
        "--comment",
        COMMENT,
        "-j",
    ];
    argv.extend_from_slice(target);
    cmd::run_in(netns, &argv);
}

/// The ingress policy of the pod behind `vpod0` in node `netns`, Calico-style:
/// `FORWARD` sends what leaves by the pod's veth through [`INGRESS_CHAIN`], whose rule
/// ends TCP to `port` with `target` (see [`rule`]).
pub fn ingress(netns: &str, tool: &str, port: u16, target: &[&str]) {
    cmd::run_in(netns, &[tool, "-N", INGRESS_CHAIN]);
    cmd::run_in(
        netns,
        &[tool, "-A", "FORWARD", "-o", "vpod0", "-j", INGRESS_CHAIN],
    );
    rule(netns, tool, INGRESS_CHAIN, port, target);
}
