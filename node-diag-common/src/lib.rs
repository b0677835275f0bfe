//! The one definition of every type that crosses the kernel/user boundary.
//!
//! The eBPF programs (`node-diag-ebpf`) fill [`FlowState`], [`DropInfo`], [`IcmpInfo`] and
//! the per-CPU counters in maps and push an [`Event`] into the [`MAP_EVENTS`] ring buffer
//! only when a connection reaches a verdict worth a finding. The agent (`node-diag`) writes
//! [`Config`] into the programs' read-only global before loading them: tracepoint field
//! offsets read from tracefs and kernel struct offsets read from BTF, so nothing here
//! depends on one kernel's layout.
//!
//! With the `openmetrics` feature it also holds the one OpenMetrics-to-text conversion
//! ([`openmetrics::openmetrics_to_text`]), shared by the agent and the tests.
//!
//! Wire rules: `#[repr(C)]`, explicit padding, integers only (no `bool`, `Option` or Rust
//! enums), and a size assert per type.
#![no_std]

#[cfg(feature = "openmetrics")]
extern crate alloc;

#[cfg(feature = "openmetrics")]
pub mod openmetrics;

/// Ring buffer of [`Event`]s.
pub const MAP_EVENTS: &str = "EVENTS";
/// LRU map socket address (`u64`) -> [`FlowState`]: TCP sockets in SYN_SENT. Keyed by
/// socket because the source port is not yet assigned when a socket enters SYN_SENT.
pub const MAP_CONNECTS: &str = "CONNECTS";
/// LRU map [`FlowKey`] -> [`DropInfo`]: the last interesting drop of a SYN of that flow.
pub const MAP_SYN_DROPS: &str = "SYN_DROPS";
/// LRU map [`FlowKey`] -> [`IcmpInfo`]: the last ICMP error this kernel generated for a flow.
pub const MAP_ICMP_SENT: &str = "ICMP_SENT";
/// Per-CPU array of [`DropSlot`], indexed by drop reason below [`DROP_REASON_SLOTS`]:
/// every in-scope `kfree_skb` counted by reason. An array, so that a drop costs an index
/// and no hash; each slot also caches the scope decision of the last namespace it counted.
pub const MAP_DROP_REASONS: &str = "DROP_REASONS";
/// Per-CPU hash map [`DropKey`] (reason only) -> `u64`: drops whose reason is beyond
/// [`DROP_REASON_SLOTS`] (the subsystem-encoded reasons, `reason >> 16` != 0).
pub const MAP_DROPS: &str = "DROPS";
/// Array of one `u64` the agent increments whenever it writes [`MAP_SCOPE`]: a
/// [`DropSlot`]'s cached scope decision holds only while the generation it was taken
/// under is current.
pub const MAP_SCOPE_GEN: &str = "SCOPE_GEN";
/// Per-CPU array of one `u64`, the programs' own: the last [`MAP_SCOPE`] decision, for
/// one namespace under one [`MAP_SCOPE_GEN`] (see [`scope_memo`]), so that a run of
/// sockets from one namespace looks the scope up once per agent refresh.
pub const MAP_SCOPE_MEMO: &str = "SCOPE_MEMO";
/// Array of one `u64` the programs increment (atomically) before they record evidence
/// a connect verdict reads ([`MAP_SYN_DROPS`], [`MAP_ICMP_SENT`], [`MAP_ICMP_ERR_RCVD`]).
/// A connect whose [`FlowState::evidence_gen`] is still current has none to look up.
pub const MAP_EVIDENCE_GEN: &str = "EVIDENCE_GEN";
/// Per-CPU hash map [`DropKey`] (reason 0, egress netns/device) -> `u64`: DF packets
/// dropped for exceeding that device's MTU.
pub const MAP_OVERSIZE_BY_DEV: &str = "OVERSIZE_BY_DEV";
/// LRU map [`FlowKey`] (sender first) -> [`DropInfo`] (egress device): flows whose DF
/// packets were dropped as too big.
pub const MAP_OVERSIZE: &str = "OVERSIZE";
/// LRU map [`FlowKey`] (original sender first) -> [`IcmpInfo`]: ICMP frag-needed / IPv6
/// packet-too-big received on this node's interfaces (TC ingress).
pub const MAP_ICMP_RCVD: &str = "ICMP_RCVD";
/// ICMP / ICMPv6 destination-unreachable errors (other than frag-needed) received for a
/// flow: what answered a connect when no RST did.
pub const MAP_ICMP_ERR_RCVD: &str = "ICMP_ERR_RCVD";
/// LRU map [`FlowKey`] (original sender first) -> [`DropInfo`]: frag-needed for that flow
/// dropped by netfilter on this node.
pub const MAP_FRAG_DROPPED: &str = "FRAG_DROPPED";
/// LRU map socket address (`u64`) -> [`RetransState`]: sockets retransmitting full-size
/// segments.
pub const MAP_RETRANS: &str = "RETRANS";
/// LRU map [`FlowKey`] (as the connecting socket sees it: the conntrack entry's original
/// direction) -> [`NatInfo`]: where this node's NAT sent a flow whose packets the drop and
/// ICMP hooks saw translated (kube-proxy's DNAT of a Service address to a backend).
pub const MAP_NAT: &str = "NAT";
/// Per-CPU array of `u64` counters indexed by the [`counter`] constants.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Hash map netns inode -> [`scope_value`]: the namespaces this node's agent reports for
/// ([`scope_value::IN`]) and those it has judged not to be this node's
/// ([`scope_value::OUT`]); a namespace it has not looked at yet has no entry. Only
/// consulted when [`Config::scope_enabled`] is set.
pub const MAP_SCOPE: &str = "SCOPE";

/// Values of [`MAP_SCOPE`].
pub mod scope_value {
    /// This node's: its sockets and packets are reported.
    pub const IN: u32 = 1;
    /// Looked at and not this node's (a router's or another node's namespace on the same
    /// kernel): ignored in the kernel. Absent, a namespace's connects are still tracked,
    /// so that a pod connecting before the agent's next look is judged.
    pub const OUT: u32 = 0;
}
/// Hash map [`VerdictKey`] -> [`VerdictAgg`]: connect verdicts aggregated in the kernel.
/// A storm of identical verdicts sends one [`Event`] per [`Config::verdict_window_ns`]
/// and CPU, and counts the rest here; the agent reads the counts and deletes entries it
/// has fully accounted once they are idle. A plain hash map, not an LRU: an entry is never evicted
/// with counts the agent has not read. When it is full, verdicts go out unaggregated.
pub const MAP_VERDICT_AGG: &str = "VERDICT_AGG";
/// Array ifindex -> `u32`: the link-layer header's length on an interface the classifier
/// is attached to, as the agent knows it from the link's type: [`ETH_HLEN`] on Ethernet
/// devices, 0 on the others (WireGuard, IPIP: no header) and where unknown. The
/// classifier reads the first byte it decides on straight from an Ethernet frame, and
/// through a helper call (relative to the network header) everywhere else.
pub const MAP_LINK_HDR: &str = "LINK_HDR";
/// Hash map [`pod_link::key`] (the agent's namespace, a pod veth's node-side ifindex) ->
/// the pod's netns inode: where a forwarded packet leaving by that device is going.
/// Written by the agent with the scope.
pub const MAP_POD_LINKS: &str = "POD_LINKS";
/// Hash map [`InboundKey`] -> [`InboundAgg`]: SYNs towards a pod of this node that a
/// filter on this node dropped, aggregated per client address, pod address and port.
/// The first drop of a key sends one [`Event`] ([`event_kind::INBOUND_SYN_DROPPED`]);
/// the rest only count here. A plain hash map: the agent reads the counts and deletes
/// idle keys, so no entry is evicted unread.
pub const MAP_INBOUND: &str = "INBOUND";
/// Array of [`DropSite`]: on kernels whose `skb:kfree_skb` carries no drop reason (before
/// 5.17), the functions that drop for a known reason (`nf_hook_slow`, `ip_error`, ...),
/// resolved from kallsyms at load time; the drop's location (its caller's return
/// address) falls in one of them or in none. Filled up to the first entry with `end` 0.
pub const MAP_DROP_SITES: &str = "DROP_SITES";
/// Capacity of [`MAP_DROP_SITES`].
pub const DROP_SITE_ENTRIES: u32 = 24;
/// Per-CPU array of one [`Shot`]: the last packet another eBPF program (a tc classifier,
/// a `cgroup_skb` egress program) told the kernel to drop on this CPU, recorded by fexit
/// programs on kernels without drop reasons, for the drop sites marked [`site_needs`].
pub const MAP_SHOT: &str = "SHOT";
/// The reason of a drop located in none of [`MAP_DROP_SITES`]' functions; the agent names
/// it `NOT_SPECIFIED` (the value newer kernels give that name).
pub const DROP_SITE_UNKNOWN: u32 = 2;
/// Read-only global holding [`Config`].
pub const GLOBAL_CONFIG: &str = "CONFIG";

/// Capacity of the flow-keyed LRU maps. Their entries are evidence about flows in trouble
/// (and connects in flight), read within seconds of being written; under more than this
/// many at once the oldest go first. Nine maps of this size are most of the agent's map
/// memory (about 1.2 MiB each).
pub const FLOW_MAP_ENTRIES: u32 = 8192;
/// Capacity of the netns scope map (one entry per pod on the node, plus the host).
pub const SCOPE_MAP_ENTRIES: u32 = 4096;
/// Capacity of [`MAP_POD_LINKS`] (one entry per pod veth of the node).
pub const POD_LINK_MAP_ENTRIES: u32 = 4096;
/// Capacity of [`MAP_INBOUND`]: distinct (client, pod, port, reason) keys dropped within
/// the agent's idle window. A drop that finds it full is counted lost.
pub const INBOUND_MAP_ENTRIES: u32 = 8192;
/// Drop reasons counted in [`MAP_DROP_REASONS`]'s array; the core `enum skb_drop_reason`
/// has about 130 values in Linux 6.18.
pub const DROP_REASON_SLOTS: u32 = 256;
/// Capacity of the fallback drop map ([`MAP_DROPS`]), one entry per subsystem reason.
pub const DROP_MAP_ENTRIES: u32 = 256;
/// Capacity of the per-device oversize drop counters (one per egress device), per-CPU.
pub const DEV_MAP_ENTRIES: u32 = 1024;
/// Capacity of [`MAP_LINK_HDR`]: interfaces with a larger ifindex (long-lived nodes number
/// their new interfaces ever higher; the attached ones, the node's own, usually come
/// first) are read through the helper.
pub const LINK_MAP_ENTRIES: u32 = 4096;
/// An Ethernet header's length, in [`MAP_LINK_HDR`].
pub const ETH_HLEN: u32 = 14;
/// Capacity of the verdict aggregation map: a storm takes one entry per CPU it runs on
/// ([`VerdictKey::cpu`]).
pub const VERDICT_MAP_ENTRIES: u32 = 16384;
/// Default [`Config::verdict_window_ns`]: at most one event per second per verdict key.
pub const VERDICT_WINDOW_NS: u64 = 1_000_000_000;
/// Ring buffer size in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// The packing of a [`MAP_SCOPE_MEMO`] value: the namespace inode in the low 32 bits, the
/// decision in bit 32, the low 31 bits of the scope generation above. One `u64`, written
/// with one store: a program interrupted on its CPU by another that updates the memo
/// never leaves it half-written.
pub mod scope_memo {
    pub const INSIDE: u64 = 1 << 32;
    const GEN_SHIFT: u32 = 33;
    const GEN_MASK: u64 = (1 << 31) - 1;

    /// The memo of `netns` under `generation`, without its decision.
    #[inline(always)]
    pub const fn tag(netns: u32, generation: u64) -> u64 {
        netns as u64 | (generation & GEN_MASK) << GEN_SHIFT
    }

    // The decision bit is never part of a tag, and every generation of one namespace
    // tags differently until the 31 bits wrap.
    const _: () = assert!(tag(u32::MAX, u64::MAX) & INSIDE == 0);
    const _: () = assert!(tag(7, 1) != tag(7, 2) && tag(7, GEN_MASK) != tag(7, 0));
}

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
    /// ICMP frag-needed / packet-too-big generated by this node.
    pub const ICMP_FRAG_SENT: u32 = 8;
    /// ICMP frag-needed / packet-too-big received on this node's interfaces.
    pub const ICMP_FRAG_RECEIVED: u32 = 9;
    /// ICMP frag-needed / packet-too-big dropped by netfilter on this node.
    pub const ICMP_FRAG_DROPPED: u32 = 10;
    pub const DF_OVERSIZE_DROPS: u32 = 11;
    /// Full-size retransmits made on the retransmission timer (see `RetransState`).
    pub const FULLSIZE_RETRANSMITS: u32 = 12;
    /// Verdict events submitted to the ring buffer.
    pub const EVENTS_SENT: u32 = 13;
    pub const COUNT: u32 = 14;
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
    /// The first DF packet of a flow dropped for exceeding the egress MTU.
    pub const DF_OVERSIZE: u32 = 6;
    /// A socket retransmitted the same full-size segment
    /// [`super::Config::fullsize_retrans_threshold`] times in a row, with evidence that
    /// size is the problem (an oversize drop, or frag-needed generated, dropped or
    /// received for the flow): a PMTUD black hole.
    pub const PMTUD_STALL: u32 = 7;
    /// One segment (of any size) retransmitted that many times without MTU evidence:
    /// the peer went silent.
    pub const TCP_STALL: u32 = 8;
    /// The application closed a connecting socket before any answer (its own connect
    /// timeout), after a SYN retransmit or a SYN drop on this node.
    pub const CONNECT_ABANDONED: u32 = 9;
    /// A connect already reported as timing out was established after all.
    pub const CONNECT_LATE: u32 = 10;
    /// A stall without MTU evidence ended with its segment sent again smaller: the
    /// kernel's own black-hole detection (`tcp_mtu_probing`) shrank the MSS. `len` is
    /// the segment before, `mtu` the MSS after, the window the stall's length.
    pub const MSS_SHRUNK: u32 = 11;
    /// A SYN towards a pod of this node, from a client elsewhere, dropped here by a
    /// filter: the first drop of its [`super::InboundKey`]. `flow` is that SYN's (client
    /// first), `netns` the pod's namespace, `drop` the drop (its `last_ns` the key's
    /// `first_ns`), `icmp` the ICMP error this node sent for it (a REJECT), `len` the
    /// ifindex of the pod's veth it was going to.
    pub const INBOUND_SYN_DROPPED: u32 = 12;
}

/// The key of [`MAP_POD_LINKS`].
pub mod pod_link {
    /// A device `ifindex` of namespace `netns`.
    #[inline(always)]
    pub const fn key(netns: u32, ifindex: u32) -> u64 {
        (netns as u64) << 32 | ifindex as u64
    }
}

/// What makes inbound SYN drops one finding: the client's address (not its port, new
/// with every attempt), the pod's address and port, the pod's namespace and the drop
/// reason.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InboundKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// The destination pod's network namespace (inode).
    pub netns: u32,
    /// `skb_drop_reason` value.
    pub reason: u32,
    /// Host byte order.
    pub dport: u16,
    pub family: u16,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<InboundKey>() == 48);

/// The drops of one [`InboundKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboundAgg {
    /// When the entry was made: with the key, which entry an event announced.
    pub first_ns: u64,
    pub last_ns: u64,
    /// Drops counted (added atomically: every CPU counts into the one entry).
    pub count: u64,
    /// The namespace whose filter dropped it (the node's).
    pub drop_netns: u32,
    /// The device the SYN came in on.
    pub ifindex: u32,
    /// The pod's veth it was going to (node side).
    pub pod_ifindex: u32,
    /// The ICMP error this node sent for the first SYN (a REJECT's), 0/0 for none: only
    /// destination-unreachable errors are recorded, so type 0 never means one.
    pub icmp_type: u16,
    pub icmp_code: u16,
}
const _: () = assert!(core::mem::size_of::<InboundAgg>() == 40);

/// [`FlowState::flags`] bits.
pub mod flow_flag {
    /// The connecting socket received a RST (`tcp:tcp_receive_reset`).
    pub const RST_RECEIVED: u16 = 1;
    /// The attempt is over (connected, failed, abandoned or out of scope): the entry
    /// stays for the next socket at this address to rewrite, and every reader skips it.
    pub const ENDED: u16 = 2;
}

/// [`Event::flags`] bits.
pub mod event_flag {
    /// The connecting socket received a RST: the peer (or a device resetting on its
    /// behalf) answered the SYN, as opposed to an ICMP error.
    pub const RST_RECEIVED: u32 = 1;
    /// The attempt had been reported as timing out (`CONNECT_TIMEOUT`): this verdict is
    /// its last word and supersedes that one. Counted already, as the timeout, so the
    /// kernel counters leave it out; never aggregated, so the agent sees each one.
    pub const AFTER_TIMEOUT: u32 = 2;
}

/// Whether verdicts of `kind` are aggregated in [`MAP_VERDICT_AGG`]: the connect
/// verdicts that come in storms. Stalls, MTU events and `CONNECT_LATE` never are.
pub const fn aggregated_kind(kind: u32) -> bool {
    matches!(
        kind,
        event_kind::CONNECT_REFUSED
            | event_kind::CONNECT_TIMEOUT
            | event_kind::CONNECT_UNREACHABLE
            | event_kind::ESTABLISHED_RESET
            | event_kind::CONNECT_ABANDONED
    )
}

/// [`VerdictKey::class`] bits: the evidence that decides a verdict's layer in user space.
pub mod verdict_class {
    /// The connecting socket received a RST.
    pub const RST_RECEIVED: u16 = 1;
    /// This kernel generated an ICMP error for the flow ([`super::Event::icmp`]).
    pub const ICMP_SENT: u16 = 2;
    /// An ICMP error was received for the flow ([`super::Event::icmp_rcvd`]).
    pub const ICMP_RCVD: u16 = 4;
    /// The drop evidence is the SYN-ACK, not the SYN ([`super::drop_flag::SYN_ACK`]).
    pub const SYN_ACK_DROP: u16 = 8;
}

/// What makes verdicts identical: the kernel aggregates verdicts with equal keys, and the
/// agent derives the same key from an [`Event`] ([`VerdictKey::of_event`]). The source
/// port is left out (it changes with every attempt).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VerdictKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub netns: u32,
    /// The drop evidence's `skb_drop_reason` (0: none).
    pub drop_reason: u32,
    /// Host byte order.
    pub dport: u16,
    pub family: u16,
    /// [`event_kind`] value (all fit in 16 bits).
    pub kind: u16,
    /// [`verdict_class`] bits.
    pub class: u16,
    /// The ICMP errors attached ([`icmp_key`]): their codes decide the layer too
    /// (administratively prohibited is a firewall, other unreachables routing).
    pub icmp: u32,
    /// The CPU that counted the verdicts. Each CPU counts a storm in its own entry, so
    /// the count's cache line does not move between CPUs on every verdict (a fifth of
    /// the error report's cost with two CPUs in a storm); the agent adds the entries up
    /// as findings.
    pub cpu: u32,
}
const _: () = assert!(core::mem::size_of::<VerdictKey>() == 56);

/// [`VerdictKey::icmp`]: type and code of the ICMP error generated here (high 16 bits)
/// and of the one received (low 16 bits), 0 for none.
pub const fn icmp_key(sent_type: u32, sent_code: u32, rcvd_type: u32, rcvd_code: u32) -> u32 {
    ((sent_type & 0xff) << 24)
        | ((sent_code & 0xff) << 16)
        | ((rcvd_type & 0xff) << 8)
        | (rcvd_code & 0xff)
}

impl VerdictKey {
    /// The key the kernel aggregated `ev` under (meaningful when `ev.count != 0`).
    pub const fn of_event(ev: &Event) -> VerdictKey {
        VerdictKey {
            saddr: ev.flow.saddr,
            daddr: ev.flow.daddr,
            netns: ev.netns,
            drop_reason: ev.drop.reason,
            dport: ev.flow.dport,
            family: ev.flow.family,
            kind: ev.kind as u16,
            class: ev.class as u16,
            icmp: ev.icmp_key,
            cpu: ev.cpu,
        }
    }
}

/// A verdict key's counts. `count` is incremented atomically by every CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerdictAgg {
    /// `bpf_ktime_get_ns` of the key's first event.
    pub first_ns: u64,
    /// When the last event for the key was submitted.
    pub last_emit_ns: u64,
    /// When the key was last counted (events or not): the agent deletes idle entries.
    pub last_ns: u64,
    /// Verdicts counted since the entry was created, events included.
    pub count: u64,
    /// Events submitted for the key.
    pub emitted: u64,
}
const _: () = assert!(core::mem::size_of::<VerdictAgg>() == 40);

/// TCP states as the kernel numbers them (`include/net/tcp_states.h`, stable UAPI-like values).
pub mod tcp_state {
    pub const ESTABLISHED: u32 = 1;
    pub const SYN_SENT: u32 = 2;
    pub const SYN_RECV: u32 = 3;
    pub const CLOSE: u32 = 7;
}

/// Address families (`AF_*`), as `struct sock` and [`FlowKey::family`] hold them.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// EtherTypes (`ETH_P_*`, `<linux/if_ether.h>`), in host order, as `skb->protocol` reads
/// once swapped.
pub mod eth_p {
    pub const IP: u16 = 0x0800;
    pub const IPV6: u16 = 0x86DD;
}

/// IP protocol numbers (`IPPROTO_*`), typed as the IPv4 header's protocol and the IPv6
/// header's next-header byte: the packet parsers compare them as they read them.
/// `struct sock`'s `sk_protocol` is wider: widen at the use site.
pub mod ipproto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
}

/// ICMP types and destination-unreachable codes (`<linux/icmp.h>`: RFC 792/1122/1812),
/// typed as [`IcmpInfo`] stores them and `icmp:icmp_send` reports them; a parser widens
/// the header's byte with `u32::from`.
pub mod icmp {
    pub const DEST_UNREACH: u32 = 3;

    pub const NET_UNREACH: u32 = 0;
    pub const HOST_UNREACH: u32 = 1;
    pub const PROT_UNREACH: u32 = 2;
    pub const PORT_UNREACH: u32 = 3;
    /// Fragmentation needed and DF set: PMTUD's signal, carrying the next-hop MTU.
    pub const FRAG_NEEDED: u32 = 4;
    pub const SR_FAILED: u32 = 5;
    pub const NET_UNKNOWN: u32 = 6;
    pub const HOST_UNKNOWN: u32 = 7;
    pub const HOST_ISOLATED: u32 = 8;
    pub const NET_ANO: u32 = 9;
    pub const HOST_ANO: u32 = 10;
    pub const NET_UNR_TOS: u32 = 11;
    pub const HOST_UNR_TOS: u32 = 12;
    pub const PKT_FILTERED: u32 = 13;
    pub const PREC_VIOLATION: u32 = 14;
    pub const PREC_CUTOFF: u32 = 15;

    /// The codes a filter sends (RFC 1812 "administratively prohibited").
    pub const ADMIN_PROHIBITED: [u32; 3] = [NET_ANO, HOST_ANO, PKT_FILTERED];
}

/// ICMPv6 types and destination-unreachable codes (`<linux/icmpv6.h>`), typed as
/// [`icmp`]'s.
pub mod icmpv6 {
    pub const DEST_UNREACH: u32 = 1;
    /// IPv6's frag-needed: carries the MTU, whatever the code.
    pub const PKT_TOOBIG: u32 = 2;

    pub const NOROUTE: u32 = 0;
    pub const ADM_PROHIBITED: u32 = 1;
    pub const NOT_NEIGHBOUR: u32 = 2;
    pub const ADDR_UNREACH: u32 = 3;
    pub const PORT_UNREACH: u32 = 4;
    pub const POLICY_FAIL: u32 = 5;
    pub const REJECT_ROUTE: u32 = 6;

    /// The codes a filter sends: `icmpv6_err_convert` makes each of them EACCES.
    pub const ADMIN_PROHIBITED: [u32; 3] = [ADM_PROHIBITED, POLICY_FAIL, REJECT_ROUTE];
}

/// The socket errors (Linux `errno` values) the programs judge and the agent names,
/// typed as [`Event::error`](crate::Event::error) carries them and as `struct sock_extended_err`'s `ee_errno`
/// is. `sk_err` is an `int` holding the same positive values.
pub mod errno {
    /// ICMPv6 administratively prohibited (IPv4's maps to EHOSTUNREACH).
    pub const EACCES: u32 = 13;
    pub const EPIPE: u32 = 32;
    pub const ENONET: u32 = 64;
    pub const ENETUNREACH: u32 = 101;
    pub const ECONNRESET: u32 = 104;
    pub const ETIMEDOUT: u32 = 110;
    pub const ECONNREFUSED: u32 = 111;
    pub const EHOSTDOWN: u32 = 112;
    pub const EHOSTUNREACH: u32 = 113;

    /// The symbolic name of one of the errors above, `""` for any other.
    pub const fn name(errno: u32) -> &'static str {
        match errno {
            EACCES => "EACCES",
            EPIPE => "EPIPE",
            ENONET => "ENONET",
            ENETUNREACH => "ENETUNREACH",
            ECONNRESET => "ECONNRESET",
            ETIMEDOUT => "ETIMEDOUT",
            ECONNREFUSED => "ECONNREFUSED",
            EHOSTDOWN => "EHOSTDOWN",
            EHOSTUNREACH => "EHOSTUNREACH",
            _ => "",
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn names_every_judged_error() {
            let all = [
                (EACCES, "EACCES"),
                (EPIPE, "EPIPE"),
                (ENONET, "ENONET"),
                (ENETUNREACH, "ENETUNREACH"),
                (ECONNRESET, "ECONNRESET"),
                (ETIMEDOUT, "ETIMEDOUT"),
                (ECONNREFUSED, "ECONNREFUSED"),
                (EHOSTDOWN, "EHOSTDOWN"),
                (EHOSTUNREACH, "EHOSTUNREACH"),
            ];
            for (errno, expected) in all {
                assert_eq!(name(errno), expected);
            }
            assert_eq!(name(0), "");
            assert_eq!(name(1), "");
        }
    }
}

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
    /// [`flow_flag`] bits.
    pub flags: u16,
    pub syn_retrans: u32,
    /// Bit set of [`event_kind`] values already reported for this flow (bit = 1 << kind).
    pub reported: u32,
    /// [`MAP_EVIDENCE_GEN`] when the attempt began.
    pub evidence_gen: u64,
}
const _: () = assert!(core::mem::size_of::<FlowState>() == 32);

/// One drop reason's counter on one CPU ([`MAP_DROP_REASONS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropSlot {
    pub count: u64,
    /// The [`MAP_SCOPE_GEN`] under which `in_scope` was decided for `netns`.
    pub scope_gen: u64,
    pub netns: u32,
    /// Non-zero: `netns` was in scope.
    pub in_scope: u32,
}
const _: () = assert!(core::mem::size_of::<DropSlot>() == 24);

/// A kernel function's text, `[start, end)`, and the drop reason a `kfree_skb` called
/// from it stands for ([`MAP_DROP_SITES`]); the reason is one of the agent's own
/// numbering on such kernels, named like the newer kernels' `enum skb_drop_reason`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropSite {
    pub start: u64,
    pub end: u64,
    pub reason: u32,
    /// [`site_needs`] bits: the site stands for its reason only for a packet the matching
    /// [`MAP_SHOT`] mark names; any other drop there stays `NOT_SPECIFIED`.
    pub needs: u32,
}
const _: () = assert!(core::mem::size_of::<DropSite>() == 24);

/// [`DropSite::needs`] and [`Shot::hook`] bits.
pub mod site_needs {
    /// A tc classifier (clsact ingress or egress) returned `TC_ACT_SHOT` for the packet.
    pub const TC_SHOT: u32 = 1;
    /// A `cgroup_skb` egress program denied the packet.
    pub const CGROUP_EGRESS_DENIED: u32 = 2;
}

/// The packet another eBPF program just told the kernel to drop ([`MAP_SHOT`]): the
/// `kfree_skb` that follows on the same CPU, microseconds later, reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shot {
    /// The `struct sk_buff` address; 0 once its drop was read.
    pub skb: u64,
    pub at_ns: u64,
    /// One [`site_needs`] bit.
    pub hook: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Shot>() == 24);
/// A [`Shot`] older than this is not the drop being read (its skb's memory reused).
pub const SHOT_MAX_AGE_NS: u64 = 10_000_000;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropInfo {
    pub last_ns: u64,
    /// Kernel `enum skb_drop_reason` value; names come from tracefs at run time.
    pub reason: u32,
    pub count: u32,
    pub netns: u32,
    pub ifindex: u32,
    /// [`drop_flag`] bits.
    pub flags: u32,
    /// For a packet dropped as too big: the MTU it exceeded (0 otherwise), so a later
    /// segment that fits it is not explained by this drop.
    pub mtu: u32,
}
const _: () = assert!(core::mem::size_of::<DropInfo>() == 32);

/// [`DropInfo::flags`] bits.
pub mod drop_flag {
    /// The dropped packet was the SYN-ACK answering the flow's SYN (the return path), not
    /// the SYN itself.
    pub const SYN_ACK: u32 = 1;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcmpInfo {
    pub last_ns: u64,
    pub icmp_type: u32,
    pub icmp_code: u32,
    pub netns: u32,
    pub ifindex: u32,
    /// Next-hop MTU carried by frag-needed / packet-too-big (0 otherwise).
    pub mtu: u32,
    pub count: u32,
    /// Who sent a received ICMP error (the router or filter on the path), IPv4 in the
    /// first 4 bytes; zero for the errors this node generated.
    pub from: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<IcmpInfo>() == 48);

/// Where NAT on this node sent a flow: the conntrack entry's reply source, when it is
/// not the original destination (a DNAT: a Service address translated to a backend).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatInfo {
    pub last_ns: u64,
    /// The translated destination; IPv4 in the first 4 bytes.
    pub backend: [u8; 16],
    /// Host byte order.
    pub backend_port: u16,
    pub family: u16,
    /// Namespace of the conntrack table that translated it.
    pub netns: u32,
}
const _: () = assert!(core::mem::size_of::<NatInfo>() == 32);

/// A socket retransmitting one data segment again and again, on its retransmission timer
/// (the retransmits of loss recovery are not tracked).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetransState {
    pub first_ns: u64,
    pub last_ns: u64,
    pub flow: FlowKey,
    /// Consecutive retransmits of the segment starting at `seq` (reset by a retransmit
    /// of another segment: progress, or congestion recovery).
    pub repeats: u32,
    /// What was reported for the current stall: 0 nothing,
    /// [`RETRANS_REPORTED_PMTUD`] a PMTUD black hole, [`RETRANS_REPORTED_STALL`] a stall
    /// without MTU evidence.
    pub reported: u32,
    pub netns: u32,
    /// Sequence number of the segment being retransmitted.
    pub seq: u32,
    /// Its length when last retransmitted: sent again shorter, the MSS shrank.
    pub len: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<RetransState>() == 80);
/// [`RetransState::reported`]: a PMTUD black hole was reported.
pub const RETRANS_REPORTED_PMTUD: u32 = 1;
/// [`RetransState::reported`]: a stall without MTU evidence was reported.
pub const RETRANS_REPORTED_STALL: u32 = 2;

/// Whether MTU evidence explains a stalled segment: the programs and the agent judge
/// alike with these.
pub mod stall {
    use super::AF_INET;

    /// The smallest packet a segment of `len` payload bytes makes: IP and TCP headers
    /// without options.
    pub const fn smallest_packet(family: u16, len: u32) -> u32 {
        len + if family == AF_INET { 40 } else { 60 }
    }

    /// Whether a `packet`-byte packet still exceeds the `mtu` a drop or a frag-needed
    /// named (0: not named, so it may). Once it fits, PMTUD has worked for the flow and
    /// that evidence is not about this stall.
    pub const fn exceeds(packet: u32, mtu: u32) -> bool {
        mtu == 0 || packet > mtu
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    pub reason: u32,
    pub netns: u32,
    pub ifindex: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<DropKey>() == 16);

/// A verdict pushed to user space. Evidence members are zero when nothing was found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub ts_ns: u64,
    pub kind: u32,
    /// Positive errno from the socket (0 when none).
    pub error: u32,
    pub flow: FlowKey,
    pub netns: u32,
    /// SYN retransmits for connect verdicts, full-size retransmits for PMTUD stalls.
    pub retrans: u32,
    /// The SYN drop (connect verdicts) or the oversize drop (DF verdicts) of this flow.
    pub drop: DropInfo,
    /// The ICMP error this kernel generated for the flow.
    pub icmp: IcmpInfo,
    /// MTU verdicts: the frag-needed / packet-too-big this node received for the flow.
    /// Connect verdicts: the ICMP destination-unreachable it received for the flow.
    pub icmp_rcvd: IcmpInfo,
    /// Frag-needed for the flow dropped by netfilter on this node.
    pub frag_dropped: DropInfo,
    /// Egress MTU (oversize drops) or the socket's MSS (PMTUD stalls).
    pub mtu: u32,
    /// Dropped packet length (oversize drops) or retransmitted segment length (stalls).
    pub len: u32,
    /// [`event_flag`] bits.
    pub flags: u32,
    /// [`verdict_class`] bits of the key the verdict was aggregated under.
    pub class: u32,
    /// Aggregated verdicts: the key's count in [`MAP_VERDICT_AGG`] (this CPU's) when the
    /// event was sent, this verdict included (the verdicts of the key since its previous event
    /// were only counted). 0: not aggregated, the event stands for one verdict.
    pub count: u64,
    /// [`VerdictKey::icmp`] of the key the verdict was aggregated under.
    pub icmp_key: u32,
    /// [`VerdictKey::cpu`] of the key the verdict was aggregated under (0 when not
    /// aggregated).
    pub cpu: u32,
    /// How far before `ts_ns` the evidence window began, in milliseconds: the ICMP and
    /// drop evidence in this event was looked up from then on. [`WINDOW_ALL`]: from the
    /// start (the maps' whole memory). User space compares it with when it was watching
    /// ICMP from the network, to tell "none received" from "not watched".
    pub window_ms: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Event>() == 264);

/// [`Event::window_ms`] of a verdict whose evidence is not limited to a window.
pub const WINDOW_ALL: u32 = u32::MAX;

/// Load-time settings, written by the agent into the read-only global [`GLOBAL_CONFIG`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Bit `r` set: a SYN dropped with `skb_drop_reason` `r` is recorded per flow.
    pub flow_reasons: [u64; 4],

    /// Record offsets of the one regular tracepoint, `icmp:icmp_send` (its record has the
    /// ICMP type and code, which its arguments do not). The other hooks are raw or BTF
    /// tracepoints: they read their arguments (positions checked in BTF by the agent) and
    /// kernel structs at the offsets below.
    pub icmp_skbaddr: u16,
    pub icmp_type: u16,
    pub icmp_code: u16,
    pub icmp_saddr: u16,
    pub icmp_daddr: u16,
    pub icmp_sport: u16,
    pub icmp_dport: u16,
    pub _pad0: u16,

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
    /// `struct net_device` -> `mtu`.
    pub dev_mtu: u32,
    /// `struct sk_buff` -> `len`.
    pub skb_len: u32,
    /// `struct sk_buff` -> `_skb_refdst` (the route; low bit is a flag).
    pub skb_refdst: u32,
    /// `struct dst_entry` -> `dev`.
    pub dst_dev: u32,
    /// `struct tcp_sock` -> `mss_cache`.
    pub tcp_mss_cache: u32,
    /// `struct sk_buff` -> `cb` (for TCP, `struct tcp_skb_cb`, whose `seq` comes first).
    pub skb_cb: u32,
    /// `struct sk_buff` -> `protocol` (network order u16).
    pub skb_protocol: u32,
    /// `struct sock` -> `__sk_common.skc_state` (u8).
    pub sk_state: u32,
    /// Non-zero when `tcp_retransmit_skb` passes the transmit's result (`err`) as its
    /// third argument (newer kernels, which also trace failed retransmits).
    pub retrans_err_arg: u32,
    /// `struct inet_sock` -> `inet_sport` (local port, network order u16): unlike
    /// `skc_num`, still set when the closing socket's port has been released.
    pub inet_sport: u32,
    /// `skb_drop_reason` values (u32::MAX when this kernel lacks them).
    pub reason_pkt_too_big: u32,
    pub reason_netfilter_drop: u32,
    /// Consecutive full-size retransmits that make a PMTUD stall.
    pub fullsize_retrans_threshold: u32,

    /// SYN retransmits after which a connect is reported as timing out.
    pub syn_retrans_threshold: u32,
    /// Non-zero: sockets and packets whose netns is known and not in [`MAP_SCOPE`] are
    /// ignored (tracepoints fire for every namespace on the kernel).
    pub scope_enabled: u32,

    /// `struct sk_buff` -> `_nfct` (the conntrack entry, low 3 bits its ctinfo); 0 when
    /// this kernel has no conntrack, which turns the NAT join off.
    pub skb_nfct: u32,
    /// `struct nf_conn` -> `tuplehash[0].tuple` (original direction) and
    /// `tuplehash[1].tuple` (reply).
    pub ct_orig: u32,
    pub ct_reply: u32,
    /// Offsets inside `struct nf_conntrack_tuple`: `src.u3`, `src.u` (the port),
    /// `src.l3num`, `dst.u3`, `dst.u`, `dst.protonum`.
    pub ct_src_u3: u16,
    pub ct_src_port: u16,
    pub ct_l3num: u16,
    pub ct_dst_u3: u16,
    pub ct_dst_port: u16,
    pub ct_protonum: u16,

    /// `struct sock` -> `sk_error_queue`, and `struct sk_buff_head` -> `prev` (its tail):
    /// where an ICMP error reported through the error queue (`IP_RECVERR`) is read back.
    /// 0 when this kernel's BTF lacks them, which leaves the error queue unread.
    pub sk_error_queue: u32,
    pub queue_prev: u32,
    /// `struct sk_buff` -> `cb` + `struct sock_exterr_skb` -> `ee` (the UAPI
    /// `struct sock_extended_err`: errno, origin, ICMP type and code); 0 when unknown.
    pub skb_ee: u32,
    /// `struct tcp_sock` -> `inet_conn.icsk_retransmits` (u8): the RTOs in a row the
    /// head segment has had without an ACK moving on (raised before the retransmit each
    /// RTO makes, cleared by the first ACK of new data).
    pub tcp_rto_count: u32,

    /// At most one event per verdict key per this many nanoseconds; the verdicts in
    /// between are only counted in [`MAP_VERDICT_AGG`].
    pub verdict_window_ns: u64,

    /// vmlinux BTF ids of `struct iphdr`, `ipv6hdr`, `tcphdr`, `udphdr`, `icmphdr` and
    /// `icmp6hdr`, for the `bpf_rdonly_cast` kfunc (Linux 6.2+): a drop's packet headers
    /// are then read with plain loads instead of a probe-read helper call each. All 0 when
    /// this kernel lacks the kfunc (the calls are then rewritten away, see
    /// [`KFUNC_RDONLY_CAST_MARK`]) and the probe reads stay.
    pub cast_iphdr: u32,
    pub cast_ipv6hdr: u32,
    pub cast_tcphdr: u32,
    pub cast_udphdr: u32,
    pub cast_icmphdr: u32,
    pub cast_icmp6hdr: u32,
    /// `struct inet_sock` and `struct tcp_sock`, so a socket's fields are plain loads
    /// too, whatever the verifier knew of the pointer (0: probe reads).
    pub cast_inet_sock: u32,
    pub cast_tcp_sock: u32,
    /// `struct dst_entry`: the route of a packet that has no device.
    pub cast_dst_entry: u32,
    /// `struct sk_buff`: a raw tracepoint's skb argument read with plain loads.
    pub cast_sk_buff: u32,

    /// Bit `r` set: a SYN towards a pod of this node dropped with `skb_drop_reason` `r`
    /// is an inbound drop ([`MAP_INBOUND`]): the filters' reasons.
    pub firewall_reasons: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<Config>() == 32 + 16 + 128 + 24 + 16 + 8 + 40 + 32);

/// The helper id the eBPF programs call in place of the `bpf_rdonly_cast` kfunc: aya
/// cannot relocate kfunc calls, so the agent rewrites every `call` with this immediate
/// in the object before loading it, into a kfunc call (the function's vmlinux BTF id)
/// or, on a kernel without it, into `r0 = 0`. No kernel has a helper with this id.
pub const KFUNC_RDONLY_CAST_MARK: i32 = 0x6e64_0001;

/// The first of the helper ids the eBPF programs call for a load-time setting they want
/// as an instruction's immediate instead of a load from [`Config`]: the agent rewrites
/// every `call` of `IMM_MARK + n` into `w0 = value` (the value of [`imm`] number `n`,
/// from [`Config::immediates`]) before loading the object. A hook that runs rarely starts
/// cold, and a load of the read-only global is then a cache and TLB miss of its own;
/// an immediate is part of the code. No kernel has a helper with these ids.
pub const IMM_MARK: i32 = 0x6e64_0100;

/// The settings the programs take as immediates (see [`IMM_MARK`]), by their number.
pub mod imm {
    /// [`Config::sk_state`](super::Config::sk_state).
    pub const SK_STATE: i32 = 0;
    /// [`Config::retrans_err_arg`](super::Config::retrans_err_arg).
    pub const RETRANS_ERR_ARG: i32 = 1;
    /// [`Config::tcp_rto_count`](super::Config::tcp_rto_count).
    pub const TCP_RTO_COUNT: i32 = 2;
    /// [`Config::cast_tcp_sock`](super::Config::cast_tcp_sock).
    pub const CAST_TCP_SOCK: i32 = 3;
    pub const COUNT: usize = 4;
}

impl Config {
    /// The values of the [`imm`] settings, by number: the same values the programs read
    /// from the global, so either way of reading a setting gives one answer.
    pub const fn immediates(&self) -> [u32; imm::COUNT] {
        [
            self.sk_state,
            self.retrans_err_arg,
            self.tcp_rto_count,
            self.cast_tcp_sock,
        ]
    }
}

impl FlowKey {
    pub const fn is_v4(&self) -> bool {
        self.family == AF_INET
    }
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    /// Marks each type plain old data for aya's map and global APIs.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {
            $(
                // SAFETY: the type is repr(C), integer-only, with its padding explicit
                // (size asserts beside each): every bit pattern is a valid value, and
                // no byte is uninitialised.
                unsafe impl aya::Pod for $t {}
            )*
        };
    }

    pod!(
        FlowKey,
        FlowState,
        DropSlot,
        DropSite,
        Shot,
        DropInfo,
        IcmpInfo,
        DropKey,
        Event,
        RetransState,
        NatInfo,
        VerdictKey,
        VerdictAgg,
        InboundKey,
        InboundAgg,
        Config,
    );
}
