//! Reads from the kernel: tracepoint record fields at the offsets tracefs gave, and
//! kernel structs (`struct sock`, `struct sk_buff`, `struct net_device`, `struct net`)
//! at the offsets BTF gave, all through [`CONFIG`](crate::config). Every read can fail
//! and says so with `None`; attribution to a namespace or device degrades to 0 instead.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_buf},
    programs::TracePointContext,
};
use node_diag_common::{AF_INET, AF_INET6, FlowKey, KFUNC_RDONLY_CAST_MARK};

use crate::{config::config, flow::set_v4};

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
    kread_at(base, offset as u64)
}

/// [`kread`] at a 64-bit offset (an [`imm!`](crate::config::imm) setting, which narrowed
/// to a `u32` would be masked again).
#[inline(always)]
pub fn kread_at<T>(base: u64, offset: u64) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel((base + offset) as *const T) }.ok()
}

/// A `T` at `base + offset`, where `base` is a pointer whose BTF type the verifier knows
/// (a BTF tracepoint's argument, or a struct pointer read from one through this). A plain
/// load, which the kernel turns into one guarded against faults (`BPF_PROBE_MEM`): no
/// helper call. The verifier checks `offset` (a read-only constant) against the type.
#[inline(always)]
pub fn btf_read<T: Copy>(base: u64, offset: u32) -> T {
    btf_read_at(base, offset as u64)
}

/// [`btf_read`] at a 64-bit offset, as [`kread_at`].
#[inline(always)]
pub fn btf_read_at<T: Copy>(base: u64, offset: u64) -> T {
    // SAFETY: see `btf_read`; a fault reads zeros instead of crashing.
    unsafe { core::ptr::read_volatile((base + offset) as *const T) }
}

/// `addr` as a pointer to the vmlinux struct whose BTF id is `btf_id`, for the verifier:
/// the `bpf_rdonly_cast` kfunc (Linux 6.2+), which the verifier turns into a register
/// move. Loads through the result are plain loads guarded against faults, checked
/// against that struct's layout, like [`btf_read`]'s. Reached only when the agent found
/// the kfunc (`btf_id` a non-zero read-only constant, which the verifier requires); the
/// call is the marker the agent rewrites ([`KFUNC_RDONLY_CAST_MARK`]).
#[inline(always)]
pub fn rdonly_cast(addr: u64, btf_id: impl Into<u64>) -> u64 {
    // SAFETY: the marker id is a call the agent rewrites into the kfunc (same calling
    // convention as a helper: arguments in r1-r2, result in r0) or into `r0 = 0`. The
    // id (a `u32` for the kfunc) is passed zero-extended, as a `u32` would be.
    let cast: unsafe extern "C" fn(u64, u64) -> u64 =
        unsafe { core::mem::transmute(KFUNC_RDONLY_CAST_MARK as usize) };
    // SAFETY: see above; the kfunc only retypes its argument.
    unsafe { cast(addr, btf_id.into()) }
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

/// `sk` retyped as the socket struct whose vmlinux BTF id is `btf_id` (a read-only
/// constant of [`CONFIG`](crate::config)) on a kernel with `bpf_rdonly_cast`, so its
/// fields are plain loads; 0 otherwise (`btf_id` 0). Whatever the verifier knew of `sk`
/// (a raw tracepoint's number, or a BTF pointer that has served as a map key) does not
/// matter to the cast.
#[inline(always)]
fn cast_sock(sk: u64, btf_id: u64) -> u64 {
    if btf_id == 0 || sk == 0 {
        return 0;
    }
    rdonly_cast(sk, btf_id)
}

/// [`cast_sock`] to `struct inet_sock`, whose first member is its `struct sock`: every
/// `sock` and `inet_sock` field.
#[inline(always)]
fn inet_sock(sk: u64) -> u64 {
    cast_sock(sk, config!(cast_inet_sock) as u64)
}

/// A field of a socket at `offset` (a `struct sock` or `struct inet_sock` BTF offset): a
/// plain load through [`inet_sock`] where the kernel allows it, a probe read elsewhere.
#[inline(always)]
pub fn sock_read<T: Copy>(sk: u64, offset: u32) -> Option<T> {
    let isk = inet_sock(sk);
    if isk != 0 {
        return Some(btf_read(isk, offset));
    }
    kread(sk, offset)
}

/// [`sock_read`] of a `struct tcp_sock` field.
#[inline(always)]
pub fn tcp_sock_read<T: Copy>(sk: u64, offset: u32) -> Option<T> {
    tcp_sock_read_as(sk, config!(cast_tcp_sock) as u64, offset as u64)
}

/// [`tcp_sock_read`] with the cast's BTF id given (`config!(cast_tcp_sock)` or its
/// immediate).
#[inline(always)]
pub fn tcp_sock_read_as<T: Copy>(sk: u64, cast_tcp_sock: u64, offset: u64) -> Option<T> {
    let tsk = cast_sock(sk, cast_tcp_sock);
    if tsk != 0 {
        return Some(btf_read_at(tsk, offset));
    }
    kread_at(sk, offset)
}

/// The flow tuple of a `struct sock *` (local end first), read at the BTF offsets: by
/// plain loads through [`inet_sock`] where the kernel allows it, else by probe reads.
#[inline(always)]
pub fn sock_tuple(sk: u64) -> Option<FlowKey> {
    let isk = inet_sock(sk);
    if isk != 0 {
        return sock_tuple_loads(isk);
    }
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

/// The IPv4 addresses of a socket the verifier knows (a `struct sock *` or
/// `struct inet_sock *`) into `key`, by plain loads of the u32 fields they are: the bytes
/// stay in network order.
#[inline(always)]
fn sock_v4_addrs_loaded(sk: u64, key: &mut FlowKey) {
    set_v4(
        &mut key.saddr,
        btf_read::<u32>(sk, config!(sk_saddr)).to_ne_bytes(),
    );
    set_v4(
        &mut key.daddr,
        btf_read::<u32>(sk, config!(sk_daddr)).to_ne_bytes(),
    );
}

/// [`sock_tuple`] through a `struct inet_sock *` the verifier knows ([`inet_sock`]):
/// every field a plain load, IPv6 addresses 4 bytes at a time (`in6_addr`'s `u32` view,
/// the widest member the verifier matches a load to).
#[inline(always)]
fn sock_tuple_loads(isk: u64) -> Option<FlowKey> {
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: u16::from_be(btf_read::<u16>(isk, config!(inet_sport))),
        dport: u16::from_be(btf_read::<u16>(isk, config!(sk_dport))),
        family: btf_read::<u16>(isk, config!(sk_family)),
        _pad: 0,
    };
    if key.family == AF_INET {
        sock_v4_addrs_loaded(isk, &mut key);
        return Some(key);
    }
    if key.family != AF_INET6 || config!(sk_v6_daddr) == 0 {
        return None;
    }
    for i in 0..4 {
        let s: u32 = btf_read(isk, config!(sk_v6_saddr) + 4 * i as u32);
        let d: u32 = btf_read(isk, config!(sk_v6_daddr) + 4 * i as u32);
        key.saddr[4 * i..4 * i + 4].copy_from_slice(&s.to_ne_bytes());
        key.daddr[4 * i..4 * i + 4].copy_from_slice(&d.to_ne_bytes());
    }
    unmap_v4(&mut key);
    Some(key)
}

/// [`sock_tuple`] for a socket the verifier knows as a `struct sock *` (a BTF
/// tracepoint's argument). Without the cast, `sock_common`'s fields by plain loads; the
/// local port is `inet_sock`'s, beyond `struct sock`, and IPv6 addresses are arrays the
/// verifier will not load 8 bytes at a time: those two stay probe reads.
#[inline(always)]
pub fn sock_tuple_btf(sk: u64) -> Option<FlowKey> {
    if config!(cast_inet_sock) != 0 {
        return sock_tuple(sk);
    }
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: u16::from_be(kread::<u16>(sk, config!(inet_sport))?),
        dport: u16::from_be(btf_read::<u16>(sk, config!(sk_dport))),
        family: btf_read::<u16>(sk, config!(sk_family)),
        _pad: 0,
    };
    if key.family == AF_INET {
        sock_v4_addrs_loaded(sk, &mut key);
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

/// [`net_inum`] of a `struct net *` the verifier knows (loaded from a struct it knows):
/// a plain load.
#[inline(always)]
fn net_inum_loaded(net: u64) -> u32 {
    if net == 0 {
        return 0;
    }
    btf_read(net, config!(net_inum))
}

/// Network namespace inode of a `struct sock *` (0 when BTF offsets are unknown).
#[inline(always)]
pub fn sock_netns(sk: u64) -> u32 {
    if config!(btf_ok) == 0 {
        return 0;
    }
    let isk = inet_sock(sk);
    if isk != 0 {
        return net_inum_loaded(btf_read(isk, config!(sk_net)));
    }
    kread::<u64>(sk, config!(sk_net)).map_or(0, net_inum)
}

/// [`skb_dev`] for an skb the verifier knows as a `struct sk_buff *` (a BTF tracepoint's
/// argument): direct loads through the device and its namespace.
#[inline(always)]
pub fn skb_dev_btf(skb: u64) -> (u32, u32) {
    let mut dev: u64 = btf_read(skb, config!(skb_dev));
    if dev == 0 {
        // A packet dropped before it got a device, or one that never had one (a closed
        // socket's queues, purged: common): the route's device, if it has a route.
        if config!(cast_dst_entry) == 0 {
            return skb_dev(skb);
        }
        let dst = btf_read::<u64>(skb, config!(skb_refdst)) & !1;
        if dst == 0 {
            return (0, 0);
        }
        dev = btf_read(rdonly_cast(dst, config!(cast_dst_entry)), config!(dst_dev));
        if dev == 0 {
            return (0, 0);
        }
    }
    let ifindex: u32 = btf_read(dev, config!(dev_ifindex));
    (net_inum_loaded(btf_read(dev, config!(dev_net))), ifindex)
}

/// [`skb_dev`] for a raw tracepoint's skb, a plain number to the verifier: retyped as a
/// `struct sk_buff *` where the kernel has the cast, so that its device and namespace
/// are plain loads ([`skb_dev_btf`]) rather than a probe read each.
#[inline(always)]
pub fn skb_dev_raw(skb: u64) -> (u32, u32) {
    let btf_id = config!(cast_sk_buff);
    if btf_id == 0 || skb == 0 || config!(btf_ok) == 0 {
        return skb_dev(skb);
    }
    skb_dev_btf(rdonly_cast(skb, btf_id))
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
