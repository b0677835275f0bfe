//! The hook table: every tracepoint program the agent attaches, what it needs, and what
//! the agent loses without it (for the degraded warning and `doctor`), plus the settings
//! the loader writes into the programs' read-only globals.

/// Consecutive full-size retransmits of one socket that make a PMTUD stall: with the
/// 200 ms minimum RTO doubling, the third comes about 1.4 s into the stall.
pub(crate) const FULLSIZE_RETRANS_THRESHOLD: u32 = 3;

/// One eBPF program and the tracepoint it attaches to.
pub(crate) struct Hook {
    pub(crate) program: &'static str,
    pub(crate) category: &'static str,
    pub(crate) name: &'static str,
    /// What the agent loses without it, for the warning and `doctor`.
    pub(crate) feature: &'static str,
    /// Attached as a raw tracepoint (arguments, not the record), which needs BTF offsets.
    /// Raw because the hook is busy: its program reads the arguments straight from its
    /// context, where a regular tracepoint's fields cost a probe read each.
    pub(crate) raw: bool,
    /// A raw tracepoint attached as a BTF tracepoint (`tp_btf`): the verifier knows its
    /// arguments' types, so the program reads the structs they point to with plain loads.
    /// Loading it needs the kernel's BTF.
    pub(crate) btf: bool,
    /// A raw tracepoint's leading argument types as its program reads them (see
    /// [`super::btf::Btf::trace_args`]); checked against this kernel's BTF before attaching.
    pub(crate) args: &'static [&'static str],
    /// What gives the same evidence on kernels without this tracepoint, if anything.
    pub(crate) fallback: Option<Fallback>,
    /// No tracepoint exists for it: the program is attached by fentry to the kernel
    /// function `name` (found in the kernel's BTF), and `category` is `fentry`.
    pub(crate) fentry: bool,
}

/// A program attached where a hook's tracepoint is missing or lacks what its program
/// reads: chosen by probing (the tracepoint absent from tracefs or its arguments in BTF
/// not as expected, the fallback's function or arguments present in the kernel's BTF),
/// never by version number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fallback {
    pub(crate) program: &'static str,
    /// The kernel function (fentry) or tracepoint (BTF tracepoint) it is attached to.
    pub(crate) function: &'static str,
    pub(crate) kind: FallbackKind,
    /// fexit programs the fallback's program reads from, loaded beside it where their
    /// functions are in the kernel's BTF; without them it gives coarser evidence.
    pub(crate) with: &'static [Companion],
}

/// An fexit program on kernel function `function` that serves a fallback. Several may
/// serve one function, for its prototypes across kernels: the one whose `args` (the
/// arguments before the return value) match this kernel's BTF is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Companion {
    pub(crate) program: &'static str,
    pub(crate) function: &'static str,
    pub(crate) args: usize,
    /// The function exists on some kernels only (folded into another since): where it
    /// is absent, nothing is lost.
    pub(crate) optional: bool,
    /// What the fallback loses without it, for the warning and `doctor`.
    pub(crate) feature: &'static str,
}

/// The companions of every fallback.
pub(crate) fn companions() -> impl Iterator<Item = &'static Companion> {
    HOOKS
        .iter()
        .filter_map(|h| h.fallback)
        .flat_map(|f| f.with.iter())
}

/// What drops by other eBPF programs read as without their companions.
const OTHER_PROGRAMS: &str =
    "drops by other eBPF programs (tc, cgroup egress) named: they read NOT_SPECIFIED";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FallbackKind {
    /// fentry on a kernel function, attached by its BTF id.
    Fentry,
    /// A BTF tracepoint reading fewer arguments: these leading types.
    Tracepoint(&'static [&'static str]),
}

impl Fallback {
    /// How `doctor` and the logs name it.
    pub(crate) fn mechanism(&self) -> String {
        let mut m = match self.kind {
            FallbackKind::Fentry => format!("fentry on {}", self.function),
            FallbackKind::Tracepoint(_) => {
                format!("{} by its drop site (kallsyms)", self.function)
            }
        };
        let functions = self.companion_functions();
        if !functions.is_empty() {
            m.push_str(&format!(" with fexit on {}", functions.join(", ")));
        }
        m
    }

    /// The kernel functions its companions attach to, each once (a function's programs
    /// are listed together).
    pub(crate) fn companion_functions(&self) -> Vec<&'static str> {
        let mut functions: Vec<&'static str> = self.with.iter().map(|c| c.function).collect();
        functions.dedup();
        functions
    }
}

impl Hook {
    pub(crate) fn label(&self) -> String {
        format!("{}:{}", self.category, self.name)
    }

    /// How `doctor` names the hook: its tracepoint, or the function an fentry program is
    /// attached to.
    pub(crate) fn describe(&self) -> String {
        if self.fentry {
            format!("fentry {}", self.name)
        } else {
            format!("tracepoint {}", self.label())
        }
    }
}

pub(crate) const HOOKS: &[Hook] = &[
    Hook {
        program: "nd_set_state",
        category: "sock",
        name: "inet_sock_set_state",
        feature: "connect tracking (refused/timeout/unreachable verdicts)",
        raw: true,
        btf: false,
        args: &["*sock", "int", "int"],
        fallback: None,
        fentry: false,
    },
    Hook {
        program: "nd_err_report",
        category: "sock",
        name: "inet_sk_error_report",
        feature: "refused/unreachable/reset verdicts",
        raw: true,
        btf: true,
        args: &["*sock"],
        // Before 5.14 the tracepoint's call sites called the socket's callback directly.
        fallback: Some(Fallback {
            program: "nd_err_fentry",
            function: "sock_def_error_report",
            kind: FallbackKind::Fentry,
            with: &[],
        }),
        fentry: false,
    },
    Hook {
        program: "nd_retransmit",
        category: "tcp",
        name: "tcp_retransmit_skb",
        feature: "connect timeout verdicts",
        raw: true,
        btf: true,
        args: &["*sock", "*sk_buff"],
        fallback: None,
        fentry: false,
    },
    Hook {
        program: "nd_rcv_reset",
        category: "tcp",
        name: "tcp_receive_reset",
        feature: "received reset counts",
        raw: true,
        btf: false,
        args: &["*sock"],
        fallback: None,
        fentry: false,
    },
    Hook {
        program: "nd_snd_reset",
        category: "tcp",
        name: "tcp_send_reset",
        feature: "sent reset counts",
        raw: true,
        btf: false,
        args: &["*sock", "*sk_buff"],
        fallback: None,
        fentry: false,
    },
    Hook {
        program: "nd_kfree_skb",
        category: "skb",
        name: "kfree_skb",
        feature: "drop counts and firewall/routing evidence",
        raw: true,
        btf: true,
        args: &["*sk_buff", "*void", "skb_drop_reason"],
        // Before 5.17 no reason: the drop's location stands for it (see `drop_sites`).
        fallback: Some(Fallback {
            program: "nd_kfree_site",
            function: "kfree_skb",
            kind: FallbackKind::Tracepoint(&["*sk_buff", "*void"]),
            with: &[
                Companion {
                    program: "nd_tc_shot4",
                    function: "tcf_classify",
                    args: 4,
                    optional: false,
                    feature: OTHER_PROGRAMS,
                },
                Companion {
                    program: "nd_tc_shot5",
                    function: "tcf_classify",
                    args: 5,
                    optional: false,
                    feature: OTHER_PROGRAMS,
                },
                Companion {
                    program: "nd_tc_shot_ingress",
                    function: "tcf_classify_ingress",
                    args: 5,
                    optional: true,
                    feature: OTHER_PROGRAMS,
                },
                Companion {
                    program: "nd_cgroup_shot",
                    function: "__cgroup_bpf_run_filter_skb",
                    args: 3,
                    optional: false,
                    feature: OTHER_PROGRAMS,
                },
            ],
        }),
        fentry: false,
    },
    Hook {
        program: "nd_icmp_send",
        category: "icmp",
        name: "icmp_send",
        feature: "ICMP unreachable evidence",
        raw: false,
        btf: false,
        args: &[],
        // Before 5.14 `__icmp_send` (where the tracepoint is now) had no tracepoint.
        fallback: Some(Fallback {
            program: "nd_icmp_fentry",
            function: "__icmp_send",
            kind: FallbackKind::Fentry,
            with: &[],
        }),
        fentry: false,
    },
    Hook {
        program: "nd_icmp6_send",
        category: "fentry",
        name: "icmp6_send",
        feature: "ICMPv6 unreachable evidence",
        raw: false,
        btf: false,
        args: &[],
        // ICMPv6 has no tracepoint where its errors are sent.
        fallback: None,
        fentry: true,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_companion_function_is_looked_up_in_btf() {
        for c in companions() {
            assert!(
                super::super::btf::KFUNCS.contains(&c.function),
                "{} is not among btf::KFUNCS",
                c.function
            );
        }
    }

    #[test]
    fn every_fentry_fallback_function_is_looked_up_in_btf() {
        for hook in HOOKS {
            if let Some(f) = hook.fallback
                && f.kind == FallbackKind::Fentry
            {
                assert!(
                    super::super::btf::KFUNCS.contains(&f.function),
                    "{} is not among btf::KFUNCS",
                    f.function
                );
            }
            if hook.fentry {
                assert!(
                    super::super::btf::KFUNCS.contains(&hook.name),
                    "{} is not among btf::KFUNCS",
                    hook.name
                );
            }
        }
    }
}
