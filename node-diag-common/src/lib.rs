//! The one definition of every type that crosses the kernel/user boundary.
//!
//! The eBPF programs (`node-diag-ebpf`) fill [`FlowState`], [`DropInfo`], [`IcmpInfo`] and
//! the per-CPU counters in maps and push an [`Event`] into the [`MAP_EVENTS`] ring buffer
//! only when a connection reaches a verdict worth a finding. The agent (`node-diag`) writes
//! [`Config`] into the programs' read-only global before loading them: tracepoint field
//! offsets read from tracefs and kernel struct offsets read from BTF, so nothing here
//! depends on one kernel's layout.
//!
//! Wire rules: `#[repr(C)]`, explicit padding, integers only (no `bool`, `Option` or Rust
//! enums), and a size assert per type.
#![no_std]

/// Ring buffer of [`Event`]s.
pub const MAP_EVENTS: &str = "EVENTS";
/// LRU map socket address (`u64`) -> [`FlowState`]: TCP sockets in SYN_SENT. Keyed by
/// socket because the source port is not yet assigned when a socket enters SYN_SENT.
pub const MAP_CONNECTS: &str = "CONNECTS";
/// LRU map [`FlowKey`] -> [`DropInfo`]: the last interesting drop of a SYN of that flow.
pub const MAP_SYN_DROPS: &str = "SYN_DROPS";
/// LRU map [`FlowKey`] -> [`IcmpInfo`]: the last ICMP error this kernel generated for a flow.
pub const MAP_ICMP_SENT: &str = "ICMP_SENT";
/// Per-CPU hash map [`DropKey`] -> `u64`: every `kfree_skb` aggregated by reason/netns/device.
pub const MAP_DROPS: &str = "DROPS";
/// Per-CPU array of `u64` counters indexed by the [`counter`] constants.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Hash map netns inode -> 1: the namespaces this node's agent reports for. Only consulted
/// when [`Config::scope_enabled`] is set.
pub const MAP_SCOPE: &str = "SCOPE";
/// Read-only global holding [`Config`].
pub const GLOBAL_CONFIG: &str = "CONFIG";

/// Capacity of the flow-keyed LRU maps.
pub const FLOW_MAP_ENTRIES: u32 = 16384;
/// Capacity of the netns scope map (one entry per pod on the node, plus the host).
pub const SCOPE_MAP_ENTRIES: u32 = 4096;
/// Capacity of the drop aggregation map.
pub const DROP_MAP_ENTRIES: u32 = 4096;
/// Ring buffer size in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Indices into [`MAP_COUNTERS`].
pub mod counter {
    pub const RST_SENT: u32 = 0;
    pub const RST_RECEIVED: u32 = 1;
    pub const CONNECT_REFUSED: u32 = 2;
    pub const CONNECT_TIMEOUT: u32 = 3;
    pub const CONNECT_UNREACHABLE: u32 = 4;
    pub const ESTABLISHED_RESET: u32 = 5;
    /// Ring-buffer reservations that failed: the event was lost.
    pub const EVENTS_LOST: u32 = 6;
    pub const SYN_RETRANSMITS: u32 = 7;
    pub const COUNT: u32 = 8;
}

/// [`Event::kind`] values.
pub mod event_kind {
    /// A RST answered the SYN (socket error ECONNREFUSED).
    pub const CONNECT_REFUSED: u32 = 1;
    /// The SYN was retransmitted [`super::Config::syn_retrans_threshold`] times unanswered.
    pub const CONNECT_TIMEOUT: u32 = 2;
    /// The connect failed on an ICMP unreachable (EHOSTUNREACH, ENETUNREACH, ...).
    pub const CONNECT_UNREACHABLE: u32 = 3;
    /// An established connection was reset by its peer (ECONNRESET/EPIPE).
    pub const ESTABLISHED_RESET: u32 = 4;
    /// The kernel itself gave up on a connect (ETIMEDOUT) after its full SYN backoff.
    pub const CONNECT_GAVE_UP: u32 = 5;
}

/// TCP states as the kernel numbers them (`include/net/tcp_states.h`, stable UAPI-like values).
pub mod tcp_state {
    pub const ESTABLISHED: u32 = 1;
    pub const SYN_SENT: u32 = 2;
    pub const SYN_RECV: u32 = 3;
    pub const CLOSE: u32 = 7;
}

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;
pub const IPPROTO_TCP: u16 = 6;

/// A TCP connection from the local socket's point of view (`s*` is the local end).
/// IPv4 addresses occupy the first 4 bytes of `saddr`/`daddr`, the rest zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Host byte order.
    pub sport: u16,
    /// Host byte order.
    pub dport: u16,
    pub family: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);

/// A connecting socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// `bpf_ktime_get_ns` when the flow entered its current phase.
    pub start_ns: u64,
    /// Network namespace inode of the socket (0 when unknown).
    pub netns: u32,
    /// Local port, host order, recorded when the socket closes: the kernel releases the
    /// port before it reports the error.
    pub sport: u16,
    pub _pad: u16,
    pub syn_retrans: u32,
    /// Bit set of [`event_kind`] values already reported for this flow (bit = 1 << kind).
    pub reported: u32,
}
const _: () = assert!(core::mem::size_of::<FlowState>() == 24);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropInfo {
    pub last_ns: u64,
    /// Kernel `enum skb_drop_reason` value; names come from tracefs at run time.
    pub reason: u32,
    pub count: u32,
    pub netns: u32,
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<DropInfo>() == 24);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcmpInfo {
    pub last_ns: u64,
    pub icmp_type: u32,
    pub icmp_code: u32,
    pub netns: u32,
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<IcmpInfo>() == 24);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    pub reason: u32,
    pub netns: u32,
    pub ifindex: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<DropKey>() == 16);

/// A verdict pushed to user space. `drop`/`icmp` are zero when no evidence was found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub ts_ns: u64,
    pub kind: u32,
    /// Positive errno from the socket (0 when none).
    pub error: u32,
    pub flow: FlowKey,
    pub netns: u32,
    pub syn_retrans: u32,
    pub drop: DropInfo,
    pub icmp: IcmpInfo,
}
const _: () = assert!(core::mem::size_of::<Event>() == 112);

/// Offsets of the flow tuple inside a tracepoint record, read from its tracefs `format`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TupleOffsets {
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub saddr: u16,
    pub daddr: u16,
    pub saddr_v6: u16,
    pub daddr_v6: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<TupleOffsets>() == 16);

/// Load-time settings, written by the agent into the read-only global [`GLOBAL_CONFIG`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Bit `r` set: a SYN dropped with `skb_drop_reason` `r` is recorded per flow.
    pub flow_reasons: [u64; 4],

    pub set_state: TupleOffsets,
    pub retrans: TupleOffsets,

    pub set_state_skaddr: u16,
    pub set_state_oldstate: u16,
    pub set_state_newstate: u16,
    pub set_state_protocol: u16,
    pub retrans_skaddr: u16,
    pub retrans_state: u16,
    pub rcv_reset_skaddr: u16,
    pub kfree_skbaddr: u16,
    pub kfree_protocol: u16,
    pub kfree_reason: u16,
    pub icmp_skbaddr: u16,
    pub icmp_type: u16,
    pub icmp_code: u16,
    pub icmp_saddr: u16,
    pub icmp_daddr: u16,
    pub icmp_sport: u16,
    pub icmp_dport: u16,
    pub snd_reset_skaddr: u16,
    pub snd_reset_skbaddr: u16,
    pub _pad0: [u16; 5],

    /// Kernel struct offsets from BTF; all zero (and `btf_ok == 0`) when BTF is missing,
    /// in which case netns/ifindex attribution and packet parsing are skipped.
    pub btf_ok: u32,
    /// `struct sock` -> `struct net *` (through `__sk_common.skc_net.net`).
    pub sk_net: u32,
    /// `struct sock` -> `sk_err` (int).
    pub sk_err: u32,
    /// `struct sock` -> `sk_err_soft` (int).
    pub sk_err_soft: u32,
    /// `struct sock` -> `sk_protocol` (u16).
    pub sk_protocol: u32,
    /// `struct sock` -> `__sk_common.skc_family` (u16).
    pub sk_family: u32,
    /// `struct sock` -> `__sk_common.skc_num` (local port, host order u16).
    pub sk_num: u32,
    /// `struct sock` -> `__sk_common.skc_dport` (remote port, network order u16).
    pub sk_dport: u32,
    /// `struct sock` -> `__sk_common.skc_rcv_saddr` (IPv4 local address).
    pub sk_saddr: u32,
    /// `struct sock` -> `__sk_common.skc_daddr` (IPv4 remote address).
    pub sk_daddr: u32,
    /// `struct sock` -> `__sk_common.skc_v6_rcv_saddr` (0: kernel without IPv6).
    pub sk_v6_saddr: u32,
    /// `struct sock` -> `__sk_common.skc_v6_daddr` (0: kernel without IPv6).
    pub sk_v6_daddr: u32,
    /// `struct net` -> `ns.inum`.
    pub net_inum: u32,
    /// `struct sk_buff` -> `dev`.
    pub skb_dev: u32,
    /// `struct sk_buff` -> `head`.
    pub skb_head: u32,
    /// `struct sk_buff` -> `network_header` (u16).
    pub skb_network_header: u32,
    /// `struct net_device` -> `ifindex`.
    pub dev_ifindex: u32,
    /// `struct net_device` -> `struct net *` (through `nd_net.net`).
    pub dev_net: u32,

    /// SYN retransmits after which a connect is reported as timing out.
    pub syn_retrans_threshold: u32,
    /// Non-zero: sockets and packets whose netns is known and not in [`MAP_SCOPE`] are
    /// ignored (tracepoints fire for every namespace on the kernel).
    pub scope_enabled: u32,
}
const _: () = assert!(core::mem::size_of::<Config>() == 32 + 32 + 48 + 80);

impl FlowKey {
    pub const fn is_v4(&self) -> bool {
        self.family == AF_INET
    }
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all types are repr(C), integer-only, with explicit padding.
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for DropInfo {}
    unsafe impl aya::Pod for IcmpInfo {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for Event {}
    unsafe impl aya::Pod for TupleOffsets {}
    unsafe impl aya::Pod for Config {}
}
