//! The script a guest runs inside its root: the mounts a booted system would have,
//! `node-diag doctor`, then every integration test binary, one test at a time, with the
//! results written to the results share for the host to read.
//!
//! Results files (in [`super::initramfs::GUEST_OUT`]): `doctor.json`, `results` (one
//! line per test binary: `name exit-code seconds`) and `done`, written last: a guest
//! that crashes or hangs never writes it.

use std::{fmt::Write as _, path::Path};

use super::initramfs::GUEST_OUT;

/// Modules the tests need that autoloading might not bring in early enough.
const MODULES: &[&str] = &[
    "veth",
    "vxlan",
    "bridge",
    "nf_tables",
    "nf_conntrack",
    "nft_chain_nat",
    "nft_reject_inet",
    "nft_ct",
    "sch_ingress",
    "cls_bpf",
    "cls_u32",
    // kube-proxy's rules in the Service tests: iptables through nf_tables (its matches
    // and targets through nft_compat) and legacy iptables, and conntrack queries.
    "nft_compat",
    "nft_nat",
    "nft_reject_ipv4",
    "nf_conntrack_netlink",
    "ip_tables",
    "iptable_filter",
    "iptable_nat",
    "xt_comment",
    "xt_conntrack",
    "xt_statistic",
    "xt_mark",
    "xt_nat",
    "xt_MASQUERADE",
    "xt_tcpudp",
    "xt_addrtype",
    "ipt_REJECT",
];

/// What the guest runs.
pub struct Plan<'a> {
    /// The agent binary (a host path, visible at the same path in the guest).
    pub agent: &'a Path,
    /// The tests' package directory (their working directory, as under `cargo test`).
    pub manifest_dir: &'a Path,
    /// Test executables.
    pub binaries: &'a [std::path::PathBuf],
    /// libtest name filters (any of them matches).
    pub filters: &'a [String],
    /// Multiplies the tests' waits on the agent (`NODE_DIAG_TEST_TIME_SCALE`): more
    /// than 1 under emulation.
    pub time_scale: u32,
}

/// The guest script for `plan`.
pub fn script(plan: &Plan<'_>) -> String {
    let mut s = prelude(plan.agent);
    let _ = writeln!(s, "cd {}", quote(plan.manifest_dir));
    let filters: Vec<String> = plan.filters.iter().map(|f| quote_str(f)).collect();
    for binary in plan.binaries {
        let name = test_name(binary);
        let _ = writeln!(
            s,
            r#"echo "ND-VM-TEST-START {name}"
start=$(date +%s)
NODE_DIAG_BIN="$AGENT" CARGO_MANIFEST_DIR={manifest} NODE_DIAG_REQUIRE_TUNNELS=1 NODE_DIAG_TEST_TIME_SCALE={scale} {binary} --test-threads=1 {filters}
rc=$?
echo "{name} $rc $(( $(date +%s) - start ))" >> "$OUT/results"
echo "ND-VM-TEST-END {name} exit=$rc""#,
            manifest = quote(plan.manifest_dir),
            binary = quote(binary),
            filters = filters.join(" "),
            scale = plan.time_scale,
        );
    }
    s.push_str(EPILOGUE);
    s
}

/// The name a bench run is recorded under in the results file.
pub const BENCH: &str = "bench";
/// What the bench in a guest writes into the results share.
pub const BENCH_JSON: &str = "bench.json";

/// The guest script of `cargo xtask bench --kernel`: `xtask bench` (the host's binary)
/// on `agent` with `args`, its JSON (and table) written to the results share, recorded
/// in the results file as one entry, [`BENCH`].
pub fn bench_script(agent: &Path, xtask: &Path, args: &[String]) -> String {
    let mut s = prelude(agent);
    let args: Vec<String> = args.iter().map(|a| quote_str(a)).collect();
    let _ = writeln!(
        s,
        r#"echo "ND-VM-TEST-START {BENCH}"
start=$(date +%s)
{xtask} bench --agent "$AGENT" --out "$OUT/{BENCH_JSON}" {args}
rc=$?
echo "{BENCH} $rc $(( $(date +%s) - start ))" >> "$OUT/results"
echo "ND-VM-TEST-END {BENCH} exit=$rc""#,
        xtask = quote(xtask),
        args = args.join(" "),
    );
    s.push_str(EPILOGUE);
    s
}

/// The script's start: the mounts a booted system would have, the modules, `doctor`.
fn prelude(agent: &Path) -> String {
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask integration`; runs as PID 1 inside the guest's root.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 RUST_BACKTRACE=1
OUT={GUEST_OUT}
# /tmp stays the overlay's (writable, in memory): a fresh tmpfs there would hide a
# checkout under the host's /tmp, and with it the binaries under test.
mkdir -p /tmp /dev/pts /dev/shm /run/netns /run/lock /sys/fs/cgroup /sys/fs/bpf
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
# devtmpfs has no /dev/fd links (udev makes them on a real system); curl -o /dev/stdout
# and bash's process substitution need them.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
[ -e /dev/stdin ] || ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || ln -s /proc/self/fd/2 /dev/stderr
# The kernel gives PID 1 a hard open-files limit of 4096; systemd raises it to 524288,
# which the endpoint tests' thousands of held connections rely on.
ulimit -H -n 524288
hostname nd-vm
ip link set lo up
modprobe -a {modules} 2>&1 | sed 's/^/modprobe: /'
echo "ND-VM: kernel $(uname -r) ($(uname -m)), $(nproc) CPUs, user space ready"
echo "ND-VM: clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource), CPU mitigations: $(grep -h Mitigation /sys/devices/system/cpu/vulnerabilities/* 2>/dev/null | wc -l)"
AGENT={agent}
# Once, as JSON (each run loads every program: seconds under emulation), shown as is.
"$AGENT" doctor -o json > "$OUT/doctor.json" 2>"$OUT/doctor.err"
cat "$OUT/doctor.json" "$OUT/doctor.err"
echo
"#,
        modules = MODULES.join(" "),
        agent = quote(agent),
    )
}

/// The script's end, after its work: what the kernel logged of crashes, `done`, power off.
const EPILOGUE: &str = r#"# What the kernel logged of crashed processes (a test sees only the signal).
dmesg | grep -E 'segfault|traps:|general protection' | tail -20 | sed 's/^/ND-VM-DMESG: /'
echo done > "$OUT/done"
sync
echo "ND-VM: powering off"
echo o > /proc/sysrq-trigger
# Wait in the shell itself: the power-off unmounts the root, so no command can start,
# and PID 1 must not exit (the kernel would panic).
while :; do :; done
"#;

/// `target/debug/deps/scenarios-0123abcd` → `scenarios`.
pub fn test_name(binary: &Path) -> String {
    let file = binary
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match file.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
        _ => file,
    }
}

fn quote(path: &Path) -> String {
    quote_str(&path.to_string_lossy())
}

/// Single-quotes `s` for sh.
fn quote_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', r#"'\''"#))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_runs_each_binary_with_the_filters_and_records_it() {
        let binaries = vec![
            std::path::PathBuf::from("/w/target/debug/deps/scenarios-0a1b2c3d4e5f6789"),
            std::path::PathBuf::from("/w/target/debug/deps/mtu-ffff"),
        ];
        let filters = vec!["refused".to_owned(), "it's".to_owned()];
        let s = script(&Plan {
            agent: Path::new("/w/target/debug/node-diag"),
            manifest_dir: Path::new("/w/tests"),
            binaries: &binaries,
            filters: &filters,
            time_scale: 4,
        });
        assert!(s.contains(
            "NODE_DIAG_TEST_TIME_SCALE=4 '/w/target/debug/deps/scenarios-0a1b2c3d4e5f6789' --test-threads=1 'refused' 'it'\\''s'"
        ));
        assert!(s.contains(r#"echo "mtu $rc"#));
        // `done` is written after the last test only.
        assert!(s.rfind("ND-VM-TEST-END mtu").unwrap() < s.find("\"$OUT/done\"").unwrap());
    }

    #[test]
    fn bench_script_runs_the_hosts_xtask_on_the_agent_and_records_it() {
        let s = bench_script(
            Path::new("/w/target/release/node-diag"),
            Path::new("/w/target/debug/xtask"),
            &["--runs".to_owned(), "3".to_owned()],
        );
        assert!(s.contains("AGENT='/w/target/release/node-diag'"));
        assert!(s.contains(
            "'/w/target/debug/xtask' bench --agent \"$AGENT\" --out \"$OUT/bench.json\" '--runs' '3'"
        ));
        assert!(s.contains(r#"echo "bench $rc"#));
        assert!(s.rfind("ND-VM-TEST-END bench").unwrap() < s.find("\"$OUT/done\"").unwrap());
    }

    #[test]
    fn test_names_drop_cargo_hashes() {
        assert_eq!(
            test_name(Path::new("/x/deps/tc_fallback-0123456789abcdef")),
            "tc_fallback"
        );
        assert_eq!(test_name(Path::new("/x/deps/plain")), "plain");
    }
}
