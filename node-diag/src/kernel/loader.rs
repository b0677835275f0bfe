//! Loads and attaches the eBPF programs: resolves every tracepoint field offset from
//! tracefs and every kernel struct offset from BTF into [`Config`], writes it (and the
//! eBPF log level) into the programs' read-only globals, and attaches each tracepoint. A
//! tracepoint this kernel lacks disables the features that need it rather than the agent.

use std::path::PathBuf;

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        BtfTracePoint, FEntry, FExit, ProgramError, RawTracePoint, SchedClassifier, TracePoint,
    },
};
use node_diag_common::{Config, GLOBAL_CONFIG};
use tracing::{debug, info, warn};

use super::{
    btf::Btf,
    drop_family, drop_sites, ebpf_log,
    hooks::{Companion, FULLSIZE_RETRANS_THRESHOLD, Fallback, FallbackKind, HOOKS, Hook},
    tracefs::{self, DropReasons, Format, TracefsError},
};

mod settings;

pub(crate) use self::settings::{check_args, check_format, plain_loads};
use self::settings::{fill_btf, fill_casts, fill_config};

/// The eBPF object built by `build.rs` (aya-build) for this target.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-diag"));

/// The embedded eBPF object, as built (marked calls not yet rewritten).
#[cfg(test)]
pub(crate) fn embedded_object() -> &'static [u8] {
    EBPF_OBJECT
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(transparent)]
    Rewrite(#[from] super::rewrite::RewriteError),
    #[error("loading the eBPF object failed: {0}{hint}", hint = super::memlock::hint())]
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
pub(crate) struct Loaded {
    pub(crate) ebpf: Ebpf,
    pub(crate) drop_reasons: DropReasons,
    pub(crate) tracefs: PathBuf,
    pub(crate) mounted_tracefs: bool,
    pub(crate) attached: Vec<&'static str>,
    /// `(tracepoint, error)` for hooks that could not be attached.
    pub(crate) degraded: Vec<(String, String)>,
    pub(crate) btf_ok: bool,
    /// The programs' log stream, when `--ebpf-log` is not off.
    pub(crate) ebpf_log: Option<ebpf_log::Logs>,
}

pub(crate) struct Options {
    pub(crate) syn_retrans_threshold: u32,
    /// Report only for the namespaces in the scope map (see `netlink::local_scope`).
    pub(crate) scoped: bool,
    /// Written into the programs' `AYA_LOG_LEVEL` global: `off` makes every log call
    /// dead code to the verifier.
    pub(crate) ebpf_log: ebpf_log::Level,
}

/// The object configured for this kernel, loaded into user space (nothing in the
/// kernel yet), with what configuring it found.
struct Prepared {
    ebpf: Ebpf,
    /// The kernel's BTF as aya reads it (relocations, BTF tracepoints); `None` without.
    kernel_btf: Option<aya::Btf>,
    tracefs: PathBuf,
    mounted_tracefs: bool,
    /// Each hook that can run here, with the fallback it runs as (if not its tracepoint).
    usable: Vec<(&'static Hook, Option<Fallback>)>,
    degraded: Vec<(String, String)>,
    drop_reasons: DropReasons,
    btf_ok: bool,
    /// The companions of the fallbacks in `usable` that fit this kernel's prototypes.
    companions: Vec<&'static Companion>,
}

fn prepare(opts: &Options) -> Result<Prepared, LoadError> {
    super::memlock::lift();
    let (root, mounted) = tracefs::ensure_mounted()?;
    if mounted {
        info!(path = %root.display(), "mounted tracefs");
    }
    let mut config = Config {
        syn_retrans_threshold: opts.syn_retrans_threshold.max(1),
        fullsize_retrans_threshold: FULLSIZE_RETRANS_THRESHOLD,
        verdict_window_ns: node_diag_common::VERDICT_WINDOW_NS,
        ..Config::default()
    };
    let mut degraded = Vec::new();
    let mut usable = Vec::new();
    let mut drop_reasons = DropReasons::default();
    let btf = Btf::from_sys_fs();
    for hook in HOOKS {
        if hook.fentry {
            match fentry_target(hook, btf.as_ref().ok()) {
                Ok(()) => usable.push((hook, None)),
                Err(e) => {
                    warn!(function = hook.name, error = %e, lost = hook.feature, "fentry unusable; feature disabled");
                    degraded.push((hook.label(), e));
                }
            }
            continue;
        }
        let checked = Format::load(&root, hook.category, hook.name)
            .and_then(|fmt| fill_config(&mut config, hook, &fmt, &mut drop_reasons))
            .map_err(|e| e.to_string())
            .and_then(|()| match &btf {
                Ok(btf) => check_args(hook, btf),
                // Raw hooks are left out at attach time, with the BTF error.
                Err(_) => Ok(()),
            });
        match checked {
            Ok(()) => usable.push((hook, None)),
            Err(e) => match btf.as_ref().ok().and_then(|b| fallback(hook, b)) {
                Some(f) => {
                    info!(tracepoint = %hook.label(), error = %e, fallback = %f.mechanism(), program = f.program, "tracepoint unusable; its fallback takes over");
                    if matches!(f.kind, FallbackKind::Tracepoint(_)) {
                        // Drops by site: the agent's own reason numbering.
                        drop_reasons = drop_sites::reasons();
                    }
                    usable.push((hook, Some(f)));
                }
                None => {
                    warn!(tracepoint = %hook.label(), error = %e, lost = hook.feature, "tracepoint unusable; feature disabled");
                    degraded.push((hook.label(), e));
                }
            },
        }
    }
    let companions = match &btf {
        Ok(btf) => fitting_companions(&usable, btf, &mut degraded),
        Err(_) => Vec::new(),
    };
    config.reason_pkt_too_big = drop_reasons.value("PKT_TOO_BIG").unwrap_or(u32::MAX);
    config.reason_netfilter_drop = drop_reasons.value("NETFILTER_DROP").unwrap_or(u32::MAX);
    for name in drop_family::flow_reasons() {
        if let Some(v) = drop_reasons.value(name)
            && v < 256
        {
            config.flow_reasons[(v / 64) as usize] |= 1 << (v % 64);
        }
    }
    for name in drop_family::firewall_reasons() {
        if let Some(v) = drop_reasons.value(name)
            && v < 256
        {
            config.firewall_reasons[(v / 64) as usize] |= 1 << (v % 64);
        }
    }
    // The casts only serve reads at the BTF offsets: without those, neither.
    let (btf_ok, rdonly_cast) = match btf.and_then(|btf| fill_btf(&mut config, &btf).map(|()| btf))
    {
        Ok(btf) => {
            // Scoping needs each socket's netns, which needs the BTF offsets.
            config.scope_enabled = u32::from(opts.scoped);
            (true, fill_casts(&mut config, &btf))
        }
        Err(e) => {
            warn!(error = %e, "kernel BTF unusable: no netns/interface attribution or packet evidence");
            degraded.push(("btf".to_string(), e.to_string()));
            (false, None)
        }
    };
    let (object, resolved) =
        super::rewrite::resolve(EBPF_OBJECT, rdonly_cast, config.immediates())?;
    debug!(
        immediates = ?resolved.immediates,
        "load-time settings written into the code as immediates"
    );
    match resolved.rdonly_cast {
        Some(id) => info!(
            calls = resolved.calls,
            btf_id = id,
            "packet headers and sockets read by plain loads (bpf_rdonly_cast)"
        ),
        None => info!(
            "no bpf_rdonly_cast to use (Linux 6.2+, with BTF): packet headers and sockets read by probe reads"
        ),
    }
    // Parsed once, for the loader's relocations and the BTF tracepoints alike.
    let kernel_btf = aya::Btf::from_sys_fs().ok();
    let ebpf = EbpfLoader::new()
        .btf(kernel_btf.as_ref())
        .override_global(GLOBAL_CONFIG, &config, true)
        .override_global(aya_log::LEVEL, &opts.ebpf_log.global(), true)
        .load(object.bytes())?;
    let mut ebpf = ebpf;
    if usable
        .iter()
        .any(|(_, f)| f.is_some_and(|f| matches!(f.kind, FallbackKind::Tracepoint(_))))
    {
        fill_drop_sites(&mut ebpf, &drop_reasons);
    }
    Ok(Prepared {
        ebpf,
        kernel_btf,
        tracefs: root,
        mounted_tracefs: mounted,
        usable,
        degraded,
        drop_reasons,
        btf_ok,
        companions,
    })
}

/// The companions of the fallbacks chosen in `usable` whose function this kernel has
/// with the arguments they read; a function none fits is a degraded feature.
fn fitting_companions(
    usable: &[(&'static Hook, Option<Fallback>)],
    btf: &Btf,
    degraded: &mut Vec<(String, String)>,
) -> Vec<&'static Companion> {
    let mut chosen = Vec::new();
    for f in usable.iter().filter_map(|(_, f)| *f) {
        for function in f.companion_functions() {
            let found = btf.func_arg_count(function);
            match f
                .with
                .iter()
                .find(|c| c.function == function && Some(c.args) == found)
            {
                Some(c) => chosen.push(c),
                None if found.is_none()
                    && f.with.iter().any(|c| c.function == function && c.optional) =>
                {
                    debug!(
                        function,
                        "not in this kernel (folded into another): its fexit program is not needed"
                    );
                }
                None => {
                    let why = match found {
                        Some(n) => format!(
                            "{function} takes {n} arguments here, no program reads that many"
                        ),
                        None => format!("{function} is not in this kernel's BTF"),
                    };
                    let lost = f
                        .with
                        .iter()
                        .find(|c| c.function == function)
                        .map_or("", |c| c.feature);
                    warn!(function, error = %why, lost, "fexit unusable; feature disabled");
                    degraded.push((format!("fexit:{function}"), why));
                }
            }
        }
    }
    chosen
}

/// Loads (and with `attach`, attaches) an fexit companion; the error is the kernel's.
fn load_companion(
    ebpf: &mut Ebpf,
    c: &Companion,
    btf: &aya::Btf,
    attach: bool,
) -> Result<Result<(), ProgramError>, LoadError> {
    let program = ebpf
        .program_mut(c.program)
        .ok_or(LoadError::MissingProgram(c.program))?;
    let program: &mut FExit = program.try_into().map_err(|source| LoadError::Program {
        program: c.program,
        source,
    })?;
    Ok(program.load(c.function, btf).and_then(|()| {
        if attach {
            program.attach().map(drop)
        } else {
            Ok(())
        }
    }))
}

/// A program's name and what the verifier said of it; `None` when it was not loaded, as
/// its hook cannot run on this kernel (which the hook's own check says).
pub(crate) type Verdict = (&'static str, Option<Result<(), String>>);

/// Loads every program into this kernel, configured as the agent would, and attaches
/// none: what the verifier says of each (`doctor`), a hook's fallback in its stead where
/// that runs here. The error is the object's own.
pub(crate) fn verify(opts: &Options) -> Result<Vec<Verdict>, LoadError> {
    let mut prepared = prepare(opts)?;
    let mut results = Vec::new();
    for hook in HOOKS {
        // A hook whose fallback runs here is judged by the fallback's program.
        let Some(chosen) = prepared
            .usable
            .iter()
            .find(|(h, _)| h.program == hook.program)
            .map(|(_, f)| *f)
        else {
            results.push((hook.program, None));
            continue;
        };
        if let Some(f) = chosen {
            let Some(program) = prepared.ebpf.program_mut(f.program) else {
                return Err(LoadError::MissingProgram(f.program));
            };
            let result = match (&prepared.kernel_btf, f.kind) {
                (Some(btf), FallbackKind::Fentry) => {
                    <&mut FEntry>::try_from(program).and_then(|p| p.load(f.function, btf))
                }
                (Some(btf), FallbackKind::Tracepoint(_)) => {
                    <&mut BtfTracePoint>::try_from(program).and_then(|p| p.load(f.function, btf))
                }
                (None, _) => {
                    results.push((f.program, Some(Err("needs kernel BTF".to_owned()))));
                    continue;
                }
            };
            results.push((f.program, Some(result.map_err(|e| verifier_error(&e)))));
            for c in prepared.companions.iter().filter(|c| f.with.contains(c)) {
                let Some(btf) = &prepared.kernel_btf else {
                    break;
                };
                let result = load_companion(&mut prepared.ebpf, c, btf, false)?;
                results.push((c.program, Some(result.map_err(|e| verifier_error(&e)))));
            }
            continue;
        }
        let Some(program) = prepared.ebpf.program_mut(hook.program) else {
            return Err(LoadError::MissingProgram(hook.program));
        };
        let result = if hook.fentry {
            match &prepared.kernel_btf {
                Some(btf) => <&mut FEntry>::try_from(program).and_then(|p| p.load(hook.name, btf)),
                None => {
                    results.push((hook.program, Some(Err("needs kernel BTF".to_owned()))));
                    continue;
                }
            }
        } else if hook.btf {
            match &prepared.kernel_btf {
                Some(btf) => {
                    <&mut BtfTracePoint>::try_from(program).and_then(|p| p.load(hook.name, btf))
                }
                None => {
                    results.push((hook.program, Some(Err("needs kernel BTF".to_owned()))));
                    continue;
                }
            }
        } else if hook.raw {
            <&mut RawTracePoint>::try_from(program).and_then(|p| p.load())
        } else {
            <&mut TracePoint>::try_from(program).and_then(|p| p.load())
        };
        results.push((hook.program, Some(result.map_err(|e| verifier_error(&e)))));
    }
    let classifier = super::tc::PROGRAM;
    let Some(program) = prepared.ebpf.program_mut(classifier) else {
        return Err(LoadError::MissingProgram(classifier));
    };
    let result = <&mut SchedClassifier>::try_from(program).and_then(|p| p.load());
    results.push((classifier, Some(result.map_err(|e| verifier_error(&e)))));
    Ok(results)
}

/// A load error with the verifier's last words (its log ends with the reason).
fn verifier_error(e: &ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => match refusal(&verifier_log.to_string()) {
            // Refused before the verifier ran (fentry not allowed at all): no log.
            "" => io_error.to_string(),
            why => format!("{io_error}: {why}"),
        },
        other => other.to_string(),
    }
}

/// The verifier's reason for refusing a program: its log's last line before the
/// statistics it always ends with (`verification time`, `stack depth` with
/// `BPF_LOG_STATS`, then `processed N insns`).
fn refusal(log: &str) -> &str {
    const STATS: [&str; 3] = ["processed ", "verification time", "stack depth"];
    log.lines()
        .rev()
        // A log buffer the kernel never wrote to reads as NULs.
        .map(|l| l.trim_matches(|c: char| c.is_whitespace() || c == '\0'))
        .find(|l| !l.is_empty() && !STATS.iter().any(|s| l.starts_with(s)))
        .unwrap_or_default()
}

pub(crate) fn load(opts: &Options) -> Result<Loaded, LoadError> {
    let Prepared {
        mut ebpf,
        kernel_btf,
        tracefs: root,
        mounted_tracefs: mounted,
        usable,
        mut degraded,
        drop_reasons,
        btf_ok,
        companions,
    } = prepare(opts)?;
    let ebpf_log = ebpf_log::init(&mut ebpf, opts.ebpf_log).unwrap_or_else(|e| {
        warn!(error = %e, "eBPF programs' logs unavailable");
        None
    });
    let mut attached = Vec::new();
    for (hook, fallback) in usable {
        if (hook.raw || hook.fentry || fallback.is_some()) && !btf_ok {
            // Raw tracepoints and fallback programs read kernel structs: without BTF
            // offsets they would read junk.
            degraded.push((hook.label(), "needs kernel BTF".to_string()));
            continue;
        }
        let result = match fallback {
            Some(f) => attach_fallback(&mut ebpf, f, kernel_btf.as_ref())?,
            None => attach(&mut ebpf, hook, kernel_btf.as_ref())?,
        };
        let program = fallback.map_or(hook.program, |f| f.program);
        match result {
            Ok(()) => attached.push(program),
            Err(e) => {
                // A verifier's refusal is its last words, not the whole log.
                let e = verifier_error(&e);
                warn!(program, error = %e, lost = hook.feature, "load or attach failed; feature disabled");
                degraded.push((hook.label(), e));
                continue;
            }
        }
        let (Some(f), Some(btf)) = (fallback, kernel_btf.as_ref()) else {
            continue;
        };
        for c in companions.iter().filter(|c| f.with.contains(c)) {
            match load_companion(&mut ebpf, c, btf, true)? {
                Ok(()) => attached.push(c.program),
                Err(e) => {
                    // arm64 before 6.0 has no fexit trampolines, for one.
                    let e = verifier_error(&e);
                    warn!(program = c.program, error = %e, lost = c.feature, "fexit load or attach failed; feature disabled");
                    degraded.push((format!("fexit:{}", c.function), e));
                }
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
        ebpf_log,
    })
}

/// Loads and attaches one hook. The outer error means the object itself is broken; the
/// inner one that this kernel refused the program (its verifier) or the attachment: that
/// feature degrades, the agent runs on.
fn attach(
    ebpf: &mut Ebpf,
    hook: &Hook,
    btf: Option<&aya::Btf>,
) -> Result<Result<(), ProgramError>, LoadError> {
    if hook.fentry {
        // Loaded and attached as a fallback fentry program is, to its own function.
        let as_fentry = Fallback {
            program: hook.program,
            function: hook.name,
            kind: FallbackKind::Fentry,
            with: &[],
        };
        return attach_fallback(ebpf, as_fentry, btf);
    }
    let program = ebpf
        .program_mut(hook.program)
        .ok_or(LoadError::MissingProgram(hook.program))?;
    let wrap = |source| LoadError::Program {
        program: hook.program,
        source,
    };
    if hook.btf {
        let program: &mut BtfTracePoint = program.try_into().map_err(wrap)?;
        let Some(btf) = btf else {
            return Ok(Err(ProgramError::IOError(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no kernel BTF to load a BTF tracepoint against",
            ))));
        };
        if let Err(e) = program.load(hook.name, btf) {
            return Ok(Err(e));
        }
        Ok(program.attach().map(drop))
    } else if hook.raw {
        let program: &mut RawTracePoint = program.try_into().map_err(wrap)?;
        if let Err(e) = program.load() {
            return Ok(Err(e));
        }
        Ok(program.attach(hook.name).map(drop))
    } else {
        let program: &mut TracePoint = program.try_into().map_err(wrap)?;
        if let Err(e) = program.load() {
            return Ok(Err(e));
        }
        Ok(program.attach(hook.category, hook.name).map(drop))
    }
}

/// Whether the function an fentry `hook` attaches to is in this kernel's BTF (fentry
/// attaches by BTF id); the error says what is missing.
pub(crate) fn fentry_target(hook: &Hook, btf: Option<&Btf>) -> Result<(), String> {
    match btf {
        Some(b) if b.func_id(hook.name).is_some() => Ok(()),
        Some(_) => Err(format!("{} is not in this kernel's BTF", hook.name)),
        None => Err("needs kernel BTF (/sys/kernel/btf/vmlinux)".to_string()),
    }
}

/// The fallback of `hook` this kernel can run: an fentry program's function is in the
/// kernel's BTF (fentry attaches by BTF id); a BTF tracepoint's leading arguments are
/// the ones it reads.
pub(crate) fn fallback(hook: &Hook, btf: &Btf) -> Option<Fallback> {
    hook.fallback.filter(|f| match f.kind {
        FallbackKind::Fentry => btf.func_id(f.function).is_some(),
        FallbackKind::Tracepoint(args) => btf
            .trace_args(f.function)
            .is_ok_and(|found| found.len() >= args.len() && found[..args.len()] == *args),
    })
}

/// Writes the drop sites this kernel's kallsyms resolves into `DROP_SITES`. Without them
/// every drop counts as `NOT_SPECIFIED`: the families, and the verdicts resting on them,
/// are lost, which the warning says.
fn fill_drop_sites(ebpf: &mut Ebpf, reasons: &DropReasons) {
    let sites = match std::fs::read_to_string("/proc/kallsyms") {
        Ok(text) => drop_sites::resolve(&text, reasons),
        Err(e) => {
            warn!(error = %e, "cannot read /proc/kallsyms: drops without a reason family");
            return;
        }
    };
    if sites.is_empty() {
        warn!(
            "no dropping function found in /proc/kallsyms (addresses hidden?): drops without a reason family"
        );
        return;
    }
    let Some(map) = ebpf.map_mut(node_diag_common::MAP_DROP_SITES) else {
        warn!("the object has no drop-site map");
        return;
    };
    let mut array = match aya::maps::Array::<_, node_diag_common::DropSite>::try_from(map) {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "drop-site map unusable");
            return;
        }
    };
    for (i, site) in sites.iter().enumerate() {
        if let Err(e) = array.set(i as u32, site, 0) {
            warn!(error = %e, "cannot write a drop site");
            return;
        }
    }
    info!(
        sites = sites.len(),
        "drop reasons resolved from the dropping functions"
    );
}

/// Loads and attaches a fallback's program; errors as [`attach`]'s.
fn attach_fallback(
    ebpf: &mut Ebpf,
    f: Fallback,
    btf: Option<&aya::Btf>,
) -> Result<Result<(), ProgramError>, LoadError> {
    let program = ebpf
        .program_mut(f.program)
        .ok_or(LoadError::MissingProgram(f.program))?;
    let Some(btf) = btf else {
        return Ok(Err(ProgramError::IOError(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no kernel BTF to load a fallback program against",
        ))));
    };
    let as_program = |source| LoadError::Program {
        program: f.program,
        source,
    };
    Ok(match f.kind {
        FallbackKind::Fentry => {
            let program: &mut FEntry = program.try_into().map_err(as_program)?;
            program
                .load(f.function, btf)
                .and_then(|()| program.attach().map(drop))
        }
        FallbackKind::Tracepoint(_) => {
            let program: &mut BtfTracePoint = program.try_into().map_err(as_program)?;
            program
                .load(f.function, btf)
                .and_then(|()| program.attach().map(drop))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::tests::blob;

    fn hook(raw: bool, args: &'static [&'static str]) -> Hook {
        Hook {
            program: "nd_demo",
            category: "demo",
            name: "demo",
            feature: "a demonstration",
            raw,
            btf: false,
            args,
            fallback: None,
            fentry: false,
        }
    }

    #[test]
    fn a_refusal_is_the_line_before_the_verifiers_statistics() {
        // The tail of a 6.18 log refusing a helper tracing programs may not call.
        let log = "\
650: (85) call bpf_ktime_get_coarse_ns#160
program of this type cannot use helper bpf_ktime_get_coarse_ns#160
verification time 3518 usec
stack depth 16+248+0+0+0+0
processed 330 insns (limit 1000000) max_states_per_insn 0 total_states 14 peak_states 14 mark_read 0
";
        assert_eq!(
            refusal(log),
            "program of this type cannot use helper bpf_ktime_get_coarse_ns#160"
        );
        // Without BPF_LOG_STATS the log ends with the count alone.
        assert_eq!(
            refusal("R1 invalid mem access 'scalar'\nprocessed 12 insns (limit 1000000)\n"),
            "R1 invalid mem access 'scalar'"
        );
        assert_eq!(refusal(""), "");
        assert_eq!(refusal("\0\0\0\0"), "");
    }

    #[test]
    fn accepts_a_raw_tracepoint_whose_leading_arguments_match() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(check_args(&hook(true, &["*outer", "int"]), &btf), Ok(()));
        // The program may read fewer arguments than the kernel passes.
        assert_eq!(check_args(&hook(true, &["*outer"]), &btf), Ok(()));
    }

    #[test]
    fn refuses_arguments_this_kernel_passes_differently() {
        let btf = Btf::parse(&blob()).unwrap();
        let err = check_args(&hook(true, &["*sock", "int"]), &btf).unwrap_err();
        assert!(err.contains("takes (*outer, int)"), "{err}");
        assert!(err.contains("reads (*sock, int"), "{err}");
        // More arguments than this kernel's tracepoint has.
        assert!(check_args(&hook(true, &["*outer", "int", "int"]), &btf).is_err());
        // A tracepoint this kernel does not have.
        let mut missing = hook(true, &["*outer"]);
        missing.name = "nope";
        assert!(check_args(&missing, &btf).is_err());
    }

    #[test]
    fn leaves_regular_tracepoints_to_their_format() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(check_args(&hook(false, &["*sock"]), &btf), Ok(()));
    }
}
