//! Reads from the kernel: tracepoint record fields at the offsets tracefs gave, and
//! kernel structs (`struct sock`, `struct sk_buff`, `struct net_device`, `struct net`)
//! at the offsets BTF gave, all through [`CONFIG`](crate::config). Every read can fail
//! and says so with `None`; attribution to a namespace or device degrades to 0 instead.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_buf},
    programs::TracePointContext,
};
use node_diag_common::{AF_INET, AF_INET6, FlowKey};

use crate::{config::config, packet::set_v4};

/// One field of the tracepoint record at `offset`.
#[inline(always)]
pub fn field<T>(ctx: &TracePointContext, offset: u16) -> Option<T> {
    // SAFETY: read_at goes through a probe read, which fails rather than faults on a bad
    // offset.
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

/// A `T` at kernel address `base + offset` (`None` for a null base or a faulting read).
#[inline(always)]
pub fn kread<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.ok()
}

/// A `T` at `base + offset`, where `base` is a pointer whose BTF type the verifier knows
/// (a BTF tracepoint's argument, or a struct pointer read from one through this). A plain
/// load, which the kernel turns into one guarded against faults (`BPF_PROBE_MEM`): no
/// helper call. The verifier checks `offset` (a read-only constant) against the type.
#[inline(always)]
pub fn btf_read<T: Copy>(base: u64, offset: u32) -> T {
    // SAFETY: see above; a fault reads zeros instead of crashing.
    unsafe { core::ptr::read_volatile((base + offset as u64) as *const T) }
}

/// Reads `dst.len()` bytes at kernel address `base + offset` straight into `dst`
/// (no stack copy).
#[inline(always)]
pub fn kread_into(dst: &mut [u8], base: u64, offset: u32) -> Option<()> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel_buf checks the source address and fails instead of
    // faulting; `dst` is a valid buffer of its length.
    unsafe { bpf_probe_read_kernel_buf((base + offset as u64) as *const u8, dst) }.ok()
}

/// An IPv6 socket talking IPv4 (dual-stack, Java's default) holds `::ffff:a.b.c.d`
/// addresses, while the packets it sends are IPv4 and their evidence is keyed so. Its
/// key is made the IPv4 one, so that verdicts and packet evidence meet.
#[inline(always)]
fn unmap_v4(key: &mut FlowKey) {
    let mapped = |a: &[u8; 16]| a[..10] == [0; 10] && a[10] == 0xff && a[11] == 0xff;
    let unspecified = |a: &[u8; 16]| *a == [0; 16];
    if !mapped(&key.daddr) || !(mapped(&key.saddr) || unspecified(&key.saddr)) {
        return;
    }
    let (s, d) = (
        [key.saddr[12], key.saddr[13], key.saddr[14], key.saddr[15]],
        [key.daddr[12], key.daddr[13], key.daddr[14], key.daddr[15]],
    );
    key.family = AF_INET;
    key.saddr = [0; 16];
    key.daddr = [0; 16];
    set_v4(&mut key.saddr, s);
    set_v4(&mut key.daddr, d);
}

/// The flow tuple of a `struct sock *` (local end first), read at the BTF offsets.
#[inline(always)]
pub fn sock_tuple(sk: u64) -> Option<FlowKey> {
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        // Not `skc_num`: a closing socket's port is released (zeroed there) before the
        // CLOSE transition is traced.
        sport: u16::from_be(kread::<u16>(sk, config!(inet_sport))?),
        dport: u16::from_be(kread::<u16>(sk, config!(sk_dport))?),
        family: kread::<u16>(sk, config!(sk_family))?,
        _pad: 0,
    };
    if key.family == AF_INET {
        set_v4(&mut key.saddr, kread::<[u8; 4]>(sk, config!(sk_saddr))?);
        set_v4(&mut key.daddr, kread::<[u8; 4]>(sk, config!(sk_daddr))?);
    } else {
        sock_v6_addrs(sk, &mut key)?;
    }
    Some(key)
}

/// The IPv6 addresses of a socket into `key` (unmapped when it talks IPv4), by probe
/// reads: [`sock_tuple`] and [`sock_tuple_btf`] alike, as the verifier will not load a
/// 16-byte array member 8 bytes at a time. `None` for another family or a kernel without
/// IPv6.
#[inline(always)]
fn sock_v6_addrs(sk: u64, key: &mut FlowKey) -> Option<()> {
    if key.family != AF_INET6 || config!(sk_v6_daddr) == 0 {
        return None;
    }
    key.saddr = kread::<[u8; 16]>(sk, config!(sk_v6_saddr))?;
    key.daddr = kread::<[u8; 16]>(sk, config!(sk_v6_daddr))?;
    unmap_v4(key);
    Some(())
}

/// [`sock_tuple`] for a socket the verifier knows as a `struct sock *` (a BTF
/// tracepoint's argument): `sock_common`'s fields by plain loads. The local port is
/// `inet_sock`'s, beyond `struct sock`, and IPv6 addresses are arrays the verifier will
/// not load 8 bytes at a time: those two stay probe reads.
#[inline(always)]
pub fn sock_tuple_btf(sk: u64) -> Option<FlowKey> {
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: u16::from_be(kread::<u16>(sk, config!(inet_sport))?),
        dport: u16::from_be(btf_read::<u16>(sk, config!(sk_dport))),
        family: btf_read::<u16>(sk, config!(sk_family)),
        _pad: 0,
    };
    if key.family == AF_INET {
        // Loaded as the u32 fields they are; the bytes stay in network order.
        set_v4(
            &mut key.saddr,
            btf_read::<u32>(sk, config!(sk_saddr)).to_ne_bytes(),
        );
        set_v4(
            &mut key.daddr,
            btf_read::<u32>(sk, config!(sk_daddr)).to_ne_bytes(),
        );
    } else {
        sock_v6_addrs(sk, &mut key)?;
    }
    Some(key)
}

/// Network namespace inode of a `struct net *`.
#[inline(always)]
fn net_inum(net: u64) -> u32 {
    kread::<u32>(net, config!(net_inum)).unwrap_or(0)
}

/// Network namespace inode of a `struct sock *` (0 when BTF offsets are unknown).
#[inline(always)]
pub fn sock_netns(sk: u64) -> u32 {
    if config!(btf_ok) == 0 {
        return 0;
    }
    kread::<u64>(sk, config!(sk_net)).map_or(0, net_inum)
}

/// [`skb_dev`] for an skb the verifier knows as a `struct sk_buff *` (a BTF tracepoint's
/// argument): direct loads through the device and its namespace.
#[inline(always)]
pub fn skb_dev_btf(skb: u64) -> (u32, u32) {
    let dev: u64 = btf_read(skb, config!(skb_dev));
    if dev == 0 {
        // Rare (a packet dropped before it got a device): the route's device, by probe
        // reads.
        return skb_dev(skb);
    }
    let ifindex: u32 = btf_read(dev, config!(dev_ifindex));
    let net: u64 = btf_read(dev, config!(dev_net));
    let netns: u32 = if net == 0 {
        0
    } else {
        btf_read(net, config!(net_inum))
    };
    (netns, ifindex)
}

/// `(netns inode, ifindex)` of the device an skb is on, zeros when unknown. A locally
/// generated packet before its output hook has no device yet: its route's device says
/// where it is.
#[inline(always)]
pub fn skb_dev(skb: u64) -> (u32, u32) {
    if config!(btf_ok) == 0 {
        return (0, 0);
    }
    let mut dev = kread::<u64>(skb, config!(skb_dev)).unwrap_or(0);
    if dev == 0 {
        dev = kread::<u64>(skb, config!(skb_refdst))
            .filter(|d| *d & !1 != 0)
            .and_then(|d| kread::<u64>(d & !1, config!(dst_dev)))
            .unwrap_or(0);
    }
    if dev == 0 {
        return (0, 0);
    }
    let ifindex = kread::<u32>(dev, config!(dev_ifindex)).unwrap_or(0);
    let netns = kread::<u64>(dev, config!(dev_net)).map_or(0, net_inum);
    (netns, ifindex)
}
