//! Socket hooks: the raw tracepoint `inet_sock_set_state` tracks connecting sockets (raw,
//! so the state that decides whether anything is to be done is read straight from the
//! arguments: most transitions leave after one load), and the BTF tracepoint
//! `inet_sk_error_report` (the regular record carries no socket pointer; BTF-typed, so
//! the socket's fields are plain loads) judges the socket error.
//!
//! Kernels before 5.14 have no `inet_sk_error_report`: its call sites (`tcp_reset`,
//! `tcp_v4_err`, `tcp_write_err`, the error queue) then call the socket's
//! `sk_error_report` callback directly, `sock_def_error_report` for every TCP socket an
//! application opens. An fentry program there (`nd_err_fentry`) runs the same judgement
//! at the same moments; the agent picks it only when the tracepoint is missing.
//!
//! The error is read from the socket itself: `sk_err`, or `sk_err_soft` when an ICMP error
//! arrived while the connecting thread held the socket lock (the kernel then reports with
//! `sk_err` still 0). When both read 0 (the application, woken first, took the error with
//! SO_ERROR), the answer the socket received names it: a reset, or the ICMP error seen for
//! its flow. Each verdict is reported once per connecting socket.

use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, fentry, raw_tracepoint},
    programs::{BtfTracePointContext, FEntryContext, RawTracePointContext},
};
use node_diag_common::{
    AF_INET, AF_INET6, FlowKey, FlowState, IcmpInfo, counter,
    errno::{
        EACCES, ECONNREFUSED, ECONNRESET, EHOSTDOWN, EHOSTUNREACH, ENETUNREACH, ENONET, EPIPE,
        ETIMEDOUT,
    },
    event_flag, event_kind, flow_flag, icmp, icmpv6, ipproto, tcp_state,
};

use crate::{
    config::{config, imm, in_scope, known_out_of_scope, now},
    emit::{Extra, connect_evidence, emit, evidence_gen, inc, note_evidence, store_lru, syn_drop},
    kernel::{btf_read, btf_read_at, kread, sock_netns, sock_read, sock_tuple, sock_tuple_btf},
    maps::{CONNECTS, ICMP_ERR_RCVD, ICMP_SENT, RETRANS},
};

/// How recent a generated ICMP error must be to explain a connect failure.
const ICMP_WINDOW_NS: u64 = 3_000_000_000;

/// `inet_sock_set_state(sk, oldstate, newstate)`; argument positions checked in BTF.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn nd_set_state(ctx: RawTracePointContext) -> i32 {
    match try_set_state(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_set_state(ctx: &RawTracePointContext) -> Option<()> {
    // Most transitions (FIN_WAIT, TIME_WAIT, ...) matter to nobody: leave first.
    let newstate = ctx.arg::<u64>(2) as u32;
    if newstate != tcp_state::SYN_SENT
        && newstate != tcp_state::ESTABLISHED
        && newstate != tcp_state::CLOSE
        && newstate != tcp_state::SYN_RECV
    {
        return None;
    }
    let sk: u64 = ctx.arg(0);
    if newstate == tcp_state::SYN_SENT {
        if sock_read::<u16>(sk, config!(sk_protocol))? != u16::from(ipproto::TCP) {
            return None;
        }
        // Sockets are reused (SLAB_TYPESAFE_BY_RCU): every attempt starts a fresh entry,
        // and an attempt out of scope must not find a previous socket's entry at error
        // time. A namespace the agent has not looked at yet (a pod connecting the moment
        // its veth appeared, before the scope refresh that veth set off) is tracked: the
        // agent judges its verdict against a fresh look at the node, and marks it out of
        // scope if it is not this node's.
        let netns = sock_netns(sk);
        if !in_scope(netns) && known_out_of_scope(netns) {
            if let Some(connect) = live_connect(sk) {
                // SAFETY: the pointer comes from CONNECTS.
                unsafe { end_connect(connect) };
            }
            return None;
        }
        // The generation first: evidence recorded from here on moves it.
        let evidence_gen = evidence_gen();
        let state = FlowState {
            start_ns: now(),
            netns,
            sport: 0,
            flags: 0,
            syn_retrans: 0,
            reported: 0,
            evidence_gen,
        };
        return start_connect(sk, &state);
    }
    // Only a socket in SYN_SENT has an entry in CONNECTS, and it leaves that state for
    // ESTABLISHED, CLOSE, or SYN_RECV (a simultaneous open: the peer's SYN answered the
    // connect, as a SYN-ACK would). So a transition from any other state needs no lookup:
    // a server's new connection (SYN_RECV to ESTABLISHED) and both ends' last close skip
    // it, three of the eight hash lookups a short connection costs here.
    let connecting = ctx.arg::<u64>(1) as u32 == tcp_state::SYN_SENT;
    // Entries exist only for TCP sockets, so the ESTABLISHED and CLOSE paths need no
    // protocol check until one is found (or a reset is seen).
    let (kind, error, netns, retrans, extra) = if newstate == tcp_state::CLOSE {
        closed(sk, connecting)?
    } else if connecting {
        established(sk)?
    } else {
        return None;
    };
    let key = sock_tuple(sk)?;
    let extra = match kind {
        event_kind::ESTABLISHED_RESET => extra,
        _ => syn_drop(&key, extra.since),
    };
    emit(ctx, kind, error, &key, netns, retrans, extra);
    Some(())
}

/// The connect succeeded (or met the peer's own SYN): nothing left to diagnose, so the
/// entry ends. If it had been reported as timing out, that verdict is withdrawn
/// (`CONNECT_LATE`).
#[inline(always)]
fn established(sk: u64) -> Option<(u32, u32, u32, u32, Extra)> {
    let entry = live_connect(sk)?;
    // SAFETY: the pointer comes from CONNECTS; the value is copied out before it ends.
    let connect = unsafe {
        let connect = *entry;
        end_connect(entry);
        connect
    };
    if connect.reported & (1 << event_kind::CONNECT_TIMEOUT) == 0 {
        return None;
    }
    Some((
        event_kind::CONNECT_LATE,
        0,
        connect.netns,
        connect.syn_retrans,
        Extra {
            since: connect.start_ns,
            ..Extra::default()
        },
    ))
}

/// A socket closing: a connect the application gave up on (`connecting`: it closes from
/// SYN_SENT), an established connection closing on a reset, or neither.
#[inline(always)]
fn closed(sk: u64, connecting: bool) -> Option<(u32, u32, u32, u32, Extra)> {
    let connect = if connecting { live_connect(sk) } else { None };
    if let Some(connect) = connect {
        // Still connecting, so it never sent data and has no stall state of its own in
        // RETRANS: the refused storm's path skips that lookup.
        // For the error report, which comes after the port is released.
        let sport = u16::from_be(sock_read::<u16>(sk, config!(inet_sport))?);
        // SAFETY: the pointer comes from the map.
        unsafe { (*connect).sport = sport };
        if config!(btf_ok) == 0 {
            // Without the socket's error offsets neither this nor a report can judge the
            // attempt: it ends here.
            // SAFETY: the pointer comes from CONNECTS.
            unsafe { end_connect(connect) };
            return None;
        }
        // A failed connect has its error set before it closes, and the error report
        // follows; without one, the application closed the socket itself (its connect
        // timeout, a kubelet probe's 1 s). A reset is that failure even when `sk_err`
        // reads 0: an application reading SO_ERROR at once (a non-blocking connect
        // polled on another CPU) may have taken the error already. Checked first, as it
        // costs no read: the refused storm's path.
        // SAFETY: the pointer comes from the map.
        if unsafe { (*connect).flags } & flow_flag::RST_RECEIVED != 0
            || sock_read::<u32>(sk, config!(sk_err))? != 0
        {
            return None;
        }
        // No error report follows: this is the attempt's last word.
        // SAFETY: the pointer comes from CONNECTS; the value is copied out before it ends.
        let state = unsafe {
            let state = *connect;
            end_connect(connect);
            state
        };
        if state.reported != 0 {
            return None;
        }
        let key = sock_tuple(sk)?;
        // An ICMP error for the SYN that reached the socket while its owner held the lock
        // set only `sk_err_soft`, with no report; an application reading SO_ERROR takes
        // it from there, fails the connect and closes it. The error this node sent, or
        // TC ingress saw arrive, for the attempt says which it was.
        let icmp_error = icmp_sent_errno(&key)
            .filter(|_| sent_since(&key, state.start_ns))
            .or_else(|| icmp_rcvd_errno(&key, state.start_ns));
        if let Some((error, (kind, counter))) =
            icmp_error.and_then(|e| Some((e, connect_verdict(e)?)))
        {
            inc(counter);
            return Some((
                kind,
                error,
                state.netns,
                state.syn_retrans,
                Extra {
                    since: state.start_ns,
                    ..Extra::default()
                },
            ));
        }
        let dropped = syn_drop(&key, state.start_ns).drop.count > 0;
        if state.syn_retrans == 0 && !dropped {
            // Closed before the first retransmit with nothing dropped here: no sign of
            // trouble, only an impatient client.
            return None;
        }
        inc(counter::CONNECT_TIMEOUT);
        return Some((
            event_kind::CONNECT_ABANDONED,
            0,
            state.netns,
            state.syn_retrans,
            Extra {
                since: state.start_ns,
                ..Extra::default()
            },
        ));
    }
    // The socket is done: its stall state must not pass to the next socket at this
    // address. Looked up first: a lookup that misses is cheaper than a delete that does.
    if RETRANS.get_ptr(&sk).is_some() {
        let _ = RETRANS.remove(&sk);
    }
    // An established connection closing on a received reset: tcp_reset() sets sk_err
    // before it closes the socket.
    if config!(btf_ok) == 0 {
        return None;
    }
    let error = sock_read::<u32>(sk, config!(sk_err))?;
    if error != ECONNRESET && error != EPIPE {
        return None;
    }
    if sock_read::<u16>(sk, config!(sk_protocol))? != u16::from(ipproto::TCP) {
        return None;
    }
    let netns = sock_netns(sk);
    if !in_scope(netns) {
        return None;
    }
    inc(counter::ESTABLISHED_RESET);
    Some((
        event_kind::ESTABLISHED_RESET,
        error,
        netns,
        0,
        Extra::default(),
    ))
}

/// A BTF tracepoint: the verifier knows `sk` as a `struct sock *`, so its fields are
/// plain loads. It runs once per failed connect, so a refused storm runs it per connect.
#[btf_tracepoint(function = "inet_sk_error_report")]
pub fn nd_err_report(ctx: BtfTracePointContext) -> i32 {
    match try_err_report(&ctx, ctx.arg(0)) {
        Some(()) | None => 0,
    }
}

/// `sock_def_error_report(sk)`, where kernels without the `inet_sk_error_report`
/// tracepoint (before 5.14) report a socket error. Its argument is BTF-typed as well, so
/// the same plain loads apply.
#[fentry(function = "sock_def_error_report")]
pub fn nd_err_fentry(ctx: FEntryContext) -> i32 {
    match try_err_report(&ctx, ctx.arg(0)) {
        Some(()) | None => 0,
    }
}

#[inline(always)]
fn try_err_report<C: EbpfContext>(ctx: &C, sk: u64) -> Option<()> {
    if btf_read::<u16>(sk, config!(sk_protocol)) != u16::from(ipproto::TCP) {
        return None;
    }
    // Everything read through `sk` is read before it serves as a map key: a pointer
    // spilled to the stack and handed to a helper as key memory is a plain number to the
    // verifier afterwards (Linux 6.12 at least), and can no longer be dereferenced.
    let mut key = sock_tuple_btf(sk)?;
    // `int`s holding positive errnos: read as the `u32` an errno is here.
    let hard = btf_read::<u32>(sk, config!(sk_err));
    let soft = btf_read::<u32>(sk, config!(sk_err_soft));
    let state = btf_read_at::<u8>(sk, imm!(SK_STATE)) as u32;
    // The ICMP error this report is about, when the kernel queued it on the socket
    // (`ip_icmp_error`, before it sets the error). The report can come before the error
    // is set, or after it (in `sk_err`, or in `sk_err_soft` when the ICMP came while the
    // connecting thread held the socket's lock): then the queued one must be that error.
    let set = if hard != 0 { hard } else { soft };
    let queued = queued_icmp_error(sk).filter(|(errno, _)| set == 0 || *errno == set);
    // Only connecting sockets (in scope by construction); resets of established
    // connections are judged at their CLOSE transition.
    let connect = live_connect(sk)?;
    // A connect's error is reported while the socket is in SYN_SENT, or just after it
    // closed from there (a reset). In any other state the entry is an earlier socket's
    // at this address, whose attempt ended without its last word (a SYN_SENT exit
    // ends it): its evidence is not this socket's.
    if state != tcp_state::SYN_SENT && state != tcp_state::CLOSE {
        // SAFETY: the pointer comes from CONNECTS.
        unsafe { end_connect(connect) };
        return None;
    }
    // SAFETY: the pointer comes from the map; the fields are copied out at once.
    let (since, reset) = unsafe {
        (
            (*connect).start_ns,
            (*connect).flags & flow_flag::RST_RECEIVED != 0,
        )
    };
    // The kernel wakes the application before this report: one reading SO_ERROR at once
    // (a non-blocking connect polled on another CPU, as Go's runtime does) can take
    // `sk_err` first, and this report then reads 0. A reset that reached the connecting
    // socket set ECONNREFUSED (tcp_reset), whatever `sk_err_soft` holds from earlier.
    let mut error = if hard != 0 {
        hard
    } else if reset {
        ECONNREFUSED
    } else {
        soft
    };
    if let Some((errno, mut info)) = queued {
        // The queued error says exactly what it was: received evidence under the
        // socket's own flow, where the verdict looks for it, unless TC ingress filed
        // this error there already (with its sender): it did not when NAT changed the
        // flow the ICMP quotes, or when the classifier was not attached.
        // SAFETY: the values are copied out at once.
        let prev = unsafe { ICMP_ERR_RCVD.get(&key) }.map(|i| (i.last_ns, i.count));
        if !prev.is_some_and(|(last_ns, _)| last_ns >= since) {
            note_evidence();
            let _ = store_lru(&ICMP_ERR_RCVD, &key, prev.map(|(_, n)| n), &mut info);
        }
        if error == 0 {
            error = errno;
        }
    }
    if error == 0 {
        // An ICMP error that hit the socket while its owner held the lock is only stored
        // in sk_err_soft after this report, and queued only on kernels that queue it:
        // the ICMP this kernel generated for the flow names it, or the one TC ingress saw
        // arrive for it (neither when NAT changed the flow on the way: its key differs).
        error = icmp_sent_errno(&key)
            .or_else(|| icmp_rcvd_errno(&key, since))
            .unwrap_or(0);
    }
    let (kind, counter) = match error {
        ECONNREFUSED | EHOSTUNREACH | ENETUNREACH | EHOSTDOWN | ENONET | EACCES => {
            connect_verdict(error)?
        }
        // The verdict was given at the SYN retransmit threshold; this only confirms it.
        // Unless no retransmit was seen: before Linux 6.10 the retransmit tracepoint
        // fires only for a segment that left, so SYNs this node's OUTPUT chain drops
        // never reach the threshold, and the kernel giving up is the first word.
        // SAFETY: the pointer comes from the map; one field read.
        ETIMEDOUT if unsafe { (*connect).reported } & (1 << event_kind::CONNECT_TIMEOUT) == 0 => {
            (event_kind::CONNECT_TIMEOUT, counter::CONNECT_TIMEOUT)
        }
        ETIMEDOUT => (event_kind::CONNECT_GAVE_UP, u32::MAX),
        _ => {
            // No verdict for this error, but a hard one still ends the attempt (see
            // below): its entry must not outlive the socket.
            if hard != 0 {
                // SAFETY: the pointer comes from CONNECTS.
                unsafe { end_connect(connect) };
            }
            return None;
        }
    };
    // A hard error ends the connect (the kernel closes the socket): nothing more will be
    // reported for this attempt, and the entry must not stay live where the next socket
    // at this address could find it.
    let last = hard != 0 || reset;
    // SAFETY: the pointer comes from the map.
    let (netns, syn_retrans, generation, timed_out) = unsafe {
        let bit = 1 << kind;
        if (*connect).reported & bit != 0 {
            if last {
                end_connect(connect);
            }
            return None;
        }
        // Before this verdict's own bit: a timeout given only now is no earlier one.
        let timed_out = (*connect).reported & (1 << event_kind::CONNECT_TIMEOUT) != 0;
        (*connect).reported |= bit;
        if key.sport == 0 {
            key.sport = (*connect).sport;
        }
        (
            (*connect).netns,
            (*connect).syn_retrans,
            (*connect).evidence_gen,
            timed_out,
        )
    };
    // An attempt reported as timing out was counted then: one attempt, one count.
    if counter != u32::MAX && !timed_out {
        inc(counter);
    }
    let mut flags = if reset { event_flag::RST_RECEIVED } else { 0 };
    if timed_out {
        flags |= event_flag::AFTER_TIMEOUT;
    }
    emit(
        ctx,
        kind,
        error,
        &key,
        netns,
        syn_retrans,
        Extra {
            flags,
            ..connect_evidence(&key, since, generation)
        },
    );
    if last {
        // SAFETY: the pointer comes from CONNECTS.
        unsafe { end_connect(connect) };
    }
    Some(())
}

/// The socket's entry in CONNECTS, unless its attempt has ended.
///
/// Entries are ended in place, not deleted, and the socket's next attempt rewrites its
/// entry in place ([`start_connect`]): an LRU map's delete and its insert of a new key
/// each take the map's free list under a lock every CPU shares. In a refused storm (each
/// connect inserted its entry and deleted it) the delete was a fifth of the error
/// report's time; the slab hands freed sockets' addresses to new ones, so most attempts
/// find an entry to rewrite (25 entries after 100,000 refused connects). The map then
/// holds an entry per socket address used lately, not per connect in flight: ended
/// entries are evicted by age with the live ones (docs/benchmarks.md).
#[inline(always)]
pub(crate) fn live_connect(sk: u64) -> Option<*mut FlowState> {
    let connect = CONNECTS.get_ptr_mut(&sk)?;
    // SAFETY: the pointer comes from the map.
    if unsafe { (*connect).flags } & flow_flag::ENDED != 0 {
        return None;
    }
    Some(connect)
}

/// Ends the attempt whose entry `connect` is: nothing reads it again until the socket at
/// its address starts another.
///
/// # Safety
/// `connect` must be a pointer CONNECTS returned.
#[inline(always)]
pub(crate) unsafe fn end_connect(connect: *mut FlowState) {
    // SAFETY: the caller's pointer comes from the map.
    unsafe { (*connect).flags = flow_flag::ENDED };
}

/// Starts the connect `state` of socket `sk`: over its address's earlier entry, ended or
/// left behind by a socket freed without its last word, or in a new one.
#[inline(always)]
pub(crate) fn start_connect(sk: u64, state: &FlowState) -> Option<()> {
    if let Some(entry) = CONNECTS.get_ptr_mut(&sk) {
        // SAFETY: the pointer comes from the map. The earlier socket at this address has
        // been freed, so none of its hooks can run on the entry any more.
        unsafe { *entry = *state };
        return Some(());
    }
    CONNECTS.insert(&sk, state, 0).ok()
}

const SO_EE_ORIGIN_ICMP: u8 = 2;
const SO_EE_ORIGIN_ICMP6: u8 = 3;

/// The ICMP error this report is about, when it was queued on the socket's error queue
/// (`ip_icmp_error` queues it and reports before `tcp_v4_err` stores it in
/// `sk_err_soft`): the queue's tail, just added. Its errno, and its type and code as
/// received evidence (which TC ingress files under the quoted flow: another key when NAT
/// changed the flow). Read through `sk` as a BTF pointer, so before `sk` serves as a map
/// key.
#[inline(always)]
fn queued_icmp_error(sk: u64) -> Option<(u32, IcmpInfo)> {
    let (queue, ee) = (config!(sk_error_queue), config!(skb_ee));
    if queue == 0 || ee == 0 {
        return None;
    }
    let head = sk + queue as u64;
    let tail: u64 = btf_read(sk, queue + config!(queue_prev));
    // An empty queue's tail is its head.
    if tail == 0 || tail == head {
        return None;
    }
    // `struct sock_extended_err`: ee_errno (u32), ee_origin, ee_type, ee_code (u8 each).
    let err = kread::<[u8; 8]>(tail, ee)?;
    let errno = u32::from_ne_bytes([err[0], err[1], err[2], err[3]]);
    if (err[4] != SO_EE_ORIGIN_ICMP && err[4] != SO_EE_ORIGIN_ICMP6) || errno == 0 {
        return None;
    }
    // No sender: the outer source reaching the socket is the one NAT on this node may
    // have rewritten (to the Service address, for an error about a DNATed flow).
    let info = IcmpInfo {
        last_ns: now(),
        icmp_type: err[5] as u32,
        icmp_code: err[6] as u32,
        ..IcmpInfo::default()
    };
    Some((errno, info))
}

/// The verdict (event kind, counter) of a connect failed with `error`, for the errors an
/// ICMP error or a reset gives.
#[inline(always)]
fn connect_verdict(error: u32) -> Option<(u32, u32)> {
    match error {
        ECONNREFUSED => Some((event_kind::CONNECT_REFUSED, counter::CONNECT_REFUSED)),
        // EACCES: ICMPv6 administratively prohibited (IPv4's maps to EHOSTUNREACH).
        EHOSTUNREACH | ENETUNREACH | EHOSTDOWN | ENONET | EACCES => Some((
            event_kind::CONNECT_UNREACHABLE,
            counter::CONNECT_UNREACHABLE,
        )),
        _ => None,
    }
}

/// Whether the ICMP error this node sent for `key` was sent since `since`.
#[inline(always)]
fn sent_since(key: &FlowKey, since: u64) -> bool {
    // SAFETY: one field copied out at once.
    unsafe { ICMP_SENT.get(key) }.is_some_and(|i| i.last_ns >= since)
}

/// The errno the kernel derives from an ICMP destination-unreachable code
/// (`icmp_err_convert`), for an ICMP this kernel generated for `key` just now.
#[inline(always)]
fn icmp_sent_errno(key: &FlowKey) -> Option<u32> {
    // SAFETY: the value is copied out at once.
    let icmp = unsafe { ICMP_SENT.get(key) }?;
    if now().saturating_sub(icmp.last_ns) > ICMP_WINDOW_NS {
        return None;
    }
    if key.family == AF_INET6 {
        return unreach6_errno(icmp.icmp_code);
    }
    unreach_errno(icmp.icmp_code)
}

/// The errno the kernel derives from the destination unreachable TC ingress saw arrive
/// for `key` (the flow it quotes) since the attempt began at `since`, just now:
/// `icmp_err_convert` for ICMP, `icmpv6_err_convert` for ICMPv6. Other ICMP types
/// (time exceeded, say) end no connect.
#[inline(always)]
fn icmp_rcvd_errno(key: &FlowKey, since: u64) -> Option<u32> {
    // SAFETY: the value is copied out at once.
    let icmp = unsafe { ICMP_ERR_RCVD.get(key) }?;
    if icmp.last_ns < since || now().saturating_sub(icmp.last_ns) > ICMP_WINDOW_NS {
        return None;
    }
    // The key's family is the quoted packet's, so the ICMP's.
    match (key.family, icmp.icmp_type) {
        (AF_INET, icmp::DEST_UNREACH) => unreach_errno(icmp.icmp_code),
        (AF_INET6, icmpv6::DEST_UNREACH) => unreach6_errno(icmp.icmp_code),
        _ => None,
    }
}

/// `icmpv6_err_convert`'s errno for an ICMPv6 destination unreachable `code`.
#[inline(always)]
fn unreach6_errno(code: u32) -> Option<u32> {
    match code {
        icmpv6::NOROUTE => Some(ENETUNREACH),
        icmpv6::NOT_NEIGHBOUR | icmpv6::ADDR_UNREACH => Some(EHOSTUNREACH),
        icmpv6::PORT_UNREACH => Some(ECONNREFUSED),
        icmpv6::ADM_PROHIBITED | icmpv6::POLICY_FAIL | icmpv6::REJECT_ROUTE => Some(EACCES),
        _ => None,
    }
}

/// `icmp_err_convert`'s errno for an ICMP destination unreachable `code`.
#[inline(always)]
fn unreach_errno(code: u32) -> Option<u32> {
    match code {
        icmp::NET_UNREACH | icmp::NET_UNKNOWN | icmp::NET_ANO | icmp::NET_UNR_TOS => {
            Some(ENETUNREACH)
        }
        icmp::HOST_UNREACH | icmp::HOST_ANO | icmp::HOST_UNR_TOS..=icmp::PREC_CUTOFF => {
            Some(EHOSTUNREACH)
        }
        icmp::PORT_UNREACH => Some(ECONNREFUSED),
        icmp::HOST_UNKNOWN => Some(EHOSTDOWN),
        icmp::HOST_ISOLATED => Some(ENONET),
        _ => None,
    }
}
