//! When ICMP errors arriving from the network are watched, and whether an event's
//! evidence window was.
//!
//! The TC classifier that sees them (`kernel::tc`) is the one program that costs packets
//! it does not want: attaching any TC ingress program turns on the kernel's ingress step
//! for every packet on every device (docs/benchmarks.md measures ~3 % of a closed loop
//! of short connections). So by default ([`Mode::OnTrouble`]) it is attached only once
//! something shows trouble that ICMP could explain (a verdict other than a plain
//! refusal, SYN or full-size retransmits, oversize drops, frag-needed sent or dropped),
//! and detached after [`IcmpWatch::hold`] without any. [`Mode::Always`] keeps it attached.
//!
//! Each event says how far back its evidence was looked up (`Event::window_ms`); an
//! event is *covered* when the classifier was attached throughout, and only then does
//! "no ICMP error received" mean none came. The correlator says "unknown" otherwise.

use std::time::{Duration, Instant};

use node_diag_common::{Event, WINDOW_ALL, counter, event_flag};

use crate::kernel::{event::EventKind, maps::KernelCounts};

/// `node-diag run --icmp-watch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Attach the classifier when trouble shows, detach it after a quiet hold time.
    #[default]
    OnTrouble,
    /// Keep it attached from the start: the first error of every episode is seen, at
    /// the price of the ingress step on every packet.
    Always,
}

/// How soon an attempt to attach that attached nothing is retried.
const RETRY: Duration = Duration::from_secs(10);

/// The kernel counters whose growth is trouble ICMP could explain.
const TROUBLE_COUNTERS: [u32; 5] = [
    counter::SYN_RETRANSMITS,
    counter::FULLSIZE_RETRANSMITS,
    counter::DF_OVERSIZE_DROPS,
    counter::ICMP_FRAG_SENT,
    counter::ICMP_FRAG_DROPPED,
];

#[derive(Debug)]
pub(crate) struct IcmpWatch {
    mode: Mode,
    hold: Duration,
    /// Programs' clock when the programs were loaded: no evidence is older.
    origin_ns: u64,
    /// Programs' clock (`CLOCK_MONOTONIC` ns) since when the classifier is attached.
    armed_from: Option<u64>,
    /// The last span it was attached, once detached: `(from, to)`.
    last_span: Option<(u64, u64)>,
    last_trouble: Option<Instant>,
    /// The last attempt to attach that attached nothing: retried only after [`RETRY`],
    /// so that a storm of trouble does not list the interfaces for every verdict.
    last_failed: Option<Instant>,
    /// The trouble counters at the previous look.
    seen: [u64; TROUBLE_COUNTERS.len()],
}

impl IcmpWatch {
    /// `origin_ns`: the programs' clock when they were loaded (their maps empty).
    pub(crate) fn new(mode: Mode, hold: Duration, origin_ns: u64) -> Self {
        Self {
            mode,
            hold,
            origin_ns,
            armed_from: None,
            last_span: None,
            last_trouble: None,
            last_failed: None,
            seen: [0; TROUBLE_COUNTERS.len()],
        }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// How long the classifier stays attached after the last trouble.
    pub(crate) fn hold(&self) -> Duration {
        self.hold
    }

    pub(crate) fn armed(&self) -> bool {
        self.armed_from.is_some()
    }

    /// Whether the classifier is to follow the interfaces as they come and go: always
    /// (attached to none yet, say before the CNI made its overlay), or while armed.
    pub(crate) fn keeps_attached(&self) -> bool {
        self.mode == Mode::Always || self.armed()
    }

    /// The classifier was attached at `now_ns` (programs' clock).
    pub(crate) fn attached(&mut self, now_ns: u64) {
        if self.armed_from.is_none() {
            self.armed_from = Some(now_ns);
        }
    }

    /// An attempt to attach, at `now`, attached nothing (no interface took it, or the
    /// classifier is unavailable).
    pub(crate) fn attach_failed(&mut self, now: Instant) {
        self.last_failed = Some(now);
    }

    /// The classifier was detached at `now_ns`.
    pub(crate) fn detached(&mut self, now_ns: u64) {
        if let Some(from) = self.armed_from.take() {
            self.last_span = Some((from, now_ns));
        }
    }

    /// Whether ICMP from the network was watched throughout `ev`'s evidence window.
    pub(crate) fn covers(&self, ev: &Event) -> bool {
        let start = if ev.window_ms == WINDOW_ALL {
            0
        } else {
            ev.ts_ns
                .saturating_sub(u64::from(ev.window_ms).saturating_mul(1_000_000))
        }
        .max(self.origin_ns);
        match (self.armed_from, self.last_span) {
            (Some(from), _) if from <= start => true,
            // Detached since: the event was made while attached.
            (_, Some((from, to))) => from <= start && ev.ts_ns <= to,
            _ => false,
        }
    }

    /// Notes `ev` and says whether it is trouble ICMP could explain, so the classifier
    /// should be attached (or kept) now.
    pub(crate) fn event(&mut self, kind: EventKind, ev: &Event, now: Instant) -> bool {
        let trouble = match kind {
            EventKind::ConnectRefused => ev.flags & event_flag::RST_RECEIVED == 0,
            EventKind::ConnectTimeout
            | EventKind::ConnectUnreachable
            | EventKind::ConnectAbandoned
            | EventKind::DfOversize
            | EventKind::PmtudStall
            | EventKind::TcpStall
            | EventKind::MssShrunk => true,
            // A drop seen here, which the classifier could not explain better.
            EventKind::EstablishedReset
            | EventKind::ConnectGaveUp
            | EventKind::ConnectLate
            | EventKind::InboundSynDropped => false,
        };
        if trouble {
            self.last_trouble = Some(now);
        }
        trouble && self.wants_attach(now)
    }

    /// Notes the kernel counters read at `now` and says whether they show new trouble
    /// that calls for attaching the classifier. They start at zero with the programs.
    pub(crate) fn counters(&mut self, counts: &KernelCounts, now: Instant) -> bool {
        let mut grew = false;
        for (seen, index) in self.seen.iter_mut().zip(TROUBLE_COUNTERS) {
            let value = counts.get(index);
            grew |= value > *seen;
            *seen = value;
        }
        if grew {
            self.last_trouble = Some(now);
        }
        grew && self.wants_attach(now)
    }

    /// Whether the classifier, attached, should be detached at `now`: watching on
    /// trouble, and none for the hold time.
    pub(crate) fn quiet(&self, now: Instant) -> bool {
        self.mode == Mode::OnTrouble
            && self.armed()
            && self
                .last_trouble
                .is_none_or(|t| now.saturating_duration_since(t) >= self.hold)
    }

    fn wants_attach(&self, now: Instant) -> bool {
        self.mode == Mode::OnTrouble
            && !self.armed()
            && self
                .last_failed
                .is_none_or(|t| now.saturating_duration_since(t) >= RETRY)
    }
}

#[cfg(test)]
mod tests {
    use node_diag_common::event_kind;

    use super::*;

    const MS: u64 = 1_000_000;

    impl IcmpWatch {
        /// [`IcmpWatch::event`] for a raw test event, decoded as the ring's reader does.
        fn event_raw(&mut self, ev: &Event, now: Instant) -> bool {
            self.event(EventKind::try_from(ev.kind).unwrap(), ev, now)
        }
    }

    fn event(kind: u32, ts_ns: u64, window_ms: u32) -> Event {
        Event {
            kind,
            ts_ns,
            window_ms,
            ..Default::default()
        }
    }

    #[test]
    fn an_event_is_covered_only_when_watched_over_its_whole_window() {
        let mut w = IcmpWatch::new(Mode::OnTrouble, Duration::from_secs(60), 0);
        let ev = event(event_kind::PMTUD_STALL, 5_000 * MS, 2_000);
        assert!(!w.covers(&ev), "never attached");
        w.attached(4_000 * MS);
        assert!(!w.covers(&ev), "attached after the window began (3 s)");
        w.detached(9_000 * MS);
        let later = event(event_kind::PMTUD_STALL, 8_000 * MS, 2_000);
        assert!(w.covers(&later), "window 6-8 s within the span 4-9 s");
        let after = event(event_kind::PMTUD_STALL, 9_500 * MS, 100);
        assert!(!w.covers(&after), "made after the detach");
        // A window with no beginning is covered only by a watch from the start.
        let all = event(event_kind::DF_OVERSIZE, 8_000 * MS, WINDOW_ALL);
        assert!(!w.covers(&all));
        // ... such as one attached when the programs were loaded.
        let mut always = IcmpWatch::new(Mode::Always, Duration::ZERO, 1_000 * MS);
        always.attached(1_000 * MS);
        assert!(always.covers(&all));
    }

    #[test]
    fn trouble_attaches_once_and_a_refusal_by_rst_is_no_trouble() {
        let now = Instant::now();
        let mut w = IcmpWatch::new(Mode::OnTrouble, Duration::from_secs(60), 0);
        let mut refused = event(event_kind::CONNECT_REFUSED, 1, 0);
        refused.flags = event_flag::RST_RECEIVED;
        assert!(!w.event_raw(&refused, now));
        assert!(!w.event_raw(&event(event_kind::ESTABLISHED_RESET, 1, 0), now));
        // Refused without a RST: an ICMP port-unreachable answered.
        refused.flags = 0;
        assert!(w.event_raw(&refused, now));
        w.attached(1);
        assert!(!w.event_raw(&event(event_kind::CONNECT_UNREACHABLE, 2, 0), now));
        // An attempt that attached nothing is retried only after a while.
        let mut failing = IcmpWatch::new(Mode::OnTrouble, Duration::from_secs(60), 0);
        let unreachable = event(event_kind::CONNECT_UNREACHABLE, 1, 0);
        assert!(failing.event_raw(&unreachable, now));
        failing.attach_failed(now);
        assert!(!failing.event_raw(&unreachable, now + RETRY / 2));
        assert!(failing.event_raw(&unreachable, now + RETRY));
        // Always: attached from the start, nothing to decide.
        let mut always = IcmpWatch::new(Mode::Always, Duration::ZERO, 0);
        assert!(!always.event_raw(&event(event_kind::CONNECT_TIMEOUT, 1, 0), now));
    }

    #[test]
    fn growing_trouble_counters_attach_and_quiet_detaches_after_the_hold() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(30);
        let mut w = IcmpWatch::new(Mode::OnTrouble, hold, 0);
        let mut counts = KernelCounts::default();
        assert!(!w.counters(&counts, t0), "nothing yet");
        counts.counters[counter::CONNECT_REFUSED as usize] += 100;
        assert!(!w.counters(&counts, t0), "refusals are not trouble");
        counts.counters[counter::FULLSIZE_RETRANSMITS as usize] += 1;
        assert!(w.counters(&counts, t0));
        assert!(!w.counters(&counts, t0), "no growth since");
        counts.counters[counter::SYN_RETRANSMITS as usize] += 1;
        assert!(w.counters(&counts, t0), "not attached yet: still wanted");
        w.attached(10);
        counts.counters[counter::SYN_RETRANSMITS as usize] += 1;
        assert!(
            !w.counters(&counts, t0),
            "attached: nothing to do, the hold restarts"
        );
        assert!(!w.quiet(t0 + hold / 2));
        assert!(w.quiet(t0 + hold));
        // Always never detaches.
        let mut always = IcmpWatch::new(Mode::Always, hold, 0);
        always.attached(0);
        assert!(!always.quiet(t0 + hold * 10));
    }
}
