//! The eBPF program behind a drop, named: a TC classifier `deny_8080` returning
//! `TC_ACT_SHOT` for SYNs to port 8080 on pod A's veth (as an eBPF dataplane's policy
//! program drops), and a `cgroup_skb` egress program dropping the client's packets.
//!
//! The programs are a few instructions each, loaded here with the `bpf` syscall (no
//! compiler needed) and attached the way other software attaches them: the classifier
//! pinned in a private bpffs and added with `tc filter ... object-pinned` (a `cls_bpf`
//! filter under `clsact`, on every kernel), the cgroup program with `BPF_PROG_ATTACH`.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask integration`), one test at a time:
//! `cargo test -p node-diag-tests --test programs -- --test-threads=1`.

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::topology::POD_HOST_IF;
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, tcp_connect, unique_name,
};
use serde_json::Value;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_CGROUP_INET_EGRESS: u32 = 1;

/// One eBPF instruction: opcode, registers (dst low nibble, src high), offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = dst | (src << 4);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

const MOV_X: u8 = 0xbf;
const MOV_K: u8 = 0xb7;
const ADD_K: u8 = 0x07;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const JNE_K: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `bpf_skb_load_bytes`.
const SKB_LOAD_BYTES: i32 = 26;

/// A program that returns `hit` for IPv4 TCP packets to `dport` and `miss` for the
/// rest. `l3` is where the IP header starts in the packet (14 behind an Ethernet
/// header at TC, 0 for a cgroup program); 20-byte IP headers are assumed.
fn tcp_dport_program(l3: i32, dport: u16, hit: i32, miss: i32) -> Vec<u8> {
    // The byte loaded from the stack, as the little-endian load reads network order.
    let port = i32::from(u16::from_le_bytes(dport.to_be_bytes()));
    let load = |offset: i32, len: i32| {
        [
            insn(MOV_X, 1, 6, 0, 0),
            insn(MOV_K, 2, 0, 0, offset),
            insn(MOV_X, 3, 10, 0, 0),
            insn(ADD_K, 3, 0, 0, -8),
            insn(MOV_K, 4, 0, 0, len),
            insn(CALL, 0, 0, 0, SKB_LOAD_BYTES),
        ]
    };
    let mut p = vec![
        insn(MOV_X, 6, 1, 0, 0),
        // __sk_buff.protocol: ETH_P_IP in network order.
        insn(LDX_W, 0, 6, 16, 0),
        insn(JNE_K, 0, 0, 20, 0x0008),
    ];
    p.extend(load(l3 + 9, 1));
    p.push(insn(JNE_K, 0, 0, 13, 0));
    p.push(insn(LDX_B, 0, 10, -8, 0));
    p.push(insn(JNE_K, 0, 0, 11, 6));
    p.extend(load(l3 + 22, 2));
    p.push(insn(JNE_K, 0, 0, 4, 0));
    p.push(insn(LDX_H, 0, 10, -8, 0));
    p.push(insn(JNE_K, 0, 0, 2, port));
    p.push(insn(MOV_K, 0, 0, 0, hit));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p.push(insn(MOV_K, 0, 0, 0, miss));
    p.push(insn(EXIT, 0, 0, 0, 0));
    assert_eq!(p.len(), 25, "the jump offsets count these instructions");
    p.concat()
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> libc::c_long {
    // SAFETY: `attr` is a zeroed bpf_attr prefix of 128 bytes, filled for `cmd`; the
    // kernel reads at most that many bytes.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

/// Loads `insns` as a program of `prog_type` named `name`; panics with the verifier's
/// log on failure.
fn load(prog_type: u32, expected_attach: u32, name: &str, insns: &[u8]) -> OwnedFd {
    // Before Linux 5.11 a program counts against the user's RLIMIT_MEMLOCK, summed over
    // its processes: the agent's maps, charged to root too, leave no room under it.
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Memlock,
        rustix::process::Rlimit {
            current: None,
            maximum: None,
        },
    );
    let license = CString::new("GPL").unwrap();
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&prog_type.to_le_bytes());
    attr[4..8].copy_from_slice(&((insns.len() / 8) as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_le_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_le_bytes());
    attr[24..28].copy_from_slice(&1u32.to_le_bytes());
    attr[28..32].copy_from_slice(&(log.len() as u32).to_le_bytes());
    attr[32..40].copy_from_slice(&(log.as_mut_ptr() as u64).to_le_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes());
    attr[68..72].copy_from_slice(&expected_attach.to_le_bytes());
    let fd = bpf(BPF_PROG_LOAD, &mut attr);
    assert!(
        fd >= 0,
        "BPF_PROG_LOAD {name}: {}\n{}",
        std::io::Error::last_os_error(),
        String::from_utf8_lossy(&log).trim_end_matches('\0')
    );
    // SAFETY: the kernel returned a new program fd, owned here from now on.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// A private bpffs, unmounted (and removed) when dropped.
struct Bpffs(PathBuf);

impl Bpffs {
    fn mount() -> Bpffs {
        let dir = std::env::temp_dir().join(unique_name());
        std::fs::create_dir_all(&dir).unwrap();
        cmd::run(&["mount", "-t", "bpf", "bpf", dir.to_str().unwrap()]);
        Bpffs(dir)
    }

    fn pin(&self, fd: &OwnedFd, name: &str) -> PathBuf {
        let path = self.0.join(name);
        let c = CString::new(path.to_str().unwrap()).unwrap();
        let mut attr = [0u8; 128];
        attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_le_bytes());
        attr[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_le_bytes());
        assert_eq!(
            bpf(BPF_OBJ_PIN, &mut attr),
            0,
            "pin {name}: {}",
            std::io::Error::last_os_error()
        );
        path
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = cmd::try_run(&["umount", self.0.to_str().unwrap()]);
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn on_flow(kind: &'static str, flow: (Ipv4Addr, Ipv4Addr, u16)) -> impl Fn(&Value) -> bool {
    move |f| field(f, "kind") == kind && flow_is(f, flow.0, flow.1, flow.2)
}

/// An eBPF dataplane's policy: `deny_8080` at TC ingress of pod A's veth (node side)
/// drops its SYNs to port 8080. The timeout is the firewall's, and names the program.
#[test]
fn tc_program_that_dropped_the_syn_is_named() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 8080;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let prog = load(
        BPF_PROG_TYPE_SCHED_CLS,
        0,
        "deny_8080",
        &tcp_dport_program(14, port, 2, 0),
    );
    let fs = Bpffs::mount();
    let pinned = fs.pin(&prog, "deny_8080");
    // The qdisc and filter go with node A's namespace.
    cmd::run_in(
        &topo.node_a,
        &["tc", "qdisc", "add", "dev", POD_HOST_IF, "clsact"],
    );
    cmd::run_in(
        &topo.node_a,
        &[
            "tc",
            "filter",
            "add",
            "dev",
            POD_HOST_IF,
            "ingress",
            "bpf",
            "object-pinned",
            pinned.to_str().unwrap(),
            "direct-action",
        ],
    );
    drop(fs);
    let flow = (topo.pod_a_ip, topo.pod_b_ip, port);

    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), Duration::from_secs(4));
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(on_flow("tcp_timeout", flow), Duration::from_secs(2));
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    let evidence = &f["evidence"];
    assert_eq!(evidence["drop_reason"], "TC_INGRESS", "{f:#}");
    let program = &evidence["program"];
    assert_eq!(program["name"], "deny_8080", "{f:#}");
    assert_eq!(program["hook"], "tc_ingress", "{f:#}");
    assert_eq!(program["interface"], POD_HOST_IF, "{f:#}");
    assert_eq!(program["attach"], "cls_bpf", "{f:#}");
    assert!(program["id"].as_u64().is_some_and(|id| id > 0), "{f:#}");
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `.../unified` on a
/// hybrid host), if anywhere.
fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount = left.split_whitespace().nth(4)?;
        right.starts_with("cgroup2 ").then(|| PathBuf::from(mount))
    })
}

/// A cgroup of its own, removed when dropped (its processes have exited by then), in
/// the cgroup v2 hierarchy: mounted here (a VM guest's init mounts none) and unmounted
/// after when nothing mounted it.
struct Cgroup(PathBuf, Option<PathBuf>);

impl Cgroup {
    fn create() -> Cgroup {
        let (root, own) = match cgroup2_root() {
            Some(root) => (root, None),
            None => {
                let dir = std::env::temp_dir().join(unique_name());
                std::fs::create_dir_all(&dir).unwrap();
                cmd::run(&["mount", "-t", "cgroup2", "cgroup2", dir.to_str().unwrap()]);
                (dir.clone(), Some(dir))
            }
        };
        let path = root.join(unique_name());
        std::fs::create_dir(&path).unwrap();
        Cgroup(path, own)
    }

    /// Attaches `prog` to this cgroup's egress.
    fn attach_egress(&self, prog: &OwnedFd) {
        let dir = std::fs::File::open(&self.0).unwrap();
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(dir.as_raw_fd() as u32).to_le_bytes());
        attr[4..8].copy_from_slice(&(prog.as_raw_fd() as u32).to_le_bytes());
        attr[8..12].copy_from_slice(&BPF_CGROUP_INET_EGRESS.to_le_bytes());
        assert_eq!(
            bpf(BPF_PROG_ATTACH, &mut attr),
            0,
            "attach to {}: {}",
            self.0.display(),
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
        if let Some(own) = &self.1 {
            let _ = cmd::try_run(&["umount", own.to_str().unwrap()]);
            let _ = std::fs::remove_dir(own);
        }
    }
}

/// A host policy agent's `cgroup_skb` egress program drops the client's packets to
/// port 8081 (the program's verdict 0). The client is a process in that cgroup; the
/// finding is the firewall's and names the program.
#[test]
fn cgroup_egress_program_that_dropped_the_syn_is_named() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 8081;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let cgroup = Cgroup::create();
    // The program's reference is the attachment's: it goes with the cgroup.
    let prog = load(
        BPF_PROG_TYPE_CGROUP_SKB,
        BPF_CGROUP_INET_EGRESS,
        "deny_egress",
        &tcp_dport_program(0, port, 0, 1),
    );
    cgroup.attach_egress(&prog);
    drop(prog);
    let flow = (topo.pod_a_ip, topo.pod_b_ip, port);

    let connect = format!(
        "import socket,sys\ns=socket.socket()\ns.settimeout(4)\ntry:\n s.connect(('{}',{port}))\nexcept Exception as e:\n print(type(e).__name__, e)",
        topo.pod_b_ip
    );
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec ip netns exec {} python3 -c \"$0\"",
        cgroup.0.display(),
        topo.pod_a
    );
    let out = cmd::run(&["sh", "-c", &script, &connect]);
    let f = agent.wait_finding(on_flow("tcp_timeout", flow), Duration::from_secs(2));
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "firewall", "{f:#} (client: {out})");
    let evidence = &f["evidence"];
    assert_eq!(evidence["drop_reason"], "BPF_CGROUP_EGRESS", "{f:#}");
    let program = &evidence["program"];
    assert_eq!(program["name"], "deny_egress", "{f:#}");
    assert_eq!(program["hook"], "cgroup_egress", "{f:#}");
    assert!(
        program["cgroup"]
            .as_str()
            .is_some_and(|c| c.ends_with(cgroup.0.file_name().unwrap().to_str().unwrap())),
        "{f:#}"
    );
}
