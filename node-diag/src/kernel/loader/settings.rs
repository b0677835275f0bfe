//! The programs' settings from this kernel: tracepoint field offsets from tracefs, struct
//! offsets, casts and the conntrack layout from BTF, into [`Config`]; and the checks that
//! a hook's arguments are what the programs read.

use super::*;

pub(super) fn fill_config(
    c: &mut Config,
    hook: &Hook,
    fmt: &Format,
    reasons: &mut DropReasons,
) -> Result<(), TracefsError> {
    match hook.program {
        // Raw tracepoints: they read their arguments and the kernel structs at BTF
        // offsets, not the record; the format only shows the tracepoint exists.
        "nd_set_state" | "nd_err_report" | "nd_retransmit" | "nd_rcv_reset" | "nd_snd_reset" => {}
        "nd_kfree_skb" => *reasons = DropReasons::from_format(fmt),
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

/// The struct ids `bpf_rdonly_cast` casts packet headers, sockets and routes to, when this kernel has the
/// kfunc and every one of those structs; the kfunc's id. Otherwise all stay 0 (probe
/// reads).
pub(super) fn fill_casts(c: &mut Config, btf: &Btf) -> Option<u32> {
    let kfunc = btf.func_id("bpf_rdonly_cast")?;
    let ids = [
        "iphdr",
        "ipv6hdr",
        "tcphdr",
        "udphdr",
        "icmphdr",
        "icmp6hdr",
        "inet_sock",
        "tcp_sock",
        "dst_entry",
        "sk_buff",
    ]
    .map(|name| btf.struct_id(name).ok());
    let [
        Some(ip),
        Some(ip6),
        Some(tcp),
        Some(udp),
        Some(icmp),
        Some(icmp6),
        Some(inet_sock),
        Some(tcp_sock),
        Some(dst_entry),
        Some(sk_buff),
    ] = ids
    else {
        return None;
    };
    c.cast_inet_sock = inet_sock;
    c.cast_tcp_sock = tcp_sock;
    c.cast_dst_entry = dst_entry;
    c.cast_sk_buff = sk_buff;
    c.cast_iphdr = ip;
    c.cast_ipv6hdr = ip6;
    c.cast_tcphdr = tcp;
    c.cast_udphdr = udp;
    c.cast_icmphdr = icmp;
    c.cast_icmp6hdr = icmp6;
    Some(kfunc)
}

/// Whether the programs read packets and sockets by plain loads on this kernel (see
/// [`fill_casts`]), for `doctor`.
pub(crate) fn plain_loads(btf: &Btf) -> bool {
    fill_casts(&mut Config::default(), btf).is_some()
}

pub(super) fn fill_btf(c: &mut Config, btf: &Btf) -> Result<(), crate::kernel::btf::BtfError> {
    c.sk_net = btf.path_offset("sock", "__sk_common.skc_net.net")?;
    c.sk_err = btf.member_offset("sock", "sk_err")?;
    c.sk_err_soft = btf.member_offset("sock", "sk_err_soft")?;
    c.sk_protocol = btf.member_offset("sock", "sk_protocol")?;
    c.sk_family = btf.path_offset("sock", "__sk_common.skc_family")?;
    c.sk_dport = btf.path_offset("sock", "__sk_common.skc_dport")?;
    c.sk_saddr = btf.path_offset("sock", "__sk_common.skc_rcv_saddr")?;
    c.sk_daddr = btf.path_offset("sock", "__sk_common.skc_daddr")?;
    // Kernels built without IPv6 have no v6 addresses in sock_common.
    c.sk_v6_saddr = btf
        .path_offset("sock", "__sk_common.skc_v6_rcv_saddr")
        .unwrap_or(0);
    c.sk_v6_daddr = btf
        .path_offset("sock", "__sk_common.skc_v6_daddr")
        .unwrap_or(0);
    c.net_inum = btf.path_offset("net", "ns.inum")?;
    c.skb_dev = btf.member_offset("sk_buff", "dev")?;
    c.skb_head = btf.member_offset("sk_buff", "head")?;
    c.skb_network_header = btf.member_offset("sk_buff", "network_header")?;
    c.dev_ifindex = btf.member_offset("net_device", "ifindex")?;
    c.dev_net = btf.path_offset("net_device", "nd_net.net")?;
    c.dev_mtu = btf.member_offset("net_device", "mtu")?;
    c.skb_len = btf.member_offset("sk_buff", "len")?;
    c.skb_refdst = btf.member_offset("sk_buff", "_skb_refdst")?;
    c.dst_dev = btf.member_offset("dst_entry", "dev")?;
    c.tcp_mss_cache = btf.member_offset("tcp_sock", "mss_cache")?;
    c.tcp_rto_count = btf.path_offset("tcp_sock", "inet_conn.icsk_retransmits")?;
    c.skb_cb = btf.member_offset("sk_buff", "cb")? + btf.member_offset("tcp_skb_cb", "seq")?;
    c.skb_protocol = btf.member_offset("sk_buff", "protocol")?;
    c.inet_sport = btf.member_offset("inet_sock", "inet_sport")?;
    c.sk_state = btf.path_offset("sock", "__sk_common.skc_state")?;
    // Newer kernels also trace failed retransmits, with their error as a third argument.
    c.retrans_err_arg = btf
        .trace_args("tcp_retransmit_skb")
        .is_ok_and(|args| args.get(2).is_some_and(|a| a == "int"))
        .into();
    // An ICMP error that reached a socket with IP_RECVERR while its owner held the lock
    // is reported through the error queue, with sk_err still 0: read back from there.
    // Optional: without these, such a report falls back to the ICMP this node sent.
    if let (Ok(queue), Ok(prev), Ok(cb), Ok(ee)) = (
        btf.member_offset("sock", "sk_error_queue"),
        btf.member_offset("sk_buff_head", "prev"),
        btf.member_offset("sk_buff", "cb"),
        btf.member_offset("sock_exterr_skb", "ee"),
    ) {
        c.sk_error_queue = queue;
        c.queue_prev = prev;
        c.skb_ee = cb + ee;
    }
    c.btf_ok = 1;
    fill_conntrack(c, btf);
    Ok(())
}

/// Conntrack offsets for the NAT join; a kernel without conntrack (or with an unexpected
/// layout) keeps `skb_nfct` at 0, and only the join is off.
pub(super) fn fill_conntrack(c: &mut Config, btf: &Btf) {
    let offsets = || -> Result<_, crate::kernel::btf::BtfError> {
        let tuple = btf.member_offset("nf_conntrack_tuple_hash", "tuple")?;
        let hash = btf.struct_size("nf_conntrack_tuple_hash")?;
        let tuplehash = btf.member_offset("nf_conn", "tuplehash")?;
        let small = |path: &str| -> Result<u16, crate::kernel::btf::BtfError> {
            let off = btf.path_offset("nf_conntrack_tuple", path)?;
            u16::try_from(off).map_err(|_| crate::kernel::btf::BtfError::Malformed("tuple offset"))
        };
        Ok((
            btf.member_offset("sk_buff", "_nfct")?,
            tuplehash + tuple,
            tuplehash + hash + tuple,
            [
                small("src.u3")?,
                small("src.u")?,
                small("src.l3num")?,
                small("dst.u3")?,
                small("dst.u")?,
                small("dst.protonum")?,
            ],
        ))
    };
    match offsets() {
        Ok((nfct, orig, reply, t)) => {
            c.skb_nfct = nfct;
            c.ct_orig = orig;
            c.ct_reply = reply;
            [
                c.ct_src_u3,
                c.ct_src_port,
                c.ct_l3num,
                c.ct_dst_u3,
                c.ct_dst_port,
                c.ct_protonum,
            ] = t;
        }
        Err(e) => tracing::info!(error = %e, "no conntrack in this kernel's BTF: NAT join off"),
    }
}

/// Whether this kernel's raw tracepoint passes the arguments where the hook's program
/// reads them (for the agent and `doctor`).
pub(crate) fn check_args(hook: &Hook, btf: &Btf) -> Result<(), String> {
    if !hook.raw {
        return Ok(());
    }
    let found = btf.trace_args(hook.name).map_err(|e| e.to_string())?;
    if found.len() < hook.args.len() || found[..hook.args.len()] != *hook.args {
        return Err(format!(
            "raw tracepoint {} takes ({}) on this kernel; the program reads ({}, ...)",
            hook.name,
            found.join(", "),
            hook.args.join(", ")
        ));
    }
    Ok(())
}

/// Whether `fmt` has every field the hook's program reads (for `doctor`).
pub(crate) fn check_format(hook: &Hook, fmt: &Format) -> Result<(), TracefsError> {
    fill_config(
        &mut Config::default(),
        hook,
        fmt,
        &mut DropReasons::default(),
    )
}
