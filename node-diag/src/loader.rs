//! Loads and attaches the eBPF programs: resolves every tracepoint field offset from
//! tracefs and every kernel struct offset from BTF into [`Config`], writes it into the
//! programs' read-only global, and attaches each tracepoint. A tracepoint this kernel
//! lacks disables the features that need it rather than the agent.

use std::path::PathBuf;

use aya::{Ebpf, EbpfLoader, programs::TracePoint};
use node_diag_common::{Config, GLOBAL_CONFIG, TupleOffsets};
use tracing::{info, warn};

use crate::{
    btf::Btf,
    tracefs::{self, DropReasons, Format, TracefsError},
};

/// The eBPF object built by `build.rs` (aya-build) for this target.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-diag"));

/// Drop reasons whose SYN drops are remembered per flow as timeout evidence.
pub const FLOW_DROP_REASONS: &[&str] = &[
    "NETFILTER_DROP",
    "IP_NOROUTE",
    "IP_INNOROUTES",
    "IP_OUTNOROUTES",
    "NEIGH_CREATEFAIL",
    "NEIGH_FAILED",
    "NEIGH_QUEUEFULL",
    "NEIGH_DEAD",
    "IP_RPFILTER",
    "PKT_TOO_BIG",
];

/// One eBPF program and the tracepoint it attaches to.
pub struct Hook {
    pub program: &'static str,
    pub category: &'static str,
    pub name: &'static str,
    /// What the agent loses without it, for the warning and `doctor`.
    pub feature: &'static str,
}

pub const HOOKS: &[Hook] = &[
    Hook {
        program: "nd_set_state",
        category: "sock",
        name: "inet_sock_set_state",
        feature: "connect tracking (refused/timeout/unreachable verdicts)",
    },
    Hook {
        program: "nd_err_report",
        category: "sock",
        name: "inet_sk_error_report",
        feature: "refused/unreachable/reset verdicts",
    },
    Hook {
        program: "nd_retransmit",
        category: "tcp",
        name: "tcp_retransmit_skb",
        feature: "connect timeout verdicts",
    },
    Hook {
        program: "nd_rcv_reset",
        category: "tcp",
        name: "tcp_receive_reset",
        feature: "received reset counts",
    },
    Hook {
        program: "nd_snd_reset",
        category: "tcp",
        name: "tcp_send_reset",
        feature: "sent reset counts",
    },
    Hook {
        program: "nd_kfree_skb",
        category: "skb",
        name: "kfree_skb",
        feature: "drop counts and firewall/routing evidence",
    },
    Hook {
        program: "nd_icmp_send",
        category: "icmp",
        name: "icmp_send",
        feature: "ICMP unreachable evidence",
    },
];

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {0} is missing from the object")]
    MissingProgram(&'static str),
    #[error("loading eBPF program {program} failed: {source}")]
    Program {
        program: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("no tracepoint could be attached; the agent would see nothing")]
    NothingAttached,
}

/// Everything the rest of the agent needs from the kernel side.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub drop_reasons: DropReasons,
    pub tracefs: PathBuf,
    pub mounted_tracefs: bool,
    pub attached: Vec<&'static str>,
    /// `(tracepoint, error)` for hooks that could not be attached.
    pub degraded: Vec<(String, String)>,
    pub btf_ok: bool,
}

pub struct Options {
    pub syn_retrans_threshold: u32,
    /// Report only for the namespaces in the scope map (see `netlink::local_scope`).
    pub scoped: bool,
}

pub fn load(opts: &Options) -> Result<Loaded, LoadError> {
    let (root, mounted) = tracefs::ensure_mounted()?;
    if mounted {
        info!(path = %root.display(), "mounted tracefs");
    }
    let mut config = Config {
        syn_retrans_threshold: opts.syn_retrans_threshold.max(1),
        ..Config::default()
    };
    let mut degraded = Vec::new();
    let mut usable = Vec::new();
    let mut drop_reasons = DropReasons::default();
    for hook in HOOKS {
        match Format::load(&root, hook.category, hook.name)
            .and_then(|fmt| fill_config(&mut config, hook, &fmt, &mut drop_reasons))
        {
            Ok(()) => usable.push(hook),
            Err(e) => {
                warn!(tracepoint = %format!("{}:{}", hook.category, hook.name), error = %e, lost = hook.feature, "tracepoint unusable; feature disabled");
                degraded.push((format!("{}:{}", hook.category, hook.name), e.to_string()));
            }
        }
    }
    for name in FLOW_DROP_REASONS {
        if let Some(v) = drop_reasons.value(name)
            && v < 256
        {
            config.flow_reasons[(v / 64) as usize] |= 1 << (v % 64);
        }
    }
    let btf_ok = match Btf::from_sys_fs().and_then(|btf| fill_btf(&mut config, &btf)) {
        Ok(()) => {
            // Scoping needs each socket's netns, which needs the BTF offsets.
            config.scope_enabled = u32::from(opts.scoped);
            true
        }
        Err(e) => {
            warn!(error = %e, "kernel BTF unusable: no netns/interface attribution or packet evidence");
            degraded.push(("btf".to_string(), e.to_string()));
            false
        }
    };

    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_CONFIG, &config, true)
        .load(EBPF_OBJECT)?;
    let mut attached = Vec::new();
    for hook in usable {
        let program: &mut TracePoint = ebpf
            .program_mut(hook.program)
            .ok_or(LoadError::MissingProgram(hook.program))?
            .try_into()
            .map_err(|source| LoadError::Program {
                program: hook.program,
                source,
            })?;
        program.load().map_err(|source| LoadError::Program {
            program: hook.program,
            source,
        })?;
        match program.attach(hook.category, hook.name) {
            Ok(_) => attached.push(hook.program),
            Err(e) => {
                warn!(program = hook.program, error = %e, lost = hook.feature, "attach failed; feature disabled");
                degraded.push((format!("{}:{}", hook.category, hook.name), e.to_string()));
            }
        }
    }
    if attached.is_empty() {
        return Err(LoadError::NothingAttached);
    }
    Ok(Loaded {
        ebpf,
        drop_reasons,
        tracefs: root,
        mounted_tracefs: mounted,
        attached,
        degraded,
        btf_ok,
    })
}

fn tuple(fmt: &Format) -> Result<TupleOffsets, TracefsError> {
    Ok(TupleOffsets {
        sport: fmt.offset("sport")?,
        dport: fmt.offset("dport")?,
        family: fmt.offset("family")?,
        saddr: fmt.offset("saddr")?,
        daddr: fmt.offset("daddr")?,
        saddr_v6: fmt.offset("saddr_v6")?,
        daddr_v6: fmt.offset("daddr_v6")?,
        _pad: 0,
    })
}

fn fill_config(
    c: &mut Config,
    hook: &Hook,
    fmt: &Format,
    reasons: &mut DropReasons,
) -> Result<(), TracefsError> {
    match hook.program {
        "nd_set_state" => {
            c.set_state = tuple(fmt)?;
            c.set_state_skaddr = fmt.offset("skaddr")?;
            c.set_state_oldstate = fmt.offset("oldstate")?;
            c.set_state_newstate = fmt.offset("newstate")?;
            c.set_state_protocol = fmt.offset("protocol")?;
        }
        "nd_err_report" => {
            c.err_report = tuple(fmt)?;
            c.err_report_error = fmt.offset("error")?;
            c.err_report_protocol = fmt.offset("protocol")?;
        }
        "nd_retransmit" => {
            c.retrans = tuple(fmt)?;
            c.retrans_skaddr = fmt.offset("skaddr")?;
            c.retrans_state = fmt.offset("state")?;
        }
        "nd_rcv_reset" => {
            c.rcv_reset = tuple(fmt)?;
            c.rcv_reset_skaddr = fmt.offset("skaddr")?;
        }
        "nd_snd_reset" => {
            c.snd_reset_skaddr = fmt.offset("skaddr")?;
            c.snd_reset_skbaddr = fmt.offset("skbaddr")?;
        }
        "nd_kfree_skb" => {
            c.kfree_skbaddr = fmt.offset("skbaddr")?;
            c.kfree_protocol = fmt.offset("protocol")?;
            c.kfree_reason = fmt.offset("reason")?;
            *reasons = DropReasons::from_format(fmt);
        }
        "nd_icmp_send" => {
            c.icmp_skbaddr = fmt.offset("skbaddr")?;
            c.icmp_type = fmt.offset("type")?;
            c.icmp_code = fmt.offset("code")?;
            c.icmp_saddr = fmt.offset("saddr")?;
            c.icmp_daddr = fmt.offset("daddr")?;
            c.icmp_sport = fmt.offset("sport")?;
            c.icmp_dport = fmt.offset("dport")?;
        }
        _ => {}
    }
    Ok(())
}

fn fill_btf(c: &mut Config, btf: &Btf) -> Result<(), crate::btf::BtfError> {
    c.sk_net = btf.path_offset("sock", "__sk_common.skc_net.net")?;
    c.net_inum = btf.path_offset("net", "ns.inum")?;
    c.skb_dev = btf.member_offset("sk_buff", "dev")?;
    c.skb_head = btf.member_offset("sk_buff", "head")?;
    c.skb_network_header = btf.member_offset("sk_buff", "network_header")?;
    c.dev_ifindex = btf.member_offset("net_device", "ifindex")?;
    c.dev_net = btf.path_offset("net_device", "nd_net.net")?;
    c.btf_ok = 1;
    Ok(())
}

/// Whether `fmt` has every field the hook's program reads (for `doctor`).
pub fn check_format(hook: &Hook, fmt: &Format) -> Result<(), TracefsError> {
    fill_config(
        &mut Config::default(),
        hook,
        fmt,
        &mut DropReasons::default(),
    )
}
